//! [`PosixSyncEnv`]: rusty-leveldb's own POSIX environment
//! (`PosixDiskEnv`) with one change: `flush` of a file it writes, which is
//! how the engine syncs a log, table or manifest file, is fdatasync(2).
//! `PosixDiskEnv` returns a plain `std::fs::File`, whose `flush` does
//! nothing, so a sync write there reaches the kernel, not the disk.

use rusty_leveldb::env::{Env, FileLock, Logger, RandomAccess};
use rusty_leveldb::PosixDiskEnv;
use std::fs::OpenOptions;
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};

/// See the module docs.
#[derive(Clone, Default)]
pub struct PosixSyncEnv {
    disk: PosixDiskEnv,
}

impl PosixSyncEnv {
    pub fn new() -> PosixSyncEnv {
        PosixSyncEnv::default()
    }
}

/// A file whose `flush` is fdatasync(2).
struct SyncFile(std::fs::File);

impl Write for SyncFile {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0.write(buf)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.0.sync_data()
    }
}

fn opened(p: &Path, f: io::Result<std::fs::File>) -> rusty_leveldb::Result<Box<dyn Write>> {
    let f = f.map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", p.display())))?;
    Ok(Box::new(SyncFile(f)))
}

impl Env for PosixSyncEnv {
    fn open_sequential_file(&self, p: &Path) -> rusty_leveldb::Result<Box<dyn Read>> {
        self.disk.open_sequential_file(p)
    }
    fn open_random_access_file(&self, p: &Path) -> rusty_leveldb::Result<Box<dyn RandomAccess>> {
        self.disk.open_random_access_file(p)
    }
    fn open_writable_file(&self, p: &Path) -> rusty_leveldb::Result<Box<dyn Write>> {
        let f = OpenOptions::new()
            .create(true)
            .truncate(true)
            .write(true)
            .open(p);
        opened(p, f)
    }
    fn open_appendable_file(&self, p: &Path) -> rusty_leveldb::Result<Box<dyn Write>> {
        opened(p, OpenOptions::new().create(true).append(true).open(p))
    }
    fn exists(&self, p: &Path) -> rusty_leveldb::Result<bool> {
        self.disk.exists(p)
    }
    fn children(&self, p: &Path) -> rusty_leveldb::Result<Vec<PathBuf>> {
        self.disk.children(p)
    }
    fn size_of(&self, p: &Path) -> rusty_leveldb::Result<usize> {
        self.disk.size_of(p)
    }
    fn delete(&self, p: &Path) -> rusty_leveldb::Result<()> {
        self.disk.delete(p)
    }
    fn mkdir(&self, p: &Path) -> rusty_leveldb::Result<()> {
        self.disk.mkdir(p)
    }
    fn rmdir(&self, p: &Path) -> rusty_leveldb::Result<()> {
        self.disk.rmdir(p)
    }
    fn rename(&self, from: &Path, to: &Path) -> rusty_leveldb::Result<()> {
        self.disk.rename(from, to)
    }
    fn lock(&self, p: &Path) -> rusty_leveldb::Result<FileLock> {
        self.disk.lock(p)
    }
    fn unlock(&self, l: FileLock) -> rusty_leveldb::Result<()> {
        self.disk.unlock(l)
    }
    fn new_logger(&self, p: &Path) -> rusty_leveldb::Result<Logger> {
        self.disk.new_logger(p)
    }
    fn micros(&self) -> u64 {
        self.disk.micros()
    }
    fn sleep_for(&self, micros: u32) {
        self.disk.sleep_for(micros)
    }
}
