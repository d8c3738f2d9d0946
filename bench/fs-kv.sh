#!/usr/bin/env bash
# Small files on iolift's kv backend (files as RADOS objects, kv:rados:POOL)
# against iolift's mirror backend (an ext4 directory), both through the
# kernel's FUSE client, side by side in one run (Q3 of the file-system
# issue, the kv half):
#
#   for 4 KiB and 64 KiB files, NFILES of them: create+write+close, read
#   back (checked against the bytes written), stat, unlink; ops/s, server
#   CPU us/op (the iolift process) and machine CPU us/op (all cores, so
#   the Ceph OSD and monitor count for kv), medians of R repeats with the
#   two setups alternating in each; peak RSS of each server.
#
#   bench/fs-kv.sh                          # release build, R=3, NFILES=400
#   R=1 NFILES=100 PROFILE=debug bench/fs-kv.sh   # quick check of the script
#   BIN=/path/to/iolift                     # use this binary, build nothing
#
# The Ceph cluster is scripts/ceph-local.sh's (one memstore OSD, pool of
# size 1, on loopback), started and stopped here. The issue sets no
# number for kv against mirror: the ratios are recorded, and the line
# that every byte read back matched is printed as met / NOT met.
# Needs root (FUSE mounts), python3 and the Ceph daemons.
set -euo pipefail
cd "$(dirname "$0")/.."

R=${R:-3}
NFILES=${NFILES:-400}
THREADS=${THREADS:-4}
PROFILE=${PROFILE:-release}
WORK=${WORK:-/var/tmp/iolift-fs-kv-bench}
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$PWD/target}

# need_root_tools, build_iolift, peak_kib, fuse_mount, fuse_unmount
source bench/lib.sh
need_root_tools bench/fs-kv.sh python3 ceph-mon ceph-osd rados
build_iolift

SRC=$WORK/src
MNT=$WORK/mnt
RES=$WORK/results
CEPH=$WORK/c
cleanup() {
    if mountpoint -q "$MNT" 2>/dev/null; then umount -l "$MNT" || true; fi
    [[ -n $SERVER_PID ]] && kill "$SERVER_PID" 2>/dev/null || true
    bash scripts/ceph-local.sh stop "$CEPH" >/dev/null 2>&1 || true
    rm -rf "$WORK"
}
trap cleanup EXIT
rm -rf "$WORK"
mkdir -p "$SRC" "$MNT" "$RES"

echo "load before: $(uptime)"
CONF=$(CEPH_LOCAL_POOL=kvfs CEPH_LOCAL_IMAGE= CEPH_LOCAL_OSDS=1 CEPH_LOCAL_POOL_SIZE=1 \
    bash scripts/ceph-local.sh start "$CEPH" 2>"$RES/ceph.log" | tail -1) ||
    { cat "$RES/ceph.log" >&2; exit 1; }

mount_setup() { # mount_setup kv|mirror
    local spec
    case $1 in
        kv) spec="kv:rados:kvfs,conf=$CONF" ;;
        mirror) spec="mirror:$SRC" ;;
    esac
    fuse_mount "$MNT" "$RES/iolift.log" 30 "$BIN" fs mount "$spec" "$MNT" --threads "$THREADS"
}

# One repeat of one setup and file size: four phases, one JSON line each.
run_one() { # run_one SETUP SIZE REPEAT
    mount_setup "$1"
    python3 - "$1" "$2" "$3" "$MNT" "$NFILES" "$SERVER_PID" >"$RES/one" <<'EOF'
import json, os, sys, time
setup, size, rep, mnt, n, pid = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], int(sys.argv[5]), sys.argv[6]
hz = os.sysconf("SC_CLK_TCK")
def server():
    f = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return int(f[11]) + int(f[12])
def machine():
    f = open("/proc/stat").readline().split()
    return sum(int(x) for x in (f[1], f[2], f[3], f[6], f[7]))
