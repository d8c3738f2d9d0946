#!/usr/bin/env bash
# File systems through the kernel's FUSE client, side by side in one run:
#
#  Q1  iolift's null backend: 4k random reads at QD 1..64 (IOPS), QD1
#      latency and CPU per operation (server, and the whole machine).
#  Q2  the same ext4 directory four ways: native ext4, bindfs (a FUSE
#      passthrough file system), iolift mirror (served) and iolift mirror
#      --passthrough: fio 4k randread/randwrite QD1 and QD16, 64k and 1M
#      sequential read/write, and metadata (stat, create+unlink, readdir
#      of 10k entries). Setups alternate within each repeat; each cell is
#      the median of R repeats, with ratios and peak RSS of each server.
#
#   bench/fs.sh                        # release build, R=3, RUNTIME=5: all
#                                      # parts, about 20 minutes; in parts
#                                      # of under 6 minutes each:
#   ONLY=q1 bench/fs.sh                               # ~2.5 min
#   ONLY=q2 CELLS=4k bench/fs.sh                      # ~6 min
#   ONLY=q2 CELLS='64k|1m' bench/fs.sh                # ~6 min
#   ONLY=q2 CELLS='stat|create|readdir' bench/fs.sh   # ~4 min
#   ONLY=virtio bench/fs.sh                           # ~4 min
#   R=1 RUNTIME=1 PROFILE=debug bench/fs.sh   # quick check of the script
#   BIN=/path/to/iolift                # use this binary, build nothing
#   CELLS=REGEX                        # only the cells whose name matches
#  Each part prints its targets as met / NOT met: Q2 one line per cell
#  (mirror >= 1.5x bindfs; with --passthrough >= 0.9x ext4 on data cells),
#  virtio below. bindfs runs with its defaults (1 s entry and attribute
#  timeouts, libfuse's) and iolift with its own (--ttl-ms 1000).
#
#
#  virtio-fs (Q1 and Q2 for the VM transport): `iolift fs drive-virtiofs`
#      plays the guest (shared memory, virtqueues, FUSE requests) against
#      iolift fs serve-virtiofs (null and mirror, --thread-pool-size
#      VPOOL, default 0 as virtiofsd's) and QEMU's virtiofsd (-o source=,
#      sandbox=chroot, its default: no thread pool) over the same directory: 4k random reads
#      and writes at QD1 and QD16 (IOPS, p50 latency), medians of R,
#      alternating, with server CPU per op and peak RSS; prints the
#      targets (iolift >= 1.3x virtiofsd IOPS at QD16, QD1 latency <=
#      virtiofsd's) as met / not met.
#
# Needs root (FUSE mounts), fio, bindfs, python3. Data lives under WORK
# (default /var/tmp/iolift-fs-bench, on the root ext4), removed at the end.
set -euo pipefail
cd "$(dirname "$0")/.."

R=${R:-3}
RUNTIME=${RUNTIME:-5}
SIZE=${SIZE:-256M}
THREADS=${THREADS:-4}
PROFILE=${PROFILE:-release}
ONLY=${ONLY:-all}
WORK=${WORK:-/var/tmp/iolift-fs-bench}
NFILES=${NFILES:-10000}
CELLS=${CELLS:-.}   # regex: run only the cells whose name matches
VPOOL=${VPOOL:-0}   # serve-virtiofs --thread-pool-size (0: both daemons' default)
# virtio setups; vfs-iolift-sync is the mirror with --uring-depth 0 (reads
# and writes on the queue thread), vfs-iolift-uw with --uring-writes (writes
# on the ring too), to compare with its default (reads on io_uring).
VSETUPS=${VSETUPS:-vfs-null vfs-iolift vfs-virtiofsd}
VIRTIOFSD=${VIRTIOFSD:-/usr/lib/qemu/virtiofsd}
# Q2 setups (the fuser front-end is "iolift"); TRANSPORTS adds the devfuse
# front-end's transports as setups iolift-uring / iolift-devfuse, e.g.
#   ONLY=q2 Q2_SETUPS='bindfs iolift' TRANSPORTS='uring devfuse' \
#     CELLS='4k-qd|stat|create|readdir' bench/fs.sh
# null-fuser / null-uring: the null backend (answers at once) over each
# transport, the floor of the stat, create+unlink and QD1 cells: with them
# (and ext4 and bindfs) the summary prints one "floor:" line per cell and
# transport, what share of bindfs's time per op the kernel's FUSE round
# trip alone takes, e.g.
#   ONLY=q2 Q2_SETUPS='ext4 bindfs null-fuser null-uring iolift' \
#     TRANSPORTS=uring CELLS='4k-qd1$|stat|create' bench/fs.sh
Q2_SETUPS=${Q2_SETUPS:-ext4 bindfs iolift iolift-pt}
TRANSPORTS=${TRANSPORTS:-}
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$PWD/target}

