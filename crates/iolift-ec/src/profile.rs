//! Erasure-code profiles as Ceph writes them (`plugin=jerasure,technique=
//! reed_sol_van,k=4,m=2`), checked the way iolift can encode them, and
//! Ceph's chunk-size rules per plugin and technique.

use crate::Error;

/// Ceph erasure-code plugin whose chunks we reproduce.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Plugin {
    Jerasure,
    Isa,
}

/// Coding technique (the `technique=` key).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Technique {
    /// jerasure reed_sol_van: systematic Vandermonde-derived matrix.
    ReedSolVan,
    /// jerasure reed_sol_r6_op: RAID-6 P and Q, m = 2.
    ReedSolR6Op,
    /// jerasure cauchy_orig: Cauchy matrix, bit-matrix encoding in packets.
    CauchyOrig,
    /// jerasure cauchy_good: improved Cauchy matrix, bit-matrix encoding.
    CauchyGood,
    /// isa reed_sol_van: ISA-L's gf_gen_rs_matrix.
    IsaReedSolVan,
    /// isa cauchy: ISA-L's gf_gen_cauchy1_matrix.
    IsaCauchy,
}

impl Technique {
    pub fn name(self) -> &'static str {
        match self {
            Technique::ReedSolVan | Technique::IsaReedSolVan => "reed_sol_van",
            Technique::ReedSolR6Op => "reed_sol_r6_op",
            Technique::CauchyOrig => "cauchy_orig",
            Technique::CauchyGood => "cauchy_good",
            Technique::IsaCauchy => "cauchy",
        }
    }

    /// True for the techniques that encode with a bit matrix over packets.
    pub fn is_bitmatrix(self) -> bool {
        matches!(self, Technique::CauchyOrig | Technique::CauchyGood)
    }
}

/// Names of the plugins iolift can stand in for.
pub const PLUGINS: &[&str] = &["jerasure", "isa"];

/// A checked profile.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Profile {
    pub plugin: Plugin,
    pub technique: Technique,
    pub k: usize,
    pub m: usize,
    /// Word size in bits (jerasure); 8 for isa.
    pub w: usize,
    /// Packet size in bytes (jerasure cauchy_*).
    pub packetsize: usize,
    /// jerasure-per-chunk-alignment.
    pub per_chunk_alignment: bool,
}

/// jerasure rounds to this vector size (its LARGEST_VECTOR_WORDSIZE).
const VECTOR: usize = 16;
/// isa aligns chunks to this many bytes.
const ISA_ALIGN: usize = 32;

fn bad(msg: String) -> Error {
    Error::Profile(msg)
}

fn int_key(map: &[(String, String)], key: &str, default: i64) -> Result<i64, Error> {
    match map.iter().rev().find(|(k, _)| k == key) {
        None => Ok(default),
        Some((_, v)) if v.is_empty() => Ok(default),
        Some((_, v)) => v
            .parse::<i64>()
            .map_err(|_| bad(format!("{key}={v} is not an integer"))),
    }
}

fn str_key<'a>(map: &'a [(String, String)], key: &str) -> Option<&'a str> {
    map.iter()
        .rev()
        .find(|(k, _)| k == key)
        .map(|(_, v)| v.as_str())
}

/// Splits a profile argument into key=value pairs (separated by commas or
/// spaces, as Ceph's tool does). A token without '=' is an error.
pub fn split(text: &str) -> Result<Vec<(String, String)>, Error> {
    let mut out = Vec::new();
    for tok in text.split([',', ' ']).filter(|t| !t.is_empty()) {
        let (k, v) = tok
            .split_once('=')
            .ok_or_else(|| bad(format!("'{tok}' is not key=value")))?;
        out.push((k.to_string(), v.to_string()));
    }
    Ok(out)
}

