//! Decoding a full OSDMap as Ceph 16.2 writes it (`OSDMap::encode` with
//! the meta wrapper v8, client data v7..=9, osd-only data kept opaque,
//! CRC32C checked). Older (classic) and newer encodings are refused with
//! the version that was found.

use crate::codec::{crc32c, Reader};
use crate::types::{Encoding, OsdMap, PgId, Pool, UTime};
use crate::{OsdMapError, Result};
use std::collections::BTreeMap;

/// Versions of the client-data struct this decoder reads.
const CLIENT_V: std::ops::RangeInclusive<u8> = 7..=9;

fn unsupported(offset: usize, field: &str, version: u8, supported: &str) -> OsdMapError {
    OsdMapError::Unsupported {
        offset,
        field: field.into(),
        version,
        supported: supported.into(),
    }
}

/// Decode a full OSDMap (`osdmaptool --createsimple`, `ceph osd getmap`).
pub fn decode(buf: &[u8]) -> Result<OsdMap> {
    let mut top = Reader::new(buf);
    let (wv, wc, mut w) = top.header("osdmap wrapper")?;
    if wv < 7 {
        return Err(unsupported(
            0,
            "osdmap wrapper",
            wv,
            "classic pre-luminous encodings (< 7) are not read",
        ));
    }
    if wc > 8 {
        return Err(unsupported(
            1,
            "osdmap wrapper compat",
            wc,
            "this decoder reads compat <= 8",
        ));
    }
    let client_at = w.offset();
    let (cv, cc, mut c) = w.header("client data")?;
    if !CLIENT_V.contains(&cv) {
        return Err(unsupported(
            client_at,
            "client data struct_v",
            cv,
            "Ceph 16.2 writes 7..=9",
        ));
    }
    let mut enc = Encoding {
        wrapper_v: (wv, wc),
        client_v: (cv, cc),
        ..Encoding::default()
    };
    let mut fsid = [0u8; 16];
    fsid.copy_from_slice(c.take(16, "fsid")?);
    let epoch = c.u32("epoch")?;
    let created = utime(&mut c, "created")?;
    let modified = utime(&mut c, "modified")?;

    let npools = c.count("pools", 8 + 6)?;
    let mut pools = BTreeMap::new();
    for _ in 0..npools {
        let id = c.i64("pool id")?;
        let p = decode_pool(&mut c, id)?;
        if pools.insert(id, p).is_some() {
            return Err(c.corrupt(c.offset(), "pools", format!("pool {id} twice")));
        }
    }
    let nnames = c.count("pool_name", 12)?;
    for _ in 0..nnames {
        let id = c.i64("pool_name id")?;
        let name = c.string("pool_name")?;
        if let Some(p) = pools.get_mut(&id) {
            p.name = name.clone();
        }
        enc.pool_names.push((id, name));
    }
    let pool_max = c.i32("pool_max")?;
    let flags = c.u32("flags")?;
    let at = c.offset();
    let max_osd = c.i32("max_osd")?;
    if max_osd < 0 {
        return Err(c.corrupt(at, "max_osd", format!("negative ({max_osd})")));
    }
    let osd_state = u32_vec(&mut c, "osd_state")?;
    let osd_weight = u32_vec(&mut c, "osd_weight")?;
    for (name, len) in [
        ("osd_state", osd_state.len()),
        ("osd_weight", osd_weight.len()),
    ] {
        if len != max_osd as usize {
            return Err(c.corrupt(at, name, format!("{len} entries but max_osd is {max_osd}")));
        }
    }
    let start = c.pos();
    let naddrs = c.count("client_addrs", 1)?;
    for _ in 0..naddrs {
        skip_addrvec(&mut c, "client_addrs")?;
    }
    enc.client_addrs = c.since(start).to_vec();

    let pg_temp = pg_map(&mut c, "pg_temp", |c| i32_vec(c, "pg_temp osds"))?;
    let primary_temp = pg_map(&mut c, "primary_temp", |c| c.i32("primary_temp osd"))?;
    let at = c.offset();
    let primary_affinity = u32_vec(&mut c, "osd_primary_affinity")?;
    if !primary_affinity.is_empty() && primary_affinity.len() != max_osd as usize {
        return Err(c.corrupt(
            at,
            "osd_primary_affinity",
            format!(
                "{} entries but max_osd is {max_osd}",
                primary_affinity.len()
            ),
        ));
    }
    let crush_at = c.offset() + 4;
    let crush_raw = c.blob("crush map")?;
    let crush = iolift_crush::decode(crush_raw).map_err(|err| OsdMapError::Crush {
        offset: crush_at,
        err,
    })?;
    enc.crush_raw = Some(crush_raw.to_vec());

    let start = c.pos();
    let n = c.count("erasure_code_profiles", 8)?;
    for _ in 0..n {
        c.string("erasure_code_profiles name")?;
        let m = c.count("erasure_code_profiles entries", 8)?;
        for _ in 0..m {
            c.string("erasure_code_profiles key")?;
            c.string("erasure_code_profiles value")?;
        }
    }
    enc.ec_profiles = c.since(start).to_vec();

    let pg_upmap = pg_map(&mut c, "pg_upmap", |c| i32_vec(c, "pg_upmap osds"))?;
    let pg_upmap_items = pg_map(&mut c, "pg_upmap_items", |c| {
        let m = c.count("pg_upmap_items pairs", 8)?;
        let mut v = Vec::with_capacity(m);
        for _ in 0..m {
            v.push((c.i32("pg_upmap_items from")?, c.i32("pg_upmap_items to")?));
        }
        Ok(v)
    })?;
    let crush_version = c.i32("crush_version")?;
    enc.client_tail = c.rest().to_vec();

    let start = w.pos();
    w.skip_struct("osd-only data")?;
    enc.osd_part = w.since(start).to_vec();
    // The crc covers the map from its first byte up to the crc field, and
    // whatever follows the field inside the wrapper.
    let crc_front = w.offset();
    let at = w.offset();
    let crc = w.u32("crc")?;
    enc.wrapper_tail = w.rest().to_vec();
    top.finish("osdmap (bytes after the map)")?;
    let mut actual = crc32c(u32::MAX, &buf[..crc_front]);
    actual = crc32c(actual, &enc.wrapper_tail);
    if actual != crc {
        return Err(OsdMapError::Corrupt {
            offset: at,
            field: "crc".into(),
            msg: format!("stored {crc:#010x}, computed {actual:#010x}"),
        });
    }

    Ok(OsdMap {
        fsid,
        epoch,
        created,
        modified,
        pools,
        pool_max,
        flags,
        max_osd,
        osd_state,
        osd_weight,
        pg_temp,
        primary_temp,
        primary_affinity,
        crush,
        pg_upmap,
        pg_upmap_items,
        crush_version,
        enc,
    })
}

