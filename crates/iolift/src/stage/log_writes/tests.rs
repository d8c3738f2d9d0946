//! Unit tests of the log-writes stage, its log format and its reader.

use super::*;
use crate::backend::memory::MemoryDev;
use crate::block::{BlockDevExt, Flags};
use std::path::Path;

fn block_on<F: std::future::Future>(f: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(f)
}

fn stage(path: &Path, early: bool) -> (LogWritesDev, DevRef) {
    let mem: DevRef = Arc::new(MemoryDev::new(1 << 20));
    let cfg = LogWritesConfig {
        path: path.to_path_buf(),
        sync: false,
        ack_flush_early: early,
    };
    (LogWritesDev::new(cfg, mem.clone()).unwrap(), mem)
}

#[test]
fn crc32c_check_value() {
    // The standard check value of CRC-32C.
    assert_eq!(crc32c(b"123456789"), 0xE306_9283);
    assert_eq!(crc32c(b""), 0);
}

#[test]
fn records_every_write_kind_in_order_with_data() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("w.log");
    let (dev, mem) = stage(&p, false);
    block_on(async {
        dev.write(4096, Bytes::from(vec![7u8; 8192]), Flags::NONE)
            .await
            .unwrap();
        dev.flush().await.unwrap();
        dev.write(0, Bytes::from_static(b"hello"), Flags::FUA)
            .await
            .unwrap();
        dev.submit(Request::Trim {
            offset: 65536,
            len: 4096,
            flags: Flags::NONE,
        })
        .await
        .unwrap();
        let nh = Flags {
            no_hole: true,
            ..Flags::NONE
        };
        dev.submit(Request::WriteZeroes {
            offset: 8192,
            len: 512,
            flags: nh,
        })
        .await
        .unwrap();
        // Reads are not recorded.
        dev.read(0, 5).await.unwrap();
    });
    // The data reached the device below too.
    let got = block_on(mem.read(0, 5)).unwrap();
    assert_eq!(&got[..], b"hello");
    let log = Log::open(&p, false).unwrap();
    assert_eq!(log.dev_size, 1 << 20);
    assert!(log.torn.is_none());
    let kinds: Vec<_> = log.records.iter().map(|r| r.head.kind).collect();
    assert_eq!(
        kinds,
        [
            RecKind::Write,
            RecKind::Flush,
            RecKind::Write,
            RecKind::Trim,
            RecKind::WriteZeroes
        ]
    );
    let r = &log.records;
    assert_eq!((r[0].head.offset, r[0].head.len), (4096, 8192));
    assert_eq!(r[1].head.covers, 1, "the flush covers the write before it");
    assert!(r[2].head.fua && !r[0].head.fua);
    assert!(r[4].head.no_hole);
    assert_eq!((r[3].head.offset, r[3].head.len), (65536, 4096));
    let f = File::open(&p).unwrap();
    let mut buf = Vec::new();
    log.payload(&f, &r[2], &mut buf).unwrap();
    assert_eq!(&buf, b"hello");
    log.payload(&f, &r[0], &mut buf).unwrap();
    assert_eq!(buf, vec![7u8; 8192]);
    for (i, rec) in r.iter().enumerate() {
        assert_eq!(rec.head.seq, i as u64);
    }
}

#[test]
fn a_flush_covers_only_writes_completed_before_it() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("w.log");
    let (dev, _mem) = stage(&p, false);
    block_on(async {
        dev.write(0, Bytes::from(vec![1u8; 512]), Flags::NONE)
            .await
            .unwrap();
        // Submitted, not yet driven: the write below completes after.
        let fl = dev.flush();
        dev.write(512, Bytes::from(vec![2u8; 512]), Flags::NONE)
            .await
            .unwrap();
        fl.await.unwrap();
    });
    let log = Log::open(&p, false).unwrap();
    let r = &log.records;
    assert_eq!(r.len(), 3);
    assert_eq!(r[2].head.kind, RecKind::Flush);
    assert_eq!(r[2].head.covers, 1, "the second write is after the flush");
}

