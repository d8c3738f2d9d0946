//! Where things are on each child, and the two on-disk records.
//!
//! Every child has the same layout (offsets in bytes):
//!
//! ```text
//! 0                      superblock (4 KiB): geometry, uuid, epoch, failed children
//! 4K                     journal: `slots` slots of 4 KiB header + chunk bytes
//! bitmap_off             write-intent bitmap (4 KiB): one bit per region of stripes
//! meta_base              crc table: one u32 per 4 KiB block of every chunk
//! data_base              chunks: stripe s at data_base + s * chunk
//! ```
//!
//! `data_base` is rounded up to a multiple of [`DATA_ALIGN`] (64 KiB), so
//! that a 64 KiB chunk is one whole page of a `memory:` child (which can
//! then take the chunk's buffer as its page without a copy) and chunks
//! start on the same boundary in files.
//!
//! Child c holds chunk c of every stripe (c < k: data, else parity).
//! Stored crcs are `crc32c(block) ^ crc32c(zero block)`, so a table of
//! zeros (a fresh, zeroed child) says "every block is zero".

use anyhow::{bail, Result};
use std::sync::OnceLock;

/// The checksum unit: one crc32c per 4 KiB of each chunk.
pub const BLOCK: u64 = 4096;
const SB_MAGIC: &[u8; 8] = b"IOLFTEC1";
const J_MAGIC: &[u8; 8] = b"IOLFTJR1";
const BM_MAGIC: &[u8; 8] = b"IOLFTBM1";
/// Version 3: `data_base` aligned to [`DATA_ALIGN`] (version 2 was not).
const VERSION: u32 = 3;
/// Where the chunks start on a child is a multiple of this.
pub const DATA_ALIGN: u64 = 64 << 10;
/// Regions one bitmap block can hold (its bits after the header).
pub const BM_BITS: u64 = 32_000;
/// The largest chunk: its block crcs must fit a journal header.
pub const MAX_CHUNK: u64 = 2 << 20;

/// The stored crc of one block.
pub fn block_crc(b: &[u8]) -> u32 {
    static ZERO: OnceLock<u32> = OnceLock::new();
    let z = *ZERO.get_or_init(|| crc32c::crc32c(&[0u8; BLOCK as usize]));
    crc32c::crc32c(b) ^ z
}

/// The stored crcs of each 4 KiB block of `b` (a multiple of 4 KiB).
pub fn crcs(b: &[u8]) -> Vec<u32> {
    b.chunks(BLOCK as usize).map(block_crc).collect()
}

/// The geometry every child shares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Geometry {
    pub k: usize,
    pub m: usize,
    pub chunk: u64,
    pub slots: u64,
    pub stripes: u64,
}

impl Geometry {
    pub fn n(&self) -> usize {
        self.k + self.m
    }
    pub fn slot_size(&self) -> u64 {
        BLOCK + self.chunk
    }
    pub fn slot_off(&self, j: u64) -> u64 {
        BLOCK + j * self.slot_size()
    }
    pub fn blocks_per_chunk(&self) -> u64 {
        self.chunk / BLOCK
    }
    pub fn bitmap_off(&self) -> u64 {
        BLOCK + self.slots * self.slot_size()
    }
    pub fn meta_base(&self) -> u64 {
        self.bitmap_off() + BLOCK
    }
    fn meta_len(&self) -> u64 {
        (self.stripes * self.blocks_per_chunk() * 4).div_ceil(BLOCK) * BLOCK
    }
    /// Offset of the crc of block `blk` of stripe `s`'s chunk.
    pub fn meta_off(&self, s: u64, blk: u64) -> u64 {
        self.meta_base() + (s * self.blocks_per_chunk() + blk) * 4
    }
    pub fn data_base(&self) -> u64 {
        (self.meta_base() + self.meta_len()).next_multiple_of(DATA_ALIGN)
    }
    pub fn chunk_off(&self, s: u64) -> u64 {
        self.data_base() + s * self.chunk
    }
    /// Bytes each child needs.
    pub fn child_size(&self) -> u64 {
        self.data_base() + self.stripes * self.chunk
    }
    /// Logical bytes of one stripe.
    pub fn stripe_bytes(&self) -> u64 {
        self.k as u64 * self.chunk
    }
    /// The most stripes children of `size` bytes hold (0 if none fit).
    pub fn fit(mut self, size: u64) -> u64 {
        let fixed = BLOCK + self.slots * self.slot_size() + 2 * BLOCK;
        let per = self.chunk + self.blocks_per_chunk() * 4;
        self.stripes = size.saturating_sub(fixed) / per;
        while self.stripes > 0 && self.child_size() > size {
            self.stripes -= 1;
        }
        self.stripes
    }
}

fn put(b: &mut [u8], at: &mut usize, v: &[u8]) {
    b[*at..*at + v.len()].copy_from_slice(v);
    *at += v.len();
}

fn get<const N: usize>(b: &[u8], at: &mut usize) -> [u8; N] {
    let mut v = [0u8; N];
    v.copy_from_slice(&b[*at..*at + N]);
    *at += N;
    v
}