impl Profile {
    /// Parses and checks a profile. The defaults are Ceph's (jerasure: k=2,
    /// m=1, w=8, packetsize=2048, technique required; isa: k=7, m=3,
    /// technique reed_sol_van). Keys other plugins or Ceph use (crush-*,
    /// stripe_unit, ...) are ignored as Ceph's plugins ignore them.
    pub fn parse(text: &str) -> Result<Profile, Error> {
        let map = split(text)?;
        let plugin = match str_key(&map, "plugin") {
            None | Some("") => return Err(bad("plugin= is missing".into())),
            Some("jerasure") => Plugin::Jerasure,
            Some("isa") => Plugin::Isa,
            Some(p) => {
                return Err(bad(format!(
                    "plugin={p} is not supported (supported: {})",
                    PLUGINS.join(", ")
                )))
            }
        };
        let (dk, dm) = match plugin {
            Plugin::Jerasure => (2, 1),
            Plugin::Isa => (7, 3),
        };
        let k = int_key(&map, "k", dk)?;
        let m = int_key(&map, "m", dm)?;
        let w = int_key(&map, "w", 8)?;
        let packetsize = int_key(&map, "packetsize", 2048)?;
        let per_chunk_alignment = match str_key(&map, "jerasure-per-chunk-alignment") {
            None | Some("") | Some("false") => false,
            Some("true") => true,
            Some(v) => {
                return Err(bad(format!(
                    "jerasure-per-chunk-alignment={v} is not true or false"
                )))
            }
        };
        if k < 2 {
            return Err(bad(format!("k={k} must be >= 2")));
        }
        if m < 1 {
            return Err(bad(format!("m={m} must be >= 1")));
        }
        let technique = match (plugin, str_key(&map, "technique")) {
            (Plugin::Jerasure, None | Some("")) => {
                return Err(bad(
                    "technique= is missing (jerasure: reed_sol_van, reed_sol_r6_op, cauchy_orig, cauchy_good)"
                        .into(),
                ))
            }
            (Plugin::Jerasure, Some("reed_sol_van")) => Technique::ReedSolVan,
            (Plugin::Jerasure, Some("reed_sol_r6_op")) => Technique::ReedSolR6Op,
            (Plugin::Jerasure, Some("cauchy_orig")) => Technique::CauchyOrig,
            (Plugin::Jerasure, Some("cauchy_good")) => Technique::CauchyGood,
            (Plugin::Jerasure, Some(t @ ("liberation" | "blaum_roth" | "liber8tion"))) => {
                return Err(bad(format!(
                    "technique={t} is a jerasure technique iolift does not implement (supported: reed_sol_van, reed_sol_r6_op, cauchy_orig, cauchy_good)"
                )))
            }
            (Plugin::Jerasure, Some(t)) => {
                return Err(bad(format!(
                    "technique={t} is not a jerasure technique (supported: reed_sol_van, reed_sol_r6_op, cauchy_orig, cauchy_good)"
                )))
            }
            (Plugin::Isa, None | Some("") | Some("reed_sol_van")) => Technique::IsaReedSolVan,
            (Plugin::Isa, Some("cauchy")) => Technique::IsaCauchy,
            (Plugin::Isa, Some(t)) => {
                return Err(bad(format!(
                    "technique={t} is not an isa technique (supported: reed_sol_van, cauchy)"
                )))
            }
        };
        let (k, m) = (k as usize, m as usize);
        match technique {
            Technique::ReedSolVan | Technique::ReedSolR6Op => {
                if ![8, 16, 32].contains(&w) {
                    return Err(bad(format!("w={w} must be one of 8, 16, 32")));
                }
                if technique == Technique::ReedSolR6Op && m != 2 {
                    return Err(bad(format!("m={m} must be 2 for reed_sol_r6_op (RAID-6)")));
                }
            }
            Technique::CauchyOrig | Technique::CauchyGood => {
                if w != 8 {
                    return Err(bad(format!(
                        "w={w} is not supported by iolift yet (only w=8)"
                    )));
                }
                if packetsize < 1 {
                    return Err(bad(format!("packetsize={packetsize} must be >= 1")));
                }
                if packetsize % 8 != 0 {
                    return Err(bad(format!(
                        "packetsize={packetsize} must be a multiple of the machine word size (8 bytes)"
                    )));
                }
            }
            Technique::IsaReedSolVan => {
                if k > 32 {
                    return Err(bad(format!("k={k} must be <= 32 for isa reed_sol_van")));
                }
                if m > 4 {
                    return Err(bad(format!(
                        "m={m} must be <= 4 for isa reed_sol_van (not MDS beyond)"
                    )));
                }
                if m == 4 && k > 21 {
                    return Err(bad(format!(
                        "k={k} must be <= 21 for isa reed_sol_van with m=4 (not MDS beyond)"
                    )));
                }
            }
            Technique::IsaCauchy => {}
        }
        if w == 8 && k + m > 256 {
            return Err(bad(format!("k+m={} must be <= 256 in GF(2^8)", k + m)));
        }
        let w = if plugin == Plugin::Isa { 8 } else { w as usize };
        // Ceph's reed_sol_r6_op does not read jerasure-per-chunk-alignment.
        let per_chunk_alignment = per_chunk_alignment && technique != Technique::ReedSolR6Op;
        Ok(Profile {
            plugin,
            technique,
            k,
            m,
            w,
            packetsize: packetsize as usize,
            per_chunk_alignment,
        })
    }

