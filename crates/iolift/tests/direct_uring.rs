//! The file backend's io_uring engine (`file:PATH,engine=uring`) through
//! NBD with real clients: fio verify (buffered and O_DIRECT, queue depths 1
//! and 32, several connections, unaligned writes that take the thread-pool
//! path), qemu-img convert and compare, and the file holding the same bytes
//! afterwards.

mod common;
use common::*;

const MIB: u64 = 1 << 20;

#[test]
fn fio_verify_uring_buffered_and_direct() {
    let _g = heavy();
    require_tool("fio");
    for (opts, name) in [
        ("", "buffered"),
        (",direct", "direct"),
        (",sqpoll", "sqpoll"),
        (",direct,rings=3", "direct, 3 rings"),
    ] {
        let mut b = ServerBuilder::iolift();
        let disk = b.dir().join("disk.img");
        let srv = b
            .backend(&format!(
                "file:{},size=64M,engine=uring{opts}",
                disk.display()
            ))
            .start();
        println!("{name}");
        fio_randwrite_verify_bs(&srv.uri(), "4k", 1, 1, "4M", "8M");
        fio_randwrite_verify_bs(&srv.uri(), "4k", 32, 4, "8M", "16M");
        // Not aligned to 4 KiB: with direct these take the thread-pool path
        // (read-modify-write), one at a time.
        fio_randwrite_verify_bs(&srv.uri(), "1536", 1, 1, "3M", "3M");
    }
}

#[test]
fn qemu_img_convert_compare_and_file_contents() {
    let _g = heavy();
    require_tool("qemu-img");
    for direct in ["", ",direct"] {
        let mut b = ServerBuilder::iolift();
        let disk = b.dir().join("disk.img");
        let mut srv = b
            .backend(&format!(
                "file:{},size=32M,engine=uring{direct}",
                disk.display()
            ))
            .start();
        let img = srv.dir().join("img.raw");
        write_random_file(&img, 32 * MIB as usize, 17);
        qemu_img_convert(&img, srv.uri());
        assert!(
            qemu_img_compare(&img, srv.uri()),
            "qemu-img compare{direct}: the export differs from what was converted onto it"
        );
        // One changed byte through the server must show.
        run_ok(cmd("qemu-io").args(["-f", "raw", &srv.uri(), "-c", "write -P 0x00 1048577 1"]));
        assert!(
            !qemu_img_compare(&img, srv.uri()),
            "compare{direct}: no difference seen"
        );
        srv.stop();
        let mut want = std::fs::read(&img).unwrap();
        want[1048577] = 0;
        let got = std::fs::read(&disk).unwrap();
        assert!(
            got == want,
            "file{direct}: backing file differs from what was written"
        );
    }
}
