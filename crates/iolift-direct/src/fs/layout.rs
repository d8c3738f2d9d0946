//! The on-disk format (all integers little-endian):
//!
//! ```text
//! block 0                   superblock (first 56 bytes, rest zero)
//! blocks 1..                block bitmap: bit b (byte b/8, bit b%8) = block b used
//! itable_start..            inode table: 128-byte inodes, inode 0 unused, 1 = root
//! data_start..blocks        data, indirect and directory blocks
//! ```
//!
//! Superblock: magic `IOLFTAFS`, version 1, block size, block count, inode
//! count, the start and length of the bitmap and inode table, the first
//! data block, the root inode, and a CRC-32C of the fields before it.
//!
//! Inode: kind (0 free, 1 file, 2 directory), link count, CRC-32C of the
//! inode with this field zero (an all-zero free inode needs none), size,
//! 12 direct block pointers, one indirect and one double-indirect pointer
//! (0 = no block; an indirect block holds block size / 8 pointers).
//!
//! Directory: a file of 64-byte entries: inode (0 = empty slot), name
//! length, kind, two bytes zero, the name (1..=56 bytes, no `/` or NUL).

use std::io;

pub const MAGIC: &[u8; 8] = b"IOLFTAFS";
pub const VERSION: u32 = 1;
pub const INODE_SIZE: usize = 128;
pub const DIRENT_SIZE: usize = 64;
pub const NAME_MAX: usize = 56;
pub const NDIRECT: usize = 12;
pub const ROOT: u32 = 1;
pub const SB_LEN: usize = 56;
/// The most inodes a file system may have: the whole inode table is kept
/// in memory while it is mounted (128 bytes an inode: 512 MiB at most).
/// mkfs's default, one per 16 blocks, stops at 2^20 (128 MiB).
pub const MAX_INODES: u32 = 1 << 22;

pub const KIND_FREE: u16 = 0;
pub const KIND_FILE: u16 = 1;
pub const KIND_DIR: u16 = 2;

/// CRC-32C (Castagnoli), bitwise-reflected, table-driven.
pub fn crc32c(data: &[u8]) -> u32 {
    static TABLE: std::sync::OnceLock<[u32; 256]> = std::sync::OnceLock::new();
    let t = TABLE.get_or_init(|| {
        let mut t = [0u32; 256];
        for (i, e) in t.iter_mut().enumerate() {
            let mut c = i as u32;
            for _ in 0..8 {
                c = if c & 1 != 0 {
                    0x82F6_3B78 ^ (c >> 1)
                } else {
                    c >> 1
                };
            }
            *e = c;
        }
        t
    });
    let mut c = !0u32;
    for &b in data {
        c = t[((c ^ b as u32) & 0xff) as usize] ^ (c >> 8);
    }
    !c
}

pub fn corrupt(msg: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg.into())
}

fn u32_at(b: &[u8], o: usize) -> u32 {
    u32::from_le_bytes(b[o..o + 4].try_into().unwrap())
}

fn u64_at(b: &[u8], o: usize) -> u64 {
    u64::from_le_bytes(b[o..o + 8].try_into().unwrap())
}

fn u16_at(b: &[u8], o: usize) -> u16 {
    u16::from_le_bytes(b[o..o + 2].try_into().unwrap())
}

/// The superblock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Super {
    pub block_size: u32,
    pub blocks: u64,
    pub inodes: u32,
    pub bitmap_start: u32,
    pub bitmap_blocks: u32,
    pub itable_start: u32,
    pub itable_blocks: u32,
    pub data_start: u32,
    pub root: u32,
}

impl Super {
    /// The layout of a file system of `blocks` blocks of `block_size`
    /// bytes with `inodes` inodes.
    pub fn plan(block_size: u32, blocks: u64, inodes: u32) -> io::Result<Super> {
        let bad = |m: String| io::Error::new(io::ErrorKind::InvalidInput, m);
        if !block_size.is_power_of_two() || !(4096..=65536).contains(&block_size) {
            return Err(bad(format!(
                "block size {block_size}: a power of two from 4096 to 65536"
            )));
        }
        if !(2..=MAX_INODES).contains(&inodes) {
            return Err(bad(format!(
                "{inodes} inodes: from 2 to {MAX_INODES} (the inode table, {INODE_SIZE} bytes \
                 an inode, is kept in memory while mounted)"
            )));
        }
        if blocks > u32::MAX as u64 {
            return Err(bad(format!(
                "{blocks} blocks of {block_size} bytes: over 2^32 - 1 blocks"
            )));
        }
        // In 64 bits: with blocks < 2^32 every sum below fits.
        let bs = block_size as u64;
        let bitmap_blocks = blocks.div_ceil(bs * 8);
        let itable_blocks = (inodes as u64 * INODE_SIZE as u64).div_ceil(bs);
        let data_start = 1 + bitmap_blocks + itable_blocks;
        if blocks < data_start + 2 {
            return Err(bad(format!(
                "{blocks} blocks of {block_size} bytes: too small for {inodes} inodes"
            )));
        }
        // data_start + 2 <= blocks < 2^32: each fits in 32 bits.
        Ok(Super {
            block_size,
            blocks,
            inodes,
            bitmap_start: 1,
            bitmap_blocks: bitmap_blocks as u32,
            itable_start: 1 + bitmap_blocks as u32,
            itable_blocks: itable_blocks as u32,
            data_start: data_start as u32,
            root: ROOT,
        })
    }

