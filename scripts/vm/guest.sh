#!/usr/bin/env bash
# guest.sh: boot a throw-away QEMU guest with a Debian kernel and run one
# command or script in it, so that the kernel's own clients (the nbd driver,
# ublk, ext4, fstrim) can be tested against iolift.
#
#   scripts/vm/guest.sh [options] -- COMMAND...   run COMMAND (bash -c) in the guest
#   scripts/vm/guest.sh [options] -f SCRIPT       run a bash script in the guest
#   scripts/vm/guest.sh --build                   only prepare the cached kernel + initramfs
#
# Options:
#   --suite NAME     Debian suite of the kernel: trixie (default: 6.12, has nbd
#                    and ublk_drv) or "host" (the host's own apt lists)
#   --timeout SEC    kill the guest after SEC seconds, boot included (default 600)
#   --mem SIZE       guest memory (default 1G)      --smp N   vCPUs (default 2)
#   --net            virtio-net on QEMU's user-mode network: the guest is
#                    10.0.2.15/24 with NO default route; 10.0.2.2 is the host's
#                    127.0.0.1. Nothing else is reachable.
#   --job DIR        the job folder (created if missing; default: a new temp dir).
#                    The guest sees it read-write at /run/job; the script's exit
#                    status lands in DIR/rc, its output in DIR/out.log
#   --env K=V        export K=V in the guest (repeatable)
#   --verbose        kernel messages on the console too
#
# Exit status: the guest command's; 124 = timed out; 125 = the guest reported
# no status (boot failure, crash, kernel panic). The console goes to stdout.
#
# How: the kernel package is downloaded (`apt-get download`) and unpacked,
# never installed, into the cache ($IOLIFT_VM_CACHE, default
# /var/tmp/iolift-vm-SUITE, outside the repository); its vmlinuz is unpacked to
# an ELF vmlinux that QEMU boots directly (PVH entry, no firmware). A busybox
# initramfs mounts the host's / over 9p read-only with a tmpfs overlay on top,
# so every host binary (iolift from target/, fio, nbd-client, mkfs.ext4) runs
# in the guest, and chroots into it. QEMU runs its emulator (TCG), never KVM:
# the /dev/kvm of these machines cannot run a stock kernel.
set -euo pipefail

SUITE=trixie TIMEOUT=600 MEM=1G SMP=2 NET=0 JOB="" VERBOSE=0 BUILD_ONLY=0 SCRIPT=""
ENVS=()
# Bump when the initramfs' init changes, so cached ones are rebuilt.
INIT_VERSION=2

die() { echo "[guest.sh] error: $*" >&2; exit 2; }
log() { echo "[guest.sh] $*" >&2; }

while (($#)); do
    case "$1" in
        --suite) SUITE=$2; shift 2 ;;
        --timeout) TIMEOUT=$2; shift 2 ;;
        --mem) MEM=$2; shift 2 ;;
        --smp) SMP=$2; shift 2 ;;
        --net) NET=1; shift ;;
        --job) JOB=$2; shift 2 ;;
        --env) [[ $2 == *=* ]] || die "--env wants K=V, got '$2'"; ENVS+=("$2"); shift 2 ;;
        --verbose) VERBOSE=1; shift ;;
        --build) BUILD_ONLY=1; shift ;;
        -f) SCRIPT=$2; shift 2 ;;
        -h | --help) sed -n '2,/^set -e/p' "$0" | sed -e '$d' -e 's/^# \{0,1\}//'; exit 0 ;;
        --) shift; break ;;
        -*) die "unknown option $1 (see --help)" ;;
        *) break ;;
    esac
done
[[ $SUITE =~ ^[a-z]+$ ]] || die "bad --suite '$SUITE'"
[[ $TIMEOUT =~ ^[0-9]+$ ]] || die "bad --timeout '$TIMEOUT'"
CACHE=${IOLIFT_VM_CACHE:-/var/tmp/iolift-vm-$SUITE}

