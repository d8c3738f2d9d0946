#!/usr/bin/env bash
# File backend engines side by side: `file:IMG,engine=uring` (the io_uring
# engine of crates/iolift-direct) against the default thread-pool engine,
# same image, same fio jobs, same run, alternating, medians + ratios, and
# the peak RSS of each server. Not a test: see docs/direct.md.
#
#   bench/direct.sh                        # 3 repeats, 10 s per job, release build
#   R=5 RUNTIME=5 bench/direct.sh
#   DIRECT=1 bench/direct.sh               # both engines with O_DIRECT
#   EXTRA=,sqpoll bench/direct.sh          # options added to the uring side
#   PROFILE=debug bench/direct.sh          # use the debug build (no release build)
#   IOLIFT=path/to/iolift bench/direct.sh  # that binary, no build
#   KEEP=1 bench/direct.sh                 # keep the fio JSON files
#   FIG=5 bench/direct.sh                  # request latency, engine / POSIX / AccelFS / ext4 (below)
#   FIG=7 STREAM_SIZE=2G bench/direct.sh   # the streaming application instead (below)
#
# Per repeat and engine: start a fresh `iolift serve` on a unix socket over
# the same image (SIZE, written once by fio before the first repeat), run
#   4k randread / randwrite at iodepth 1 and 32 (fio ioengine=nbd, one
#   connection),
# record IOPS, p50/p99 completion latency, the server's CPU time per I/O
# (utime+stime from /proc/PID/stat) and its peak RSS (VmHWM) at the end.
# The engine order flips every repeat. Summary: medians per engine and the
# ratio uring/threads.
set -euo pipefail
cd "$(dirname "$0")/.."

R=${R:-3}
RUNTIME=${RUNTIME:-10}
SIZE=${SIZE:-1G}
THREADS=${THREADS:-2}
PROFILE=${PROFILE:-release}
TARGET=${CARGO_TARGET_DIR:-target}
BUILD=1; [[ -n ${IOLIFT:-} ]] && BUILD=
IOLIFT=${IOLIFT:-$TARGET/$PROFILE/iolift}
PY=/usr/bin/python3; [[ -x $PY ]] || PY=python3
OPTS=""; [[ -n ${DIRECT:-} && ${DIRECT} != 0 ]] && OPTS=",direct"

if [[ -z ${FIG:-} ]]; then
    command -v fio >/dev/null || { echo "missing fio: run scripts/test.sh, which installs it" >&2; exit 1; }
    fio --enghelp=nbd >/dev/null 2>&1 || { echo "this fio has no nbd engine" >&2; exit 1; }
fi

if [[ -z $BUILD ]]; then
    echo "== using $IOLIFT" >&2
elif [[ $PROFILE == release ]]; then
    echo "== building iolift (release)" >&2
    cargo build --release -p iolift >&2
else
    echo "== building iolift ($PROFILE)" >&2
    cargo build -p iolift >&2
fi

