#!/usr/bin/env bash
# NBD benchmark: iolift (memory backend) vs `nbdkit memory`, same fio jobs,
# same run, alternating servers, medians + ratios. Not a test: see docs/testing.md.
#
#   bench/nbd.sh                 # 3 repeats, 4 s per job (about 5 minutes)
#   R=5 RUNTIME=10 bench/nbd.sh  # more repeats, longer jobs
#   KEEP=1 bench/nbd.sh          # keep the fio JSON files (path printed)
#   BUSY=1 bench/nbd.sh          # the same under a fixed competing load
#                                # (stress-ng --cpu <cores>, see bench/lib.sh)
#   ONLY='_4k_qd(1|32)$' bench/nbd.sh   # only the jobs whose name matches
#   IOLIFT_ARGS="--poll-us 50" bench/nbd.sh  # extra flags for the iolift column
#   IOLIFT=PATH bench/nbd.sh     # this iolift binary, no build step
#   FLOOR=1 bench/nbd.sh         # QD1 floor: a minimal responder, nbdkit
#                                # null/memory, iolift null/memory (below)
#
# Per repeat and server: start a fresh server on a unix socket with a 1 GiB
# export, fill it with fio (so reads return real data), then run
#   4k randread/randwrite at iodepth 1 (IOPS, p50/p99 completion latency),
#   4k randread/randwrite at iodepth 32 (IOPS), from one fio process and
#     connection (the target) and from two (`..._qd32x2`, the
#     total of both: one fio process is the limit at QD32 on this
#     machine, two show more of what the server costs),
#   128k sequential read/write at iodepth 8 (MB/s),
# each with fio ioengine=nbd, one connection, and record the server's CPU
# time (utime+stime from /proc/PID/stat) over each job. The order of the two
# servers flips every repeat (A B, B A, ...) so drift on a shared machine
# hits both. Summary: bench/fio_summary.py.
#
# iolift runs with its defaults (poll mode off since 2026-11-25, see
# docs/nbd.md). A third server, `alt`, runs every job after each pair:
# `iolift serve --poll-us auto` (adaptive poll mode; its column shows what
# polling buys and costs; ALT_ARGS="..." gives it other flags, e.g.
# ALT_ARGS="--poll-us 100" for a fixed budget), or, with BASE=PATH, another iolift binary (e.g. a build
# of an earlier commit) with its defaults, so a change is compared with the
# code before it in the same run (column iolift/alt). ALT=0 skips it. The summary also prints fio's own CPU use at
# QD32: near 100% of a core, the client is the limit and no server can
# raise IOPS much. After it: each server's peak RSS (VmHWM, median over its
# runs) and the targets (docs/measurements/nbd.md): on a quiet machine QD1
# p50 <= 0.5x nbdkit's, QD32 IOPS from two fio processes >= 2x, server CPU
# per I/O at QD32 <= 0.5x; with BUSY=1 every QD1/QD32 IOPS ratio >= 1.0x
# and QD1 p99 <= 1.0x. Last, with alt, the default against alt (the
# default must not be worse than polling; a NOT MET line there says
# polling would have paid in that run): IOPS >= 0.95x alt's, QD1 p50/p99
# <= 1.05x. Last, per job and server, the kernel's scheduler counters of
# every server and fio thread over the middle of the job (sched_snap), per
# I/O: CPU time, time runnable but kept waiting for a CPU, sleeps,
# preemptions, fio's CPU and wait, and the cores server and fio used
# together (near the machine's core count: CPU-bound).
set -euo pipefail
cd "$(dirname "$0")/.."

R=${R:-3}
RUNTIME=${RUNTIME:-4}
SIZE=${SIZE:-1G}
THREADS=${THREADS:-2}
TARGET=${CARGO_TARGET_DIR:-target}
ALT_ARGS=${ALT_ARGS:---poll-us auto}
IOLIFT_ARGS=${IOLIFT_ARGS:-}
ONLY=${ONLY:-}
# IOLIFT=PATH: run this iolift binary as is (no build step).
BUILD=1; [[ -n ${IOLIFT:-} ]] && BUILD=0
IOLIFT=${IOLIFT:-$TARGET/release/iolift}
PY=/usr/bin/python3; [[ -x $PY ]] || PY=python3

