#!/usr/bin/env bash
# qcow2 4 KiB random I/O over NBD, side by side in one run, alternating
# servers each repeat, every server with O_DIRECT (DIRECT=1, default):
#   qemu     qemu-nbd --cache=none --aio=$QAIO (native unless QAIO=threads)
#            on the qcow2 image (the peer)
#   qemuu    qemu-nbd --cache=none --aio=io_uring: the peer's other fast
#            engine; each cell compares iolift with the faster of qemu and
#            qemuu there (the "peer" column)
#   cp       iolift qcow2:IMG,cache=0: every request under the control plane
#   miss     iolift qcow2:IMG,cache=16,paths=1: the fast path, nearly always missing
#   hit      (MAIN_SERVERS="... hit ...") iolift qcow2:IMG,cache=ENTRIES,paths=1
#            after a warm-up read: every mapping in one cache shared by
#            the workers, engine=threads
#   hitw     (MAIN_SERVERS="... hitw ...") iolift qcow2:IMG,cache=ENTRIES,
#            paths=4,engine=threads: one cache per worker, every request on
#            the blocking pool, warmed the same way
#   hitu     iolift's default with direct (engine=uring): hits through
#            io_uring from the thread that read the request; a request
#            alone on its data path is read or written on that thread with
#            a blocking pread / pwrite (as the raw export does), at depth
#            the path's ring thread batches
#   hitr     hitu with spin_us=1: a lone hit submits to the path's inline
#            ring and waits there (one io_uring_enter; the spin is shorter
#            than any read, so it never spins): the lone path before pread
#   hitv     (MAIN_SERVERS="... hitv ...") hitu with serve --poll-us
#            $POLL_US: pread for lone hits, the reader polls its socket
#   hitq     (MAIN_SERVERS="... hitq ...") hitu with inline_us=0: every hit
#            through the ring thread (the path before the inline ring)
#   hitc     hitu with placement=conn: one data path per NBD connection
#   hits     hitu with spin_us=$SPIN_US (default 50): a request alone on its
#            data path spins on its ring's completion up to that long
#            before sleeping in io_uring_enter (no wake-up when the device
#            answers within it; a CPU busy meanwhile)
#   hitp     hits with the NBD front-end's poll mode (serve --poll-us
#            $POLL_US, default 100): at low queue depth the thread that
#            answered a request retries its socket for the next one before
#            sleeping, and spins on the inline ring for the disk's answer,
#            so at QD 1 the server is never woken (a CPU busy meanwhile);
#            both turn themselves off at depth
#   <name>B  (with IOLIFT_B=PATH) any iolift server above run by that other
#            binary: MAIN_SERVERS="qemuu hitu hituB" A/Bs two builds in one
#            run, alternating like every server
#   <name>P  (PIN section, or any list) that server with every one of its
#            threads and its fio pinned to the CPU the disk interrupts
#            (PIN_CPU=N to choose): request, completion and reply wake-ups
#            all land on one CPU (on this VM a wake-up across CPUs wakes a
#            halted vCPU); e.g. hituP, qemuuP, devP
#   raw      iolift file:RAW,direct: the same bytes as a raw file (the limit;
#            a request alone on the file runs on the thread that read it)
#   qraw     (floor section) qemu-nbd --cache=none --aio=io_uring serving the
#            raw file: the NBD hop without any qcow2 translation
#   mini     (floor and pin sections) the minimal responder of
#            bench/nbd-floor.c (C, compiled here: one thread per connection,
#            a blocking recv, pread of the raw file with O_DIRECT, one
#            writev per reply, structured replies as iolift): what any
#            server could reach at QD 1 through this client and disk
#   dev      (floor section) no server: fio reads the raw file itself
#            (io_uring, O_DIRECT), the disk's own latency
# Sections:
#   main     1 GiB image, 64 KiB clusters: QD 1..128 (QDS), and 4
#            connections at QD 8
#   miss     (MISS=1) cp against miss at QD 1 and 32 and 4 connections x QD 8
#   spin     (SPIN=1) QD 1 reads: both qemu-nbds against hits (hitu and hitp
#            are in main)
#   floor    (FLOOR=1, off by default) QD 1 reads: qemuu, qraw, raw, mini, dev,
#            hitu, hitr and hitp: what the disk and the NBD hop leave to
#            any server at QD 1
#   pin      (PIN=1, off by default) QD 1 reads: qemuu, raw, hitu and dev,
#            each also pinned (P): whether same-CPU wake-ups are what a
#            QD 1 read waits for here
#   place    (PLACE=1) the data path per worker (hitu) against per
#            connection (hitc), 4 connections at QD 8
#   small    (SMALL=1) 1 GiB, 4 KiB clusters: 2 MiB of L2 entries, more
#            than qemu's default L2 cache covers (1 MiB): QD 1 and 4
#            connections at QD 8
#   write    (WRITES=1) 4 KiB random writes in place on the fully
#            allocated 64 KiB-cluster image at QD 1 and 32, and at QD 1
#            with a flush after every write (qd1f, fio fsync=1: the flush
#            latency rows)
# Latency avg/p50/p90/p99/p99.9/p99.99, IOPS and the server's CPU time per
# I/O (utime + stime from /proc/PID/stat around each job), medians over R repeats,
# ratios against the faster qemu-nbd, the hit ratio iolift's control
# socket reported, peak RSS, and the targets as met / not met. Not a
# test: see docs/qcow2.md.
#
#   bench/qcow2.sh                       # R=3, 2 s per job: about 9 minutes
#   PLACE=0 SMALL=0 SPIN=0 bench/qcow2.sh   # about 6 minutes
#   R=5 RUNTIME=5 SIZE=4G bench/qcow2.sh
#   DIRECT=0 bench/qcow2.sh              # through the page cache instead
#   SMALL=0 WRITES=0 PLACE=0 MISS=0 SPIN=0 bench/qcow2.sh   # the main section only
#   MAIN_SERVERS="qemu qemuu hitq hitu" QDS="1 8" bench/qcow2.sh
#   FLOOR=1 QDS=1 MISS=0 SPIN=0 PLACE=0 SMALL=0 WRITES=0 bench/qcow2.sh   # the QD 1 floor
#   BUILD=0 bench/qcow2.sh               # use the binary already built
#   IOLIFT=PATH bench/qcow2.sh           # this iolift binary, no build step
#   IOLIFT=new IOLIFT_B=old MAIN_SERVERS="qemuu hitu hituB" QDS="1 8" bench/qcow2.sh
#   KEEP=1 bench/qcow2.sh                # keep the fio JSON files
set -euo pipefail
cd "$(dirname "$0")/.."