# need_root_tools, build_iolift (BIN=path/to/iolift skips the build),
# cpu_ticks, busy_ticks, peak_kib, wait_mount, stop_server, fs_cells; sets
# SERVER_PID=.
source bench/lib.sh
need_root_tools bench/fs.sh fio bindfs python3
build_iolift

SRC=$WORK/src
MNT=$WORK/mnt
RES=$WORK/results
cleanup() {
    if mountpoint -q "$MNT" 2>/dev/null; then umount -l "$MNT" || true; fi
    [[ -n $SERVER_PID ]] && kill "$SERVER_PID" 2>/dev/null || true
    rm -rf "$WORK"
    [[ -n ${URING_OLD:-} ]] && echo "$URING_OLD" >/sys/module/fuse/parameters/enable_uring || true
}
trap cleanup EXIT
rm -rf "$WORK"
mkdir -p "$SRC" "$MNT" "$RES"

# mount_setup NAME: makes $MNT show $SRC (or null) the NAME way; sets
# DIR (where the job runs) and SERVER_PID (empty for native ext4).
mount_setup() {
    SERVER_PID=
    case $1 in
        ext4) DIR=$SRC; META_DIR=$SRC; return ;;
        bindfs)
            bindfs -f --multithreaded "$SRC" "$MNT" 2>"$RES/bindfs.log" &
            SERVER_PID=$! ;;
        iolift)
            "$BIN" fs mount "mirror:$SRC" "$MNT" --threads "$THREADS" >"$RES/iolift.out" 2>"$RES/iolift.log" &
            SERVER_PID=$! ;;
        iolift-pt)
            "$BIN" fs mount "mirror:$SRC" "$MNT" --threads "$THREADS" --passthrough >"$RES/iolift.out" 2>"$RES/iolift.log" &
            SERVER_PID=$! ;;
        iolift-uring|iolift-devfuse)
            "$BIN" fs mount "mirror:$SRC" "$MNT" --threads "$THREADS" --transport "${1#iolift-}" >"$RES/iolift.out" 2>"$RES/iolift.log" &
            SERVER_PID=$! ;;
        null)
            "$BIN" fs mount "null:1G" "$MNT" --threads "$THREADS" >"$RES/iolift.out" 2>"$RES/iolift.log" &
            SERVER_PID=$! ;;
        null-fuser|null-uring)
            "$BIN" fs mount "null:1G" "$MNT" --threads "$THREADS" --transport "${1#null-}" >"$RES/iolift.out" 2>"$RES/iolift.log" &
            SERVER_PID=$! ;;
    esac
    DIR=$MNT
    # The null backend answers every lookup with a regular file, so the
    # stat job's DIR/meta/fN reaches it through a host symlink meta -> MNT
    # (one more cached path step than bindfs's MNT/meta/fN).
    META_DIR=$MNT NULL_SETUP=
    if [[ $1 == null-* ]]; then
        NULL_SETUP=1
        META_DIR=$WORK/nullroot
        mkdir -p "$META_DIR"; ln -sfn "$MNT" "$META_DIR/meta"
    fi
    wait_mount "$MNT" "$RES/$([[ $1 == bindfs ]] && echo bindfs || echo iolift).log" 10
}

