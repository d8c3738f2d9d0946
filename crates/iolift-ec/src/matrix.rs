//! Coding matrices over GF(2^8): the ones Ceph's jerasure and isa plugins
//! generate (so that parity is byte-identical with theirs), inversion for
//! decoding, and the bit-matrix expansion jerasure's Cauchy techniques use.
//!
//! A coding matrix here is the m x k block of parity rows, row-major
//! (`rows[i * k + j]` is the coefficient of data chunk j in parity i); the
//! identity rows of the systematic code are implicit.

use crate::gf;

/// A dense row-major matrix over GF(2^8).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Matrix {
    pub rows: usize,
    pub cols: usize,
    pub data: Vec<u8>,
}

impl Matrix {
    pub fn zero(rows: usize, cols: usize) -> Matrix {
        Matrix {
            rows,
            cols,
            data: vec![0; rows * cols],
        }
    }

    pub fn identity(n: usize) -> Matrix {
        let mut m = Matrix::zero(n, n);
        for i in 0..n {
            m.data[i * n + i] = 1;
        }
        m
    }

    #[inline]
    pub fn get(&self, r: usize, c: usize) -> u8 {
        self.data[r * self.cols + c]
    }

    #[inline]
    pub fn set(&mut self, r: usize, c: usize, v: u8) {
        self.data[r * self.cols + c] = v;
    }

    pub fn row(&self, r: usize) -> &[u8] {
        &self.data[r * self.cols..(r + 1) * self.cols]
    }

    /// self x other.
    pub fn mul(&self, other: &Matrix) -> Matrix {
        assert_eq!(self.cols, other.rows);
        let mut out = Matrix::zero(self.rows, other.cols);
        for r in 0..self.rows {
            for c in 0..other.cols {
                let mut acc = 0u8;
                for i in 0..self.cols {
                    acc ^= gf::mul(self.get(r, i), other.get(i, c));
                }
                out.set(r, c, acc);
            }
        }
        out
    }

    /// The inverse of a square matrix by Gauss-Jordan elimination, or None
    /// when it is singular.
    pub fn invert(&self) -> Option<Matrix> {
        assert_eq!(self.rows, self.cols);
        let a: Vec<u32> = self.data.iter().map(|&e| e as u32).collect();
        let inv = invert_square(&Gf8, self.rows, &a)?;
        Some(Matrix {
            rows: self.rows,
            cols: self.cols,
            data: inv.into_iter().map(|e| e as u8).collect(),
        })
    }
}

/// jerasure `reed_sol_van`: the parity rows of the systematic code made
/// from an extended Vandermonde matrix of k+m rows. The (k+m) x k matrix
/// has rows [1,0,..,0], [1,i,i^2,..] for i = 1..k+m-2, and [0,..,0,1]; it is
/// brought to systematic form by column operations (which keep every k rows
/// independent), working down the diagonal: a row with a non-zero diagonal
/// element is swapped up if needed, its column scaled so the element is 1,
/// and the other columns cleared on that row. Then each column of the parity
/// part is scaled so the first parity row is all ones, and each later parity
/// row is scaled so its first element is 1. Needs k + m <= 256.
pub fn jerasure_rs_vandermonde(k: usize, m: usize) -> Matrix {
    assert!(k + m <= 256 && k >= 1);
    Matrix {
        rows: m,
        cols: k,
        data: vandermonde_rows(&Gf8, k, m)
            .into_iter()
            .map(|e| e as u8)
            .collect(),
    }
}

/// [`jerasure_rs_vandermonde`] in any field: the m x k parity rows,
/// row-major. Needs k + m <= the field's size.
pub fn vandermonde_rows<F: Field>(f: &F, k: usize, m: usize) -> Vec<u32> {
    let rows = k + m;
    let mut d = vec![0u32; rows * k];
    d[0] = 1;
    if rows > 1 {
        d[(rows - 1) * k + k - 1] = 1;
    }
    for i in 1..rows.saturating_sub(1) {
        let mut p = 1u32;
        for j in 0..k {
            d[i * k + j] = p;
            p = f.mul(p, i as u32);
        }
    }
    for i in 1..k {
        // A row at or below i with a non-zero element in column i.
        let r = (i..rows)
            .find(|&r| d[r * k + i] != 0)
            .expect("extended Vandermonde matrix has full rank");
        if r != i {
            for c in 0..k {
                d.swap(r * k + c, i * k + c);
            }
        }
        let e = d[i * k + i];
        if e != 1 {
            let s = f.inv(e);
            for row in 0..rows {
                d[row * k + i] = f.mul(s, d[row * k + i]);
            }
        }
        for j in 0..k {
            let g = d[i * k + j];
            if j != i && g != 0 {
                for row in 0..rows {
                    d[row * k + j] ^= f.mul(g, d[row * k + i]);
                }
            }
        }
    }
    // Row k (the first parity row) becomes all ones: scale the parity part
    // of each column.
    for j in 0..k {
        let e = d[k * k + j];
        if e != 1 {
            let s = f.inv(e);
            for row in k..rows {
                d[row * k + j] = f.mul(s, d[row * k + j]);
            }
        }
    }
    // Each later parity row starts with 1.
    for row in k + 1..rows {
        let e = d[row * k];
        if e != 1 {
            let s = f.inv(e);
            for j in 0..k {
                d[row * k + j] = f.mul(d[row * k + j], s);
            }
        }
    }
    d.split_off(k * k)
}

