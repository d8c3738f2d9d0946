#!/usr/bin/env bash
# THE test command of iolift: installs the peer tools the suite needs (Debian
# packages, only when missing), builds everything in release mode and runs the
# whole test suite. CI runs it through .ci/run (with CI=true).
#
#   scripts/test.sh                      # everything
#   scripts/test.sh --test nbd_clients   # extra args go to `cargo test`
#   IOLIFT_NO_INSTALL=1 scripts/test.sh  # never call apt-get
#
# See docs/testing.md for how the suite is organised.
set -euo pipefail
cd "$(dirname "$0")/.."

# ---------------------------------------------------------------------------
# Debian packages the test suite needs. ONE LIST: add yours here, one per line.
# ---------------------------------------------------------------------------
PACKAGES=(
    libnbd-bin      # nbdinfo, nbdcopy, nbdsh
    python3-libnbd  # python3 `import nbd` (tests/python/*.py)
    qemu-utils      # qemu-img, qemu-io
    fio             # fio ioengine=nbd
    nbdkit          # sanity peer for the harness and bench/
    ceph-mon        # tests/rbd_*: local Ceph cluster (scripts/ceph-local.sh)
    ceph-osd
    ceph-mgr
    ceph-common     # ceph, rados, rbd CLIs
    librbd1         # loaded at run time by the rbd backend
    qemu-block-extra  # qemu-img/qemu-nbd rbd:pool/image driver
    e2fsprogs       # mkfs.ext4, e2fsck (tests/fuse_attach)
    fuse3           # fusermount3 for nbdfuse, the peer in bench/fuse.sh
    qemu-system-x86 # scripts/vm/guest.sh: the guest for the kernel's nbd and ublk clients (tests/guest_*)
    busybox-static  # scripts/vm/guest.sh: the guest's initramfs
    nbd-client      # tests/guest_nbd: the kernel nbd client's control tool, run in the guest
    zstd            # scripts/vm/guest.sh: unpacks Debian 13's kernel image
    cpio            # scripts/vm/guest.sh: packs the initramfs
    kmod            # scripts/vm/guest.sh: depmod/modprobe on the unpacked kernel's modules
    xz-utils        # scripts/vm/guest.sh: unpacks the kernel's .ko.xz modules for the initramfs
    libclang-dev    # feature iolift/ublk: libublk's bindings are generated with bindgen at build time
    g++             # iolift-offload: crates/iolift-offload/kernels/crush.cu built for the host (tests/host_kernel.rs)
    libisal2        # iolift-ec: ISA-L loaded at run time (ec_encode_data); the codec tests compare it with iolift's own kernels
    libjerasure2    # bench/ec.sh: jerasure, the second peer of `iolift ec bench`
    rsync           # tests/fs_workloads: rsync -c against the source through `iolift fs mount`
    sqlite3         # tests/fs_workloads: a database on the mount, PRAGMA integrity_check
    git             # tests/fs_workloads: clone, checkout, status on the mount
    bindfs          # bench/fs.sh: the FUSE passthrough file system iolift's mirror is measured against
    rocksdb-tools   # bench/kv.sh: RocksDB's db_bench, the peer of `iolift kv bench`
    stress-ng       # bench/nbd.sh BUSY=1 and tests/nbd_poll: a fixed competing CPU load
    libnfs13        # the fs nfs backend: libnfs loaded at run time (tests/fs_nfs)
    nfs-ganesha     # tests/fs_nfs, bench/fs-nfs.sh: the user-space NFSv4 server
    nfs-ganesha-vfs # its VFS backend, exporting a local directory
    rpcbind         # tests/fs_nfs, bench/fs-nfs.sh: ganesha registers its NFSv3 service there
)
# ---------------------------------------------------------------------------

log() { printf '[test.sh] %s\n' "$*" >&2; }

missing=()
for p in "${PACKAGES[@]}"; do
    if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
        missing+=("$p")
    fi
done
if ((${#missing[@]})); then
    if [[ "${IOLIFT_NO_INSTALL:-}" == 1 ]]; then
        log "missing packages: ${missing[*]} (IOLIFT_NO_INSTALL=1: not installing; tests needing them will fail)"
    else
        SUDO=()
        if [[ $(id -u) != 0 ]]; then
            command -v sudo >/dev/null || { log "missing ${missing[*]} and not root and no sudo"; exit 1; }
            SUDO=(sudo)
        fi
        log "installing: ${missing[*]}"
        export DEBIAN_FRONTEND=noninteractive
        "${SUDO[@]}" apt-get update -q
        "${SUDO[@]}" apt-get install -y -q --no-install-recommends "${missing[@]}"
    fi
fi

# --- iolift-offload: NVRTC without a GPU -----------------------------------
# pip's NVRTC wheel (no driver, no GPU needed) lets the suite compile
# crates/iolift-offload/kernels/*.cu to PTX (crates/iolift-offload/tests/nvrtc.rs).
if ! python3 -c 'import nvidia.cuda_nvrtc' 2>/dev/null; then
    if [[ "${IOLIFT_NO_INSTALL:-}" == 1 ]]; then
        log "NVRTC wheel missing (IOLIFT_NO_INSTALL=1: not installing; the NVRTC test will fail)"
    else
        log "installing: pip nvidia-cuda-nvrtc-cu12"
        python3 -m pip install -q nvidia-cuda-nvrtc-cu12 || log "pip install nvidia-cuda-nvrtc-cu12 failed"
    fi
fi
# --- end iolift-offload ---------------------------------------------------

command -v cargo >/dev/null || { log "cargo not found: install Rust (https://rustup.rs), then rerun"; exit 1; }

log "cargo $(cargo --version | cut -d' ' -f2), $(nproc) cores, CI=${CI:-}"
start=$(date +%s)
# iolift/ublk: `serve --ublk` (docs/ublk.md), tested in a guest (tests/guest_ublk.rs)
cargo build --release --workspace --features iolift/ublk
# The test Ceph cluster the binaries share (crates/iolift-testkit/src/ceph.rs)
# would stop itself two minutes after its last user, and fs_kv runs many
# binaries before rbd_*: keep it for up to 30 idle minutes so that they
# share one start, and stop it when the suite ends, however it ends.
export IOLIFT_CEPH_SHARED_IDLE_S=${IOLIFT_CEPH_SHARED_IDLE_S:-1800}
shared_ceph=/var/tmp/iolift-ceph-shared
trap '[ -d "$shared_ceph" ] && bash scripts/ceph-local.sh stop "$shared_ceph" >/dev/null 2>&1 || true' EXIT
cargo test --release --workspace --features iolift/ublk --no-fail-fast "$@"
log "suite passed in $(( $(date +%s) - start )) s"