unmount_setup() {
    [[ -z $SERVER_PID ]] && return
    HWM=$(peak_kib "$SERVER_PID" 2>/dev/null || echo 0)
    umount "$MNT" 2>/dev/null || umount -l "$MNT"
    stop_server
}

# run_cell SETUP CELL REPEAT CMD...: one measurement -> one JSON line in $RES/rows.
run_cell() {
    local setup=$1 cell=$2 rep=$3; shift 3
    [[ $cell =~ $CELLS ]] || return 0
    # The null backend lists nothing: no readdir cell for it.
    [[ $setup == null-* && $cell == readdir-10k ]] && return 0
    mount_setup "$setup"
    local t0 b0 s0=0 t1 b1 s1=0
    b0=$(busy_ticks); t0=$(date +%s.%N)
    [[ -n $SERVER_PID ]] && s0=$(cpu_ticks "$SERVER_PID")
    "$@" >"$RES/out.json"
    [[ -n $SERVER_PID ]] && s1=$(cpu_ticks "$SERVER_PID")
    b1=$(busy_ticks); t1=$(date +%s.%N)
    HWM=0
    unmount_setup
    python3 - "$setup" "$cell" "$rep" "$((s1 - s0))" "$((b1 - b0))" "$HWM" "$RES/out.json" >>"$RES/rows" <<'EOF'
import json, sys
setup, cell, rep, sticks, bticks, hwm, path = sys.argv[1:]
hz = 100
raw = open(path).read()
d = json.loads(raw[raw.index("{"):])
if "jobs" in d:  # fio
    j = d["jobs"][0]
    rw = j["read"] if j["read"]["io_bytes"] else j["write"]
    ops = rw["total_ios"]
    val = {"iops": rw["iops"], "mbs": rw["bw_bytes"] / 1e6,
           "lat_us": rw["clat_ns"]["mean"] / 1000,
           "p50_us": rw["clat_ns"].get("percentile", {}).get("50.000000", 0) / 1000}
else:            # metadata script
    ops, val = d["ops"], {"ops_s": d["ops_s"]}
val.update(setup=setup, cell=cell, rep=int(rep), ops=ops,
           server_us_op=int(sticks) * 1e6 / hz / max(ops, 1),
           total_us_op=int(bticks) * 1e6 / hz / max(ops, 1), rss_mib=int(hwm) / 1024)
print(json.dumps(val))
EOF
}

fio_job() { # fio_job NAME RW BS QD [extra...]
    local name=$1 rw=$2 bs=$3 qd=$4; shift 4
    fio --name="$name" --directory="$DIR" --filename=bench.dat --size="$SIZE" \
        --rw="$rw" --bs="$bs" --iodepth="$qd" --ioengine=libaio --direct=1 \
        --time_based --runtime="$RUNTIME" --ramp_time=1 --norandommap --randrepeat=0 \
        --output-format=json "$@"
}

# Metadata: a python loop of system calls (its own cost, a few us per call,
# is the same for every setup).
meta_job() { # meta_job stat|create|readdir
    if [[ $1 == create && $DIR == "$MNT" && -n ${NULL_SETUP:-} ]]; then
        # The null backend finds every name (lookup never says ENOENT), so
        # O_EXCL would fail: the same loop without it (lookup, then open
        # of the found file instead of create: as many round trips).
        python3 -c '
import json, os, sys, time
p, runtime, ops, t0 = os.path.join(sys.argv[1], "cu"), float(sys.argv[2]), 0, time.perf_counter()
while time.perf_counter() - t0 < runtime:
    for i in range(1000):
        os.close(os.open(p, os.O_CREAT | os.O_WRONLY, 0o644))
        os.unlink(p)
    ops += 1000
print(json.dumps({"ops": ops, "ops_s": ops / (time.perf_counter() - t0)}))' "$DIR" "$RUNTIME"
        return
    fi
    python3 bench/fs-meta.py "$([[ $1 == stat ]] && echo "$META_DIR" || echo "$DIR")" "$1" "$NFILES" "$RUNTIME" 1000
}

