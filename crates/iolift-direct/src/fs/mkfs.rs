//! Making a file system: `mkfs` writes the inode table (with the root
//! directory's inode), the block bitmap and, last, the superblock.

use super::layout::{self, *};
use super::Mkfs;
use crate::buf::{AlignedBuf, Buf};
use crate::engine::{Engine, Op};
use std::io;

/// Makes an empty file system (root directory only) on the engine's target.
pub fn mkfs(eng: &Engine, o: &Mkfs) -> io::Result<layout::Super> {
    let bs = o.block_size as u64;
    let blocks = eng.target().size() / bs;
    let inodes = if o.inodes == 0 {
        (blocks / 16).clamp(16, 1 << 20) as u32
    } else {
        o.inodes
    };
    let sb = Super::plan(o.block_size, blocks, inodes)?;
    if eng.target().align() > o.block_size as usize {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "block size {bs} below the device's {}",
                eng.target().align()
            ),
        ));
    }
    let mut a = AlignedBuf::new(bs as usize);
    let run = |op| eng.run(op).wait().result();
    // Inode table (zero, then the root), bitmap, superblock last.
    for b in sb.itable_start..sb.data_start {
        a.fill(0);
        if b == sb.itable_start {
            let root = Inode {
                kind: KIND_DIR,
                nlink: 1,
                ..Inode::default()
            };
            let at = ROOT as usize * INODE_SIZE;
            a[at..at + INODE_SIZE].copy_from_slice(&root.encode());
        }
        a = write_owned(eng, b as u64 * bs, a)?;
    }
    let mut bitmap = vec![0u8; sb.bitmap_blocks as usize * bs as usize];
    for b in 0..sb.data_start as usize {
        bitmap[b / 8] |= 1 << (b % 8);
    }
    for i in 0..sb.bitmap_blocks as usize {
        a.copy_from_slice(&bitmap[i * bs as usize..(i + 1) * bs as usize]);
        a = write_owned(eng, (sb.bitmap_start as u64 + i as u64) * bs, a)?;
    }
    run(Op::Flush)?;
    a.fill(0);
    a[..SB_LEN].copy_from_slice(&sb.encode());
    write_owned(eng, 0, a)?;
    run(Op::Flush)?;
    Ok(sb)
}

fn write_owned(eng: &Engine, off: u64, a: AlignedBuf) -> io::Result<AlignedBuf> {
    let d = eng.write(off, Buf::Aligned(a)).wait();
    d.result()?;
    match d.buf {
        Some(Buf::Aligned(a)) => Ok(a),
        _ => unreachable!("the engine gives back the buffer it was given"),
    }
}
