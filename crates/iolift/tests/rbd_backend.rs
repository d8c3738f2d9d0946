//! The rbd backend against a real local Ceph cluster (scripts/ceph-local.sh),
//! through the BlockDev API, checked against `rbd export`; and its error
//! lines for a missing pool, image, cluster or librbd.
//!
//! Each #[test] works in a pool and image of its own on the suite's shared
//! cluster (iolift_testkit::ceph: a cluster takes tens of seconds to start
//! and a few hundred MiB of RAM), its checks in sequence.

mod rbd_util;

use bytes::Bytes;
use iolift::block::{BlockDevExt, DevRef, Errno, Flags, Reply, Request};
use iolift_testkit::random_bytes;
use rbd_util::{run_limited, Cluster};
use std::process::Command;
use std::time::{Duration, Instant};

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

async fn put(dev: &DevRef, model: &mut [u8], off: u64, data: Vec<u8>, fua: bool) {
    let n = data.len();
    model[off as usize..off as usize + n].copy_from_slice(&data);
    let flags = if fua { Flags::FUA } else { Flags::NONE };
    let r = dev.write(off, Bytes::from(data), flags).await;
    assert_eq!(r, Ok(Reply::Done(n as u64)), "write {off}+{n}");
}

async fn check(dev: &DevRef, model: &[u8], off: u64, len: u32) {
    let got = dev.read(off, len).await.expect("read");
    assert!(
        got[..] == model[off as usize..off as usize + len as usize],
        "read {off}+{len} differs from what was written"
    );
}