    /// The alignment Ceph's plugin rounds chunk sizes (per-chunk alignment)
    /// or object sizes (otherwise) up to.
    pub fn alignment(&self) -> usize {
        let (k, w) = (self.k, self.w);
        match self.plugin {
            Plugin::Isa => ISA_ALIGN,
            Plugin::Jerasure if self.technique.is_bitmatrix() => {
                let ps = self.packetsize;
                if self.per_chunk_alignment {
                    (w * ps).div_ceil(VECTOR) * VECTOR
                } else if !(w * ps * 4).is_multiple_of(VECTOR) {
                    k * w * ps * VECTOR
                } else {
                    k * w * ps * 4
                }
            }
            Plugin::Jerasure => {
                if self.per_chunk_alignment {
                    w * VECTOR
                } else if !(w * 4).is_multiple_of(VECTOR) {
                    k * w * VECTOR
                } else {
                    k * w * 4
                }
            }
        }
    }

    /// Ceph's `get_chunk_size(object_size)` for this plugin: the size of
    /// each of the k data chunks an object of that size is cut into
    /// (padding included).
    pub fn chunk_size(&self, object_size: usize) -> usize {
        let a = self.alignment();
        match self.plugin {
            Plugin::Isa => {
                let c = object_size.div_ceil(self.k).div_ceil(a) * a;
                if c == 0 {
                    a
                } else {
                    c
                }
            }
            Plugin::Jerasure if self.per_chunk_alignment => {
                object_size.div_ceil(self.k).div_ceil(a).max(1) * a
            }
            Plugin::Jerasure => object_size.div_ceil(a) * a / self.k,
        }
    }

    /// The smallest legal stripe unit: a stripe unit is legal exactly when
    /// `chunk_size(k * su) == su`, which is when it is a multiple of this.
    pub fn stripe_unit_multiple(&self) -> usize {
        match self.plugin {
            Plugin::Isa => ISA_ALIGN,
            Plugin::Jerasure if self.per_chunk_alignment => self.alignment(),
            Plugin::Jerasure => self.alignment() / self.k,
        }
    }

    /// Checks a stripe unit (the chunk size of one stripe).
    pub fn check_stripe_unit(&self, su: usize) -> Result<(), Error> {
        if su == 0 || self.chunk_size(self.k * su) != su {
            return Err(Error::StripeUnit(format!(
                "stripe_unit={su} is not valid for this profile: it must be a non-zero multiple of {}",
                self.stripe_unit_multiple()
            )));
        }
        Ok(())
    }

    pub fn chunk_count(&self) -> usize {
        self.k + self.m
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_defaults_and_errors() {
        let p = Profile::parse("plugin=isa").unwrap();
        assert_eq!((p.k, p.m, p.technique), (7, 3, Technique::IsaReedSolVan));
        let p = Profile::parse("plugin=jerasure technique=cauchy_good k=4 m=3").unwrap();
        assert_eq!((p.k, p.m, p.packetsize), (4, 3, 2048));
        for (text, part) in [
            ("plugin=jerasure,technique=reed_sol_van,k=0,m=2", "k=0"),
            ("plugin=jerasure,k=3,m=2", "technique="),
            ("plugin=jerasure,technique=reed_sol_r6_op,k=3,m=3", "m=3"),
            ("plugin=jerasure,technique=foo,k=3,m=2", "technique=foo"),
            ("plugin=jerasure,technique=reed_sol_van,k=3,m=2,w=7", "w=7"),
            ("plugin=jerasure,technique=cauchy_good,k=3,m=2,w=16", "w=16"),
            (
                "plugin=jerasure,technique=cauchy_orig,k=3,m=2,packetsize=12",
                "packetsize=12",
            ),
            ("plugin=isa,k=22,m=4", "k=22"),
            ("plugin=isa,k=4,m=5", "m=5"),
            ("plugin=foo,k=4,m=2", "plugin=foo"),
            ("plugin=isa,k=x", "k=x"),
            ("plugin=isa,technique=cauchy,k=250,m=7", "k+m=257"),
        ] {
            let e = Profile::parse(text).unwrap_err().to_string();
            assert!(e.contains(part), "{text}: {e}");
        }
    }

    #[test]
    fn chunk_sizes() {
        let isa = Profile::parse("plugin=isa,k=3,m=2").unwrap();
        assert_eq!(isa.chunk_size(10000), 3360);
        assert_eq!(isa.chunk_size(0), 32);
        let rs = Profile::parse("plugin=jerasure,technique=reed_sol_van,k=3,m=2").unwrap();
        // aligned to k*w*4 = 96 bytes of object
        assert_eq!(rs.chunk_size(10000), 10080 / 3);
        rs.check_stripe_unit(4096).unwrap();
        assert!(rs.check_stripe_unit(4016).is_err());
        let c =
            Profile::parse("plugin=jerasure,technique=cauchy_good,k=3,m=2,packetsize=8").unwrap();
        assert_eq!(c.stripe_unit_multiple(), 8 * 8 * 4);
    }
}