data = [os.urandom(size) for _ in range(8)]
# Both stores keep the bytes in RAM (memstore; ext4's page cache), and
# FUSE opens drop the kernel's cached pages, so reads reach the server.
names = [os.path.join(mnt, f"f{size}-{i:05d}") for i in range(n)]
ok = True
def create():
    for i, p in enumerate(names):
        fd = os.open(p, os.O_CREAT | os.O_WRONLY | os.O_EXCL, 0o644)
        os.write(fd, data[i % 8]); os.close(fd)
def read():
    global ok
    for i, p in enumerate(names):
        fd = os.open(p, os.O_RDONLY)
        b = os.read(fd, size + 1); os.close(fd)
        ok = ok and b == data[i % 8]
def stat():
    global ok
    for p in names:
        ok = ok and os.stat(p).st_size == size
def unlink():
    for p in names: os.unlink(p)
for name, f in [("create", create), ("read", read), ("stat", stat), ("unlink", unlink)]:
    s0, m0, t0 = server(), machine(), time.perf_counter()
    f()
    t1, s1, m1 = time.perf_counter(), server(), machine()
    print(json.dumps({"setup": setup, "cell": f"{name}-{size // 1024}k", "rep": rep,
                      "ops_s": n / (t1 - t0),
                      "server_us_op": (s1 - s0) / hz * 1e6 / n,
                      "machine_us_op": (m1 - m0) / hz * 1e6 / n, "ok": ok}))
EOF
    fuse_unmount "$MNT"
    python3 -c 'import json,sys; [print(json.dumps({**json.loads(l), "rss_mib": int(sys.argv[1]) / 1024})) for l in open(sys.argv[2])]' \
        "$HWM" "$RES/one" >>"$RES/rows"
}

for rep in $(seq "$R"); do
    for size in 4096 65536; do
        # Alternate which setup goes first.
        if (( rep % 2 )); then order="kv mirror"; else order="mirror kv"; fi
        for s in $order; do run_one "$s" "$size" "$rep"; done
    done
    echo "repeat $rep of $R done ($(date +%T))"
done

python3 - "$RES/rows" "$R" "$NFILES" <<'EOF'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
med = statistics.median
cells = []
for r in rows:
    if r["cell"] not in cells: cells.append(r["cell"])
print(f"\nQ3 small files, kv (RADOS, 1 memstore OSD) vs mirror (ext4), kernel FUSE, "
      f"NFILES={sys.argv[3]}, medians of R={sys.argv[2]}")
print(f"  {'cell':12} {'kv ops/s':>10} {'mirror ops/s':>13} {'kv/mirror':>10}   "
      f"{'kv srv us/op':>12} {'mir srv us/op':>13}   {'kv mach us/op':>13} {'mir mach us/op':>14}")
for c in cells:
    v = {s: [r for r in rows if r["cell"] == c and r["setup"] == s] for s in ("kv", "mirror")}
    m = {s: {k: med([r[k] for r in v[s]]) for k in ("ops_s", "server_us_op", "machine_us_op")} for s in v}
    print(f"  {c:12} {m['kv']['ops_s']:10.0f} {m['mirror']['ops_s']:13.0f} "
          f"{m['kv']['ops_s'] / m['mirror']['ops_s']:10.2f}   {m['kv']['server_us_op']:12.1f} "
          f"{m['mirror']['server_us_op']:13.1f}   {m['kv']['machine_us_op']:13.1f} {m['mirror']['machine_us_op']:14.1f}")
for s in ("kv", "mirror"):
    print(f"  peak RSS {s}: {max(r['rss_mib'] for r in rows if r['setup'] == s):.1f} MiB")
ok = all(r["ok"] for r in rows)
print(f"  target: every file read back and stat'ed as written, both setups: {'met' if ok else 'NOT met'}")
print("  recorded: kv/mirror ops/s and CPU per op (the issue sets no number for kv)")
EOF
echo "load after: $(uptime)"
