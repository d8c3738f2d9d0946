//! The streaming application: a generated FASTA-like file counted through
//! the io_uring engine (O_DIRECT, registered buffers, several depths and
//! chunk sizes, SQPOLL) and through read(2), each compared with a plain
//! line-by-line count of the file made here.

use iolift_direct::stream::{generate_fasta, stream_direct, stream_read, Counts};
use iolift_direct::Direct;
use std::io::BufRead;
use std::path::Path;

/// The reference: std's line reader, records = lines starting with '>'.
fn plain_count(path: &Path) -> Counts {
    let f = std::io::BufReader::new(std::fs::File::open(path).unwrap());
    let mut c = Counts::default();
    for l in f.split(b'\n') {
        let l = l.unwrap();
        c.lines += 1;
        c.records += (l.first() == Some(&b'>')) as u64;
        c.bytes += l.len() as u64 + 1;
    }
    c
}

#[test]
fn every_path_counts_what_the_file_holds() {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("genome.fa");
    let wrote = generate_fasta(&f, 24 << 20, 9).unwrap();
    assert_eq!(std::fs::metadata(&f).unwrap().len(), wrote.bytes);
    assert_ne!(wrote.bytes % 4096, 0, "a file that ends inside a block");
    let reference = plain_count(&f);
    assert_eq!(wrote, reference);
    assert!(reference.records > 1000, "{reference:?}");
    assert_eq!(stream_read(&f, 64 << 10).unwrap(), reference);
    for (chunk, depth, direct, sqpoll) in [
        (64 << 10, 4, Direct::Auto, false),
        (4096, 1, Direct::Auto, false),
        (1 << 20, 8, Direct::Off, false),
        (64 << 10, 16, Direct::Auto, true),
    ] {
        let got = stream_direct(&f, chunk, depth, direct, sqpoll).unwrap();
        assert_eq!(
            got, reference,
            "chunk {chunk} depth {depth} {direct:?} sqpoll {sqpoll}"
        );
    }
}

#[test]
fn bad_arguments_are_errors() {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("x.fa");
    generate_fasta(&f, 1000, 1).unwrap();
    let e = stream_direct(&f, 1000, 4, Direct::Auto, false).unwrap_err();
    assert!(e.to_string().contains("chunk size"), "{e}");
    let e = stream_direct(&f, 4096, 0, Direct::Auto, false).unwrap_err();
    assert!(e.to_string().contains("depth"), "{e}");
    let e = stream_read(&dir.path().join("none"), 4096).unwrap_err();
    assert!(e.to_string().contains("none"), "{e}");
    let e = stream_direct(&dir.path().join("none"), 4096, 1, Direct::Auto, false).unwrap_err();
    assert!(e.to_string().contains("none"), "{e}");
}