for t in fio nbdkit; do
    command -v $t >/dev/null || { echo "missing $t: run scripts/test.sh, which installs it" >&2; exit 1; }
done
fio --enghelp=nbd >/dev/null 2>&1 || { echo "this fio has no nbd engine" >&2; exit 1; }

if (( BUILD )); then
    echo "== building iolift (release)" >&2
    cargo build --release -p iolift >&2
fi

WORK=$(mktemp -d /tmp/iolift-bench.XXXXXX)
. bench/lib.sh
cleanup() {
    if [[ -n $SERVER_PID ]]; then kill "$SERVER_PID" 2>/dev/null || true; wait "$SERVER_PID" 2>/dev/null || true; fi
    stop_busy
    if [[ -z ${KEEP:-} ]]; then rm -rf "$WORK"; else echo "results kept in $WORK" >&2; fi
}
trap cleanup EXIT


start_server() { # $1 = iolift|nbdkit, $2 = socket
    rm -f "$2"
    case $1 in
        iolift) "$IOLIFT" serve --socket "$2" --threads "$THREADS" $IOLIFT_ARGS "memory:$SIZE" 2>"$WORK/$1.log" & ;;
        alt) if [[ -n ${BASE:-} ]]; then
                 "$BASE" serve --socket "$2" --threads "$THREADS" "memory:$SIZE" 2>"$WORK/$1.log" &
             else
                 "$IOLIFT" serve --socket "$2" --threads "$THREADS" $ALT_ARGS "memory:$SIZE" 2>"$WORK/$1.log" &
             fi ;;
        nbdkit) nbdkit -f -U "$2" memory "$SIZE" 2>"$WORK/$1.log" & ;;
    esac
    SERVER_PID=$!
    wait_socket "$1" "$2"
}

