//! Encoding and decoding of one stripe: k data chunks of equal length in,
//! m parity chunks out; any k of the k+m chunks rebuild the others.

use crate::cache::{PlanCache, DEFAULT_CAPACITY};
use crate::isal::Isal;
use crate::matrix::{self, Matrix};
use crate::profile::{Plugin, Profile, Technique};
use crate::region::{avx2_available, BitPlan, NativePlan};
use crate::wide::{self, Wide, WidePlan};
use crate::Error;
use std::sync::Arc;

/// Which kernels multiply matrices by chunks. All give the same bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Engine {
    /// The fastest kernel here: iolift's own AVX2 kernel where the CPU
    /// has AVX2 (it beats ISA-L's AVX2 kernels, see docs/ec.md), else
    /// ISA-L when it loads (its SSE/NEON kernels), else the portable loop.
    Auto,
    /// ISA-L's ec_encode_data (error if libisal cannot be loaded).
    Isal,
    /// iolift's own AVX2 kernel (portable loop where AVX2 is missing).
    Native,
    /// iolift's portable table loop only.
    Scalar,
}

impl Engine {
    pub fn parse(s: &str) -> Result<Engine, Error> {
        Ok(match s {
            "auto" => Engine::Auto,
            "isal" => Engine::Isal,
            "native" => Engine::Native,
            "scalar" => Engine::Scalar,
            _ => {
                return Err(Error::Invalid(format!(
                    "engine {s} is unknown (auto, isal, native, scalar)"
                )))
            }
        })
    }
}

/// A matrix prepared for the chosen kernel.
pub enum Plan {
    Isal(&'static Isal, Vec<u8>, usize, usize),
    Native(NativePlan),
    Bits(BitPlan),
    /// w = 16 or 32: words multiplied in GF(2^w).
    Wide(WidePlan),
}

impl Plan {
    /// outs = rows x srcs.
    pub fn run(&self, srcs: &[&[u8]], outs: &mut [&mut [u8]]) {
        match self {
            Plan::Isal(lib, t, rows, cols) => {
                assert_eq!((srcs.len(), outs.len()), (*cols, *rows));
                lib.encode(t, srcs, outs)
            }
            Plan::Native(p) => p.run(srcs, outs),
            Plan::Bits(p) => p.run(srcs, outs),
            Plan::Wide(p) => p.run(srcs, outs),
        }
    }

    /// Which kernel runs: "isal", "avx2", "scalar" or "bitmatrix".
    pub fn kernel(&self) -> &'static str {
        match self {
            Plan::Isal(..) => "isal",
            Plan::Native(p) if p.uses_avx2() => "avx2",
            Plan::Native(_) => "scalar",
            Plan::Bits(_) => "bitmatrix",
            Plan::Wide(_) => "wide",
        }
    }
}

/// An erasure code for one profile.
pub struct Codec {
    profile: Profile,
    /// (k+m) x k generator: identity, then the parity rows (w = 8).
    gen: Matrix,
    /// For w = 16 and 32: the field and the generator's elements.
    wide: Option<(Wide, Vec<u32>)>,
    engine: Engine,
    encode_plan: Plan,
    /// Decode plans by erasure pattern (bounded, see `with_plan_cache`).
    plans: PlanCache<Plan>,
}

impl Codec {
    pub fn new(profile: &Profile) -> Result<Codec, Error> {
        Codec::with_engine(profile, Engine::Auto)
    }

