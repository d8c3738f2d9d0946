//! The osd-only half of the map, read on demand from the bytes kept at
//! decode time: the fields `--print` shows and the release the map
//! requires (which decides whether a new crush map bumps crush_version).

use crate::addr::{Addr, AddrVec};
use crate::codec::Reader;
use crate::types::{OsdMap, UTime};
use crate::Result;

/// `ceph_release_t::luminous`.
pub const RELEASE_LUMINOUS: u8 = 12;

/// Fields of the osd-only struct.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct OsdPart {
    pub struct_v: u8,
    /// Per OSD: (up_from, up_thru, down_at, last_clean_begin, last_clean_end, lost_at).
    pub osd_info: Vec<[u32; 6]>,
    pub blocklist_len: usize,
    /// Blocklisted addresses and when they expire, in encoded order.
    pub blocklist: Vec<(Addr, UTime)>,
    pub cluster_addrs: Vec<AddrVec>,
    pub range_blocklist: Vec<(Addr, UTime)>,
    pub cluster_snapshot: String,
    pub osd_uuid: Vec<[u8; 16]>,
    pub nearfull_ratio: f32,
    pub full_ratio: f32,
    pub backfillfull_ratio: f32,
    pub require_min_compat_client: u8,
    pub require_osd_release: u8,
    pub stretch_mode_enabled: bool,
    pub stretch_bucket_count: u32,
    pub degraded_stretch_mode: u32,
    pub recovering_stretch_mode: u32,
    pub stretch_mode_bucket: i32,
    /// Per pool: snap intervals (start, length) queued for removal.
    pub removed_snaps_queue: Vec<(i64, Vec<(u64, u64)>)>,
}

fn skip_addrvecs(r: &mut Reader, field: &str) -> Result<()> {
    let n = r.count(field, 1)?;
    for _ in 0..n {
        crate::decode::skip_addrvec(r, field)?;
    }
    Ok(())
}

impl OsdMap {
    /// Parse the osd-only struct kept from decoding.
    pub fn osd_part(&self) -> Result<OsdPart> {
        let mut top = Reader::new(&self.enc.osd_part);
        let (v, _, mut r) = top.header("osd-only data")?;
        let mut p = OsdPart {
            struct_v: v,
            ..OsdPart::default()
        };
        skip_addrvecs(&mut r, "hb_back_addrs")?;
        let n = r.count("osd_info", 25)?;
        for _ in 0..n {
            r.u8("osd_info version")?;
            let lcb = r.u32("osd_info")?;
            let lce = r.u32("osd_info")?;
            let uf = r.u32("osd_info")?;
            let ut = r.u32("osd_info")?;
            let da = r.u32("osd_info")?;
            let la = r.u32("osd_info")?;
            p.osd_info.push([uf, ut, da, lcb, lce, la]);
        }
        let n = r.count("blocklist", 9)?;
        for _ in 0..n {
            let a = Addr::read(&mut r, "blocklist")?;
            let t = UTime {
                sec: r.u32("blocklist expiry")?,
                nsec: r.u32("blocklist expiry")?,
            };
            p.blocklist.push((a, t));
        }
        p.blocklist_len = n;
        p.cluster_addrs = AddrVec::read_list(&mut r, "cluster_addrs")?;
        r.u32("cluster_snapshot_epoch")?;
        p.cluster_snapshot = r.string("cluster_snapshot")?;
        let n = r.count("osd_uuid", 16)?;
        for _ in 0..n {
            let mut u = [0u8; 16];
            u.copy_from_slice(r.take(16, "osd_uuid")?);
            p.osd_uuid.push(u);
        }
        let n = r.count("osd_xinfo", 6)?;
        for _ in 0..n {
            r.skip_struct("osd_xinfo")?;
        }
        skip_addrvecs(&mut r, "hb_front_addrs")?;
        if v >= 2 {
            p.nearfull_ratio = f32::from_bits(r.u32("nearfull_ratio")?);
            p.full_ratio = f32::from_bits(r.u32("full_ratio")?);
        }
        if v >= 3 {
            p.backfillfull_ratio = f32::from_bits(r.u32("backfillfull_ratio")?);
        }
        if v >= 5 {
            p.require_min_compat_client = r.u8("require_min_compat_client")?;
            p.require_osd_release = r.u8("require_osd_release")?;
        }
        // removed_snaps_queue (v6), crush_node_flags and
        // device_class_flags (v7, v8), then stretch mode (v10).
        if v >= 6 {
            let n = r.count("removed_snaps_queue", 12)?;
            for _ in 0..n {
                let pool = r.i64("removed_snaps_queue pool")?;
                let m = r.count("removed_snaps_queue intervals", 16)?;
                let mut iv = Vec::with_capacity(m);
                for _ in 0..m {
                    iv.push((r.u64("removed_snaps_queue")?, r.u64("removed_snaps_queue")?));
                }
                p.removed_snaps_queue.push((pool, iv));
            }
        }
        for (field, since) in [("crush_node_flags", 8), ("device_class_flags", 9)] {
            if v >= since {
                let n = r.count(field, 8)?;
                r.take(n * 8, field)?;
            }
        }
        if v >= 10 {
            p.stretch_mode_enabled = r.u8("stretch_mode_enabled")? != 0;
            p.stretch_bucket_count = r.u32("stretch_bucket_count")?;
            p.degraded_stretch_mode = r.u32("degraded_stretch_mode")?;
            p.recovering_stretch_mode = r.u32("recovering_stretch_mode")?;
            p.stretch_mode_bucket = r.i32("stretch_mode_bucket")?;
        }
        if v >= 11 {
            let n = r.count("range_blocklist", 9)?;
            for _ in 0..n {
                let a = Addr::read(&mut r, "range_blocklist")?;
                let t = UTime {
                    sec: r.u32("range_blocklist expiry")?,
                    nsec: r.u32("range_blocklist expiry")?,
                };
                p.range_blocklist.push((a, t));
            }
        }
        Ok(p)
    }

    /// Whether the map requires luminous or later OSDs (then a new crush
    /// map increments crush_version, as `apply_incremental` does).
    pub fn require_luminous(&self) -> bool {
        self.osd_part()
            .map(|p| p.require_osd_release >= RELEASE_LUMINOUS)
            .unwrap_or(false)
    }
}
