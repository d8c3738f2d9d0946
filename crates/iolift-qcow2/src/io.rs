//! Positioned file I/O helpers.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;

/// Reads exactly `buf.len()` bytes at `off`; a short file is an error.
pub fn read_exact(file: &File, off: u64, buf: &mut [u8]) -> io::Result<()> {
    file.read_exact_at(buf, off)
}

/// Reads `buf.len()` bytes at `off`; what lies past the end of the file
/// reads as zeroes (qcow2 files may end inside their last cluster).
pub fn read_zero_fill(file: &File, off: u64, buf: &mut [u8]) -> io::Result<()> {
    let mut done = 0;
    while done < buf.len() {
        match file.read_at(&mut buf[done..], off + done as u64) {
            Ok(0) => {
                buf[done..].fill(0);
                return Ok(());
            }
            Ok(n) => done += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

pub fn write_all(file: &File, off: u64, buf: &[u8]) -> io::Result<()> {
    file.write_all_at(buf, off)
}

/// Makes every completed write to `file` durable (fdatasync).
pub fn sync(file: &File) -> io::Result<()> {
    file.sync_data()
}