    pub fn with_engine(profile: &Profile, engine: Engine) -> Result<Codec, Error> {
        if engine == Engine::Isal {
            Isal::get().map_err(|e| Error::Invalid(format!("ISA-L is not available: {e}")))?;
        }
        let (k, m) = (profile.k, profile.m);
        if profile.w != 8 {
            let f = Wide::new(profile.w);
            let parity = match profile.technique {
                Technique::ReedSolVan => matrix::vandermonde_rows(&f, k, m),
                Technique::ReedSolR6Op => wide::r6_rows(&f, k),
                t => {
                    return Err(Error::Profile(format!(
                        "w={} is not supported for {}",
                        profile.w,
                        t.name()
                    )))
                }
            };
            let mut gen = vec![0u32; k * k];
            for i in 0..k {
                gen[i * k + i] = 1;
            }
            gen.extend_from_slice(&parity);
            let encode_plan = Plan::Wide(WidePlan::new(&f, m, k, &parity));
            return Ok(Codec {
                profile: profile.clone(),
                gen: Matrix::zero(0, k),
                wide: Some((f, gen)),
                engine,
                encode_plan,
                plans: PlanCache::new(DEFAULT_CAPACITY),
            });
        }
        let parity = match profile.technique {
            Technique::ReedSolVan => matrix::jerasure_rs_vandermonde(k, m),
            Technique::ReedSolR6Op => matrix::jerasure_rs_r6(k),
            Technique::CauchyOrig => matrix::jerasure_cauchy_orig(k, m),
            Technique::CauchyGood => matrix::jerasure_cauchy_good(k, m),
            // Ceph's isa plugin computes a single parity chunk as the XOR
            // of the data, whatever the technique.
            Technique::IsaReedSolVan | Technique::IsaCauchy if m == 1 => matrix::xor_row(k),
            Technique::IsaReedSolVan => matrix::isa_rs_vandermonde(k, m),
            Technique::IsaCauchy => matrix::isa_cauchy(k, m),
        };
        debug_assert!(profile.plugin == Plugin::Jerasure || !profile.technique.is_bitmatrix());
        let gen = matrix::generator(&parity);
        let encode_plan = plan(profile, engine, &parity);
        Ok(Codec {
            profile: profile.clone(),
            gen,
            wide: None,
            engine,
            encode_plan,
            plans: PlanCache::new(DEFAULT_CAPACITY),
        })
    }

    /// Keeps at most `plans` decode plans (one per erasure pattern, least
    /// recently used dropped first; 0 keeps none). The default is
    /// [`DEFAULT_CAPACITY`](crate::cache::DEFAULT_CAPACITY).
    pub fn with_plan_cache(mut self, plans: usize) -> Codec {
        self.plans = PlanCache::new(plans);
        self
    }

    /// Decode plans cached now.
    pub fn cached_plans(&self) -> usize {
        self.plans.len()
    }

    pub fn profile(&self) -> &Profile {
        &self.profile
    }

    /// The m x k parity rows (w = 8 only).
    ///
    /// # Panics
    /// For w = 16 and 32, whose elements do not fit a byte.
    pub fn parity_matrix(&self) -> Matrix {
        assert!(self.wide.is_none(), "parity_matrix: w = {}", self.profile.w);
        let k = self.profile.k;
        Matrix {
            rows: self.profile.m,
            cols: k,
            data: self.gen.data[k * k..].to_vec(),
        }
    }

    /// For each parity chunk, whether it is the XOR of the k data chunks
    /// (its row of the coding matrix is all ones, as the first parity row
    /// of the Reed-Solomon Vandermonde codes): a checksum that is linear
    /// over XOR (the `ec` device's stored block crc) can then be derived
    /// from the data chunks' checksums instead of computed. Only for
    /// w = 8 techniques that encode byte by byte (false for the others).
    pub fn xor_rows(&self) -> Vec<bool> {
        (0..self.profile.m).map(|j| self.is_xor_row(j)).collect()
    }

    /// Whether parity row `j` is the XOR of the data ([`Codec::xor_rows`]
    /// for one row, without a list: asked once per stripe written).
    pub fn is_xor_row(&self, j: usize) -> bool {
        let k = self.profile.k;
        if j >= self.profile.m || self.wide.is_some() || self.profile.technique.is_bitmatrix() {
            return false;
        }
        self.gen.data[(k + j) * k..(k + j + 1) * k]
            .iter()
            .all(|&x| x == 1)
    }