R=${R:-3}
RUNTIME=${RUNTIME:-2}
SIZE=${SIZE:-1G}
QDS=${QDS:-"1 8 32 128"}
DIRECT=${DIRECT:-1}
SMALL=${SMALL:-1}
WRITES=${WRITES:-1}
PLACE=${PLACE:-1}
SPIN=${SPIN:-1}
SPIN_US=${SPIN_US:-50}
POLL_US=${POLL_US:-100}
FLOOR=${FLOOR:-0}
MISS=${MISS:-1}
QAIO=${QAIO:-native}
MAIN_SERVERS=${MAIN_SERVERS:-"qemu qemuu hitu hitp raw"}
PROFILE=${PROFILE:-release}
TARGET=${CARGO_TARGET_DIR:-target}
# IOLIFT=PATH: run this binary as is (no build step); IOLIFT_B=PATH: the
# binary of the servers whose name ends in B (an A/B of two builds).
[[ -n ${IOLIFT:-} ]] && BUILD=${BUILD:-0}
IOLIFT=${IOLIFT:-$TARGET/$PROFILE/iolift}
IOLIFT_B=${IOLIFT_B:-}
PIN=${PIN:-0}
PY=/usr/bin/python3; [[ -x $PY ]] || PY=python3

for t in fio qemu-nbd qemu-img; do
    command -v $t >/dev/null || { echo "missing $t: run scripts/test.sh, which installs it" >&2; exit 1; }
done
fio --enghelp=nbd >/dev/null 2>&1 || { echo "this fio has no nbd engine" >&2; exit 1; }
if [[ ${BUILD:-1} == 0 ]]; then
    [[ -x $IOLIFT ]] || { echo "BUILD=0 but no $IOLIFT" >&2; exit 1; }
elif [[ $PROFILE == release ]]; then
    cargo build --release -p iolift >&2
else
    cargo build -p iolift >&2
fi