/// A Galois field GF(2^w) with elements as u32.
pub trait Field {
    fn mul(&self, a: u32, b: u32) -> u32;
    fn inv(&self, a: u32) -> u32;
}

/// GF(2^8) through the tables of [`gf`].
pub struct Gf8;

impl Field for Gf8 {
    fn mul(&self, a: u32, b: u32) -> u32 {
        gf::mul(a as u8, b as u8) as u32
    }
    fn inv(&self, a: u32) -> u32 {
        gf::inv(a as u8) as u32
    }
}

/// The inverse of the n x n matrix `a` (row-major) by Gauss-Jordan
/// elimination, or None when it is singular.
pub fn invert_square<F: Field>(f: &F, n: usize, a: &[u32]) -> Option<Vec<u32>> {
    assert_eq!(a.len(), n * n);
    let mut a = a.to_vec();
    let mut inv = vec![0u32; n * n];
    for i in 0..n {
        inv[i * n + i] = 1;
    }
    for col in 0..n {
        let pivot = (col..n).find(|&r| a[r * n + col] != 0)?;
        if pivot != col {
            for c in 0..n {
                a.swap(pivot * n + c, col * n + c);
                inv.swap(pivot * n + c, col * n + c);
            }
        }
        let p = f.inv(a[col * n + col]);
        for c in 0..n {
            a[col * n + c] = f.mul(a[col * n + c], p);
            inv[col * n + c] = f.mul(inv[col * n + c], p);
        }
        for r in 0..n {
            let g = a[r * n + col];
            if r != col && g != 0 {
                for c in 0..n {
                    a[r * n + c] ^= f.mul(g, a[col * n + c]);
                    inv[r * n + c] ^= f.mul(g, inv[col * n + c]);
                }
            }
        }
    }
    Some(inv)
}

/// Rows (row-major, `want.len()` x k) that rebuild chunks `want` from the
/// k chunks `have`, for a (k+m) x k generator `gen` in field `f`.
pub fn recovery<F: Field>(
    f: &F,
    k: usize,
    gen: &[u32],
    have: &[usize],
    want: &[usize],
) -> Option<Vec<u32>> {
    assert_eq!(have.len(), k);
    let sub: Vec<u32> = have
        .iter()
        .flat_map(|&id| gen[id * k..(id + 1) * k].iter().copied())
        .collect();
    let inv = invert_square(f, k, &sub)?;
    let mut out = vec![0u32; want.len() * k];
    for (r, &id) in want.iter().enumerate() {
        for c in 0..k {
            let mut acc = 0;
            for i in 0..k {
                acc ^= f.mul(gen[id * k + i], inv[i * k + c]);
            }
            out[r * k + c] = acc;
        }
    }
    Some(out)
}

/// jerasure `reed_sol_r6_op` (RAID-6, m = 2): P is the XOR of the data, Q is
/// the sum of 2^j * d_j.
pub fn jerasure_rs_r6(k: usize) -> Matrix {
    let mut m = Matrix::zero(2, k);
    let mut p = 1u8;
    for j in 0..k {
        m.set(0, j, 1);
        m.set(1, j, p);
        p = gf::mul(p, 2);
    }
    m
}

/// jerasure `cauchy_orig`: element (i, j) = 1 / (i XOR (m + j)).
pub fn jerasure_cauchy_orig(k: usize, m: usize) -> Matrix {
    assert!(k + m <= 256);
    let mut mat = Matrix::zero(m, k);
    for i in 0..m {
        for j in 0..k {
            mat.set(i, j, gf::inv((i ^ (m + j)) as u8));
        }
    }
    mat
}