# FIG=5: latency in a single-threaded tight loop (HAYAGUI's Figure 5),
# `iolift accelfs lat`, one request at a time at random offsets aligned to
# its size (SIZES, default 4K 64K 1M), COUNT requests (default 200) per
# cell, read / write / write+sync:
#   uring    the io_uring engine, O_DIRECT, on an image file (SPAN bytes,
#            default 64M, written in full first) on this machine's ext4,
#   posix    pread / pwrite / fdatasync, O_DIRECT, on the same file,
#   spin     the engine as `uring` with a spinning reaper (--spin-us
#            SPIN_US): one system call per request to submit, then the
#            caller reads the completion ring in a loop instead of
#            sleeping until the completion wakes it,
#   sqspin   the engine as `uring` with SQPOLL and a spinning reaper
#            (--sqpoll --spin-us SPIN_US, default 200): no system call
#            per request while the kernel's polling thread is awake, at
#            the price of that thread and the caller spinning (CPU time
#            per request below counts both),
#   dtask    the engine as `uring` on a ring set up with SINGLE_ISSUER and
#            DEFER_TASKRUN (--defer-taskrun): the kernel posts the
#            completion when the waiting caller runs, no task-work
#            interrupt,
#   accelfs  a file of SPAN bytes on AccelFS (an image file, O_DIRECT;
#            write+sync = hard sync),
#   ext4     a file of SPAN bytes on an ext4 made on a loop device
#            (--direct-io=on) over an image file on the same disk, through
#            the page cache (pread / pwrite / fdatasync), as applications
#            use files.
#   fio-*    the floor: fio itself on raw.img, 4K random read / write at
#            queue depth 1, O_DIRECT, FLOOR_IOS requests (default 2000)
#            each, with psync (pread / pwrite) and io_uring plain, with
#            registered files and buffers, with SQPOLL (and those), and
#            with hipri (IOPOLL) where the device has poll queues: the
#            fastest submission any io_uring user gets on this device,
#            against fio's pread on the same file (latency from submission
#            to completion, fio's lat percentiles).
# Paths alternate (the order rotates every repeat); medians of R of each
# cell's p50 and mean; ratios uring/posix and accelfs/ext4. Needs root.
if [[ ${FIG:-} == 5 ]]; then
    [[ $(id -u) == 0 ]] || { echo "FIG=5 needs root (losetup, mount)" >&2; exit 1; }
    SPAN=${SPAN:-64M}; COUNT=${COUNT:-200}; SIZES=${SIZES:-"4K 64K 1M"}; SPIN_US=${SPIN_US:-200}
    WORK=$(mktemp -d /var/tmp/iolift-lat-bench.XXXXXX)
    MNT=$WORK/ext4; LOOP=
    cleanup5() {
        if mountpoint -q "$MNT" 2>/dev/null; then umount "$MNT" || umount -l "$MNT"; fi
        [[ -n $LOOP ]] && losetup -d "$LOOP" 2>/dev/null || true
        rm -rf "$WORK"
    }
    trap cleanup5 EXIT
    span_bytes=$(numfmt --from=iec "$SPAN")
    head -c "$span_bytes" /dev/zero >"$WORK/raw.img"
    # Written through the page cache: drop its pages, or the first O_DIRECT
    # write to each of them through io_uring cannot go without blocking
    # (the page must be invalidated) and is handed to an io-wq worker
    # thread, while pwrite invalidates it in line; whichever path wrote an
    # offset first would pay for every path after it.
    sync "$WORK/raw.img"
    "$PY" -c 'import os, sys; fd = os.open(sys.argv[1], os.O_RDONLY); os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)' "$WORK/raw.img"
    # Allocated (as raw.img is written): an O_DIRECT write into a hole is
    # handed to an io-wq worker thread (docs/direct.md).
    fallocate -l $((span_bytes * 2)) "$WORK/accel.img"
    "$IOLIFT" accelfs mkfs --size $((span_bytes * 2)) "$WORK/accel.img" >/dev/null
    truncate -s $((span_bytes * 2)) "$WORK/ext4.img"
    mkfs.ext4 -q -F "$WORK/ext4.img"
    LOOP=$(losetup -f --show --direct-io=on "$WORK/ext4.img")
    mkdir -p "$MNT"; mount "$LOOP" "$MNT"
    head -c "$span_bytes" /dev/zero >"$MNT/lat.dat"; sync
    PATHS=(uring posix accelfs ext4 spin sqspin dtask)
    lat() { # path op bs out
        local p=$1; shift
        local a=(--op "$1" --bs "$2" --count "$COUNT" --span "$SPAN")
        case $p in
        uring) "$IOLIFT" accelfs lat --direct on --io uring "${a[@]}" "$WORK/raw.img" ;;
        posix) "$IOLIFT" accelfs lat --direct on --io posix "${a[@]}" "$WORK/raw.img" ;;
        spin) "$IOLIFT" accelfs lat --direct on --io uring --spin-us "$SPIN_US" "${a[@]}" "$WORK/raw.img" ;;
        sqspin) "$IOLIFT" accelfs lat --direct on --io uring --sqpoll --spin-us "$SPIN_US" "${a[@]}" "$WORK/raw.img" ;;
        dtask) "$IOLIFT" accelfs lat --direct on --io uring --defer-taskrun "${a[@]}" "$WORK/raw.img" ;;
        accelfs) "$IOLIFT" accelfs lat --direct on --io accelfs "${a[@]}" "$WORK/accel.img" ;;
        ext4) "$IOLIFT" accelfs lat --direct off --io posix "${a[@]}" "$MNT/lat.dat" ;;
        esac
    }
    echo "== $R repeats x $COUNT requests per cell, span $SPAN, sizes $SIZES, sqspin $SPIN_US us, $PROFILE build, $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"
    dev=$(findmnt -no SOURCE -T "$WORK" | sed 's|^/dev/||; s|[0-9]*$||; s|p$||')
    IOPOLL=0
    if [[ -r /sys/block/$dev/queue/io_poll ]]; then
        IOPOLL=$(cat "/sys/block/$dev/queue/io_poll")
        echo "== $WORK is on $dev: queue/io_poll $IOPOLL (0: no IOPOLL possible)"
    fi
    FLOOR=(psync uring uring-reg uring-sqpoll)
    [[ $IOPOLL == 1 ]] && FLOOR+=(uring-hipri)
    command -v fio >/dev/null || { echo "missing fio: run scripts/test.sh, which installs it" >&2; exit 1; }
    floor() { # engine rw: one fio run, one line as lat() prints
        local e=() rw=$2
        case $1 in
        psync) e=(--ioengine=psync) ;;
        uring) e=(--ioengine=io_uring) ;;
        uring-reg) e=(--ioengine=io_uring --fixedbufs=1 --registerfiles=1) ;;
        uring-sqpoll) e=(--ioengine=io_uring --fixedbufs=1 --registerfiles=1 --sqthread_poll=1) ;;
        uring-hipri) e=(--ioengine=io_uring --fixedbufs=1 --registerfiles=1 --hipri=1) ;;
        esac
        fio --name=floor --filename="$WORK/raw.img" --direct=1 --rw="rand$rw" --bs=4k --iodepth=1 \
            --number_ios="${FLOOR_IOS:-2000}" --size="$SPAN" --norandommap --randrepeat=0 \
            --lat_percentiles=1 "${e[@]}" --output-format=json | "$PY" -c '
