//! Shared test support for the iolift workspace. A dev-dependency of
//! `iolift`, `iolift-crush` and `iolift-offload`; never part of a build
//! that ships.
//!
//! What it holds, one module each:
//! - [`rng`]: [`Rng`], the one seeded pseudo-random generator the tests use
//!   (deterministic for a seed; not for cryptography).
//! - [`crushmap`]: [`crushmap::text_map`], a generator of CRUSH text maps
//!   (`crushtool -c` input) from a [`crushmap::Spec`]: shape, bucket
//!   algorithms, tunables, weights, device classes, choose_args.
//! - [`process`]: find a peer tool or fail loudly ([`require_tool`]), run a
//!   command under a time limit and assert on its exit ([`run_ok`],
//!   [`run_fail`], [`run_timeout`]), run a peer tool by name and arguments
//!   ([`tool_output`], [`tool_ok`]), wait for a child ([`wait_child`]).
//! - [`data`]: deterministic random data ([`random_bytes`],
//!   [`write_random_file`]), [`sha256_file`], [`parse_size`].
//! - [`disk`]: root-only helpers for tests that use the kernel: mounts
//!   ([`Mount`], [`is_mounted`], [`umount_lazy`]), `mkfs.ext4`, `e2fsck`,
//!   `sync`, and the `qemu-img` calls several tests repeat.
//! - [`ceph`]: one local Ceph cluster shared by the test binaries of a
//!   suite run ([`ceph::shared_cluster`]), each test in a pool of its own.
//! - [`ceph_tools`]: maps made by `osdmaptool` and `crushtool`
//!   ([`ceph_tools::createsimple`], [`ceph_tools::crush_build_straw2`]) in a
//!   scratch [`ceph_tools::ToolDir`].
//! - [`fsmount`]: the scratch layout of FUSE mount tests
//!   ([`fsmount::mount_layout`]) and a plain HTTP GET ([`fsmount::http_get`]).
//! - [`guest`]: boot a throw-away QEMU guest and run one test script in it
//!   (for tests of the kernel's own clients).
//!
//! A missing tool fails the test with "missing X: run scripts/test.sh,
//! which installs it"; nothing here skips a test silently.

pub mod ceph;
pub mod ceph_tools;
pub mod crushmap;
pub mod data;
pub mod disk;
pub mod fsmount;
pub mod guest;
pub mod process;
pub mod rng;

pub use data::{parse_size, random_bytes, sha256_file, write_random_file};
pub use disk::{
    fsck_clean, is_mounted, mkfs_ext4, qemu_img_compare, qemu_img_convert, require_root, sync,
    umount_lazy, Loop, Mount,
};
pub use process::{
    cmd, find_tool, require_tool, run_capture, run_fail, run_ok, run_timeout, tool_ok, tool_output,
    wait_child, Out, CMD_TIMEOUT, TOOL_TIMEOUT,
};
pub use rng::Rng;