fn utime(r: &mut Reader, field: &str) -> Result<UTime> {
    Ok(UTime {
        sec: r.u32(field)?,
        nsec: r.u32(field)?,
    })
}

fn u32_vec(r: &mut Reader, field: &str) -> Result<Vec<u32>> {
    let n = r.count(field, 4)?;
    (0..n).map(|_| r.u32(field)).collect()
}

fn i32_vec(r: &mut Reader, field: &str) -> Result<Vec<i32>> {
    let n = r.count(field, 4)?;
    (0..n).map(|_| r.i32(field)).collect()
}

/// A map keyed by `pg_t` (pg_temp, primary_temp, pg_upmap,
/// pg_upmap_items): a count, then per entry the PG and the value `value`
/// reads. Every entry takes at least 21 bytes (a PG and a u32).
fn pg_map<T>(
    r: &mut Reader,
    field: &str,
    mut value: impl FnMut(&mut Reader) -> Result<T>,
) -> Result<BTreeMap<PgId, T>> {
    let n = r.count(field, 17 + 4)?;
    let mut m = BTreeMap::new();
    for _ in 0..n {
        let pg = pg_id(r, field)?;
        m.insert(pg, value(r)?);
    }
    Ok(m)
}

/// `pg_t`: version 1, pool, seed, and a "preferred" that must be -1.
fn pg_id(r: &mut Reader, field: &str) -> Result<PgId> {
    let at = r.offset();
    let v = r.u8(field)?;
    if v != 1 {
        return Err(r.corrupt(at, field, format!("pg id version {v} (expected 1)")));
    }
    let pool = r.u64(field)?;
    let seed = r.u32(field)?;
    let preferred = r.i32(field)?;
    if preferred != -1 {
        return Err(r.corrupt(
            at,
            field,
            format!("pg id 'preferred' {preferred} (expected -1)"),
        ));
    }
    Ok(PgId { pool, seed })
}