    /// The kernel encoding runs on.
    pub fn kernel(&self) -> &'static str {
        self.encode_plan.kernel()
    }

    fn check_len(&self, len: usize) -> Result<(), Error> {
        if let Some((f, _)) = &self.wide {
            if !len.is_multiple_of(f.bytes()) {
                return Err(Error::Invalid(format!(
                    "chunk length {len} is not a multiple of the word size ({} bytes)",
                    f.bytes()
                )));
            }
        }
        if self.profile.technique.is_bitmatrix() {
            let block = 8 * self.profile.packetsize;
            if !len.is_multiple_of(block) {
                return Err(Error::Invalid(format!(
                    "chunk length {len} is not a multiple of w*packetsize = {block}"
                )));
            }
        }
        Ok(())
    }

    /// Computes the m parity chunks of k data chunks (all the same length).
    pub fn encode(&self, data: &[&[u8]], parity: &mut [&mut [u8]]) -> Result<(), Error> {
        let (k, m) = (self.profile.k, self.profile.m);
        if data.len() != k || parity.len() != m {
            return Err(Error::Invalid(format!(
                "encode needs {k} data and {m} parity chunks, got {} and {}",
                data.len(),
                parity.len()
            )));
        }
        let len = data[0].len();
        if data.iter().any(|d| d.len() != len) || parity.iter().any(|p| p.len() != len) {
            return Err(Error::Invalid("chunks of different lengths".into()));
        }
        self.check_len(len)?;
        self.encode_plan.run(data, parity);
        Ok(())
    }

    /// `recovery_plan` through the codec's bounded cache: the same pattern
    /// again costs a lookup, not an inversion.
    pub fn decode_plan(&self, have: &[usize], want: &[usize]) -> Result<Arc<Plan>, Error> {
        self.plans
            .get_or_make(have, want, || self.recovery_plan(have, want))
    }

    /// Computes chunks `want` into `outs` from the k chunks `have` whose
    /// contents are `srcs` (in `have`'s order), all of one length, with
    /// a cached plan; allocates nothing once the pattern's plan is cached.
    pub fn reconstruct(
        &self,
        have: &[usize],
        srcs: &[&[u8]],
        want: &[usize],
        outs: &mut [&mut [u8]],
    ) -> Result<(), Error> {
        if srcs.len() != have.len() || outs.len() != want.len() {
            return Err(Error::Invalid(format!(
                "reconstruct: {} chunk ids for {} sources, {} for {} outputs",
                have.len(),
                srcs.len(),
                want.len(),
                outs.len()
            )));
        }
        let len = srcs.first().map_or(0, |s| s.len());
        if let Some(i) = (0..srcs.len()).find(|&i| srcs[i].len() != len) {
            return Err(Error::Shards(format!(
                "chunk {} is {} bytes, chunk {} is {len}",
                have[i],
                srcs[i].len(),
                have[0]
            )));
        }
        if let Some(i) = (0..outs.len()).find(|&i| outs[i].len() != len) {
            return Err(Error::Invalid(format!(
                "output for chunk {} is {} bytes, the chunks are {len}",
                want[i],
                outs[i].len()
            )));
        }
        self.check_len(len)?;
        let plan = self.decode_plan(have, want)?;
        plan.run(srcs, outs);
        Ok(())
    }

    /// A plan that computes chunks `want` from the k chunks `have` (chunk
    /// ids; the sources passed to `Plan::run` come in `have`'s order).
    pub fn recovery_plan(&self, have: &[usize], want: &[usize]) -> Result<Plan, Error> {
        let n = self.profile.chunk_count();
        let k = self.profile.k;
        if have.len() != k {
            return Err(Error::Shards(format!(
                "{} chunks at hand, decoding needs exactly {k}",
                have.len()
            )));
        }
        if let Some(bad) = have.iter().chain(want).find(|&&i| i >= n) {
            return Err(Error::Shards(format!(
                "chunk {bad} does not exist (k+m = {n})"
            )));
        }
        if let Some((f, gen)) = &self.wide {
            let rows = matrix::recovery(f, k, gen, have, want).ok_or_else(|| {
                Error::Shards(format!(
                    "chunks {have:?} are not independent: cannot decode"
                ))
            })?;
            return Ok(Plan::Wide(WidePlan::new(f, want.len(), k, &rows)));
        }
        let rows = matrix::recovery_rows(&self.gen, have, want).ok_or_else(|| {
            Error::Shards(format!(
                "chunks {have:?} are not independent: cannot decode"
            ))
        })?;
        Ok(plan(&self.profile, self.engine, &rows))
    }

    /// Rebuilds every missing chunk in place: `chunks` has k+m entries,
    /// `Some` for the chunks at hand (all the same length). Needs at least
    /// k of them.
    pub fn decode(&self, chunks: &mut [Option<Vec<u8>>]) -> Result<(), Error> {
        let (k, n) = (self.profile.k, self.profile.chunk_count());
        if chunks.len() != n {
            return Err(Error::Invalid(format!(
                "decode needs {n} chunk slots, got {}",
                chunks.len()
            )));
        }
        let have: Vec<usize> = (0..n).filter(|&i| chunks[i].is_some()).collect();
        let want: Vec<usize> = (0..n).filter(|&i| chunks[i].is_none()).collect();
        if have.len() < k {
            return Err(Error::Shards(format!(
                "only {} of {n} chunks at hand, at least k={k} are needed",
                have.len()
            )));
        }
        if want.is_empty() {
            return Ok(());
        }
        let len = chunks[have[0]].as_ref().map_or(0, |c| c.len());
        if let Some(&i) = have
            .iter()
            .find(|&&i| chunks[i].as_ref().unwrap().len() != len)
        {
            return Err(Error::Shards(format!(
                "chunk {i} is {} bytes, chunk {} is {len}",
                chunks[i].as_ref().unwrap().len(),
                have[0]
            )));
        }
        self.check_len(len)?;
        // Prefer data chunks as sources: fewer multiplications when the
        // erasures are parity only.
        let use_: Vec<usize> = have[..k].to_vec();
        let plan = self.decode_plan(&use_, &want)?;
        let mut outs: Vec<Vec<u8>> = want.iter().map(|_| vec![0u8; len]).collect();
        {
            let srcs: Vec<&[u8]> = use_
                .iter()
                .map(|&i| chunks[i].as_deref().unwrap())
                .collect();
            let mut o: Vec<&mut [u8]> = outs.iter_mut().map(|v| v.as_mut_slice()).collect();
            plan.run(&srcs, &mut o);
        }
        for (i, v) in want.into_iter().zip(outs) {
            chunks[i] = Some(v);
        }
        Ok(())
    }
}

fn plan(profile: &Profile, engine: Engine, rows: &Matrix) -> Plan {
    if profile.technique.is_bitmatrix() {
        return Plan::Bits(BitPlan::new(rows, profile.packetsize));
    }
    let isal = |lib: &'static Isal| {
        Plan::Isal(
            lib,
            lib.tables(rows.cols, rows.rows, &rows.data),
            rows.rows,
            rows.cols,
        )
    };
    match engine {
        Engine::Auto if avx2_available() => Plan::Native(NativePlan::new(rows, true)),
        Engine::Auto | Engine::Isal => match Isal::get() {
            Ok(lib) => isal(lib),
            Err(_) => Plan::Native(NativePlan::new(rows, true)),
        },
        Engine::Native => Plan::Native(NativePlan::new(rows, true)),
        Engine::Scalar => Plan::Native(NativePlan::new(rows, false)),
    }
}

// Codecs are shared between threads (a block device's workers): the plan
// cache must keep them Send and Sync. Checked when the crate compiles.
const _: fn() = || {
    fn shared<T: Send + Sync>() {}
    shared::<Codec>();
    shared::<Plan>();
};
