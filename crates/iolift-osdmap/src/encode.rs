//! Encoding an OSDMap back into the form it was read in. Parsed fields
//! are written from the model, everything else from the bytes kept at
//! decode time; the CRC32C is recomputed. An unchanged map encodes to the
//! input byte for byte.

use crate::codec::{begin_struct, crc32c, end_struct, put_i32, put_i64, put_u32, put_u64, put_u8};
use crate::types::{OsdMap, PgId, Pool};

fn put_pg(out: &mut Vec<u8>, pg: &PgId) {
    put_u8(out, 1);
    put_u64(out, pg.pool);
    put_u32(out, pg.seed);
    put_i32(out, -1);
}

fn put_u32s(out: &mut Vec<u8>, v: &[u32]) {
    put_u32(out, v.len() as u32);
    for &x in v {
        put_u32(out, x);
    }
}

fn put_i32s(out: &mut Vec<u8>, v: &[i32]) {
    put_u32(out, v.len() as u32);
    for &x in v {
        put_i32(out, x);
    }
}

/// The pool's kept encoding with the parsed fields written over it.
fn pool_bytes(p: &Pool) -> Vec<u8> {
    let mut b = p.raw.clone();
    // header (6 bytes), then type, size, crush_rule, object_hash, pg_num, pgp_num
    b[6] = p.pool_type;
    b[7] = p.size;
    b[8] = p.crush_rule;
    b[9] = p.object_hash;
    b[10..14].copy_from_slice(&p.pg_num.to_le_bytes());
    b[14..18].copy_from_slice(&p.pgp_num.to_le_bytes());
    b[26..30].copy_from_slice(&p.last_change.to_le_bytes());
    let (at, width) = p.flags_at;
    b[at..at + width].copy_from_slice(&p.flags.to_le_bytes()[..width]);
    b[p.min_size_at] = p.min_size;
    b
}

/// Encode the map (Ceph's `OSDMap::encode` layout, as it was read).
pub fn encode(m: &OsdMap) -> Vec<u8> {
    let e = &m.enc;
    let mut out = Vec::with_capacity(4096 + e.osd_part.len() + 64 * m.osd_state.len());
    let wrapper = begin_struct(&mut out, e.wrapper_v.0, e.wrapper_v.1);
    let client = begin_struct(&mut out, e.client_v.0, e.client_v.1);
    out.extend_from_slice(&m.fsid);
    put_u32(&mut out, m.epoch);
    put_u32(&mut out, m.created.sec);
    put_u32(&mut out, m.created.nsec);
    put_u32(&mut out, m.modified.sec);
    put_u32(&mut out, m.modified.nsec);
    put_u32(&mut out, m.pools.len() as u32);
    for (id, p) in &m.pools {
        put_i64(&mut out, *id);
        out.extend_from_slice(&pool_bytes(p));
    }
    put_u32(&mut out, e.pool_names.len() as u32);
    for (id, name) in &e.pool_names {
        put_i64(&mut out, *id);
        crate::codec::put_string(&mut out, name);
    }
    put_i32(&mut out, m.pool_max);
    put_u32(&mut out, m.flags);
    put_i32(&mut out, m.max_osd);
    put_u32s(&mut out, &m.osd_state);
    put_u32s(&mut out, &m.osd_weight);
    out.extend_from_slice(&e.client_addrs);
    put_u32(&mut out, m.pg_temp.len() as u32);
    for (pg, v) in &m.pg_temp {
        put_pg(&mut out, pg);
        put_i32s(&mut out, v);
    }
    put_u32(&mut out, m.primary_temp.len() as u32);
    for (pg, o) in &m.primary_temp {
        put_pg(&mut out, pg);
        put_i32(&mut out, *o);
    }
    put_u32s(&mut out, &m.primary_affinity);
    let crush = m.crush_bytes();
    put_u32(&mut out, crush.len() as u32);
    out.extend_from_slice(&crush);
    out.extend_from_slice(&e.ec_profiles);
    put_u32(&mut out, m.pg_upmap.len() as u32);
    for (pg, v) in &m.pg_upmap {
        put_pg(&mut out, pg);
        put_i32s(&mut out, v);
    }
    put_u32(&mut out, m.pg_upmap_items.len() as u32);
    for (pg, v) in &m.pg_upmap_items {
        put_pg(&mut out, pg);
        put_u32(&mut out, v.len() as u32);
        for &(a, b) in v {
            put_i32(&mut out, a);
            put_i32(&mut out, b);
        }
    }
    put_i32(&mut out, m.crush_version);
    out.extend_from_slice(&e.client_tail);
    end_struct(&mut out, client);
    out.extend_from_slice(&e.osd_part);
    let crc_at = out.len();
    put_u32(&mut out, 0);
    out.extend_from_slice(&e.wrapper_tail);
    end_struct(&mut out, wrapper);
    let crc = crc32c(crc32c(u32::MAX, &out[..crc_at]), &e.wrapper_tail);
    out[crc_at..crc_at + 4].copy_from_slice(&crc.to_le_bytes());
    out
}