# ----------------------------------------------------------------- packages
# Installed only when missing (IOLIFT_NO_INSTALL=1: never; fail instead).
ensure_packages() {
    local p missing=()
    for p in qemu-system-x86 busybox-static nbd-client zstd xz-utils cpio kmod; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
    done
    ((${#missing[@]})) || return 0
    [[ ${IOLIFT_NO_INSTALL:-} != 1 ]] || die "missing packages ${missing[*]} (IOLIFT_NO_INSTALL=1)"
    [[ $(id -u) == 0 ]] || die "missing packages ${missing[*]}: run scripts/test.sh as root, or install them"
    log "installing ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null ||
        { apt-get update -q >/dev/null && apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null; }
}

# ------------------------------------------------------------------- kernel
# apt options for the suite: the host's configuration, or a private source
# list and list folder under the cache (the system's apt state is untouched).
apt_opts() {
    APT=()
    [[ $SUITE == host ]] && return
    mkdir -p "$CACHE/apt/lists/partial"
    echo "deb http://deb.debian.org/debian $SUITE main" >"$CACHE/apt/sources.list"
    APT=(-o "Dir::Etc::sourcelist=$CACHE/apt/sources.list" -o Dir::Etc::sourceparts=-
        -o "Dir::State::lists=$CACHE/apt/lists" -o APT::Get::List-Cleanup=0)
}

# The versioned image package linux-image-amd64 points at.
kernel_package() {
    apt-cache "${APT[@]}" depends linux-image-amd64 2>/dev/null |
        awk '$1 == "Depends:" && $2 ~ /^linux-image-[0-9]/ { print $2; exit }' || true
}

fetch_kernel() {
    [[ -f $CACHE/kernel/ok ]] && return
    apt_opts
    local pkg
    pkg=$(kernel_package)
    if [[ -z $pkg ]]; then
        apt-get "${APT[@]}" update -q >/dev/null
        pkg=$(kernel_package)
    fi
    [[ -n $pkg ]] || die "no linux-image-amd64 in suite $SUITE"
    log "downloading $pkg (unpacked into $CACHE, not installed)"
    rm -rf "$CACHE/deb" "$CACHE/kernel"
    mkdir -p "$CACHE/deb" "$CACHE/kernel.new"
    # apt downloads as its sandbox user where it can write
    chown _apt "$CACHE/deb" 2>/dev/null || true
    (cd "$CACHE/deb" && apt-get "${APT[@]}" download -q "$pkg" >/dev/null)
    dpkg-deb -x "$CACHE"/deb/*.deb "$CACHE/kernel.new/root"
    local mods=$CACHE/kernel.new/root/lib/modules
    [[ -d $mods ]] || mods=$CACHE/kernel.new/root/usr/lib/modules
    local kver
    kver=$(ls "$mods")
    [[ $(wc -w <<<"$kver") == 1 ]] || die "expected one kernel in the package, found: $kver"
    mv "$mods/$kver" "$CACHE/kernel.new/modules"
    mkdir -p "$CACHE/kernel.new/depmod/lib/modules"
    ln -s ../../../modules "$CACHE/kernel.new/depmod/lib/modules/$kver"
    depmod -b "$CACHE/kernel.new/depmod" "$kver"
    echo "$kver" >"$CACHE/kernel.new/version"
    unpack_vmlinux "$CACHE/kernel.new/root/boot/vmlinuz-$kver" "$CACHE/kernel.new/vmlinux"
    rm -rf "$CACHE/kernel.new/root" "$CACHE/deb"
    touch "$CACHE/kernel.new/ok"
    mv "$CACHE/kernel.new" "$CACHE/kernel"
}

# vmlinuz = boot stub + compressed ELF kernel. QEMU boots the ELF directly
# through its PVH note, which skips the firmware and the decompressor.
unpack_vmlinux() {
    python3 - "$1" "$2" <<'PY'
import lzma, subprocess, sys
src, dst = sys.argv[1], sys.argv[2]
blob = open(src, "rb").read()
for magic, how in ((b"\x28\xb5\x2f\xfd", "zstd"), (b"\xfd7zXZ\x00", "xz")):
    at = blob.find(magic)
    while at >= 0:
        if how == "zstd":
            r = subprocess.run(["zstd", "-dcq"], input=blob[at:], capture_output=True)
            out = r.stdout
        else:
            try:
                out = lzma.LZMADecompressor().decompress(blob[at:])
            except lzma.LZMAError:
                out = b""
        if out[:4] == b"\x7fELF":
            open(dst, "wb").write(out)
            sys.exit(0)
        at = blob.find(magic, at + 1)
sys.exit("no zstd or xz compressed ELF kernel in " + src)
PY
}

# ---------------------------------------------------------------- initramfs
build_initramfs() {
    local kver out=$CACHE/initramfs.gz stamp=$CACHE/initramfs.version
    kver=$(cat "$CACHE/kernel/version")
    [[ -f $out && $(cat "$stamp" 2>/dev/null) == "$INIT_VERSION $kver" ]] && return
    log "building the initramfs for $kver"
    local d=$CACHE/initramfs.d
    rm -rf "$d"
    mkdir -p "$d"/{bin,dev,proc,sys,host,upper,root,mod}
    cp /bin/busybox "$d/bin/busybox"
    # Modules needed to reach the host's root, in dependency order.
    local m f
    : >"$d/mod/order"
    for m in virtio_pci 9pnet_virtio 9p overlay; do
        modprobe -d "$CACHE/kernel/depmod" -S "$kver" --show-depends "$m" | awk '$1 == "insmod" { print $2 }' |
            while read -r f; do
                f=${f/#*\/lib\/modules\/$kver/$CACHE\/kernel\/modules}
                local ko
                ko=$(basename "${f%.xz}")
                grep -qxF "$ko" "$d/mod/order" && continue
                # busybox insmod wants plain ELF: Debian 13 ships .ko.xz
                if [[ $f == *.xz ]]; then xz -dc "$f" >"$d/mod/$ko"; else cp "$f" "$d/mod/$ko"; fi
                echo "$ko" >>"$d/mod/order"
            done
    done
    cat >"$d/init" <<'INIT'
#!/bin/busybox sh
/bin/busybox --install -s /bin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
halt() { echo "[guest-init] $*"; poweroff -f; }
for m in $(cat /mod/order); do insmod "/mod/$m" || echo "[guest-init] insmod $m failed"; done
P9=trans=virtio,version=9p2000.L,msize=512000
mount -t 9p -o $P9,ro,cache=loose host /host || halt "cannot mount the host's root"
mount -t tmpfs -o mode=755 tmpfs /upper
mkdir -p /upper/data /upper/work
mount -t overlay -o lowerdir=/host,upperdir=/upper/data,workdir=/upper/work overlay /root ||
    halt "cannot mount the overlay"
for x in tmp run mnt root var/tmp; do mount -t tmpfs -o mode=755 tmpfs /root/$x; done
chmod 1777 /root/tmp /root/var/tmp
mount -t proc proc /root/proc
mount -t sysfs sysfs /root/sys
mount -t devtmpfs devtmpfs /root/dev
mkdir -p /root/dev/pts /root/dev/shm /root/run/job /root/lib/modules/$(uname -r)
mount -t devpts devpts /root/dev/pts
mount -t tmpfs -o mode=1777 tmpfs /root/dev/shm
mount -t 9p -o $P9,ro modules /root/lib/modules/$(uname -r) || echo "[guest-init] no modules share"
mount -t 9p -o $P9,cache=none job /root/run/job || halt "cannot mount the job folder"
chroot /root /bin/bash /run/job/stage2.sh </dev/null >/dev/console 2>&1
sync
poweroff -f
INIT
    chmod +x "$d/init"
    (cd "$d" && find . | cpio -o -H newc --quiet | gzip -1 >"$out.new")
    mv "$out.new" "$out"
    echo "$INIT_VERSION $kver" >"$stamp"
    rm -rf "$d"
}

ensure_packages
mkdir -p "$CACHE"
exec 8>"$CACHE/lock"
flock 8
fetch_kernel
build_initramfs
flock -u 8
if ((BUILD_ONLY)); then
    log "ready: kernel $(cat "$CACHE/kernel/version") in $CACHE"
    exit 0
fi

# --------------------------------------------------------------------- job
if [[ -z $JOB ]]; then JOB=$(mktemp -d /tmp/iolift-guest.XXXXXX); fi
mkdir -p "$JOB"
JOB=$(cd "$JOB" && pwd)
rm -f "$JOB/rc" "$JOB/out.log" "$JOB/clock" "$JOB/started"
if [[ -n $SCRIPT ]]; then
    cp "$SCRIPT" "$JOB/cmd.sh"
elif (($#)); then
    printf '%s\n' "$*" >"$JOB/cmd.sh"
else
    die "nothing to run: give -f SCRIPT or -- COMMAND"
fi

# Runs in the guest, chrooted into the overlaid host root.
{
    echo '#!/bin/bash'
    echo "NET=$NET"
    for kv in "${ENVS[@]}"; do printf 'export %q\n' "$kv"; done
    cat <<'STAGE2'
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LANG=C.UTF-8 TERM=dumb
export GUEST_JOB=/run/job
for l in fd:/proc/self/fd stdin:/proc/self/fd/0 stdout:/proc/self/fd/1 stderr:/proc/self/fd/2; do
    ln -sf "${l#*:}" "/dev/${l%%:*}"
done
hostname guest
modprobe -a virtio_net ext4 crc32c_intel 2>/dev/null
ip link set lo up
if [ "$NET" = 1 ]; then
    for i in $(seq 100); do [ -e /sys/class/net/eth0 ] && break; sleep 0.1; done
    # The slirp subnet only: no default route, so nothing but the host's
    # loopback (10.0.2.2) can be reached.
    ip addr add 10.0.2.15/24 dev eth0 && ip link set eth0 up
fi
echo "[guest] ready: kernel $(uname -r), up $(cut -d' ' -f1 /proc/uptime) s"
cd /root
: >/run/job/started
bash /run/job/cmd.sh 2>&1 | tee /run/job/out.log
rc=${PIPESTATUS[0]}
echo "[guest] exit status $rc, up $(cut -d' ' -f1 /proc/uptime) s"
date +%s >/run/job/clock
echo "$rc" >/run/job/rc
sync
STAGE2
} >"$JOB/stage2.sh"

APPEND="console=ttyS0 panic=-1 reboot=t mitigations=off clocksource=hpet"
# clocksource=hpet: under the emulator the TSC's calibration goes wrong on a
# loaded host and the guest clock can run many times too fast.
((VERBOSE)) && APPEND+=" loglevel=7" || APPEND+=" quiet loglevel=1"
Q=(qemu-system-x86_64 -accel tcg,thread=multi,tb-size=256 -cpu max -machine pc
    -m "$MEM" -smp "$SMP" -nodefaults -no-user-config -display none -serial stdio
    -monitor none -no-reboot
    -kernel "$CACHE/kernel/vmlinux" -initrd "$CACHE/initramfs.gz" -append "$APPEND"
    -virtfs local,path=/,mount_tag=host,security_model=none,readonly=on,multidevs=remap
    -virtfs "local,path=$CACHE/kernel/modules,mount_tag=modules,security_model=none,readonly=on"
    -virtfs "local,path=$JOB,mount_tag=job,security_model=none")
((NET)) && Q+=(-netdev user,id=n0 -device virtio-net-pci,netdev=n0)

log "job $JOB, kernel $(cat "$CACHE/kernel/version"), timeout ${TIMEOUT}s"
start=$(date +%s)
# A guest that dies before it starts the job (an emulator fault while the
# kernel boots: seen once as an int3 Oops while the kernel patched its own
# code under multi-threaded TCG) is booted once more; nothing of the job
# has run then. A guest that started the job is never booted again.
for attempt in 1 2; do
    set +e
    timeout -k 5 "$TIMEOUT" "${Q[@]}" </dev/null 2>"$JOB/qemu.err" | sed -u -e 's/\r$//' -e 's/\x1b[[0-9;?]*[A-Za-z]//g' -e 's/\x1bc//g'
    qrc=${PIPESTATUS[0]}
    set -e
    if [[ $qrc == 124 || $qrc == 137 || -f $JOB/started || -f $JOB/rc ]]; then
        break
    fi
    if ((attempt == 1)); then
        log "the guest stopped before it started the job (qemu status $qrc): booting it once more"
    fi
done
took=$(($(date +%s) - start))
grep -v '^$' "$JOB/qemu.err" >&2 || true
if [[ $qrc == 124 || $qrc == 137 ]]; then
    log "TIMEOUT: the guest ran past ${TIMEOUT}s (job $JOB)"
    exit 124
fi
[[ -f $JOB/rc ]] || { log "the guest reported no exit status (qemu status $qrc, ${took}s)"; exit 125; }
rc=$(cat "$JOB/rc")
if [[ -f $JOB/clock ]]; then
    drift=$(($(cat "$JOB/clock") - $(date +%s)))
    ((drift > 3 || drift < -5)) && log "WARNING: the guest clock is ${drift}s off the host's: guest-side timings are wrong"
fi
log "exit status $rc after ${took}s"
exit "$rc"
