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
# <= 1.05x.
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
            --output-format=json >"$WORK/${srv}_${rep}_$1.json"
        c1=$(cpu_ticks "$SERVER_PID")
        echo $((c1 - c0)) >"$WORK/${srv}_${rep}_$1.cpu"
        echo "   $srv rep $rep $1 done" >&2
    done
    peak_kib "$SERVER_PID" >"$WORK/${srv}_${rep}.rss"
    stop_server
}

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
        "met" if x is not None and ok(x) else "NOT MET", want, "-" if a is None else "%.2f" % a))
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