/// The second row jerasure's `cauchy_good` uses for m = 2 (the first row is
/// all ones): field elements in the order jerasure lists them, best (fewest
/// ones in their bit matrix) first. These are interoperability constants:
/// parity is byte-identical with Ceph's only with exactly these values.
const CAUCHY_GOOD_M2: [u8; 255] = [
    1, 2, 142, 4, 71, 8, 70, 173, 3, 35, 143, 16, 17, 67, 134, 140, 172, 6, 34, 69, 201, 216, 5,
    33, 86, 12, 65, 138, 158, 159, 175, 10, 32, 43, 66, 108, 130, 193, 234, 9, 24, 25, 50, 68, 79,
    100, 132, 174, 200, 217, 20, 21, 42, 48, 87, 169, 41, 54, 64, 84, 96, 117, 154, 155, 165, 226,
    77, 82, 135, 136, 141, 168, 192, 218, 238, 7, 18, 19, 39, 40, 78, 113, 116, 128, 164, 180, 195,
    205, 220, 232, 14, 26, 27, 58, 109, 156, 157, 203, 235, 13, 28, 29, 38, 51, 56, 75, 85, 90,
    101, 110, 112, 139, 171, 11, 37, 49, 52, 76, 83, 102, 119, 131, 150, 151, 167, 182, 184, 188,
    197, 219, 224, 45, 55, 80, 94, 97, 133, 170, 194, 204, 221, 227, 236, 36, 47, 73, 92, 98, 104,
    118, 152, 153, 166, 202, 207, 239, 251, 22, 23, 44, 74, 91, 148, 149, 161, 181, 190, 233, 46,
    59, 88, 137, 146, 147, 163, 196, 208, 212, 222, 250, 57, 81, 95, 106, 111, 129, 160, 176, 199,
    243, 249, 15, 53, 72, 93, 103, 115, 125, 162, 183, 185, 189, 206, 225, 255, 186, 210, 230, 237,
    242, 248, 30, 31, 62, 89, 99, 105, 114, 121, 124, 178, 209, 213, 223, 228, 241, 254, 60, 191,
    198, 247, 120, 240, 107, 127, 144, 145, 177, 211, 214, 246, 245, 123, 126, 187, 231, 253, 63,
    179, 229, 244, 61, 122, 215, 252,
];

/// jerasure `cauchy_good`: for m = 2 a fixed row of cheap coefficients;
/// otherwise `cauchy_orig` improved: every column scaled so row 0 is all
/// ones, then each later row divided by whichever of its elements leaves
/// the fewest ones in its bit matrix (if any beats the row as it is; ties
/// keep the earlier element).
pub fn jerasure_cauchy_good(k: usize, m: usize) -> Matrix {
    if m == 2 && k <= CAUCHY_GOOD_M2.len() {
        let mut mat = Matrix::zero(2, k);
        for (j, &c) in CAUCHY_GOOD_M2[..k].iter().enumerate() {
            mat.set(0, j, 1);
            mat.set(1, j, c);
        }
        return mat;
    }
    let mut mat = jerasure_cauchy_orig(k, m);
    for j in 0..k {
        let e = mat.get(0, j);
        if e != 1 {
            let s = gf::inv(e);
            for i in 0..m {
                mat.set(i, j, gf::mul(mat.get(i, j), s));
            }
        }
    }
    for i in 1..m {
        let ones = |s: u8, mat: &Matrix| -> u32 {
            (0..k).map(|j| gf::n_ones(gf::mul(mat.get(i, j), s))).sum()
        };
        let mut best = ones(1, &mat);
        let mut best_j = None;
        for j in 0..k {
            let e = mat.get(i, j);
            if e != 1 {
                let n = ones(gf::inv(e), &mat);
                if n < best {
                    best = n;
                    best_j = Some(j);
                }
            }
        }
        if let Some(j) = best_j {
            let s = gf::inv(mat.get(i, j));
            for c in 0..k {
                mat.set(i, c, gf::mul(mat.get(i, c), s));
            }
        }
    }
    mat
}

/// ISA-L `gf_gen_rs_matrix` (Ceph isa `reed_sol_van`): parity row r is
/// [1, g, g^2, ...] with g = 2^r. Not MDS for every k, m: Ceph limits it
/// (m <= 4, and k <= 21 when m = 4).
pub fn isa_rs_vandermonde(k: usize, m: usize) -> Matrix {
    let mut mat = Matrix::zero(m, k);
    let mut g = 1u8;
    for i in 0..m {
        let mut p = 1u8;
        for j in 0..k {
            mat.set(i, j, p);
            p = gf::mul(p, g);
        }
        g = gf::mul(g, 2);
    }
    mat
}

/// ISA-L `gf_gen_cauchy1_matrix` (Ceph isa `cauchy`): element (i, j) of
/// the parity part = 1 / ((k + i) XOR j).
pub fn isa_cauchy(k: usize, m: usize) -> Matrix {
    assert!(k + m <= 256);
    let mut mat = Matrix::zero(m, k);
    for i in 0..m {
        for j in 0..k {
            mat.set(i, j, gf::inv(((k + i) ^ j) as u8));
        }
    }
    mat
}

/// All-ones single parity row (plain XOR).
pub fn xor_row(k: usize) -> Matrix {
    Matrix {
        rows: 1,
        cols: k,
        data: vec![1; k],
    }
}