    pub fn encode(&self) -> [u8; SB_LEN] {
        let mut b = [0u8; SB_LEN];
        b[0..8].copy_from_slice(MAGIC);
        b[8..12].copy_from_slice(&VERSION.to_le_bytes());
        b[12..16].copy_from_slice(&self.block_size.to_le_bytes());
        b[16..24].copy_from_slice(&self.blocks.to_le_bytes());
        b[24..28].copy_from_slice(&self.inodes.to_le_bytes());
        b[28..32].copy_from_slice(&self.bitmap_start.to_le_bytes());
        b[32..36].copy_from_slice(&self.bitmap_blocks.to_le_bytes());
        b[36..40].copy_from_slice(&self.itable_start.to_le_bytes());
        b[40..44].copy_from_slice(&self.itable_blocks.to_le_bytes());
        b[44..48].copy_from_slice(&self.data_start.to_le_bytes());
        b[48..52].copy_from_slice(&self.root.to_le_bytes());
        let c = crc32c(&b[..52]);
        b[52..56].copy_from_slice(&c.to_le_bytes());
        b
    }

    /// Decodes and checks a superblock against the device size.
    pub fn decode(b: &[u8], dev_size: u64) -> io::Result<Super> {
        if b.len() < SB_LEN {
            return Err(corrupt("superblock: device too small"));
        }
        if &b[0..8] != MAGIC {
            return Err(corrupt("superblock: bad magic (not an accelfs image)"));
        }
        let v = u32_at(b, 8);
        if v != VERSION {
            return Err(corrupt(format!(
                "superblock: version {v}, expected {VERSION}"
            )));
        }
        if crc32c(&b[..52]) != u32_at(b, 52) {
            return Err(corrupt("superblock: checksum mismatch"));
        }
        let s = Super {
            block_size: u32_at(b, 12),
            blocks: u64_at(b, 16),
            inodes: u32_at(b, 24),
            bitmap_start: u32_at(b, 28),
            bitmap_blocks: u32_at(b, 32),
            itable_start: u32_at(b, 36),
            itable_blocks: u32_at(b, 40),
            data_start: u32_at(b, 44),
            root: u32_at(b, 48),
        };
        let want = Super::plan(s.block_size, s.blocks, s.inodes)
            .map_err(|e| corrupt(format!("superblock: {e}")))?;
        if want != s {
            return Err(corrupt(format!(
                "superblock: inconsistent layout {s:?}, expected {want:?}"
            )));
        }
        let need = s.blocks * s.block_size as u64;
        if need > dev_size {
            return Err(corrupt(format!(
                "superblock: {need} bytes of blocks on a {dev_size}-byte device"
            )));
        }
        Ok(s)
    }

    /// Pointers in one indirect block.
    pub fn per_block(&self) -> u64 {
        self.block_size as u64 / 8
    }

    /// The largest file: direct, indirect and double-indirect blocks.
    pub fn max_file_size(&self) -> u64 {
        let p = self.per_block();
        (NDIRECT as u64 + p + p * p) * self.block_size as u64
    }

    /// The largest directory: its direct and single-indirect blocks.
    pub fn max_dir_size(&self) -> u64 {
        (NDIRECT as u64 + self.per_block()) * self.block_size as u64
    }

    pub fn is_data(&self, b: u64) -> bool {
        b >= self.data_start as u64 && b < self.blocks
    }
}

/// An inode in memory.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Inode {
    pub kind: u16,
    pub nlink: u16,
    pub size: u64,
    pub direct: [u64; NDIRECT],
    pub indirect: u64,
    pub dindirect: u64,
}