fn seal(b: &mut [u8]) {
    let c = crc32c::crc32c(&b[..BLOCK as usize - 4]);
    b[BLOCK as usize - 4..].copy_from_slice(&c.to_le_bytes());
}

fn sealed(b: &[u8]) -> bool {
    b.len() >= BLOCK as usize
        && crc32c::crc32c(&b[..BLOCK as usize - 4]).to_le_bytes()
            == b[BLOCK as usize - 4..BLOCK as usize]
}

/// A child's superblock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Super {
    pub geo: Geometry,
    /// Logical size of the device.
    pub size: u64,
    /// Set when the children were formatted; every member has the same.
    pub uuid: u64,
    /// Raised each time the superblocks are rewritten; the highest wins.
    pub epoch: u64,
    /// This child's position.
    pub index: u32,
    /// Children that need a rebuild (bit c).
    pub failed: u64,
    /// The erasure-code profile (`plugin=.. technique=.. k=.. m=..`).
    pub profile: String,
}

/// What block 0 of a child holds.
#[derive(Debug)]
pub enum Found {
    Super(Super),
    /// No superblock (zeroes, or another format): a blank or new child.
    Blank,
    /// Our magic with a bad checksum or version.
    Damaged(String),
}

impl Super {
    pub fn encode(&self) -> Vec<u8> {
        let mut b = vec![0u8; BLOCK as usize];
        let at = &mut 0;
        put(&mut b, at, SB_MAGIC);
        put(&mut b, at, &VERSION.to_le_bytes());
        put(&mut b, at, &self.index.to_le_bytes());
        for v in [
            self.geo.k as u64,
            self.geo.m as u64,
            self.geo.chunk,
            self.geo.slots,
            self.geo.stripes,
            self.size,
            self.uuid,
            self.epoch,
            self.failed,
        ] {
            put(&mut b, at, &v.to_le_bytes());
        }
        let p = self.profile.as_bytes();
        let n = p.len().min(1024);
        put(&mut b, at, &(n as u16).to_le_bytes());
        put(&mut b, at, &p[..n]);
        seal(&mut b);
        b
    }

    pub fn decode(b: &[u8]) -> Found {
        if b.len() < BLOCK as usize || &b[..8] != SB_MAGIC {
            return Found::Blank;
        }
        if !sealed(b) {
            return Found::Damaged("superblock checksum mismatch".into());
        }
        let at = &mut 8;
        let version = u32::from_le_bytes(get(b, at));
        if version != VERSION {
            return Found::Damaged(format!("superblock version {version}, expected {VERSION}"));
        }
        let index = u32::from_le_bytes(get(b, at));
        let mut v = [0u64; 9];
        for x in v.iter_mut() {
            *x = u64::from_le_bytes(get(b, at));
        }
        let n = u16::from_le_bytes(get(b, at)) as usize;
        let profile = String::from_utf8_lossy(&b[*at..*at + n.min(1024)]).into_owned();
        Found::Super(Super {
            geo: Geometry {
                k: v[0] as usize,
                m: v[1] as usize,
                chunk: v[2],
                slots: v[3],
                stripes: v[4],
            },
            size: v[5],
            uuid: v[6],
            epoch: v[7],
            failed: v[8],
            index,
            profile,
        })
    }

    /// Fails, naming the field, if this superblock is not of the device
    /// the options describe.
    pub fn matches(&self, geo: &Geometry, profile: &str) -> Result<()> {
        let g = &self.geo;
        for (what, have, want) in [
            ("k", g.k as u64, geo.k as u64),
            ("m", g.m as u64, geo.m as u64),
            ("chunk", g.chunk, geo.chunk),
            ("slots", g.slots, geo.slots),
        ] {
            if have != want {
                bail!("it was formatted with {what}={have}, the spec says {what}={want}");
            }
        }
        if self.profile != profile {
            bail!(
                "it was formatted with profile {:?}, the spec says {profile:?}",
                self.profile
            );
        }
        Ok(())
    }
}

/// The header of one journal entry (one child's part of a stripe update).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JHeader {
    pub uuid: u64,
    pub seq: u64,
    pub stripe: u64,
    /// Column range within the chunk.
    pub lo: u64,
    pub hi: u64,
    /// Children that take part in this update (bit c).
    pub parts: u64,
    /// Stored crcs of the payload's blocks.
    pub crcs: Vec<u32>,
}

impl JHeader {
    pub fn encode(&self) -> Vec<u8> {
        let mut b = vec![0u8; BLOCK as usize];
        let at = &mut 0;
        put(&mut b, at, J_MAGIC);
        for v in [
            self.uuid,
            self.seq,
            self.stripe,
            self.lo,
            self.hi,
            self.parts,
        ] {
            put(&mut b, at, &v.to_le_bytes());
        }
        put(&mut b, at, &(self.crcs.len() as u32).to_le_bytes());
        for c in &self.crcs {
            put(&mut b, at, &c.to_le_bytes());
        }
        seal(&mut b);
        b
    }

