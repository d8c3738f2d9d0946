//! Whole objects as Ceph's `ceph-erasure-code-tool` lays them out: the
//! object is zero-padded to a multiple of the stripe width (k x stripe
//! unit), each stripe is cut into k chunks of one stripe unit and encoded
//! alone, and shard i is chunk i of every stripe, concatenated.

use crate::codec::Codec;
use crate::Error;

/// Number of stripes an object of `len` bytes takes.
pub fn stripes(codec: &Codec, su: usize, len: usize) -> usize {
    len.div_ceil(codec.profile().k * su)
}

/// Encodes an object into its k+m shards (each `stripes * su` bytes).
pub fn encode_object(codec: &Codec, su: usize, input: &[u8]) -> Result<Vec<Vec<u8>>, Error> {
    let p = codec.profile();
    p.check_stripe_unit(su)?;
    let (k, m) = (p.k, p.m);
    let width = k * su;
    let n = stripes(codec, su, input.len());
    let mut shards: Vec<Vec<u8>> = vec![vec![0u8; n * su]; k + m];
    let mut last = vec![0u8; width];
    for s in 0..n {
        let start = s * width;
        let stripe: &[u8] = if start + width <= input.len() {
            &input[start..start + width]
        } else {
            last[..input.len() - start].copy_from_slice(&input[start..]);
            &last
        };
        let (data, parity) = shards.split_at_mut(k);
        for (j, d) in data.iter_mut().enumerate() {
            d[s * su..(s + 1) * su].copy_from_slice(&stripe[j * su..(j + 1) * su]);
        }
        let srcs: Vec<&[u8]> = (0..k).map(|j| &stripe[j * su..(j + 1) * su]).collect();
        let mut outs: Vec<&mut [u8]> = parity
            .iter_mut()
            .map(|p| &mut p[s * su..(s + 1) * su])
            .collect();
        codec.encode(&srcs, &mut outs)?;
    }
    Ok(shards)
}

/// Decodes an object from the shards at hand (`Some`, k+m slots): returns
/// the k data chunks of every stripe, concatenated (the padded object; its
/// original length is not recorded in the shards).
pub fn decode_object(
    codec: &Codec,
    su: usize,
    shards: &[Option<Vec<u8>>],
) -> Result<Vec<u8>, Error> {
    let p = codec.profile();
    p.check_stripe_unit(su)?;
    let (k, n) = (p.k, p.chunk_count());
    if shards.len() != n {
        return Err(Error::Invalid(format!(
            "{} shard slots for {n} chunks",
            shards.len()
        )));
    }
    let have: Vec<usize> = (0..n).filter(|&i| shards[i].is_some()).collect();
    if have.len() < k {
        return Err(Error::Shards(format!(
            "{} shards given ({have:?}), at least k={k} are needed",
            have.len()
        )));
    }
    let len = shards[have[0]].as_ref().unwrap().len();
    for &i in &have {
        let l = shards[i].as_ref().unwrap().len();
        if l != len {
            return Err(Error::Shards(format!(
                "shard {i} is {l} bytes but shard {} is {len}: shards differ in size",
                have[0]
            )));
        }
    }
    if !len.is_multiple_of(su) {
        return Err(Error::Shards(format!(
            "shards are {len} bytes, not a multiple of stripe_unit={su}"
        )));
    }
    let count = len / su;
    let missing: Vec<usize> = (0..k).filter(|&i| shards[i].is_none()).collect();
    // Sources: data shards at hand first, then parity, k in all.
    let use_: Vec<usize> = have[..k].to_vec();
    let plan = if missing.is_empty() {
        None
    } else {
        Some(codec.decode_plan(&use_, &missing)?)
    };
    let mut out = vec![0u8; count * k * su];
    let mut rebuilt = vec![vec![0u8; su]; missing.len()];
    for s in 0..count {
        let r = s * su..(s + 1) * su;
        if let Some(plan) = &plan {
            let srcs: Vec<&[u8]> = use_
                .iter()
                .map(|&i| &shards[i].as_ref().unwrap()[r.clone()])
                .collect();
            let mut o: Vec<&mut [u8]> = rebuilt.iter_mut().map(|v| v.as_mut_slice()).collect();
            plan.run(&srcs, &mut o);
        }
        let stripe = &mut out[s * k * su..(s + 1) * k * su];
        for j in 0..k {
            let dst = &mut stripe[j * su..(j + 1) * su];
            match &shards[j] {
                Some(sh) => dst.copy_from_slice(&sh[r.clone()]),
                None => {
                    let idx = missing.iter().position(|&x| x == j).unwrap();
                    dst.copy_from_slice(&rebuilt[idx]);
                }
            }
        }
    }
    Ok(out)
}
