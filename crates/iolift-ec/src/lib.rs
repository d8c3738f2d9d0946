//! Reed-Solomon erasure coding over GF(2^8), byte-identical with Ceph's
//! `jerasure` (reed_sol_van, reed_sol_r6_op, cauchy_orig, cauchy_good) and
//! `isa` (reed_sol_van, cauchy) erasure-code plugins, with Ceph's chunk-size
//! rules. Matrices are multiplied by iolift's own AVX2 kernel where the CPU
//! has AVX2, else by ISA-L's kernels when libisal loads at run time, else
//! by a portable loop, with the same bytes either way.

pub mod bench;
pub mod cache;
pub mod codec;
pub mod gf;
pub mod isal;
pub mod matrix;
pub mod profile;
pub mod region;
pub mod stripe;
pub mod wide;

pub use codec::{Codec, Engine, Plan};
pub use profile::{Plugin, Profile, Technique};

/// What can go wrong; each message names the bad part.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("invalid profile: {0}")]
    Profile(String),
    #[error("{0}")]
    StripeUnit(String),
    #[error("{0}")]
    Shards(String),
    #[error("{0}")]
    Invalid(String),
}