# name rw bs iodepth [numjobs: fio processes, one connection each]
JOBS=(
    "randread_4k_qd1 randread 4k 1"
    "randwrite_4k_qd1 randwrite 4k 1"
    "randread_4k_qd32 randread 4k 32"
    "randwrite_4k_qd32 randwrite 4k 32"
    "randread_4k_qd32x2 randread 4k 32 2"
    "randwrite_4k_qd32x2 randwrite 4k 32 2"
    "seqread_128k_qd8 read 128k 8"
    "seqwrite_128k_qd8 write 128k 8"
)
if [[ -n $ONLY ]]; then
    kept=()
    for j in "${JOBS[@]}"; do [[ ${j%% *} =~ $ONLY ]] && kept+=("$j"); done
    JOBS=("${kept[@]}")
    (( ${#JOBS[@]} )) || { echo "ONLY=$ONLY matches no job" >&2; exit 1; }
fi

# sched_snap SERVER_PID FIO_PID: one line per thread of the server and of
# fio (its main process and its job processes), in one awk so that taking
# it costs the measured job one fork:
#   ROLE TID WALL_NS RUN_NS RUNQ_WAIT_NS VOLUNTARY INVOLUNTARY
# from /proc/PID/task/TID/schedstat (time on a CPU, time runnable but
# waiting for one) and .../status (context switches).
sched_snap() {
    local files=() p t
    for p in "$1" "$2" $(pgrep -P "$2" 2>/dev/null); do
        for t in /proc/"$p"/task/*; do files+=("$t/schedstat" "$t/status"); done
    done
    awk -v srv="$1" -v now="$(date +%s%N)" '
        FNR == 1 { split(FILENAME, f, "/"); key = f[3] " " f[5] }
        FILENAME ~ /schedstat$/ { run[key] = $1; wait[key] = $2 }
        /^voluntary_ctxt_switches/ { vol[key] = $2 }
        /^nonvoluntary_ctxt_switches/ { inv[key] = $2 }
        END { for (k in run) { split(k, a, " ");
              print (a[1] == srv ? "server" : "fio"), a[2], now, run[k], wait[k], vol[k] + 0, inv[k] + 0 } }
    ' "${files[@]}" 2>/dev/null || true
}

run_one() { # server rep
    local srv=$1 rep=$2 sock=$WORK/$1.sock
    start_server "$srv" "$sock"
    local uri="nbd+unix:///?socket=$sock"
    # precondition: write the whole export once
    fio --name=fill --ioengine=nbd --uri="$uri" --rw=write --bs=1M --iodepth=8 \
        --size="$SIZE" --output-format=json >"$WORK/fill.json"
    for j in "${JOBS[@]}"; do
        set -- $j
        local c0 c1
        c0=$(cpu_ticks "$SERVER_PID")
        fio --name="$1" --ioengine=nbd --uri="$uri" --rw="$2" --bs="$3" --iodepth="$4" \
            --numjobs="${5:-1}" --group_reporting --size="$SIZE" --time_based --runtime="$RUNTIME" --norandommap --randrepeat=0 \
            --output-format=json >"$WORK/${srv}_${rep}_$1.json" &
        local fio_pid=$!
        # scheduler counters of every server and fio thread over the middle
        # of the job (threads that exist at both snapshots; see sched_snap):
        # from 0.3 s after fio forked its job processes (its start-up before
        # that varies with the load) to 0.5 s before their end
        for _ in $(seq 100); do pgrep -P "$fio_pid" >/dev/null && break; sleep 0.05; done
        sleep 0.3
        sched_snap "$SERVER_PID" "$fio_pid" >"$WORK/${srv}_${rep}_$1.sched0"
        sleep "$(awk -v r="$RUNTIME" 'BEGIN { print (r > 1.6 ? r - 0.8 : 0.5) }')"
        sched_snap "$SERVER_PID" "$fio_pid" >"$WORK/${srv}_${rep}_$1.sched1"
        wait "$fio_pid"
        c1=$(cpu_ticks "$SERVER_PID")
        echo $((c1 - c0)) >"$WORK/${srv}_${rep}_$1.cpu"
        echo "   $srv rep $rep $1 done" >&2
    done
    peak_kib "$SERVER_PID" >"$WORK/${srv}_${rep}.rss"
    stop_server
}

# FLOOR=1: what QD1 p50 any server can reach through this client and
# kernel path, instead of the jobs above. 4k randread/randwrite at QD1
# (RUNTIME s, R repeats, servers in a rotating order) against:
#   floor        a minimal responder (C, compiled here with cc): one thread
#                per connection, blocking recv of each request, one
#                writev/send of its reply, zeros for reads, writes dropped;
#                no thread hand-off, no event loop: the least a server can
#                do. It agrees to structured replies as iolift and nbdkit
#                do (reads answered with one OFFSET_DATA chunk), since
#                libnbd receives those in four recvs against two for a
#                simple reply
#   floor-simple the same, refusing structured replies (simple replies)
#   floor-spin   floor, spinning on a non-blocking recv (never sleeps)
#   nbdkit-null, nbdkit (memory), iolift-null, iolift-null-auto
#   (--poll-us auto), iolift (memory), each with the flags used above,
#   each export written once first (as above).
# Prints per server: IOPS, p50, p99, fio's own CPU per I/O (the client's
# share of each round trip), the server's CPU per I/O, and p50 as a ratio
# of nbdkit memory's; then whether the floor reaches 0.5x.

start_floor_server() { # $1 = server name, $2 = socket
    rm -f "$2"
    case $1 in
        floor) "$WORK/floor" "$2" 0 1 2>"$WORK/$1.log" & ;;
        floor-simple) "$WORK/floor" "$2" 0 0 2>"$WORK/$1.log" & ;;
        floor-spin) "$WORK/floor" "$2" 1 1 2>"$WORK/$1.log" & ;;
        nbdkit-null) nbdkit -f -U "$2" null "$SIZE" 2>"$WORK/$1.log" & ;;
        nbdkit) nbdkit -f -U "$2" memory "$SIZE" 2>"$WORK/$1.log" & ;;
        iolift-null) "$IOLIFT" serve --socket "$2" --threads "$THREADS" $IOLIFT_ARGS "null:$SIZE" 2>"$WORK/$1.log" & ;;
        iolift-null-auto) "$IOLIFT" serve --socket "$2" --threads "$THREADS" --poll-us auto "null:$SIZE" 2>"$WORK/$1.log" & ;;
        iolift) "$IOLIFT" serve --socket "$2" --threads "$THREADS" $IOLIFT_ARGS "memory:$SIZE" 2>"$WORK/$1.log" & ;;
    esac
    SERVER_PID=$!
    wait_socket "$1" "$2"
}

run_floor() {
    local servers=(nbdkit-null nbdkit iolift-null iolift-null-auto iolift)
    if command -v cc >/dev/null && cc -O2 -pthread -o "$WORK/floor" bench/nbd-floor.c; then
        servers=(floor floor-simple floor-spin "${servers[@]}")
    else
        echo "no C compiler (or it failed): running without the minimal responder" >&2
    fi
    echo "== FLOOR: $R repeats x ${#servers[@]} servers x 2 jobs x ${RUNTIME}s, $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)${BUSY:+, BUSY=$BUSY}" >&2
    start_busy
    local n=${#servers[@]}
    for rep in $(seq 1 "$R"); do
        for i in $(seq 0 $((n - 1))); do
            local srv=${servers[$(((i + rep - 1) % n))]} sock=$WORK/floor.sock
            start_floor_server "$srv" "$sock"
            # as in the jobs above: reads return written data, writes
            # overwrite (no page allocation on the measured path)
            fio --name=fill --ioengine=nbd --uri="nbd+unix:///?socket=$sock" --rw=write --bs=1M --iodepth=8 \
                --size="$SIZE" --output-format=json >"$WORK/fill.json" 2>/dev/null
            for rw in randread randwrite; do
                local c0 c1
                c0=$(cpu_ticks "$SERVER_PID")
                fio --name="${rw}_4k_qd1" --ioengine=nbd --uri="nbd+unix:///?socket=$sock" --rw=$rw --bs=4k \
                    --iodepth=1 --size="$SIZE" --time_based --runtime="$RUNTIME" --norandommap --randrepeat=0 \
                    --output-format=json >"$WORK/floor_${srv}_${rep}_$rw.out" 2>/dev/null
                c1=$(cpu_ticks "$SERVER_PID")
                echo $((c1 - c0)) >"$WORK/floor_${srv}_${rep}_$rw.cpu"
            done
            echo "   $srv rep $rep done" >&2
            stop_server
        done
    done
    stop_busy
    echo "== done, load $(cut -d' ' -f1-3 /proc/loadavg)" >&2
    "$PY" - "$WORK" "$(getconf CLK_TCK)" "${servers[@]}" <<'EOF'
import glob, json, os, statistics, sys
d, clk, servers = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
rows = {}
for f in glob.glob(os.path.join(d, "floor_*.out")):
    srv, rep, rw = os.path.basename(f)[len("floor_"):-len(".out")].rsplit("_", 2)
    text = open(f).read()
    j = json.loads(text[text.index("{"):])["jobs"][0]
    io = j["read" if rw == "randread" else "write"]
    n = max(io["total_ios"], 1)
    secs = j["job_runtime"] / 1000
    ticks = int(open(f[:-4] + ".cpu").read())
    pct = io["clat_ns"]["percentile"]
    rows.setdefault((srv, rw), []).append((
        io["iops"], pct["50.000000"] / 1000, pct["99.000000"] / 1000,
        (j["usr_cpu"] + j["sys_cpu"]) / 100 * secs / n * 1e6, ticks / clk / n * 1e6))
med = {k: [statistics.median(c) for c in zip(*v)] for k, v in rows.items()}
for rw in ("randread", "randwrite"):
    base = med.get(("nbdkit", rw))
    print("\n4k %s QD1, medians of %d (p50 ratio: to nbdkit memory's)" % (rw, len(rows.get(("nbdkit", rw), []))))
    print("  %-17s %8s %8s %8s %12s %12s %9s" % ("server", "IOPS", "p50 us", "p99 us", "fio CPU/IO", "srv CPU/IO", "p50 ratio"))
    for s in servers:
        m = med.get((s, rw))
        if m:
            print("  %-17s %8.0f %8.1f %8.1f %12.1f %12.1f %9s" % (s, *m, "%.2f" % (m[1] / base[1]) if base else "-"))
    f = med.get(("floor", rw))
    if f and base:
        x = f[1] / base[1]
        print("  floor p50 / nbdkit p50 = %.2f: 0.5x is %s through this client and kernel path" % (
            x, "reachable" if x <= 0.5 else "NOT reachable"))
EOF
}

if [[ ${FLOOR:-0} != 0 ]]; then
    run_floor
    exit 0
fi

echo "== $R repeats x ${#JOBS[@]} jobs x ${RUNTIME}s, export $SIZE, $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)${BUSY:+, BUSY=$BUSY}" >&2
start_busy
for rep in $(seq 1 "$R"); do
    if (( rep % 2 )); then order="iolift nbdkit"; else order="nbdkit iolift"; fi
    if [[ ${ALT:-${NOPOLL:-1}} != 0 ]]; then order="$order alt"; fi
    for srv in $order; do run_one "$srv" "$rep"; done
done
stop_busy
echo "== done, load $(cut -d' ' -f1-3 /proc/loadavg)" >&2

ALT_LABEL="iolift $ALT_ARGS"
[[ -n ${BASE:-} ]] && ALT_LABEL="$BASE (defaults)"
"$PY" bench/fio_summary.py "$WORK" --clk-tck "$(getconf CLK_TCK)" --repeats "$R" --alt-label "$ALT_LABEL" \
    --json "$WORK/summary.json"
"$PY" - "$WORK" "${BUSY:-0}" <<'EOF'
import glob, json, os, statistics, sys
d, busy = sys.argv[1], sys.argv[2] not in ("", "0")
print()
print("peak RSS (VmHWM, median over runs, MiB):", ", ".join(
    "%s %.1f" % (srv, statistics.median(v) / 1024)
    for srv in ("iolift", "nbdkit", "alt")
    for v in [[int(open(f).read()) for f in glob.glob(os.path.join(d, srv + "_*.rss"))]] if v))
s = json.load(open(os.path.join(d, "summary.json")))
def r(job, key, who="ratio"):
    return s.get(job, {}).get(key, {}).get(who)
if busy:
    t = [(j, "iops", ">= 1.0", lambda x: x >= 1.0) for j in (
        "randread_4k_qd1", "randwrite_4k_qd1", "randread_4k_qd32", "randwrite_4k_qd32",
        "randread_4k_qd32x2", "randwrite_4k_qd32x2")]
    t += [(j, "p99_us", "<= 1.0", lambda x: x <= 1.0) for j in ("randread_4k_qd1", "randwrite_4k_qd1")]
else:
    t = [(j, "p50_us", "<= 0.5", lambda x: x <= 0.5) for j in ("randread_4k_qd1", "randwrite_4k_qd1")]
    t += [(j, "iops", ">= 2.0", lambda x: x >= 2.0) for j in ("randread_4k_qd32x2", "randwrite_4k_qd32x2")]
    t += [(j, "cpu_us_per_io", "<= 0.5", lambda x: x <= 0.5) for j in ("randread_4k_qd32", "randwrite_4k_qd32")]
print("targets, %s machine (ratio iolift / nbdkit; alt / nbdkit in brackets):" % ("busy" if busy else "quiet"))
for job, key, want, ok in t:
    x, a = r(job, key), r(job, key, "alt_ratio")
    print("  %-22s %-14s ratio %-5s %-8s want %s  [alt %s]" % (
        job, key, "-" if x is None else "%.2f" % x,
        "not run" if x is None else "met" if ok(x) else "NOT MET", want, "-" if a is None else "%.2f" % a))
# Scheduler counters (sched_snap): what each server and its fio did with
# the CPU over the middle of each job, per I/O: time on a CPU, time
# runnable but waiting for one (behind the other threads of the machine,
# e.g. BUSY=1's stress-ng), voluntary switches (sleeps) and involuntary
# ones (preemptions); "cores" is server + fio time on a CPU per second of
# wall time (at most the machine's cores: near it, the pair is CPU-bound
# and IOPS is set by their CPU per I/O).
def snap(f):
    out = {}
    for line in open(f):
        role, tid, now, run, wait, vol, inv = line.split()
        out[(role, tid)] = (int(now), int(run), int(wait), int(vol), int(inv))
    return out
cells = {}
for f0 in glob.glob(os.path.join(d, "*.sched0")):
    base = f0[:-len(".sched0")]
    srv, rep, job = os.path.basename(base).split("_", 2)
    try:
        a, b = snap(f0), snap(base + ".sched1")
        text = open(base + ".json").read()
        jb = json.loads(text[text.index("{"):])["jobs"][0]
    except (OSError, ValueError):
        continue
    iops = jb["read"]["iops"] + jb["write"]["iops"]
    common = [k for k in a if k in b]
    if not common or not iops:
        continue
    wall = (max(b[k][0] for k in common) - min(a[k][0] for k in common)) / 1e9
    ios = iops * wall
    tot = {}
    for k in common:
        t = tot.setdefault(k[0], [0, 0, 0, 0])
        for i in range(4):
            t[i] += b[k][i + 1] - a[k][i + 1]
    sv, fo = tot.get("server", [0] * 4), tot.get("fio", [0] * 4)
    cells.setdefault((job, srv), []).append((
        sv[0] / ios / 1e3, sv[1] / ios / 1e3, sv[2] / ios, sv[3] / ios,
        fo[0] / ios / 1e3, fo[1] / ios / 1e3, (sv[0] + fo[0]) / wall / 1e9))
if cells:
    order = ["randread_4k_qd1", "randwrite_4k_qd1", "randread_4k_qd32", "randwrite_4k_qd32",
             "randread_4k_qd32x2", "randwrite_4k_qd32x2", "seqread_128k_qd8", "seqwrite_128k_qd8"]
    print("\nscheduler counters over the middle of each job (per I/O, medians; %d cores):" % os.cpu_count())
    print("  %-20s %-7s %8s %8s %7s %7s %8s %8s %6s" % (
        "job", "server", "CPU us", "runq us", "sleeps", "preempt", "fio CPU", "fio runq", "cores"))
    for job in sorted({j for j, _ in cells}, key=lambda j: order.index(j) if j in order else 99):
        for srv in ("iolift", "nbdkit", "alt"):
            v = cells.get((job, srv))
            if v:
                m = [statistics.median(c) for c in zip(*v)]
                print("  %-20s %-7s %8.2f %8.2f %7.2f %7.2f %8.2f %8.2f %6.2f" % (job, srv, *m))
# The default (poll mode off) must not be worse than alt (by default
# --poll-us auto): IOPS >= 0.95x alt's, QD1 p50 and p99
# <= 1.05x (5% for the noise of alternating runs).
if any(r(j, "iops", "iolift_over_alt") for j in s):
    print("default vs alt (iolift / alt; want IOPS >= 0.95, latency <= 1.05):")
    for job in ("randread_4k_qd1", "randwrite_4k_qd1", "randread_4k_qd32", "randwrite_4k_qd32"):
        for key in ("iops", "p50_us", "p99_us") if job.endswith("qd1") else ("iops",):
            v = r(job, key, "iolift_over_alt")
            if v is None:
                continue
            ok = v >= 0.95 if key == "iops" else v <= 1.05
            print("  %-22s %-14s %.2f  %s" % (job, key, v, "met" if ok else "NOT MET"))
EOF