import json, sys
t = sys.stdin.read(); j = json.loads(t[t.index("{"):])["jobs"][0]
d = j["read"] if j["read"]["io_bytes"] else j["write"]
ios = max(d["total_ios"], 1)
cpu = (j["usr_cpu"] + j["sys_cpu"]) / 100 * j["job_runtime"] * 1000 / ios
lat = d["lat_ns"]
print("p50_us %.1f mean_us %.1f cpu_us %.2f" % (lat["percentile"]["50.000000"] / 1000, lat["mean"] / 1000, cpu))'
    }
    for rep in $(seq 1 "$R"); do
        for bs in $SIZES; do
            for op in read write write-sync; do
                for i in 0 1 2 3 4 5 6; do
                    p=${PATHS[$(((i + rep) % 7))]}
                    echo "$p $op $bs $(lat "$p" "$op" "$bs")" >>"$WORK/lat.txt"
                done
            done
        done
        nf=${#FLOOR[@]}
        for rw in read write; do
            for i in $(seq 0 $((nf - 1))); do
                e=${FLOOR[$(((i + rep) % nf))]}
                echo "fio-$e $rw 4K $(floor "$e" "$rw")" >>"$WORK/lat.txt"
            done
        done
        echo "   repeat $rep done (load $(cut -d' ' -f1 /proc/loadavg))" >&2
    done
    # Where a 4K request's completion runs (perf, once per path, COUNT
    # requests): an O_DIRECT write submitted asynchronously (io_uring) to a
    # file of a host file system completes on that file system's dio
    # workqueue (a kernel worker is woken, then it wakes the submitter),
    # while pwrite(2) and every read complete in the caller or in the
    # interrupt: one wake-up more per io_uring write, whoever submits it
    # (fio too). Counted: raw.img's direct-I/O completions (tracepoint
    # iomap:iomap_dio_complete, filtered by its inode, so other processes'
    # I/O is not counted) run by a kernel worker (kworker), as a share.
    HOPS=
    if command -v perf >/dev/null && perf list 2>/dev/null | grep iomap:iomap_dio_complete >/dev/null; then
        ino=$(stat -c %i "$WORK/raw.img")
        for op in write read; do
            for p in uring posix; do
                share=$(perf record -q -a -e iomap:iomap_dio_complete --filter "ino == $ino" -o "$WORK/hops.data" -- \
                    "$IOLIFT" accelfs lat --direct on --io "$p" --op "$op" --bs 4K --count "$COUNT" --span "$SPAN" "$WORK/raw.img" \
                    >/dev/null 2>&1 && perf script -i "$WORK/hops.data" -F comm 2>/dev/null |
                    awk '{t++; if ($1 ~ /^kworker/) k++} END {if (t) printf "%.2f (of %d)", k / t, t; else print "none"}' || true)
                HOPS+=" $p-$op ${share:-failed}"
            done
        done
    fi
    echo "== load at the end $(cut -d' ' -f1-3 /proc/loadavg)"
    "$PY" - "$WORK/lat.txt" <<'PY'
import statistics, sys
cells = {}
for line in open(sys.argv[1]):
    w = line.split()
    d = dict(zip(w[3::2], w[4::2]))
    cells.setdefault((w[0], w[1], w[2]), []).append(
        (float(d["p50_us"]), float(d["mean_us"]), float(d.get("cpu_us", "nan"))))
med = lambda p, op, bs, k: statistics.median(x[k] for x in cells[p, op, bs])
print("p50 / mean latency in us, medians over repeats")
print(f"{'op':<11} {'size':>5} {'uring':>15} {'posix':>15} {'uring/posix':>12} {'accelfs':>15} {'ext4':>15} {'accelfs/ext4':>13}")
seen = []
for (p, op, bs) in cells:
    if (op, bs) not in seen and not p.startswith("fio-"):
        seen.append((op, bs))
for op, bs in seen:
    v = {p: (med(p, op, bs, 0), med(p, op, bs, 1)) for p in ["uring", "posix", "accelfs", "ext4"]}
    f = lambda p: f"{v[p][0]:.1f}/{v[p][1]:.1f}"
    print(f"{op:<11} {bs:>5} {f('uring'):>15} {f('posix'):>15} {v['uring'][0] / v['posix'][0]:>11.2f}x"
          f" {f('accelfs'):>15} {f('ext4'):>15} {v['accelfs'][0] / v['ext4'][0]:>12.2f}x")
print()
print("CPU time per request in us (user + system, all threads), medians over repeats")
print(f"{'op':<11} {'size':>5} {'uring':>9} {'posix':>9} {'uring/posix':>12} {'accelfs':>9} {'ext4':>9} {'spin':>9} {'sqspin':>9}")
for op, bs in seen:
    c = {p: med(p, op, bs, 2) for p in ["uring", "posix", "accelfs", "ext4", "spin", "sqspin"]}
    print(f"{op:<11} {bs:>5} {c['uring']:>9.2f} {c['posix']:>9.2f} {c['uring'] / c['posix']:>11.2f}x"
          f" {c['accelfs']:>9.2f} {c['ext4']:>9.2f} {c['spin']:>9.2f} {c['sqspin']:>9.2f}")
print()
print("spinning reaper (spin), SQPOLL + spinning reaper (sqspin) and DEFER_TASKRUN (dtask) against pread/pwrite: p50 / mean in us, ratios of p50 and of CPU per request")
print(f"{'op':<11} {'size':>5} {'spin':>15} {'spin/posix':>11} {'cpu':>7} {'sqspin':>15} {'sqspin/posix':>13} {'cpu':>7} {'dtask':>15} {'dtask/posix':>13} {'cpu':>7}")
for op, bs in seen:
    row = f"{op:<11} {bs:>5}"
    for p in ["spin", "sqspin", "dtask"]:
        row += (f" {med(p, op, bs, 0):>7.1f}/{med(p, op, bs, 1):<7.1f}"
                f" {med(p, op, bs, 0) / med('posix', op, bs, 0):>{10 if p == 'spin' else 12}.2f}x"
                f" {med(p, op, bs, 2) / med('posix', op, bs, 2):>6.2f}x")
    print(row)
print()
for p, what in [("uring", "engine"), ("dtask", "engine with DEFER_TASKRUN"),
               ("spin", "engine with a spinning reaper"),
                ("sqspin", "engine with SQPOLL + spinning reaper")]:
    for op in ["read", "write"]:
        if (op, "4K") not in seen:
            continue
        r = med(p, op, "4K", 0) / med("posix", op, "4K", 0)
        c = med(p, op, "4K", 2) / med("posix", op, "4K", 2)
        print(f"target: {what} QD1 4K {op} p50 <= 0.8x pread/pwrite (O_DIRECT, same file): "
              f"{r:.2f}x (CPU per request {c:.2f}x) {'met' if r <= 0.8 else 'NOT MET'}")
fio = sorted({p for (p, _, _) in cells if p.startswith("fio-")})
if fio:
    print()
    print("the floor: fio on the same file, 4K QD1 O_DIRECT; p50 / mean latency in us (submission to completion), ratio of p50 to fio's psync, CPU per request")
    print(f"{'fio engine':<18} {'read':>13} {'/psync':>7} {'cpu':>7} {'write':>13} {'/psync':>7} {'cpu':>7}")
    for p in fio:
        row = f"{p[4:]:<18}"
        for op in ["read", "write"]:
            row += (f" {med(p, op, '4K', 0):>6.1f}/{med(p, op, '4K', 1):<6.1f}"
                    f" {med(p, op, '4K', 0) / med('fio-psync', op, '4K', 0):>6.2f}x"
                    f" {med(p, op, '4K', 2):>7.2f}")
        print(row)
    for op in ["read", "write"]:
        best = min((p for p in fio if p != "fio-psync"), key=lambda p: med(p, op, "4K", 0))
        r = med(best, op, "4K", 0) / med("fio-psync", op, "4K", 0)
        print(f"floor: the fastest io_uring submission fio has here ({best[4:]}) reaches {r:.2f}x of psync's 4K {op} p50"
              f" ({med(best, op, '4K', 0):.1f} against {med('fio-psync', op, '4K', 0):.1f} us; our {'pread' if op == 'read' else 'pwrite'} path {med('posix', op, '4K', 0):.1f} us):"
              f" <= 0.8x is {'within' if r <= 0.8 else 'beyond'} what this device gives any io_uring user")
PY
    if [[ -n $HOPS ]]; then
        echo
        echo "kernel: share of 4K direct-I/O completions on raw.img run by a kernel worker (perf, one run each; 1.00: each woke a worker before the caller):$HOPS"
    else
        echo
        echo "kernel: perf (or its iomap tracepoints) missing: where completions run was not counted"
    fi
    exit 0
fi

# FIG=7: the streaming application (HAYAGUI's Figure 7), CPU paths: a
# FASTA-like file of STREAM_SIZE (default 2G) made by `iolift accelfs
# gen-fasta`, counted by `iolift accelfs stream` with --io uring --direct on
# (the engine, O_DIRECT, registered buffers, 4 reads of 64 KiB in flight),
# --io uring --direct off (the engine through the page cache) and --io read
# (read(2) into pageable memory), the file's pages dropped from the page
# cache (fadvise DONTNEED) before every run, order rotating; medians of R,
# GB/s ratios against read, peak RSS. The GPU path is not built.
if [[ ${FIG:-} == 7 ]]; then
    WORK=$(mktemp -d /var/tmp/iolift-stream-bench.XXXXXX)
    trap 'rm -rf "$WORK"' EXIT
    F=$WORK/genome.fa
    echo "== generating $F (${STREAM_SIZE:-2G})" >&2
    "$IOLIFT" accelfs gen-fasta --size "${STREAM_SIZE:-2G}" "$F" >"$WORK/gen.txt"
    MODES=("uring-direct --io uring --direct on" "uring-cached --io uring --direct off" "read --io read")
    echo "== $R repeats, $(cat "$WORK/gen.txt"), $PROFILE build, $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"
    for rep in $(seq 1 "$R"); do
        for i in 0 1 2; do
            set -- ${MODES[$(((i + rep) % 3))]}
            name=$1; shift
            "$PY" -c 'import os, sys; fd = os.open(sys.argv[1], os.O_RDONLY); os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)' "$F"
            /usr/bin/time -f "peak_rss_kib %M" "$IOLIFT" accelfs stream "$@" "$F" >"$WORK/$name.$rep.txt" 2>&1
            echo "   $name rep $rep: $(head -1 "$WORK/$name.$rep.txt")" >&2
        done
    done
    echo "== load at the end $(cut -d' ' -f1-3 /proc/loadavg)"
    "$PY" - "$WORK" "$R" <<'PY'
import re, statistics, sys
work, reps = sys.argv[1], int(sys.argv[2])
want = open(f"{work}/gen.txt").read().split()[:6]
gbs, rss = {}, {}
for m in ["uring-direct", "uring-cached", "read"]:
    for r in range(1, reps + 1):
        text = open(f"{work}/{m}.{r}.txt").read()
        if text.split()[:6] != want:
            sys.exit(f"{m} rep {r}: counts differ from the generator's: {text}")
        gbs.setdefault(m, []).append(float(re.search(r"GB/s ([0-9.]+)", text).group(1)))
        rss.setdefault(m, []).append(int(re.search(r"peak_rss_kib (\d+)", text).group(1)) / 1024)
base = statistics.median(gbs["read"])
print(f"{'path':<14} {'GB/s':>8} {'vs read':>8}  per repeat")
for m in gbs:
    g = statistics.median(gbs[m])
    print(f"{m:<14} {g:>8.3f} {g / base:>7.2f}x  {', '.join(f'{x:.3f}' for x in gbs[m])}")
for m in rss:
    print(f"peak RSS {m:<14} median {statistics.median(rss[m]):.1f} MiB")
PY
    exit 0
fi

WORK=$(mktemp -d /var/tmp/iolift-direct-bench.XXXXXX)
. bench/lib.sh
IMG=$WORK/disk.img
cleanup() {
    if [[ -n $SERVER_PID ]]; then kill "$SERVER_PID" 2>/dev/null || true; wait "$SERVER_PID" 2>/dev/null || true; fi
    rm -f "$IMG"
    if [[ -z ${KEEP:-} ]]; then rm -rf "$WORK"; else echo "results kept in $WORK" >&2; fi
}
trap cleanup EXIT

peak_rss_kib() { awk '/^VmHWM:/ { print $2 }' "/proc/$1/status"; }

start_server() { # $1 = threads|uring, $2 = socket
    local spec="file:$IMG,size=$SIZE$OPTS"
    [[ $1 == uring ]] && spec="$spec,engine=uring${EXTRA:-}"
    rm -f "$2"
    "$IOLIFT" serve --socket "$2" --threads "$THREADS" "$spec" 2>"$WORK/$1.log" &
    SERVER_PID=$!
    wait_socket "$1" "$2"
}

JOBS=(
    "randread_4k_qd1 randread 4k 1"
    "randwrite_4k_qd1 randwrite 4k 1"
    "randread_4k_qd32 randread 4k 32"
    "randwrite_4k_qd32 randwrite 4k 32"
)

run_one() { # engine rep
    local eng=$1 rep=$2 sock=$WORK/$1.sock
    start_server "$eng" "$sock"
    local uri="nbd+unix:///?socket=$sock"
    for j in "${JOBS[@]}"; do
        set -- $j
        local c0 c1
        c0=$(cpu_ticks "$SERVER_PID")
        fio --name="$1" --ioengine=nbd --uri="$uri" --rw="$2" --bs="$3" --iodepth="$4" \
            --size="$SIZE" --time_based --runtime="$RUNTIME" --norandommap --randrepeat=0 \
            --output-format=json >"$WORK/${eng}_${rep}_$1.json"
        c1=$(cpu_ticks "$SERVER_PID")
        echo $((c1 - c0)) >"$WORK/${eng}_${rep}_$1.cpu"
        echo "   $eng rep $rep $1 done" >&2
    done
    peak_rss_kib "$SERVER_PID" >"$WORK/${eng}_${rep}.rss"
    stop_server
}

echo "== $R repeats x ${#JOBS[@]} jobs x ${RUNTIME}s, image $SIZE on $(df --output=fstype "$WORK" | tail -1), options '${OPTS#,}' uring extra '${EXTRA:-}', $PROFILE build, $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)" >&2
start_server threads "$WORK/fill.sock"
fio --name=fill --ioengine=nbd --uri="nbd+unix:///?socket=$WORK/fill.sock" --rw=write --bs=1M \
    --iodepth=8 --size="$SIZE" --output-format=json >"$WORK/fill.json"
stop_server
for rep in $(seq 1 "$R"); do
    if (( rep % 2 )); then order="threads uring"; else order="uring threads"; fi
    for eng in $order; do run_one "$eng" "$rep"; done
done
echo "== load at the end $(cut -d' ' -f1-3 /proc/loadavg)" >&2

"$PY" - "$WORK" "$R" "$(getconf CLK_TCK)" <<'PY'
import json, os, statistics, sys
work, reps, tck = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
jobs = ["randread_4k_qd1", "randwrite_4k_qd1", "randread_4k_qd32", "randwrite_4k_qd32"]
engines = ["threads", "uring"]

def one(eng, rep, job):
    text = open(f"{work}/{eng}_{rep}_{job}.json").read()
    # fio may print notices before its JSON
    d = json.loads(text[text.index("{"):])["jobs"][0]
    side = d["read"] if d["read"]["io_bytes"] else d["write"]
    ios = side["total_ios"]
    cpu = int(open(f"{work}/{eng}_{rep}_{job}.cpu").read()) / tck
    pct = side["clat_ns"].get("percentile", {})
    return {
        "iops": side["iops"],
        "p50": pct.get("50.000000", 0) / 1000,
        "p99": pct.get("99.000000", 0) / 1000,
        "cpu_us": cpu * 1e6 / ios if ios else 0,
    }

med = {}
for e in engines:
    for j in jobs:
        rs = [one(e, r, j) for r in range(1, reps + 1)]
        med[e, j] = {k: statistics.median(x[k] for x in rs) for k in rs[0]}
print(f"{'job':<20} {'metric':<8} {'threads':>10} {'uring':>10} {'uring/threads':>14}")
for j in jobs:
    for k, label in [("iops", "IOPS"), ("p50", "p50 us"), ("p99", "p99 us"), ("cpu_us", "CPU us/IO")]:
        a, b = med["threads", j][k], med["uring", j][k]
        ratio = f"{b / a:.2f}x" if a else "-"
        print(f"{j:<20} {label:<8} {a:>10.1f} {b:>10.1f} {ratio:>14}")
for e in engines:
    rss = [int(open(f"{work}/{e}_{r}.rss").read()) for r in range(1, reps + 1)]
    print(f"peak RSS {e:<8} median {statistics.median(rss) / 1024:.1f} MiB (per repeat: {', '.join(f'{x / 1024:.1f}' for x in rss)})")
PY