impl Inode {
    pub fn encode(&self) -> [u8; INODE_SIZE] {
        let mut b = [0u8; INODE_SIZE];
        if self.kind == KIND_FREE && *self == Inode::default() {
            return b;
        }
        b[0..2].copy_from_slice(&self.kind.to_le_bytes());
        b[2..4].copy_from_slice(&self.nlink.to_le_bytes());
        b[8..16].copy_from_slice(&self.size.to_le_bytes());
        for (i, p) in self.direct.iter().enumerate() {
            b[16 + i * 8..24 + i * 8].copy_from_slice(&p.to_le_bytes());
        }
        b[112..120].copy_from_slice(&self.indirect.to_le_bytes());
        b[120..128].copy_from_slice(&self.dindirect.to_le_bytes());
        let c = crc32c(&b);
        b[4..8].copy_from_slice(&c.to_le_bytes());
        b
    }

    /// Decodes and checks inode `ino`.
    pub fn decode(b: &[u8], ino: u32, sb: &Super) -> io::Result<Inode> {
        if b.iter().all(|&x| x == 0) {
            return Ok(Inode::default());
        }
        let mut z = [0u8; INODE_SIZE];
        z.copy_from_slice(&b[..INODE_SIZE]);
        z[4..8].fill(0);
        if crc32c(&z) != u32_at(b, 4) {
            return Err(corrupt(format!("inode {ino}: checksum mismatch")));
        }
        let mut n = Inode {
            kind: u16_at(b, 0),
            nlink: u16_at(b, 2),
            size: u64_at(b, 8),
            ..Inode::default()
        };
        for i in 0..NDIRECT {
            n.direct[i] = u64_at(b, 16 + i * 8);
        }
        n.indirect = u64_at(b, 112);
        n.dindirect = u64_at(b, 120);
        if !matches!(n.kind, KIND_FREE | KIND_FILE | KIND_DIR) {
            return Err(corrupt(format!("inode {ino}: unknown kind {}", n.kind)));
        }
        let max = if n.kind == KIND_DIR {
            sb.max_dir_size()
        } else {
            sb.max_file_size()
        };
        if n.size > max {
            return Err(corrupt(format!("inode {ino}: size {} over {max}", n.size)));
        }
        if n.kind == KIND_DIR && !n.size.is_multiple_of(DIRENT_SIZE as u64) {
            return Err(corrupt(format!(
                "inode {ino}: directory size {} not a multiple of {DIRENT_SIZE}",
                n.size
            )));
        }
        if n.kind == KIND_DIR && n.dindirect != 0 {
            return Err(corrupt(format!(
                "inode {ino}: directory with a double-indirect block"
            )));
        }
        for p in n.direct.iter().chain([&n.indirect, &n.dindirect]) {
            if *p != 0 && !sb.is_data(*p) {
                return Err(corrupt(format!(
                    "inode {ino}: block pointer {p} outside the data area {}..{}",
                    sb.data_start, sb.blocks
                )));
            }
        }
        Ok(n)
    }
}

/// One directory entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Dirent {
    pub ino: u32,
    pub kind: u16,
    pub name: String,
}

/// Checks a name for a directory entry.
pub fn check_name(name: &str) -> io::Result<()> {
    if name.is_empty()
        || name.len() > NAME_MAX
        || name.contains(['/', '\0'])
        || name == "."
        || name == ".."
    {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("bad name {name:?}: 1 to {NAME_MAX} bytes, no '/' or NUL, not . or .."),
        ));
    }
    Ok(())
}

impl Dirent {
    pub fn encode(&self) -> [u8; DIRENT_SIZE] {
        let mut b = [0u8; DIRENT_SIZE];
        b[0..4].copy_from_slice(&self.ino.to_le_bytes());
        b[4] = self.name.len() as u8;
        b[5] = self.kind as u8;
        b[8..8 + self.name.len()].copy_from_slice(self.name.as_bytes());
        b
    }