#[test]
fn rbd_backend_io_and_export() {
    let cl = Cluster::shared("rbd", 3, Some("64M"));
    let size = cl.image_size;
    let rt = rt();
    let dev = iolift::backend::open(&cl.spec()).expect("open rbd backend");
    let info = dev.info();
    assert_eq!(info.size, size, "image size");
    assert!(info.can_flush && info.can_fua && info.can_trim && info.can_zero);
    let img = format!("{}/{}", cl.pool, cl.image);
    assert!(dev.name().contains(&img), "{}", dev.name());

    let mut model = vec![0u8; size as usize];
    rt.block_on(async {
        // A fresh image reads as zeroes and is one hole.
        check(&dev, &model, 0, 1 << 20).await;
        let bs = dev
            .submit(Request::BlockStatus {
                offset: 0,
                len: 8 << 20,
            })
            .await;
        match bs {
            Ok(Reply::Extents(e)) => {
                assert_eq!(e.iter().map(|x| x.len).sum::<u64>(), 8 << 20);
                assert!(e.iter().all(|x| x.hole && x.zero), "fresh image: {e:?}");
            }
            other => panic!("block status: {other:?}"),
        }
        // Aligned, unaligned, object-crossing (4 MiB objects) and FUA writes.
        put(&dev, &mut model, 0, random_bytes(4096, 1), false).await;
        put(&dev, &mut model, 12345, random_bytes(70001, 2), false).await;
        put(
            &dev,
            &mut model,
            (4 << 20) - 5000,
            random_bytes(10000, 3),
            true,
        )
        .await;
        put(
            &dev,
            &mut model,
            size - 131072,
            random_bytes(131072, 4),
            false,
        )
        .await;
        assert_eq!(dev.flush().await, Ok(Reply::Done(0)));
        for (o, l) in [
            (0, 4096),
            (12000, 80000),
            ((4 << 20) - 6000, 12000),
            (size - 200000, 200000),
        ] {
            check(&dev, &model, o, l).await;
        }
        // Written ranges are data in block status.
        match dev
            .submit(Request::BlockStatus {
                offset: 0,
                len: 4096,
            })
            .await
        {
            Ok(Reply::Extents(e)) => assert!(!e[0].hole, "written block reported as hole: {e:?}"),
            other => panic!("block status: {other:?}"),
        }
        // Write-zeroes (punching and thick) and trim of written data.
        let wz = |offset, len, no_hole| {
            dev.submit(Request::WriteZeroes {
                offset,
                len,
                flags: Flags {
                    fua: false,
                    no_hole,
                    fast_zero: false,
                },
            })
        };
        assert_eq!(wz(20000, 30000, false).await, Ok(Reply::Done(0)));
        model[20000..50000].fill(0);
        assert_eq!(wz((4 << 20) - 1000, 2000, true).await, Ok(Reply::Done(0)));
        model[(4 << 20) - 1000..(4 << 20) + 1000].fill(0);
        check(&dev, &model, 0, 100000).await;
        check(&dev, &model, (4 << 20) - 6000, 12000).await;
        // Trim of a whole object: reads back zeroes (librbd removes it).
        put(&dev, &mut model, 8 << 20, random_bytes(4 << 20, 5), false).await;
        let t = dev.submit(Request::Trim {
            offset: 8 << 20,
            len: 4 << 20,
            flags: Flags::NONE,
        });
        assert_eq!(t.await, Ok(Reply::Done(0)));
        model[8 << 20..12 << 20].fill(0);
        check(&dev, &model, 8 << 20, 4 << 20).await;

        // Many requests in flight at once, out of order: 512 x 4k random writes.
        let mut futs = Vec::new();
        for i in 0..512u64 {
            let off = (i * 7919 % 4096) * 4096 + (16 << 20);
            let data = random_bytes(4096, 100 + i);
            model[off as usize..off as usize + 4096].copy_from_slice(&data);
            futs.push(dev.write(off, Bytes::from(data), Flags::NONE));
        }
        for f in futs {
            assert_eq!(f.await, Ok(Reply::Done(4096)));
        }
        let mut reads = Vec::new();
        for i in 0..64u64 {
            reads.push((i << 18, dev.read(i << 18, 1 << 18)));
        }
        for (off, f) in reads {
            let got = f.await.expect("read");
            assert!(
                got[..] == model[off as usize..(off as usize) + (1 << 18)],
                "read at {off}"
            );
        }
        // Ranges past the end are refused, not sent to librbd.
        assert_eq!(dev.read(size - 4096, 8192).await, Err(Errno::EINVAL));
        assert_eq!(
            dev.write(size, Bytes::from_static(b"x"), Flags::NONE).await,
            Err(Errno::ENOSPC)
        );
        assert_eq!(dev.close().await, Ok(Reply::Done(0)));
    });
    drop(dev);

    // What librbd's own tool reads is what we wrote.
    let out = tempfile::tempdir().unwrap();
    let p = out.path().join("export.raw");
    cl.export(&p);
    let exported = std::fs::read(&p).unwrap();
    assert_eq!(exported.len(), model.len(), "export size");
    assert!(
        exported == model,
        "rbd export differs from the data written through iolift"
    );

    // A read-only open refuses writes.
    let ro = iolift::backend::open(&format!("{},ro", cl.spec())).expect("open ro");
    rt.block_on(async {
        assert_eq!(
            ro.write(0, Bytes::from_static(b"x"), Flags::NONE).await,
            Err(Errno::EPERM)
        );
        check(&ro, &model, 0, 65536).await;
    });
}

/// Runs `iolift serve SPEC` and expects it to fail quickly with one clear
/// error line containing `want`.
fn serve_fails(spec: &str, env: &[(&str, &str)], want: &str, within: Duration) {
    let mut c = Command::new(env!("CARGO_BIN_EXE_iolift"));
    c.args(["serve", spec]);
    c.env("IOLIFT_LOG", "warn");
    for (k, v) in env {
        c.env(k, v);
    }
    let t0 = Instant::now();
    let (ok, out) = run_limited(&mut c, within + Duration::from_secs(20));
    let took = t0.elapsed();
    assert!(!ok, "iolift serve {spec} should fail:\n{out}");
    assert!(
        took <= within,
        "iolift serve {spec} took {took:?} to fail (limit {within:?}):\n{out}"
    );
    let lines: Vec<&str> = out.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(
        lines.len(),
        1,
        "expected one error line for {spec}, got:\n{out}"
    );
    assert!(
        lines[0].contains(want),
        "error for {spec} should mention {want:?}: {out}"
    );
}