# The data file and the 10k-entry directory, made once on the host. The
# file is written in 4 KiB blocks in random order: written in 1 MiB
# pieces, its page cache would be large folios, and ext4 then walks every
# buffer head of a 2 MiB folio on each 4 KiB buffered write (perf: 73% of
# a virtio-fs server's CPU in ext4_block_write_begin, 5-10x fewer IOPS),
# which would measure that walk, the same for every server, not them.
# fio first drops the file's cached pages (its default invalidate=1), so
# this also undoes what earlier cells did to the page cache (O_DIRECT
# writes drop pages, sequential reads bring large folios back): it runs
# before each setup's cells, which then all start from the same state.
prep_data() {
    fio --name=prep --directory="$SRC" --filename=bench.dat --size="$SIZE" --rw=randwrite --bs=4k \
        --ioengine=psync --end_fsync=1 --output=/dev/null
}
prep_data
mkdir -p "$SRC/meta"
python3 -c "
import os, sys
for i in range($NFILES): open(os.path.join('$SRC/meta', f'f{i}'), 'w').close()"

echo "bench/fs.sh: $(date -u '+%F %T') UTC, R=$R RUNTIME=${RUNTIME}s SIZE=$SIZE threads=$THREADS $PROFILE; $(uptime)"

if [[ $ONLY == all || $ONLY == q1 ]]; then
    for rep in $(seq "$R"); do
        for qd in 1 2 4 8 16 32 64; do
            run_cell null "randread-4k-qd$qd" "$rep" fio_job r randread 4k "$qd" --size=1G --filename=f
        done
    done
fi
if [[ $ONLY == all || $ONLY == q2 ]]; then
    read -ra SETUPS <<<"$Q2_SETUPS"
    for t in $TRANSPORTS; do SETUPS+=("iolift-$t"); done
    if [[ " ${SETUPS[*]} " == *-uring" "* ]]; then
        # FUSE over io_uring is off unless fuse's enable_uring is Y (restored at exit).
        URING_OLD=$(cat /sys/module/fuse/parameters/enable_uring)
        echo Y >/sys/module/fuse/parameters/enable_uring
    fi
    echo "timeouts: bindfs $(bindfs --version 2>&1 | head -1), its defaults (libfuse 2: entry_timeout=1 s, attr_timeout=1 s, negative_timeout=0, no kernel_cache);" \
         "iolift --ttl-ms 1000 (entry and attribute replies 1 s, no negative entries; kept directory listings checked by mtime), the null backend 1 s"
    for rep in $(seq "$R"); do
        for s in "${SETUPS[@]}"; do
            prep_data
            fs_cells "$s" "$rep"
        done
    done
fi