#[test]
fn refuses_an_existing_log() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("w.log");
    std::fs::write(&p, b"x").unwrap();
    let mem: DevRef = Arc::new(MemoryDev::new(4096));
    let cfg = LogWritesConfig {
        path: p.clone(),
        sync: false,
        ack_flush_early: false,
    };
    let e = match LogWritesDev::new(cfg, mem) {
        Ok(_) => panic!("an existing log was accepted"),
        Err(e) => format!("{e:#}"),
    };
    assert!(e.contains("exists"), "{e}");
    assert_eq!(
        std::fs::read(&p).unwrap(),
        b"x",
        "the old file is untouched"
    );
}

#[test]
fn torn_tails_and_damage_name_the_offset() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("w.log");
    let (dev, _mem) = stage(&p, false);
    block_on(async {
        for i in 0..3u8 {
            dev.write(i as u64 * 4096, Bytes::from(vec![i; 4096]), Flags::NONE)
                .await
                .unwrap();
        }
    });
    let whole = std::fs::read(&p).unwrap();
    let log = Log::open(&p, false).unwrap();
    let last = log.records[2];
    assert_eq!(last.end, whole.len() as u64);
    // Cut inside the last payload, inside its header, and zeroes after it.
    let cases: [(Vec<u8>, &str); 3] = [
        (whole[..whole.len() - 100].to_vec(), "payload cut short"),
        (whole[..last.pos as usize + 20].to_vec(), "header cut short"),
        (
            [&whole[..last.pos as usize], &vec![0u8; 4096][..]].concat(),
            "unwritten",
        ),
    ];
    for (bytes, why) in cases {
        std::fs::write(&p, &bytes).unwrap();
        let e = format!("{:#}", Log::open(&p, false).unwrap_err());
        assert!(
            e.contains(&format!("torn tail at offset {}", last.pos)) && e.contains(why),
            "{e}"
        );
        let cut = Log::open(&p, true).unwrap();
        assert_eq!(cut.records.len(), 2);
        assert_eq!(cut.torn.as_ref().unwrap().offset, last.pos);
    }
    // A bad payload checksum in the last record is a torn tail...
    let mut bytes = whole.clone();
    *bytes.last_mut().unwrap() ^= 1;
    std::fs::write(&p, &bytes).unwrap();
    let e = format!("{:#}", Log::open(&p, false).unwrap_err());
    assert!(e.contains("checksum") && e.contains("torn"), "{e}");
    // ...but in the middle, damage with records after it.
    let mut bytes = whole.clone();
    bytes[log.records[1].data_pos as usize + 10] ^= 1;
    std::fs::write(&p, &bytes).unwrap();
    let e = format!("{:#}", Log::open(&p, true).unwrap_err());
    assert!(
        e.contains(&format!("at offset {}", log.records[1].pos))
            && e.contains("payload checksum mismatch")
            && !e.contains("torn"),
        "{e}"
    );
    let mut bytes = whole.clone();
    bytes[log.records[0].pos as usize + 17] ^= 1;
    std::fs::write(&p, &bytes).unwrap();
    let e = format!("{:#}", Log::open(&p, true).unwrap_err());
    assert!(
        e.contains(&format!(
            "at offset {}: bad record header",
            log.records[0].pos
        )),
        "{e}"
    );
    std::fs::write(&p, b"IOLIFTLX").unwrap();
    let e = format!("{:#}", Log::open(&p, true).unwrap_err());
    assert!(e.contains("shorter than"), "{e}");
}

#[test]
fn ack_flush_early_records_the_flush_one_flush_late() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("w.log");
    let (dev, _mem) = stage(&p, true);
    block_on(async {
        dev.write(0, Bytes::from(vec![1u8; 512]), Flags::NONE)
            .await
            .unwrap();
        dev.flush().await.unwrap();
    });
    // Acknowledged, yet nothing durable is recorded.
    let log = Log::open(&p, false).unwrap();
    assert_eq!(log.records.len(), 1);
    block_on(async {
        dev.write(512, Bytes::from(vec![2u8; 512]), Flags::NONE)
            .await
            .unwrap();
        dev.flush().await.unwrap();
    });
    let log = Log::open(&p, false).unwrap();
    let r = &log.records;
    assert_eq!(r.len(), 3);
    assert_eq!((r[2].head.kind, r[2].head.covers), (RecKind::Flush, 1));
    block_on(dev.close()).unwrap();
    let log = Log::open(&p, false).unwrap();
    let covers: Vec<u64> = log
        .records
        .iter()
        .filter(|r| r.head.kind == RecKind::Flush)
        .map(|r| r.head.covers)
        .collect();
    assert_eq!(covers, [1, 2, 4], "close passes the deferred flush down");
}