WORK=$(mktemp -d /var/tmp/iolift-qcow2-bench.XXXXXX)
. bench/lib.sh
SERVER_PID=
cleanup() {
    if [[ -n $SERVER_PID ]]; then kill "$SERVER_PID" 2>/dev/null || true; wait "$SERVER_PID" 2>/dev/null || true; fi
    rm -f "$WORK"/*.raw "$WORK"/*.qcow2
    if [[ -z ${KEEP:-} ]]; then rm -rf "$WORK"; else echo "results kept in $WORK" >&2; fi
}
trap cleanup EXIT

SIZE_BYTES=$(numfmt --from=iec "${SIZE^^}")
RAW=$WORK/disk.raw
if [[ $DIRECT == 1 ]]; then
    QCACHE="--cache=none --aio=$QAIO"; QCACHEU="--cache=none --aio=io_uring"; IDIR=",direct"
else
    QCACHE=""; QCACHEU="--aio=io_uring"; IDIR=""
fi

start_server() { # name socket image entries readonly(1/0)
    local s=${1%P} sock=$2 img=$3 n=$4 ro=$5 qro="" iro="" IOLIFT=$IOLIFT
    if [[ $s == *B ]]; then
        [[ -x $IOLIFT_B ]] || { echo "server $s needs IOLIFT_B=PATH (an iolift binary)" >&2; exit 1; }
        IOLIFT=$IOLIFT_B; s=${s%B}
    fi
    rm -f "$sock" "$sock.ctl"
    [[ $ro == 1 ]] && { qro="-r"; iro=",ro"; }
    local q="qcow2:$img$IDIR$iro,control=$sock.ctl"
    case $s in
        qemu) qemu-nbd -f qcow2 $qro $QCACHE -k "$sock" --persistent --shared=8 "$img" 2>"$WORK/$s.log" & ;;
        qemuu) qemu-nbd -f qcow2 $qro $QCACHEU -k "$sock" --persistent --shared=8 "$img" 2>"$WORK/$s.log" & ;;
        cp)   "$IOLIFT" serve --socket "$sock" "$q,cache=0" 2>"$WORK/$s.log" & ;;
        miss) "$IOLIFT" serve --socket "$sock" "$q,cache=16,paths=1" 2>"$WORK/$s.log" & ;;
        hit)  "$IOLIFT" serve --socket "$sock" "$q,cache=$n,paths=1,engine=threads" 2>"$WORK/$s.log" & ;;
        hitw) "$IOLIFT" serve --socket "$sock" "$q,cache=$n,paths=4,engine=threads" 2>"$WORK/$s.log" & ;;
        hitu) "$IOLIFT" serve --socket "$sock" "$q,cache=$n,paths=4,engine=uring" 2>"$WORK/$s.log" & ;;
        hitq) "$IOLIFT" serve --socket "$sock" "$q,cache=$n,paths=4,engine=uring,inline_us=0" 2>"$WORK/$s.log" & ;;
        hitc) "$IOLIFT" serve --socket "$sock" "$q,cache=$n,paths=4,engine=uring,placement=conn" 2>"$WORK/$s.log" & ;;
        hits) "$IOLIFT" serve --socket "$sock" "$q,cache=$n,paths=4,engine=uring,spin_us=$SPIN_US" 2>"$WORK/$s.log" & ;;
        hitp) "$IOLIFT" serve --poll-us "$POLL_US" --socket "$sock" "$q,cache=$n,paths=4,engine=uring,spin_us=$SPIN_US" 2>"$WORK/$s.log" & ;;
        hitr) "$IOLIFT" serve --socket "$sock" "$q,cache=$n,paths=4,engine=uring,spin_us=1" 2>"$WORK/$s.log" & ;;
        hitv) "$IOLIFT" serve --poll-us "$POLL_US" --socket "$sock" "$q,cache=$n,paths=4,engine=uring" 2>"$WORK/$s.log" & ;;
        raw)  "$IOLIFT" serve --socket "$sock" "file:$RAW$IDIR$iro" 2>"$WORK/$s.log" & ;;
        mini) "$WORK/floor" "$sock" 0 1 "$RAW" 2>"$WORK/$s.log" & ;;
        qraw) qemu-nbd -f raw $qro $QCACHEU -k "$sock" --persistent --shared=8 "$RAW" 2>"$WORK/$s.log" & ;;
    esac
    SERVER_PID=$!
    wait_socket "$s" "$sock"
    # every thread of the server, and those it starts later, on one CPU
    [[ $1 == *P ]] && taskset -a -p -c "$(pin_cpu)" "$SERVER_PID" >/dev/null
    return 0
}

# The CPU the disk under $WORK interrupts (its first queue), or PIN_CPU.
pin_cpu() {
    if [[ -n ${PIN_CPU:-} ]]; then echo "$PIN_CPU"; return; fi
    local dev vdev irq
    dev=$(basename "$(df --output=source "$WORK" | tail -1)")
    vdev=$(basename "$(readlink -f "/sys/class/block/$dev/device" 2>/dev/null)" 2>/dev/null)
    # the IRQ number of the device's first request queue (virtio: vdN's
    # virtioM-req.0; others: a name with the disk's)
    irq=$(awk -v a="$vdev-req" -v b="$dev" '$NF ~ a || $NF ~ b { sub(":", "", $1); print $1; exit }' /proc/interrupts)
    if [[ -n $irq && -r /proc/irq/$irq/effective_affinity_list ]]; then
        cut -d, -f1 "/proc/irq/$irq/effective_affinity_list" | cut -d- -f1
    else
        echo 0
    fi
}

fio_job() { # uri name rw qd jobs out [fio options] (PINNED=1: on pin_cpu)
    local pre=(); [[ ${PINNED:-0} == 1 ]] && pre=(taskset -c "$(pin_cpu)")
    "${pre[@]}" fio --name="$2" --ioengine=nbd --uri="$1" --rw="$3" --bs=4k --iodepth="$4" "${@:7}" \
        --numjobs="$5" --group_reporting --size="$SIZE" --time_based --runtime="$RUNTIME" \
        --norandommap --randrepeat=0 \
        --percentile_list=50:90:99:99.9:99.99 --output-format=json >"$6"
}

# run_one SECTION SERVER REP IMAGE ENTRIES RW JOBS...: one server, its jobs
# (qdN: one connection at QD N; qdNxC: C connections at QD N; qdNf: QD N
# with a flush after every write)
run_one() {
    local sec=$1 s=$2 rep=$3 img=$4 n=$5 rw=$6; shift 6
    local sock=$WORK/$s.sock ro=1
    local pre=(); [[ $s == *P ]] && pre=(taskset -c "$(pin_cpu)")
    if [[ ${s%P} == dev ]]; then
        # no server: fio on the raw file itself, the same job otherwise
        for job in "$@"; do
            "${pre[@]}" fio --name="$job" --ioengine=io_uring --direct=1 --filename="$RAW" --readonly \
                --rw="$rw" --bs=4k --iodepth="${job#qd}" --size="$SIZE" --time_based \
                --runtime="$RUNTIME" --norandommap --randrepeat=0 \
                --percentile_list=50:90:99:99.9:99.99 --output-format=json \
                >"$WORK/${sec}_${s}_${rep}_$job.json"
        done
        echo 0 >"$WORK/${sec}_${s}_${rep}.rss"
        return
    fi
    [[ $rw == randwrite ]] && ro=0
    start_server "$s" "$sock" "$img" "$n" "$ro"
    local uri="nbd+unix:///?socket=$sock" base=${s%P}; base=${base%B}
    if [[ $base == hit* ]]; then
        # warm-up: a sequential read of the whole image (hitw: from 4
        # connections at once, so more of the workers' caches see each
        # cluster; the hit ratio printed says how well that worked)
        local nj=1; [[ $base != hit ]] && nj=4
        fio --name=warm --ioengine=nbd --uri="$uri" --rw=read --bs=1M --iodepth=4 \
            --numjobs=$nj --size="$SIZE" --output-format=json >/dev/null
    fi
    if [[ $base == hit* || $base == cp || $base == miss ]]; then
        "$IOLIFT" qcow2 control "$sock.ctl" stats >"$WORK/${sec}_${s}_${rep}.stats0"
    fi
    for job in "$@"; do
        local qd=${job#qd} c=1 extra=()
        [[ $qd == *f ]] && { qd=${qd%f}; extra=(--fsync=1); }
        [[ $qd == *x* ]] && { c=${qd#*x}; qd=${qd%x*}; }
        local c0; c0=$(cpu_ticks "$SERVER_PID")
        PINNED=$([[ $s == *P ]] && echo 1 || echo 0) \
            fio_job "$uri" "$job" "$rw" "$qd" "$c" "$WORK/${sec}_${s}_${rep}_$job.json" "${extra[@]}"
        echo $(( $(cpu_ticks "$SERVER_PID") - c0 )) >"$WORK/${sec}_${s}_${rep}_$job.cpu"
    done
    if [[ $base == hit* || $base == cp || $base == miss ]]; then
        "$IOLIFT" qcow2 control "$sock.ctl" stats >"$WORK/${sec}_${s}_${rep}.stats"
    fi
    peak_kib "$SERVER_PID" >"$WORK/${sec}_${s}_${rep}.rss"
    stop_server
}

section() { # name image entries rw "servers" jobs...
    local sec=$1 img=$2 n=$3 rw=$4 servers=$5; shift 5
    echo "== section $sec: $servers; $*; load $(cut -d' ' -f1-3 /proc/loadavg)" >&2
    for rep in $(seq 1 "$R"); do
        local order=$servers
        (( rep % 2 )) || order=$(echo "$servers" | tr ' ' '\n' | tac | tr '\n' ' ')
        for s in $order; do run_one "$sec" "$s" "$rep" "$img" "$n" "$rw" "$@"; done
        echo "   $sec rep $rep done" >&2
    done
    echo "$sec|$rw|$servers|$*" >>"$WORK/sections"
}

echo "== $R repeats, ${RUNTIME}s per job, image $SIZE, DIRECT=$DIRECT, qemu-nbd --aio=$QAIO, $PROFILE build, $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)" >&2
head -c "$SIZE_BYTES" /dev/urandom >"$RAW"
IMG=$WORK/disk64k.qcow2
qemu-img convert -f raw -O qcow2 -o cluster_size=65536 "$RAW" "$IMG"
MAIN_JOBS=""; for q in $QDS; do MAIN_JOBS+=" qd$q"; done
section main "$IMG" $(( SIZE_BYTES / 65536 + 1024 )) randread "$MAIN_SERVERS" $MAIN_JOBS qd8x4
if [[ $MISS == 1 ]]; then
    section miss "$IMG" $(( SIZE_BYTES / 65536 + 1024 )) randread "cp miss" qd1 qd32 qd8x4
fi
if [[ $SPIN == 1 ]]; then
    section spin "$IMG" $(( SIZE_BYTES / 65536 + 1024 )) randread "qemu qemuu hits" qd1
fi
# the minimal responder (floor and pin sections), if a C compiler is here
MINI=""
if [[ $FLOOR == 1 || $PIN == 1 ]]; then
    if command -v cc >/dev/null && cc -O2 -pthread -o "$WORK/floor" bench/nbd-floor.c; then
        MINI=mini
    else
        echo "no C compiler (or it failed): no minimal responder (mini)" >&2
    fi
fi
if [[ $FLOOR == 1 ]]; then
    section floor "$IMG" $(( SIZE_BYTES / 65536 + 1024 )) randread "qemuu qraw raw $MINI dev hitu hitr hitp" qd1
fi
if [[ $PIN == 1 ]]; then
    echo "== pin section: the disk interrupts CPU $(pin_cpu)" >&2
    section pin "$IMG" $(( SIZE_BYTES / 65536 + 1024 )) randread \
        "qemuu qemuuP raw rawP ${MINI:+mini miniP} hitu hituP dev devP" qd1
fi
if [[ $PLACE == 1 ]]; then
    section place "$IMG" $(( SIZE_BYTES / 65536 + 1024 )) randread "qemu qemuu hitu hitc" qd8x4
fi
if [[ $SMALL == 1 ]]; then
    IMG4=$WORK/disk4k.qcow2
    qemu-img convert -f raw -O qcow2 -o cluster_size=4096 "$RAW" "$IMG4"
    section small "$IMG4" $(( SIZE_BYTES / 4096 + 1024 )) randread "qemu qemuu hitu" qd1 qd8x4
    rm -f "$IMG4"
fi
if [[ $WRITES == 1 ]]; then
    section write "$IMG" $(( SIZE_BYTES / 65536 + 1024 )) randwrite "qemu qemuu hitu hitp" qd1 qd32 qd1f
fi
echo "== load at the end $(cut -d' ' -f1-3 /proc/loadavg)" >&2

"$PY" - "$WORK" "$R" "$RUNTIME" <<'PY'
import json, statistics, sys, os
work, reps, runtime = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
HZ = os.sysconf("SC_CLK_TCK")
keys = [("iops", "IOPS"), ("avg", "avg us"), ("50", "p50 us"), ("90", "p90 us"),
        ("99", "p99 us"), ("99.9", "p99.9 us"), ("99.99", "p99.99 us"),
        ("cpu", "srv CPU us/IO")]

def pcts(lat, out, prefix=""):
    pct = lat.get("percentile", {})
    out[prefix + "avg"] = lat.get("mean", 0) / 1000
    for k in ["50", "90", "99", "99.9", "99.99"]:
        v = [x for p, x in pct.items() if abs(float(p) - float(k)) < 1e-6]
        out[prefix + k] = v[0] / 1000 if v else 0

def one(sec, s, rep, job, rw):
    text = open(f"{work}/{sec}_{s}_{rep}_{job}.json").read()
    j = json.loads(text[text.index("{"):])["jobs"][0]
    r = j["read" if rw == "randread" else "write"]
    out = {"iops": r["iops"]}
    pcts(r["clat_ns"], out)
    # the server's CPU per I/O over the job (no server for dev)
    cpu = f"{work}/{sec}_{s}_{rep}_{job}.cpu"
    ios = r["iops"] * runtime
    out["cpu"] = (int(open(cpu).read()) / HZ * 1e6 / ios) if os.path.exists(cpu) and ios else 0
    if job.endswith("f"):
        # flush after every write: its latency as fio saw it
        pcts(j.get("sync", {}).get("lat_ns", {}), out, "f")
    return out

def base(s):
    # the server without its P (pinned) and B (other binary) suffixes
    return s.removesuffix("P").removesuffix("B")

def counters(p):
    out = {}
    for line in open(p):
        k, _, v = line.partition(" ")
        if k in ("cache_hits", "cache_misses"):
            out[k] = int(v)
    return out

def hit_ratio(sec, s):
    # hits / lookups during the measured jobs (after the warm-up)
    vals = []
    for r in range(1, reps + 1):
        p = f"{work}/{sec}_{s}_{r}.stats"
        if os.path.exists(p) and os.path.exists(p + "0"):
            a, b = counters(p + "0"), counters(p)
            h = b.get("cache_hits", 0) - a.get("cache_hits", 0)
            m = b.get("cache_misses", 0) - a.get("cache_misses", 0)
            vals.append(h / (h + m) if h + m else 0.0)
    return statistics.median(vals) if vals else None

fkeys = [("f" + k, "flush " + label.replace(" us", "") + " us") for k, label in keys[1:-1]]

targets = []
med = {}
peer = {}
for line in open(f"{work}/sections"):
    sec, rw, servers, jobs = line.strip().split("|")
    servers, jobs = servers.split(), jobs.split()
    for s in servers:
        for j in jobs:
            rs = [one(sec, s, r, j, rw) for r in range(1, reps + 1)]
            med[sec, s, j] = {k: statistics.median(x[k] for x in rs) for k in rs[0]}
    qemus = [s for s in servers if s.startswith("qemu")]
    for j in jobs:
        # the peer of this cell: the faster qemu-nbd (by IOPS); without
        # one, the first server
        p = max(qemus, key=lambda s: med[sec, s, j]["iops"]) if qemus else servers[0]
        peer[sec, j] = p
        others = [s for s in servers if s not in qemus and s != p]
        print(f"\n[{sec}] {rw} {j} (medians of {reps}; ratios to {p})")
        print(f"{'metric':<15}" + "".join(f"{s:>10}" for s in servers)
              + "".join(f"{s + '/' + p:>13}" for s in others))
        for k, label in keys + (fkeys if j.endswith("f") else []):
            row = [med[sec, s, j][k] for s in servers]
            q = med[sec, p, j][k]
            ratios = "".join(f"{(med[sec, s, j][k] / q if q else 0):>12.2f}x" for s in others)
            print(f"{label:<15}" + "".join(f"{x:>10.1f}" for x in row) + ratios)
    print()
    for s in servers:
        rss = [int(open(f"{work}/{sec}_{s}_{r}.rss").read()) for r in range(1, reps + 1)]
        hr = hit_ratio(sec, s)
        hrs = f", hit ratio in the jobs {hr:.4f}" if hr is not None else ""
        print(f"[{sec}] {s:<5} peak RSS median {statistics.median(rss) / 1024:.1f} MiB{hrs}")
    M = lambda s, j, k: med[sec, s, j][k]
    P = lambda j: peer[sec, j]
    # (the pin section is a diagnosis: its fio is pinned too, which no
    # server can do for its clients, so it prints no target lines)
    if sec in ("main", "small", "place", "spin", "floor"):
        for h in [x for x in servers if base(x) in ("hit", "hitw", "hitq", "hitu", "hitr", "hitv", "hitc", "hits", "hitp")]:
            if not qemus:
                continue
            for j in jobs:
                r = M(h, j, "iops") / M(P(j), j, "iops")
                targets.append((f"[{sec}] {h} IOPS >= 1.3x qemu-nbd ({P(j)}) at {j}", r >= 1.3, f"{r:.2f}x"))
    if sec == "pin":
        for s in servers:
            if s.endswith("P") and s[:-1] in servers:
                for j in jobs:
                    u, p_ = med[sec, s[:-1], j], med[sec, s, j]
                    print(f"[pin] {j}: {s} / {s[:-1]} IOPS {p_['iops'] / u['iops']:.2f}x, "
                          f"p50 {p_['50']:.1f} / {u['50']:.1f} us")
    if sec == "floor" and "mini" in servers:
        for j in jobs:
            r = M("mini", j, "iops") / M(P(j), j, "iops")
            print(f"[floor] {j}: the minimal responder (blocking recv, pread, writev; no work) "
                  f"{r:.2f}x {P(j)}'s IOPS, p50 {M('mini', j, '50'):.1f} us: 1.3x is "
                  + ("within reach of a server here" if r >= 1.3 else
                     "out of reach for any server through this client and disk"))
    if sec == "floor" and "dev" in servers:
        for j in jobs:
            d, q = M("dev", j, "iops"), M(P(j), j, "iops")
            print(f"[floor] {j}: the disk read directly (fio, io_uring, O_DIRECT, no NBD) "
                  f"{d:.0f} IOPS, p50 {M('dev', j, '50'):.1f} us = {d / q:.2f}x {P(j)}'s IOPS; "
                  f"1.3x {P(j)} would need {1.3 * q:.0f} IOPS"
                  + (" (more than the disk gives without NBD)" if 1.3 * q > d else ""))
    if sec == "main":
        j1 = "qd1"
        if j1 in jobs and "raw" in servers:
            for h in [x for x in servers if base(x) in ("hit", "hitw", "hitq", "hitu", "hitr", "hitv", "hitp")]:
                r = M(h, j1, "50") / M("raw", j1, "50")
                targets.append((f"[main] {h} p50 <= 1.1x raw p50 at qd1", r <= 1.1, f"{r:.2f}x"))
    if sec in ("main", "miss") and "miss" in servers and "cp" in servers:
        for j in jobs:
            r = M("miss", j, "iops") / M("cp", j, "iops")
            targets.append((f"[{sec}] miss IOPS no worse than control-plane-only at {j}", r >= 1.0, f"{r:.2f}x"))
        if "qd1" in jobs:
            r = M("miss", "qd1", "50") / M("cp", "qd1", "50")
            targets.append((f"[{sec}] miss p50 no worse than control-plane-only at qd1", r <= 1.0, f"{r:.2f}x"))
    if sec == "write":
        for h in [x for x in servers if base(x) in ("hitw", "hitq", "hitu", "hitp")]:
            for j in jobs:
                r = M(h, j, "iops") / M(P(j), j, "iops")
                targets.append((f"[write] iolift {h} write IOPS no slower than qemu-nbd ({P(j)}) at {j}", r >= 1.0, f"{r:.2f}x"))
                if j.endswith("f"):
                    r = M(h, j, "f50") / M(P(j), j, "f50")
                    targets.append((f"[write] iolift {h} flush p50 no slower than qemu-nbd ({P(j)}) at {j}", r <= 1.0, f"{r:.2f}x"))
print("\ntargets:")
for name, ok, val in targets:
    print(f"  {'met    ' if ok else 'NOT MET'}  {name}: {val}")
PY