# virtio-fs: one daemon per measurement (both serve one connection and
# exit when the driver disconnects); a sampler records the daemon's CPU
# ticks and peak RSS while it lives.
VSOCK=$WORK/vfs.sock
vrun() { # vrun SETUP CELL REPEAT RW QD
    local setup=$1 cell=$2 rep=$3 rw=$4 qd=$5 pid
    [[ $cell =~ $CELLS ]] || return 0
    rm -f "$VSOCK"
    case $setup in
        vfs-null) "$BIN" fs serve-virtiofs null:1G --socket-path "$VSOCK" --thread-pool-size "$VPOOL" >"$RES/vd.out" 2>"$RES/vd.log" & ;;
        vfs-iolift) "$BIN" fs serve-virtiofs --shared-dir "$SRC" --socket-path "$VSOCK" --thread-pool-size "$VPOOL" >"$RES/vd.out" 2>"$RES/vd.log" & ;;
        vfs-iolift-sync) "$BIN" fs serve-virtiofs --shared-dir "$SRC" --socket-path "$VSOCK" --thread-pool-size "$VPOOL" --uring-depth 0 >"$RES/vd.out" 2>"$RES/vd.log" & ;;
        vfs-iolift-uw) "$BIN" fs serve-virtiofs --shared-dir "$SRC" --socket-path "$VSOCK" --thread-pool-size "$VPOOL" --uring-writes >"$RES/vd.out" 2>"$RES/vd.log" & ;;
        vfs-virtiofsd) "$VIRTIOFSD" --socket-path="$VSOCK" -o source="$SRC" -o sandbox=chroot -o cache=auto >"$RES/vd.out" 2>"$RES/vd.log" & ;;
    esac
    pid=$!
    for _ in $(seq 200); do [[ -S $VSOCK ]] && break; sleep 0.05; done
    [[ -S $VSOCK ]] || { echo "$setup did not listen" >&2; cat "$RES/vd.log" >&2; exit 1; }
    ( while kill -0 "$pid" 2>/dev/null; do echo "$(cpu_ticks "$pid" 2>/dev/null || echo 0) $(peak_kib "$pid" 2>/dev/null || echo 0)" >"$RES/vd.sample.tmp" && mv "$RES/vd.sample.tmp" "$RES/vd.sample"; sleep 0.1; done ) &
    local sampler=$! s0
    s0=$(cpu_ticks "$pid")
    "$BIN" fs drive-virtiofs --socket-path "$VSOCK" --file bench.dat --rw "$rw" --iodepth "$qd" \
        --span "$(numfmt --from=iec "$SIZE")" --runtime-ms "$((RUNTIME * 1000))" >"$RES/vdrive.out" \
        || { echo "drive-virtiofs against $setup failed" >&2; cat "$RES/vd.log" >&2; exit 1; }
    local t=0; while kill -0 "$pid" 2>/dev/null && ((t < 50)); do sleep 0.1; t=$((t + 1)); done
    kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true
    kill "$sampler" 2>/dev/null || true; wait "$sampler" 2>/dev/null || true
    python3 - "$setup" "$cell" "$rep" "$s0" "$RES/vd.sample" "$RES/vdrive.out" >>"$RES/vrows" <<'EOF'
import json, sys
setup, cell, rep, s0, sample, out = sys.argv[1:]
d = dict(kv.split("=") for kv in open(out).read().split())
ticks, hwm = (open(sample).read().split() + ["0", "0"])[:2]
ops = int(d["ops"])
print(json.dumps(dict(setup=setup, cell=cell, rep=int(rep), ops=ops, iops=float(d["iops"]),
    p50_us=float(d["lat_p50_us"]), mean_us=float(d["lat_mean_us"]),
    server_us_op=(int(ticks) - int(s0)) * 1e4 / max(ops, 1), rss_mib=int(hwm) / 1024)))
EOF
}

if [[ $ONLY == all || $ONLY == virtio ]]; then
    [[ -x $VIRTIOFSD ]] || { echo "missing $VIRTIOFSD (Debian qemu-system-common)" >&2; exit 1; }
    prep_data
    for rep in $(seq "$R"); do
        for s in $VSETUPS; do
            vrun "$s" randread-4k-qd1 "$rep" randread 1
            vrun "$s" randread-4k-qd16 "$rep" randread 16
            vrun "$s" randwrite-4k-qd1 "$rep" randwrite 1
            vrun "$s" randwrite-4k-qd16 "$rep" randwrite 16
        done
    done
    python3 - "$RES/vrows" <<'EOF'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
med = lambda xs: statistics.median(xs) if xs else 0
setups, cells = [], []
for r in rows:
    if r["cell"] not in cells: cells.append(r["cell"])
    if r["setup"] not in setups: setups.append(r["setup"])
print("\nvirtio-fs (host-side driver), medians: IOPS / p50 us / server CPU us per op")
print(f"  {'cell':20}" + "".join(f"{s:>28}" for s in setups) + "   iolift/virtiofsd IOPS")
v = {}
for c in cells:
    line = f"  {c:20}"
    for s in setups:
        rs = [r for r in rows if r["cell"] == c and r["setup"] == s]
        v[c, s] = (med([r["iops"] for r in rs]), med([r["p50_us"] for r in rs]), med([r["server_us_op"] for r in rs]))
        line += f"{v[c, s][0]:12.0f} {v[c, s][1]:7.1f} {v[c, s][2]:7.1f}"
    b = v.get((c, "vfs-virtiofsd"), (0,))[0]
    line += f"{v[c, 'vfs-iolift'][0] / b:14.2f}" if b and (c, "vfs-iolift") in v else f"{'-':>14}"
    print(line)