#[test]
fn rbd_backend_errors() {
    // No cluster needed: a conf naming a monitor port nobody listens on.
    let d = tempfile::tempdir().unwrap();
    let conf = d.path().join("ceph.conf");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    std::fs::write(
        &conf,
        format!("[global]\nmon host = 127.0.0.1:{port}\nauth client required = none\n"),
    )
    .unwrap();
    let c = conf.display();
    serve_fails(
        &format!("rbd:rbd/img,conf={c},timeout=3"),
        &[],
        "cannot connect to Ceph cluster",
        Duration::from_secs(12),
    );
    // The default timeout is bounded too.
    serve_fails(
        &format!("rbd:rbd/img,conf={c}"),
        &[],
        "within 10s",
        Duration::from_secs(25),
    );
    // CEPH_CONF is honoured.
    serve_fails(
        "rbd:rbd/img,timeout=2",
        &[("CEPH_CONF", &c.to_string())],
        "cannot connect",
        Duration::from_secs(12),
    );
    serve_fails(
        "rbd:rbd/img,conf=/nonexistent/ceph.conf",
        &[],
        "cannot read Ceph config /nonexistent/ceph.conf",
        Duration::from_secs(5),
    );
    serve_fails(
        "rbd:rbd/img",
        &[("IOLIFT_LIBRBD", "/nonexistent/librbd.so.1")],
        "cannot load /nonexistent/librbd.so.1",
        Duration::from_secs(5),
    );
    serve_fails(
        "rbd:justapool",
        &[],
        "expected POOL/IMAGE",
        Duration::from_secs(5),
    );
    serve_fails(
        "rbd:p/i,keyring=/nonexistent/k",
        &[("CEPH_CONF", &c.to_string())],
        "keyring /nonexistent/k does not exist",
        Duration::from_secs(5),
    );

    // Against a live cluster with cephx: missing pool, missing image, wrong
    // key; id= and keyring= reach librados.
    let cl = Cluster::shared("rbd", 3, Some("16M"));
    let (conf, pool) = (cl.conf.display().to_string(), &cl.pool);
    serve_fails(
        &format!("rbd:nopool/img,conf={conf}"),
        &[],
        "pool \"nopool\" does not exist",
        Duration::from_secs(15),
    );
    serve_fails(
        &format!("rbd:{pool}/noimage,conf={conf}"),
        &[],
        &format!("image {pool}/noimage does not exist"),
        Duration::from_secs(15),
    );
    let wrong = d.path().join("wrong.keyring");
    let mut c = Command::new("ceph-authtool");
    c.arg("--create-keyring")
        .arg(&wrong)
        .args(["--gen-key", "-n", "client.admin"]);
    assert!(
        run_limited(&mut c, Duration::from_secs(20)).0,
        "ceph-authtool"
    );
    serve_fails(
        &format!(
            "rbd:{pool}/img,conf={conf},keyring={},timeout=5",
            wrong.display()
        ),
        &[],
        "authentication failed",
        Duration::from_secs(15),
    );
    serve_fails(
        &format!("rbd:{pool}/img,conf={conf},id=nobody,timeout=5"),
        &[],
        "cannot connect",
        Duration::from_secs(15),
    );
    let right = d.path().join("admin.keyring");
    std::fs::copy(cl.keyring(), &right).unwrap();
    let dev = iolift::backend::open(&format!(
        "rbd:{pool}/img,conf={conf},id=admin,keyring={}",
        right.display()
    ))
    .expect("open with id= and keyring=");
    assert_eq!(dev.info().size, 16 << 20);
}
