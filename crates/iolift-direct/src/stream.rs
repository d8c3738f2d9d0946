//! The streaming application (HAYAGUI's genome case): a large FASTA-like
//! file read in chunks (64 KiB by default) and its records (`>` at the
//! start of a line) and lines counted.
//!
//! Two ways in, both counted on the CPU by [`Scanner`]:
//! - [`stream_direct`]: the io_uring engine, O_DIRECT where the file
//!   system allows it, into registered (fixed) buffers, `depth` reads in
//!   flight, each chunk scanned in place where the engine put it;
//! - [`stream_read`]: the host-mediated path, read(2) into pageable memory.
//!
//! The GPU path (the engine's registered buffers page-locked with
//! `PinHook`, a kernel scanning them in place) is not built: see
//! docs/direct.md. [`generate_fasta`] writes the input.

use crate::buf::Buf;
use crate::engine::{Config, Engine, Op};
use crate::target::{Direct, Open, Target};
use std::collections::VecDeque;
use std::io::{self, Read, Write};
use std::path::Path;

/// What a scan counted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts {
    pub bytes: u64,
    /// Lines that start with `>` (record headers).
    pub records: u64,
    /// Newline characters.
    pub lines: u64,
}

/// Counts records and lines across chunks given in file order.
#[derive(Debug, Clone)]
pub struct Scanner {
    counts: Counts,
    at_line_start: bool,
}

impl Default for Scanner {
    fn default() -> Self {
        Scanner {
            counts: Counts::default(),
            at_line_start: true,
        }
    }
}

impl Scanner {
    pub fn scan(&mut self, chunk: &[u8]) {
        let Some(&last) = chunk.last() else {
            return;
        };
        let c = &mut self.counts;
        c.bytes += chunk.len() as u64;
        if self.at_line_start && chunk[0] == b'>' {
            c.records += 1;
        }
        for (i, _) in chunk.iter().enumerate().filter(|(_, &b)| b == b'\n') {
            c.lines += 1;
            if chunk.get(i + 1) == Some(&b'>') {
                c.records += 1;
            }
        }
        self.at_line_start = last == b'\n';
    }

    pub fn counts(&self) -> Counts {
        self.counts
    }
}

fn check_chunk(chunk: usize) -> io::Result<()> {
    if chunk == 0 || !chunk.is_multiple_of(4096) || chunk > 64 << 20 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("chunk size {chunk}: a multiple of 4096, at most 64 MiB"),
        ));
    }
    Ok(())
}

/// The host-mediated path: read(2) of `chunk` bytes at a time into one
/// pageable buffer.
pub fn stream_read(path: &Path, chunk: usize) -> io::Result<Counts> {
    check_chunk(chunk)?;
    let mut f = std::fs::File::open(path)
        .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", path.display())))?;
    let mut buf = vec![0u8; chunk];
    let mut s = Scanner::default();
    loop {
        let n = f.read(&mut buf)?;
        if n == 0 {
            return Ok(s.counts());
        }
        s.scan(&buf[..n]);
    }
}

/// The direct path: the io_uring engine reads `chunk` bytes at a time into
/// `depth` registered buffers (memory: `depth` x `chunk`), keeping them all
/// in flight; chunks are scanned in file order as they complete.
pub fn stream_direct(
    path: &Path,
    chunk: usize,
    depth: usize,
    direct: Direct,
    sqpoll: bool,
) -> io::Result<Counts> {
    check_chunk(chunk)?;
    if depth == 0 || depth > 256 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("depth {depth}: 1 to 256"),
        ));
    }
    let t = Target::open(
        path,
        &Open {
            direct,
            write: false,
            ..Open::default()
        },
    )?;
    let size = t.size();
    let eng = Engine::new(
        t,
        Config {
            fixed_bufs: depth,
            fixed_buf_size: chunk,
            sqpoll: sqpoll.then_some(1000),
            ..Config::default()
        },
    )?;
    let mut next = 0u64;
    let mut inflight = VecDeque::new();
    let submit = |buf: Buf, next: &mut u64, q: &mut VecDeque<_>| {
        if *next < size {
            q.push_back(eng.run(Op::Read { offset: *next, buf }));
            *next += chunk as u64;
        }
    };
    for _ in 0..depth {
        submit(eng.alloc(chunk), &mut next, &mut inflight);
    }
    let mut s = Scanner::default();
    let mut done = 0u64;
    while let Some(p) = inflight.pop_front() {
        let d = p.wait();
        let n = d
            .result()
            .map_err(|e| io::Error::new(e.kind(), format!("read at {done}: {e}")))?;
        let buf = d.buf.expect("the engine gives the buffer back");
        s.scan(&buf[..n]);
        done += n as u64;
        if n < chunk && done < size {
            return Err(io::Error::other(format!(
                "short read at {}: {n} of {chunk} bytes",
                done - n as u64
            )));
        }
        submit(buf, &mut next, &mut inflight);
    }
    Ok(s.counts())
}

/// Writes a FASTA-like file of about `size` bytes (whole records): headers
/// `>seqN length=L`, then L bases (ACGT) in lines of 60. Returns what it
/// wrote, counted as it wrote it.
pub fn generate_fasta(path: &Path, size: u64, seed: u64) -> io::Result<Counts> {
    let f = std::fs::File::create(path)
        .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", path.display())))?;
    let mut w = io::BufWriter::with_capacity(1 << 20, f);
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut rnd = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let mut c = Counts::default();
    let mut line = Vec::with_capacity(61);
    while c.bytes < size {
        let len = 100 + rnd() % 20_000;
        let head = format!(">seq{} length={len}\n", c.records);
        w.write_all(head.as_bytes())?;
        c.bytes += head.len() as u64;
        c.records += 1;
        c.lines += 1;
        let mut left = len;
        while left > 0 {
            let k = left.min(60);
            line.clear();
            let mut r = rnd();
            for i in 0..k {
                if i % 32 == 0 {
                    r = rnd();
                }
                line.push(b"ACGT"[(r >> ((i % 32) * 2) & 3) as usize]);
            }
            line.push(b'\n');
            w.write_all(&line)?;
            c.bytes += line.len() as u64;
            c.lines += 1;
            left -= k;
        }
    }
    w.flush()?;
    Ok(c)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scanner_counts_across_chunk_edges() {
        let text = b">a\nACGT\n>b x\nAC\n\n>c\nA";
        for split in 0..text.len() {
            let mut s = Scanner::default();
            s.scan(&text[..split]);
            s.scan(&text[split..]);
            let c = s.counts();
            assert_eq!(
                (c.records, c.lines, c.bytes),
                (3, 6, text.len() as u64),
                "{split}"
            );
        }
        let mut s = Scanner::default();
        s.scan(b"x>y\n");
        assert_eq!(s.counts().records, 0, "'>' not at a line start");
    }
}
