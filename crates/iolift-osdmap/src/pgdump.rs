//! PG sizes from `ceph pg dump -f json` (`pg_map.pg_stats[].pgid` and its
//! `stat_sum.num_bytes`), read as a stream: the file (gigabytes on a big
//! cluster) is scanned once with a few bytes of state, and only a
//! `PgId -> bytes` table is kept, bounded by `max_pgs`.

use crate::types::PgId;
use crate::{OsdMapError, Result};
use std::collections::HashMap;
use std::io::Read;

/// Default bound on the PGs kept (about 32 bytes each).
pub const DEFAULT_MAX_PGS: usize = 16 << 20;

/// Longest string kept while scanning (keys and pg ids are short).
const MAX_STR: usize = 64;

#[derive(PartialEq)]
enum State {
    Out,
    Str { escaped: bool },
    AfterStr,
    Num,
}

/// Read `pgid` / `num_bytes` pairs: each `"pgid": "P.S"` is paired with
/// the first `"num_bytes": N` after it.
pub fn read_pg_bytes(mut r: impl Read, max_pgs: usize) -> Result<HashMap<PgId, u64>> {
    let err = |msg: String| OsdMapError::Invalid(format!("pg dump: {msg}"));
    let mut out = HashMap::new();
    let mut buf = vec![0u8; 1 << 16];
    let mut st = State::Out;
    let mut s: Vec<u8> = Vec::with_capacity(MAX_STR);
    let mut key: Vec<u8> = Vec::with_capacity(MAX_STR);
    let mut expect_value = false;
    let mut num: u64 = 0;
    let mut pending: Option<PgId> = None;
    let mut at: u64 = 0;
    let mut saw_pgid = false;
    loop {
        let n = r
            .read(&mut buf)
            .map_err(|e| err(format!("read error: {e}")))?;
        if n == 0 {
            break;
        }
        for &c in &buf[..n] {
            at += 1;
            match st {
                State::Str { escaped } => {
                    if escaped {
                        st = State::Str { escaped: false };
                    } else if c == b'\\' {
                        st = State::Str { escaped: true };
                    } else if c == b'"' {
                        st = State::AfterStr;
                        if expect_value && key == b"pgid" {
                            let t = String::from_utf8_lossy(&s);
                            let pg: PgId = t
                                .parse()
                                .map_err(|_| err(format!("bad pgid \"{t}\" at byte {at}")))?;
                            pending = Some(pg);
                            saw_pgid = true;
                        }
                    } else if s.len() < MAX_STR {
                        s.push(c);
                    }
                    continue;
                }
                State::AfterStr => {
                    if c.is_ascii_whitespace() {
                        continue;
                    }
                    if c == b':' {
                        std::mem::swap(&mut key, &mut s);
                        expect_value = true;
                        st = State::Out;
                        continue;
                    }
                    expect_value = false;
                    st = State::Out;
                }
                State::Num => {
                    if c.is_ascii_digit() {
                        num = num
                            .checked_mul(10)
                            .and_then(|v| v.checked_add((c - b'0') as u64))
                            .ok_or_else(|| err(format!("num_bytes overflows at byte {at}")))?;
                        continue;
                    }
                    if let Some(pg) = pending.take() {
                        if out.len() >= max_pgs && !out.contains_key(&pg) {
                            return Err(err(format!(
                                "more than {max_pgs} PGs (the table's bound)"
                            )));
                        }
                        out.insert(pg, num);
                    }
                    st = State::Out;
                    expect_value = false;
                }
                State::Out => {}
            }
            // State::Out
            if c == b'"' {
                s.clear();
                st = State::Str { escaped: false };
            } else if expect_value && key == b"num_bytes" && c.is_ascii_digit() {
                num = (c - b'0') as u64;
                st = State::Num;
            } else if !c.is_ascii_whitespace() {
                expect_value = false;
            }
        }
    }
    if st != State::Out && st != State::AfterStr {
        return Err(err("truncated (ends inside a value)".into()));
    }
    if !saw_pgid {
        return Err(err(
            "no pg_stats entries with a \"pgid\" (want `ceph pg dump -f json` output)".into(),
        ));
    }
    Ok(out)
}