    /// Decodes slot `slot` of directory `dir`: None for an empty slot.
    pub fn decode(b: &[u8], dir: u32, slot: u64, sb: &Super) -> io::Result<Option<Dirent>> {
        let ino = u32_at(b, 0);
        if ino == 0 {
            return Ok(None);
        }
        let at = || format!("directory inode {dir}, entry {slot}");
        if ino >= sb.inodes {
            return Err(corrupt(format!("{}: inode {ino} out of range", at())));
        }
        let len = b[4] as usize;
        let kind = b[5] as u16;
        if kind != KIND_FILE && kind != KIND_DIR {
            return Err(corrupt(format!("{}: unknown kind {kind}", at())));
        }
        if len == 0 || len > NAME_MAX {
            return Err(corrupt(format!("{}: name length {len}", at())));
        }
        let name = std::str::from_utf8(&b[8..8 + len])
            .map_err(|_| corrupt(format!("{}: name is not UTF-8", at())))?;
        check_name(name).map_err(|e| corrupt(format!("{}: {e}", at())))?;
        Ok(Some(Dirent {
            ino,
            kind,
            name: name.to_string(),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc32c_known_value() {
        // The standard check value of CRC-32C.
        assert_eq!(crc32c(b"123456789"), 0xE306_9283);
    }

    #[test]
    fn superblock_round_trip_and_checks() {
        let s = Super::plan(8192, 1024, 256).unwrap();
        assert_eq!(s.data_start, 1 + 1 + 4);
        let b = s.encode();
        assert_eq!(Super::decode(&b, 8192 * 1024).unwrap(), s);
        let e = Super::decode(&b, 8192 * 1000).unwrap_err();
        assert!(e.to_string().contains("device"), "{e}");
        let mut bad = b;
        bad[20] ^= 1;
        let e = Super::decode(&bad, u64::MAX).unwrap_err();
        assert!(e.to_string().contains("checksum"), "{e}");
        assert!(Super::plan(1000, 1024, 256).is_err());
        // The inode table is kept in memory: its size is bounded.
        assert!(Super::plan(4096, 1 << 31, MAX_INODES).is_ok());
        let e = Super::plan(4096, 1 << 31, MAX_INODES + 1).unwrap_err();
        assert!(e.to_string().contains("kept in memory"), "{e}");
        assert!(Super::plan(8192, 4, 256).is_err());
    }

    #[test]
    fn inode_and_dirent_round_trip() {
        let s = Super::plan(4096, 4096, 64).unwrap();
        let mut n = Inode {
            kind: KIND_FILE,
            nlink: 1,
            size: 12345,
            ..Inode::default()
        };
        n.direct[3] = s.data_start as u64 + 7;
        n.indirect = 4000;
        let b = n.encode();
        assert_eq!(Inode::decode(&b, 5, &s).unwrap(), n);
        let mut bad = b;
        bad[9] ^= 0x40;
        assert!(Inode::decode(&bad, 5, &s).is_err());
        assert_eq!(Inode::decode(&[0u8; 128], 5, &s).unwrap(), Inode::default());
        let d = Dirent {
            ino: 9,
            kind: KIND_DIR,
            name: "héllo".into(),
        };
        assert_eq!(Dirent::decode(&d.encode(), 1, 0, &s).unwrap(), Some(d));
        assert!(check_name("a/b").is_err() && check_name("..").is_err());
        assert!(check_name(&"x".repeat(57)).is_err());
    }

    /// Every field of a superblock set to each of a list of awkward values
    /// (zero, one, the largest, powers of two and their neighbours, values
    /// whose bitmap or inode table would not fit in 32 bits), with its
    /// checksum made right so that the checks behind it are reached:
    /// decode gives a superblock that plans back to itself, or an error
    /// that says it is about the superblock; never a panic.
    #[test]
    fn every_field_of_a_checksummed_superblock_is_decoded_or_refused() {
        let good = Super::plan(4096, 1024, 64).unwrap().encode();
        let mut values: Vec<u64> = vec![0, 1, 2, 7, 4095, 4096, 65536, 65537];
        for k in 0..64 {
            values.extend([1u64 << k, (1u64 << k) - 1, (1u64 << k) + 1]);
        }
        // Block counts whose bitmap needs about 2^32 blocks (4 KiB and
        // 64 KiB blocks): the layout's block numbers would not fit in 32 bits.
        for bs in [4096u64, 65536] {
            for d in [0, 1, 2, 1 << 20] {
                values.push(((1u64 << 32) - d) * bs * 8);
                values.push((u32::MAX as u64 - d) * bs * 8 + 1);
            }
        }
        values.extend([u32::MAX as u64, u64::MAX, u64::MAX - 1]);
        let (mut ok, mut refused) = (0, 0);
        for (at, width) in [
            (12, 4),
            (16, 8),
            (24, 4),
            (28, 4),
            (32, 4),
            (36, 4),
            (40, 4),
            (44, 4),
            (48, 4),
        ] {
            for &v in &values {
                if width == 4 && v > u32::MAX as u64 {
                    continue;
                }
                let mut b = good;
                b[at..at + width].copy_from_slice(&v.to_le_bytes()[..width]);
                let c = crc32c(&b[..52]);
                b[52..56].copy_from_slice(&c.to_le_bytes());
                match Super::decode(&b, u64::MAX) {
                    Ok(s) => {
                        let again = Super::plan(s.block_size, s.blocks, s.inodes).unwrap();
                        assert_eq!(again, s, "field at {at} = {v}");
                        ok += 1;
                    }
                    Err(e) => {
                        assert!(
                            e.to_string().starts_with("superblock: "),
                            "field at {at} = {v}: {e}"
                        );
                        refused += 1;
                    }
                }
            }
        }
        assert!(ok > 0 && refused > ok, "{ok} decoded, {refused} refused");
    }
}