/// The full (k+m) x k generator: identity on top of the parity rows.
pub fn generator(parity: &Matrix) -> Matrix {
    let k = parity.cols;
    let mut g = Matrix::identity(k);
    g.rows += parity.rows;
    g.data.extend_from_slice(&parity.data);
    g
}

/// Rows that rebuild chunks `want` from the k chunks `have` (ids into the
/// generator `gen`, `have.len()` == k): one row per wanted chunk, each a
/// combination of the `have` chunks in the order given. None when the
/// chosen rows are not independent (cannot happen for an MDS code).
pub fn recovery_rows(gen: &Matrix, have: &[usize], want: &[usize]) -> Option<Matrix> {
    let g: Vec<u32> = gen.data.iter().map(|&e| e as u32).collect();
    let rows = recovery(&Gf8, gen.cols, &g, have, want)?;
    Some(Matrix {
        rows: want.len(),
        cols: gen.cols,
        data: rows.into_iter().map(|e| e as u8).collect(),
    })
}

/// The bit matrix of a GF(2^8) matrix: each element e becomes the 8x8 block
/// whose column x holds the bits of e * 2^x (bit l in row l). Row
/// `i * 8 + l`, column `j * 8 + x`. Multiplying packets instead of bits, this
/// is how jerasure's Cauchy techniques encode.
pub fn to_bitmatrix(mat: &Matrix) -> Vec<Vec<bool>> {
    let mut bits = vec![vec![false; mat.cols * 8]; mat.rows * 8];
    for i in 0..mat.rows {
        for j in 0..mat.cols {
            let mut e = mat.get(i, j);
            for x in 0..8 {
                for (l, row) in bits[i * 8..i * 8 + 8].iter_mut().enumerate() {
                    row[j * 8 + x] = e & (1 << l) != 0;
                }
                e = gf::mul(e, 2);
            }
        }
    }
    bits
}

#[cfg(test)]
mod tests {
    use super::*;

    fn is_mds(parity: &Matrix) -> bool {
        let k = parity.cols;
        let gen = generator(parity);
        let n = gen.rows;
        // Every choice of k rows out of n must be invertible.
        let mut idx: Vec<usize> = (0..k).collect();
        loop {
            let mut sub = Matrix::zero(k, k);
            for (r, &id) in idx.iter().enumerate() {
                sub.data[r * k..(r + 1) * k].copy_from_slice(gen.row(id));
            }
            if sub.invert().is_none() {
                return false;
            }
            // next combination
            let mut i = k;
            loop {
                if i == 0 {
                    return true;
                }
                i -= 1;
                if idx[i] < n - k + i {
                    idx[i] += 1;
                    for j in i + 1..k {
                        idx[j] = idx[j - 1] + 1;
                    }
                    break;
                }
            }
        }
    }

    #[test]
    fn invert_roundtrip() {
        let m = jerasure_cauchy_orig(5, 5);
        let sq = Matrix {
            rows: 5,
            cols: 5,
            data: m.data.clone(),
        };
        let inv = sq.invert().unwrap();
        assert_eq!(sq.mul(&inv), Matrix::identity(5));
        let singular = Matrix {
            rows: 2,
            cols: 2,
            data: vec![3, 3, 3, 3],
        };
        assert!(singular.invert().is_none());
    }

    #[test]
    fn jerasure_vandermonde_shape() {
        for (k, m) in [(2, 1), (3, 2), (6, 4), (8, 4), (12, 4), (10, 6)] {
            let p = jerasure_rs_vandermonde(k, m);
            assert!(p.row(0).iter().all(|&e| e == 1), "k={k} m={m}");
            for i in 1..m {
                assert_eq!(p.get(i, 0), 1);
            }
            assert!(is_mds(&p), "k={k} m={m}");
        }
    }

    #[test]
    fn cauchy_codes_are_mds() {
        for (k, m) in [(3, 2), (6, 3), (8, 4), (12, 4)] {
            assert!(is_mds(&jerasure_cauchy_orig(k, m)));
            assert!(is_mds(&jerasure_cauchy_good(k, m)));
            assert!(is_mds(&isa_cauchy(k, m)));
        }
        assert!(is_mds(&jerasure_rs_r6(12)));
        assert!(is_mds(&isa_rs_vandermonde(12, 4)));
    }

    #[test]
    fn bitmatrix_multiplies() {
        let m = Matrix {
            rows: 1,
            cols: 1,
            data: vec![0x53],
        };
        let b = to_bitmatrix(&m);
        for v in 0..=255u8 {
            let mut out = 0u8;
            for (l, row) in b.iter().enumerate() {
                let mut bit = false;
                for (x, &on) in row.iter().enumerate() {
                    bit ^= on && v & (1 << x) != 0;
                }
                out |= (bit as u8) << l;
            }
            assert_eq!(out, gf::mul(0x53, v));
        }
    }
}