print("  peak RSS MiB: " + ", ".join(f"{s} {max([r['rss_mib'] for r in rows if r['setup'] == s] or [0]):.1f}" for s in setups))
def target(name, ok):
    print(f"  target: {name}: {'met' if ok else 'NOT met'}")
for c in cells:
    if (c, "vfs-iolift-sync") in v and (c, "vfs-iolift") in v and v[c, "vfs-iolift-sync"][0]:
        a, b = v[c, "vfs-iolift"], v[c, "vfs-iolift-sync"]
        print(f"  io_uring vs synchronous mirror {c}: {a[0] / b[0]:.2f}x IOPS, p50 {a[1]:.1f} vs {b[1]:.1f} us, CPU {a[2]:.1f} vs {b[2]:.1f} us/op")
for c in ["randread-4k-qd16", "randwrite-4k-qd16"]:
    if (c, "vfs-virtiofsd") in v and (c, "vfs-iolift") in v and v[c, "vfs-virtiofsd"][0]:
        r = v[c, "vfs-iolift"][0] / v[c, "vfs-virtiofsd"][0]
        target(f"iolift virtio-fs mirror {c} IOPS >= 1.3x virtiofsd ({r:.2f}x)", r >= 1.3)
for c in ["randread-4k-qd1", "randwrite-4k-qd1"]:
    if (c, "vfs-virtiofsd") in v and (c, "vfs-iolift") in v:
        a, b = v[c, "vfs-iolift"][1], v[c, "vfs-virtiofsd"][1]
        target(f"iolift virtio-fs mirror {c} p50 latency <= virtiofsd ({a:.1f} vs {b:.1f} us)", a <= b)
if ("randread-4k-qd1", "vfs-null") in v:
    n = v["randread-4k-qd1", "vfs-null"]
    print(f"  recorded: null backend QD1 latency p50 {n[1]:.1f} us, server CPU {n[2]:.1f} us/op")
EOF
fi

[[ -s $RES/rows ]] || { echo "load after: $(uptime)"; exit 0; }

python3 - "$RES/rows" <<'EOF'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
def med(xs): return statistics.median(xs) if xs else 0
cells, setups = [], []
for r in rows:
    if r["cell"] not in cells: cells.append(r["cell"])
    if r["setup"] not in setups: setups.append(r["setup"])
def key(r): return "ops_s" if "ops_s" in r else ("iops" if r["cell"].split("-")[1] == "4k" or "qd" not in r["cell"] else "mbs")
def metric(cell):
    rs = [r for r in rows if r["cell"] == cell]
    return key(rs[0])
print()
if "null" in setups:
    print("Q1 null backend (kernel FUSE):  cell | IOPS | mean clat us | server CPU us/op | total CPU us/op | peak RSS MiB")
    for c in cells:
        rs = [r for r in rows if r["cell"] == c and r["setup"] == "null"]
        if not rs: continue
        print(f"  {c:20} {med([r['iops'] for r in rs]):10.0f} {med([r['lat_us'] for r in rs]):8.1f} "
              f"{med([r['server_us_op'] for r in rs]):8.1f} {med([r['total_us_op'] for r in rs]):8.1f} "
              f"{max(r['rss_mib'] for r in rs):6.1f}")
