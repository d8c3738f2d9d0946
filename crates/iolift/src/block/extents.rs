//! Building block-status replies: one list of extents, hole or data, with
//! neighbours of the same kind merged.
//!
//! Contract: an [`ExtentList`] is fed consecutive pieces of a range, in
//! order; each piece extends the last extent when both are holes or both
//! are data, else starts a new one, so no two neighbours in the result are
//! of the same kind. A hole reads as zeroes (`zero` is set with `hole`);
//! data is not known to be zero. Zero-length pieces are dropped. The
//! lengths add up to what was pushed. Backends that learn allocation as
//! pieces (pages, `SEEK_DATA`) push them; those that learn a set of
//! allocated ranges use [`from_allocated`].

use super::Extent;

/// Extents of one block-status reply, built piece by piece.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct ExtentList(Vec<Extent>);

impl ExtentList {
    pub fn new() -> Self {
        ExtentList(Vec::new())
    }

    /// Appends `len` bytes of hole (`hole`) or data.
    pub fn push(&mut self, len: u64, hole: bool) {
        if len == 0 {
            return;
        }
        match self.0.last_mut() {
            Some(e) if e.hole == hole => e.len += len,
            _ => self.0.push(Extent {
                len,
                hole,
                zero: hole,
            }),
        }
    }

    pub fn into_vec(self) -> Vec<Extent> {
        self.0
    }
}

/// Extents covering exactly `[offset, offset+len)` from the allocated
/// ranges in it, given as `(offset, length)` pairs sorted by offset; they
/// may overlap each other and extend outside the window. Allocated bytes
/// are data, the gaps are holes.
pub fn from_allocated(offset: u64, len: u64, ranges: &[(u64, u64)]) -> Vec<Extent> {
    let end = offset + len;
    let mut out = ExtentList::new();
    let mut pos = offset;
    for &(o, l) in ranges {
        let (s, e) = (o.max(pos), (o + l).min(end));
        if e <= s {
            continue;
        }
        out.push(s - pos, true);
        out.push(e - s, false);
        pos = e;
    }
    out.push(end - pos, true);
    out.into_vec()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kinds(v: &[Extent]) -> Vec<(u64, bool)> {
        for e in v {
            assert_eq!(e.zero, e.hole, "{e:?}: holes and only holes read as zero");
        }
        v.iter().map(|e| (e.len, e.hole)).collect()
    }

    #[test]
    fn pushes_merge_neighbours_of_one_kind() {
        let mut l = ExtentList::new();
        for (n, hole) in [
            (4, true),
            (4, true),
            (0, false),
            (8, false),
            (1, false),
            (2, true),
            (0, true),
            (3, false),
        ] {
            l.push(n, hole);
        }
        assert_eq!(
            kinds(&l.into_vec()),
            vec![(8, true), (9, false), (2, true), (3, false)]
        );
        assert!(ExtentList::new().into_vec().is_empty());
        let mut l = ExtentList::new();
        l.push(0, true);
        assert!(l.into_vec().is_empty(), "zero-length pieces are dropped");
    }

    #[test]
    fn allocated_ranges_to_extents() {
        assert_eq!(kinds(&from_allocated(0, 100, &[])), vec![(100, true)]);
        assert_eq!(
            kinds(&from_allocated(0, 100, &[(0, 100)])),
            vec![(100, false)]
        );
        // Clipped to the window; overlapping and touching ranges merge.
        let e = from_allocated(10, 100, &[(0, 20), (50, 10), (55, 10), (100, 50)]);
        assert_eq!(
            kinds(&e),
            vec![
                (10, false),
                (30, true),
                (15, false),
                (35, true),
                (10, false)
            ]
        );
        assert_eq!(e.iter().map(|x| x.len).sum::<u64>(), 100);
        let e = from_allocated(100, 50, &[(0, 10), (120, 5), (125, 5), (200, 8)]);
        assert_eq!(kinds(&e), vec![(20, true), (10, false), (20, true)]);
        // A range contained in an earlier one adds nothing.
        let e = from_allocated(0, 64, &[(8, 32), (16, 4), (40, 0)]);
        assert_eq!(kinds(&e), vec![(8, true), (32, false), (24, true)]);
    }
}