/// `entity_addr_t`: marker 0 is the legacy fixed layout, 1 a versioned struct.
pub(crate) fn skip_addr(r: &mut Reader, field: &str) -> Result<()> {
    let at = r.offset();
    let m = r.u8(field)?;
    if !skip_addr_body(r, m, field)? {
        return Err(r.corrupt(at, field, format!("address marker {m}")));
    }
    Ok(())
}

/// `entity_addrvec_t`: marker 0/1 a single address, 2 a vector of them.
pub(crate) fn skip_addrvec(r: &mut Reader, field: &str) -> Result<()> {
    let at = r.offset();
    let m = r.u8(field)?;
    if m == 2 {
        let n = r.count(field, 1)?;
        for _ in 0..n {
            skip_addr(r, field)?;
        }
    } else if !skip_addr_body(r, m, field)? {
        return Err(r.corrupt(at, field, format!("address vector marker {m}")));
    }
    Ok(())
}

/// The rest of an `entity_addr_t` whose marker `m` was just read; false
/// (nothing read) for a marker other than 0 and 1.
fn skip_addr_body(r: &mut Reader, m: u8, field: &str) -> Result<bool> {
    match m {
        0 => r.take(3 + 4 + 128, field).map(drop)?,
        1 => r.header(field).map(drop)?,
        _ => return Ok(false),
    }
    Ok(true)
}

/// `pg_pool_t`: the leading fields up to min_size are read; the whole
/// struct is kept.
fn decode_pool(r: &mut Reader, id: i64) -> Result<Pool> {
    let field = format!("pool {id}");
    let start = r.pos();
    let hdr_at = r.offset();
    let (v, _compat, mut p) = r.header(&field)?;
    if v < 27 {
        return Err(unsupported(
            hdr_at,
            &field,
            v,
            "pg_pool_t >= 27 (luminous+) is read",
        ));
    }
    let body = hdr_at + 6;
    let pool_type = p.u8("pool type")?;
    let size = p.u8("pool size")?;
    let crush_rule = p.u8("pool crush_rule")?;
    let object_hash = p.u8("pool object_hash")?;
    let pg_num = p.u32("pool pg_num")?;
    let pgp_num = p.u32("pool pgp_num")?;
    p.take(8, "pool lpg_num")?;
    let last_change = p.u32("pool last_change")?;
    p.take(8 + 4, "pool snap_seq")?;
    let n = p.count("pool snaps", 9)?;
    for _ in 0..n {
        p.u64("pool snap id")?;
        p.skip_struct("pool snap info")?;
    }
    let n = p.count("pool removed_snaps", 16)?;
    p.take(n * 16, "pool removed_snaps")?;
    p.u64("pool auid")?;
    let flags_at = p.offset() - hdr_at;
    let flags = p.u64("pool flags")?;
    p.u32("pool crash_replay_interval")?;
    let min_size_at = p.offset() - hdr_at;
    let min_size = p.u8("pool min_size")?;
    p.rest();
    for (what, bad) in [
        ("type", !(pool_type == 1 || pool_type == 3)),
        ("pg_num", pg_num == 0),
        ("pgp_num", pgp_num == 0 || pgp_num > pg_num),
    ] {
        if bad {
            return Err(OsdMapError::Corrupt {
                offset: body,
                field: format!("{field} {what}"),
                msg: format!(
                    "type {pool_type}, pg_num {pg_num}, pgp_num {pgp_num} \
                     (type must be 1 or 3, 0 < pgp_num <= pg_num)"
                ),
            });
        }
    }
    Ok(Pool {
        id,
        name: String::new(),
        pool_type,
        size,
        crush_rule,
        object_hash,
        pg_num,
        pgp_num,
        last_change,
        flags,
        min_size,
        raw: r.since(start).to_vec(),
        flags_at: (flags_at, 8),
        min_size_at,
    })
}