q2 = [s for s in setups if s != "null"]
if q2:
    print("\nQ2 medians (IOPS for 4k, MB/s for 64k/1M, ops/s for metadata); server CPU us/op in ()")
    print("  " + f"{'cell':20}" + "".join(f"{s:>20}" for s in q2) + "   iolift/bindfs  pt/bindfs  iolift/ext4  pt/ext4")
    for c in cells:
        rs = [r for r in rows if r["cell"] == c and r["setup"] in q2]
        if not rs: continue
        k = "ops_s" if "ops_s" in rs[0] else ("iops" if "-4k-" in c else "mbs")
        v = {s: med([r[k] for r in rs if r["setup"] == s]) for s in q2}
        cpu = {s: med([r["server_us_op"] for r in rs if r["setup"] == s]) for s in q2}
        line = f"  {c:20}" + "".join(f"{v[s]:12.0f} ({cpu[s]:5.1f})" for s in q2)
        ratio = lambda a, b: f"{v[a] / v[b]:13.2f}" if v.get(b) and a in v else f"{'-':>13}"
        line += ratio("iolift", "bindfs") + ratio("iolift-pt", "bindfs") + ratio("iolift", "ext4") + ratio("iolift-pt", "ext4")
        print(line)
    print("  peak RSS MiB: " + ", ".join(
        f"{s} {max([r['rss_mib'] for r in rows if r['setup'] == s] or [0]):.1f}" for s in q2 if s != "ext4"))
    # The targets, one line per cell: served mirror >= 1.5x bindfs on every
    # cell; with passthrough >= 0.9x native ext4 on the data cells.
    for c in cells:
        rs = [r for r in rows if r["cell"] == c and r["setup"] in q2]
        if not rs: continue
        k = "ops_s" if "ops_s" in rs[0] else ("iops" if "-4k-" in c else "mbs")
        v = {s: med([r[k] for r in rs if r["setup"] == s]) for s in q2}
        if v.get("bindfs") and "iolift" in v:
            r = v["iolift"] / v["bindfs"]
            print(f"  target: iolift FUSE mirror {c} >= 1.5x bindfs ({r:.2f}x): {'met' if r >= 1.5 else 'NOT met'}")
        for t in ("iolift-uring", "iolift-devfuse"):
            if v.get("bindfs") and t in v:
                r, f = v[t] / v["bindfs"], (f"; {v[t] / v['iolift']:.2f}x fuser" if v.get("iolift") else "")
                print(f"  target: iolift FUSE mirror over {t[7:]} {c} >= 1.5x bindfs ({r:.2f}x{f}): {'met' if r >= 1.5 else 'NOT met'}")
        if k != "ops_s" and v.get("ext4") and "iolift-pt" in v:
            r = v["iolift-pt"] / v["ext4"]
            print(f"  target: iolift FUSE mirror --passthrough {c} >= 0.9x ext4 ({r:.2f}x): {'met' if r >= 0.9 else 'NOT met'}")
    # The FUSE floor: the null backend answers at once, so no server over
    # the same transport and timeouts beats it. For QD1 and the one-thread
    # metadata loops the time per op is 1/rate; on the metadata cells null
    # minus ext4 is what the kernel's FUSE round trip adds, and bindfs
    # minus null is bindfs's own work (all a faster server could save).
    for c in cells:
        if not (c.endswith("-qd1") or c.startswith(("stat", "create"))):
            continue
        rs = [r for r in rows if r["cell"] == c and r["setup"] in q2]
        k = "ops_s" if "ops_s" in rs[0] else "iops"
        v = {s: med([r[k] for r in rs if r["setup"] == s]) for s in q2}
        us = {s: 1e6 / v[s] for s in v if v[s]}
        for n in ("null-fuser", "null-uring"):
            if n not in us or "bindfs" not in us:
                continue
            r = v[n] / v["bindfs"]
            line = f"  floor: {n} {c}: {r:.2f}x bindfs ({'room for 1.5x' if r >= 1.5 else 'below 1.5x: an instant server over this transport does not reach the target'}); us/op: {n} {us[n]:.1f}, bindfs {us['bindfs']:.1f}"
            # (ext4's data cells go to the disk, null's do not: no
            # round-trip estimate there.)
            if "ext4" in us and k == "ops_s":
                rt = us[n] - us["ext4"]
                line += f", ext4 {us['ext4']:.1f}; FUSE round trip (null - ext4) {rt:.1f} us = {100 * rt / us['bindfs']:.0f}% of bindfs's op"
            print(line)
EOF
echo "load after: $(uptime)"