#[test]
fn options_are_checked() {
    for (spec, want) in [
        ("log-writes", "path is required"),
        ("log-writes:path=/x,fault=maybe", "fault"),
        ("log-writes:/tmp/x", "unknown option"),
    ] {
        let e = format!("{:#}", super::super::check_spec(spec).unwrap_err());
        assert!(e.contains(want), "{spec}: {e}");
    }
    super::super::check_spec("log-writes:path=/tmp/x.log,sync,fault=none").unwrap();
}

/// Every cut and every single-byte change of a log, and every field of
/// each record header set to awkward values with its checksum made right
/// (so the checks behind the checksum are reached): reading it gives
/// records that lie inside the file and the device, in order, or an error
/// naming the log; never a panic.
#[test]
fn damaged_logs_are_read_or_refused_never_a_panic() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("w.log");
    let (dev, _mem) = stage(&p, false);
    block_on(async {
        dev.write(512, Bytes::from(vec![3u8; 700]), Flags::NONE)
            .await
            .unwrap();
        dev.flush().await.unwrap();
        dev.submit(Request::Trim {
            offset: 4096,
            len: 4096,
            flags: Flags::NONE,
        })
        .await
        .unwrap();
        dev.write(0, Bytes::from_static(b"tail"), Flags::FUA)
            .await
            .unwrap();
    });
    let whole = std::fs::read(&p).unwrap();
    let log = Log::open(&p, false).unwrap();
    let check = |bytes: &[u8], what: &str| {
        std::fs::write(&p, bytes).unwrap();
        match Log::read(&p) {
            Ok(l) => {
                let mut pos = FILE_HEADER as u64;
                for (i, r) in l.records.iter().enumerate() {
                    assert_eq!((r.pos, r.head.seq), (pos, i as u64), "{what}");
                    assert!(r.end <= bytes.len() as u64, "{what}");
                    if r.head.kind != RecKind::Flush {
                        assert!(r.head.offset + r.head.len <= l.dev_size, "{what}");
                    }
                    pos = r.end;
                }
            }
            Err(e) => {
                let e = format!("{e:#}");
                assert!(e.contains("log "), "{what}: {e}");
            }
        }
    };
    for n in 0..whole.len() {
        check(&whole[..n], &format!("cut at {n}"));
    }
    for i in 0..whole.len() {
        for v in [whole[i] ^ 1, !whole[i]] {
            let mut b = whole.clone();
            b[i] = v;
            check(&b, &format!("byte {i} = {v}"));
        }
    }
    let mut values: Vec<u64> = vec![0, 1, 4, 700, 4096, 1 << 20, (1 << 20) + 1];
    values.extend([u32::MAX as u64, i64::MAX as u64, u64::MAX - 1, u64::MAX]);
    for r in &log.records {
        let at = r.pos as usize;
        // seq, offset, len, covers (u64s), then kind and flags bytes.
        for field in [8usize, 16, 24, 32] {
            for &v in &values {
                let mut b = whole.clone();
                b[at + field..at + field + 8].copy_from_slice(&v.to_le_bytes());
                let c = crc32c(&b[at..at + 44]);
                b[at + 44..at + 48].copy_from_slice(&c.to_le_bytes());
                check(&b, &format!("record at {at}, field {field} = {v}"));
            }
        }
        for (field, vals) in [(4usize, [0u8, 2, 4, 5]), (5, [1, 3, 4, 0xff])] {
            for v in vals {
                let mut b = whole.clone();
                b[at + field] = v;
                let c = crc32c(&b[at..at + 44]);
                b[at + 44..at + 48].copy_from_slice(&c.to_le_bytes());
                check(&b, &format!("record at {at}, byte {field} = {v}"));
            }
        }
    }
}
