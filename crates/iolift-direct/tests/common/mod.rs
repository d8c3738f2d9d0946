//! Helpers shared by the AccelFS write-back tests: an engine that runs
//! each request on the calling thread, and a fresh file system on it.
// Each test binary uses its own part of this module.
#![allow(dead_code)]

use iolift_direct::fs::{Fs, Mkfs};
use iolift_direct::{Config, Direct, Engine, Open, Target};
use std::path::Path;

/// Block size of the file systems made by [`fresh`].
pub const BS: usize = 4096;

/// An inline engine (no ring thread) on `img`, created with `create`
/// bytes when given.
pub fn inline_engine(img: &Path, create: Option<u64>) -> Engine {
    inline_engine_with(img, create, Direct::Auto)
}

/// [`inline_engine`] with the given O_DIRECT mode.
pub fn inline_engine_with(img: &Path, create: Option<u64>, direct: Direct) -> Engine {
    let t = Target::open(
        img,
        &Open {
            direct,
            create_size: create,
            ..Open::default()
        },
    )
    .unwrap();
    Engine::new(
        t,
        Config {
            inline: true,
            ..Config::default()
        },
    )
    .unwrap()
}

/// A new 32 MiB file system (blocks of [`BS`], 64 inodes) on `img`, mounted.
pub fn fresh(img: &Path) -> Fs {
    let eng = inline_engine(img, Some(32 << 20));
    iolift_direct::fs::mkfs(
        &eng,
        &Mkfs {
            block_size: BS as u32,
            inodes: 64,
        },
    )
    .unwrap();
    Fs::mount(eng).unwrap()
}