    /// The header, if `b` holds a sealed one of device `uuid`.
    pub fn decode(b: &[u8], uuid: u64) -> Option<JHeader> {
        if b.len() < BLOCK as usize || &b[..8] != J_MAGIC || !sealed(b) {
            return None;
        }
        let at = &mut 8;
        let mut v = [0u64; 6];
        for x in v.iter_mut() {
            *x = u64::from_le_bytes(get(b, at));
        }
        let n = u32::from_le_bytes(get(b, at)) as usize;
        if v[0] != uuid || n > (MAX_CHUNK / BLOCK) as usize || v[4] < v[3] {
            return None;
        }
        let crcs = (0..n).map(|_| u32::from_le_bytes(get(b, at))).collect();
        Some(JHeader {
            uuid: v[0],
            seq: v[1],
            stripe: v[2],
            lo: v[3],
            hi: v[4],
            parts: v[5],
            crcs,
        })
    }
}

/// The write-intent bitmap block: bit r set = region r (stripes
/// `r * region ..`) may have a stripe whose parity does not match its
/// data; `floor`: journal entries with a lower sequence number are in
/// place (they are not replayed).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bitmap {
    pub uuid: u64,
    pub floor: u64,
    /// Stripes per region.
    pub region: u64,
    pub bits: Vec<u64>,
}

impl Bitmap {
    pub fn encode(&self) -> Vec<u8> {
        let mut b = vec![0u8; BLOCK as usize];
        let at = &mut 0;
        put(&mut b, at, BM_MAGIC);
        for v in [self.uuid, self.floor, self.region, self.bits.len() as u64] {
            put(&mut b, at, &v.to_le_bytes());
        }
        for w in &self.bits {
            put(&mut b, at, &w.to_le_bytes());
        }
        seal(&mut b);
        b
    }

    /// The bitmap, if `b` holds a sealed one of device `uuid`.
    pub fn decode(b: &[u8], uuid: u64) -> Option<Bitmap> {
        if b.len() < BLOCK as usize || &b[..8] != BM_MAGIC || !sealed(b) {
            return None;
        }
        let at = &mut 8;
        let mut v = [0u64; 4];
        for x in v.iter_mut() {
            *x = u64::from_le_bytes(get(b, at));
        }
        if v[0] != uuid || v[2] == 0 || v[3] > BM_BITS.div_ceil(64) {
            return None;
        }
        let bits = (0..v[3]).map(|_| u64::from_le_bytes(get(b, at))).collect();
        Some(Bitmap {
            uuid: v[0],
            floor: v[1],
            region: v[2],
            bits,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip_and_detect_damage() {
        let geo = Geometry {
            k: 4,
            m: 2,
            chunk: 65536,
            slots: 8,
            stripes: 100,
        };
        let sb = Super {
            geo,
            size: 100 * 4 * 65536,
            uuid: 7,
            epoch: 3,
            index: 5,
            failed: 0b10,
            profile: "plugin=isa k=4 m=2".into(),
        };
        let mut b = sb.encode();
        match Super::decode(&b) {
            Found::Super(s) => assert_eq!(s, sb),
            f => panic!("{f:?}"),
        }
        b[100] ^= 1;
        assert!(matches!(Super::decode(&b), Found::Damaged(_)));
        assert!(matches!(Super::decode(&[0u8; 4096]), Found::Blank));
        let h = JHeader {
            uuid: 7,
            seq: 9,
            stripe: 3,
            lo: 4096,
            hi: 12288,
            parts: 0b110001,
            crcs: vec![1, 2],
        };
        let mut b = h.encode();
        assert_eq!(JHeader::decode(&b, 7), Some(h));
        assert_eq!(JHeader::decode(&b, 8), None);
        b[20] ^= 1;
        assert_eq!(JHeader::decode(&b, 7), None);
        let bm = Bitmap {
            uuid: 7,
            floor: 12,
            region: 16,
            bits: vec![0b101, 1 << 63],
        };
        let mut b = bm.encode();
        assert_eq!(Bitmap::decode(&b, 7), Some(bm));
        assert_eq!(Bitmap::decode(&b, 8), None);
        b[30] ^= 1;
        assert_eq!(Bitmap::decode(&b, 7), None);
    }

    #[test]
    fn geometry_fits_and_is_disjoint() {
        let g = Geometry {
            k: 4,
            m: 2,
            chunk: 65536,
            slots: 64,
            stripes: 0,
        };
        let n = g.fit(64 << 20);
        let g = Geometry { stripes: n, ..g };
        assert!(n > 900 && g.child_size() <= 64 << 20, "{n}");
        assert!(g.meta_off(n - 1, 15) + 4 <= g.data_base());
        assert_eq!(g.data_base() % DATA_ALIGN, 0);
        assert!(g.slot_off(63) + g.slot_size() <= g.bitmap_off());
        assert!(g.bitmap_off() + BLOCK <= g.meta_base());
        assert_eq!(g.fit(4096), 0);
        assert_eq!(block_crc(&[0u8; 4096]), 0);
        assert_ne!(block_crc(&[1u8; 4096]), 0);
    }
}