/// `k` of an erasure-code profile in the map (for the size of one shard).
pub fn ec_profile_k(map: &crate::OsdMap, profile: &str) -> Option<u64> {
    map.ec_profile(profile)?
        .into_iter()
        .find(|(k, _)| k == "k")
        .and_then(|(_, v)| v.parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pairs_pgid_with_next_num_bytes() {
        let j = br#"{"pg_map":{"pg_stats_sum":{"stat_sum":{"num_bytes":99}},
            "pg_stats":[{"pgid":"1.1f","state":"a\"b","stat_sum":{"num_bytes":4096,"num_objects":1}},
            {"pgid" : "2.0","stat_sum":{"num_bytes": 0}}]}}"#;
        let m = read_pg_bytes(&j[..], 10).unwrap();
        assert_eq!(m.len(), 2);
        assert_eq!(
            m[&PgId {
                pool: 1,
                seed: 0x1f
            }],
            4096
        );
        assert_eq!(m[&PgId { pool: 2, seed: 0 }], 0);
        assert!(read_pg_bytes(&j[..], 1).is_err());
        let e = read_pg_bytes(&br#"{"pgid":"x.y"}"#[..], 10).unwrap_err();
        assert!(e.to_string().contains("bad pgid"), "{e}");
        assert!(read_pg_bytes(&b"{}"[..], 10).is_err());
    }

    /// Hands out its bytes a few at a time (1 to 7 per read), as a pipe
    /// or a slow file would.
    struct Trickle<'a>(&'a [u8], usize);

    impl Read for Trickle<'_> {
        fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            self.1 = self.1 % 7 + 1;
            let n = self.1.min(buf.len()).min(self.0.len());
            buf[..n].copy_from_slice(&self.0[..n]);
            self.0 = &self.0[n..];
            Ok(n)
        }
    }

    /// Every cut and every single-byte change (to bytes that matter to the
    /// scanner) of a dump: an answer, never a panic, the same however the
    /// bytes arrive, and an error that says it is about the pg dump.
    #[test]
    fn cut_and_corrupted_dumps_are_answered_the_same_in_any_chunks() {
        let j: &[u8] = br#"{"pg_map":{"pg_stats":[{"pgid":"1.1f","state":"a\"b","stat_sum":{"num_bytes":4096}},{"pgid":"2.0","stat_sum":{"num_bytes":18446744073709551615}}]}}"#;
        let check = |b: &[u8]| {
            let whole = read_pg_bytes(b, 10);
            let trickled = read_pg_bytes(Trickle(b, 0), 10);
            match (&whole, &trickled) {
                (Ok(a), Ok(c)) => assert_eq!(a, c, "{}", String::from_utf8_lossy(b)),
                (Err(a), Err(c)) => {
                    assert_eq!(a.to_string(), c.to_string());
                    assert!(a.to_string().contains("pg dump: "), "{a}");
                }
                _ => panic!(
                    "{whole:?} vs {trickled:?} for {}",
                    String::from_utf8_lossy(b)
                ),
            }
            whole.is_ok()
        };
        assert!(check(j));
        let cut_ok = (0..j.len()).filter(|&n| check(&j[..n])).count();
        let mut changed_ok = 0;
        for at in 0..j.len() {
            for c in [b'"', b':', b'\\', b'9', b'.', b'x', b' ', b'{', 0xff] {
                let mut v = j.to_vec();
                v[at] = c;
                changed_ok += check(&v) as usize;
            }
        }
        // Cuts after the first entry's size still hold it; most changes
        // leave a dump that reads.
        assert!(
            cut_ok > 0 && cut_ok < j.len(),
            "{cut_ok} of {} cuts read",
            j.len()
        );
        assert!(changed_ok > 0, "no changed dump read");
    }
}
