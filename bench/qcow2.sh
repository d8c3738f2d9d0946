#!/usr/bin/env bash
# qcow2 4 KiB random reads, side by side in one run, alternating:
#   qemu     qemu-nbd serving the qcow2 image (the peer)
#   cp       iolift qcow2:IMG,cache=0: every request under the control plane
#   miss     iolift qcow2:IMG,cache=16,paths=1: the fast path, nearly always missing
#   hit      iolift qcow2:IMG,cache=ENTRIES,paths=1 after a sequential warm-up
#            read: every mapping cached
#   raw      iolift file:RAW: the same bytes as a raw file (the limit)
# Latency avg/p50/p90/p99/p99.9/p99.99 and IOPS per queue depth (fio
# ioengine=nbd, one connection; and 4 connections at QD8), medians over
# R repeats, ratios against qemu-nbd and hit/raw, peak RSS per server.
# Not a test: see docs/qcow2.md.
#
#   bench/qcow2.sh                          # 3 repeats, 5 s per job, 1 GiB, 64 KiB clusters
#   R=5 RUNTIME=10 SIZE=4G bench/qcow2.sh
#   CLUSTER=4k bench/qcow2.sh               # many more L2 entries than qemu caches by default
#   PROFILE=debug bench/qcow2.sh            # use the debug build
#   KEEP=1 bench/qcow2.sh                   # keep the fio JSON files
#   BUILD=0 bench/qcow2.sh                  # use the binary already built
#
# All servers read through the page cache (qemu-nbd's default
# cache=writeback; iolift's qcow2 backend has no O_DIRECT yet), and the
# image is written once before the first repeat, so this compares the
# software paths, not the disk.
set -euo pipefail
cd "$(dirname "$0")/.."

R=${R:-3}
RUNTIME=${RUNTIME:-5}
SIZE=${SIZE:-1G}
CLUSTER=${CLUSTER:-64k}
QDS=${QDS:-"1 8 32"}
PROFILE=${PROFILE:-release}
TARGET=${CARGO_TARGET_DIR:-target}
IOLIFT=$TARGET/$PROFILE/iolift
PY=/usr/bin/python3; [[ -x $PY ]] || PY=python3

for t in fio qemu-nbd qemu-img; do
    command -v $t >/dev/null || { echo "missing $t: run scripts/test.sh, which installs it" >&2; exit 1; }
done
fio --enghelp=nbd >/dev/null 2>&1 || { echo "this fio has no nbd engine" >&2; exit 1; }
if [[ ${BUILD:-1} == 0 ]]; then
    [[ -x $IOLIFT ]] || { echo "BUILD=0 but no $IOLIFT" >&2; exit 1; }
elif [[ $PROFILE == release ]]; then
    cargo build --release -p iolift --bin iolift >&2
else
    cargo build -p iolift --bin iolift >&2
fi

WORK=$(mktemp -d /var/tmp/iolift-qcow2-bench.XXXXXX)
. bench/lib.sh
RAW=$WORK/disk.raw
IMG=$WORK/disk.qcow2
cleanup() {
    if [[ -n $SERVER_PID ]]; then kill "$SERVER_PID" 2>/dev/null || true; wait "$SERVER_PID" 2>/dev/null || true; fi
    rm -f "$RAW" "$IMG"
    if [[ -z ${KEEP:-} ]]; then rm -rf "$WORK"; else echo "results kept in $WORK" >&2; fi
}
trap cleanup EXIT

CLUSTER_BYTES=$(numfmt --from=iec "${CLUSTER^^}")
SIZE_BYTES=$(numfmt --from=iec "${SIZE^^}")
ENTRIES=$(( SIZE_BYTES / CLUSTER_BYTES + 1024 ))

start_server() { # name socket
    rm -f "$2"
    case $1 in
        qemu) qemu-nbd -f qcow2 -r -k "$2" --persistent --shared=8 "$IMG" 2>"$WORK/$1.log" & ;;
        cp)   "$IOLIFT" serve --socket "$2" "qcow2:$IMG,cache=0,ro" 2>"$WORK/$1.log" & ;;
        miss) "$IOLIFT" serve --socket "$2" "qcow2:$IMG,cache=16,paths=1,ro" 2>"$WORK/$1.log" & ;;
        hit)  "$IOLIFT" serve --socket "$2" "qcow2:$IMG,cache=$ENTRIES,paths=1,ro" 2>"$WORK/$1.log" & ;;
        raw)  "$IOLIFT" serve --socket "$2" "file:$RAW,ro" 2>"$WORK/$1.log" & ;;
    esac
    SERVER_PID=$!
    wait_socket "$1" "$2"
}

fio_job() { # uri name qd jobs out
    fio --name="$2" --ioengine=nbd --uri="$1" --rw=randread --bs=4k --iodepth="$3" \
        --numjobs="$4" --group_reporting --size="$SIZE" --time_based --runtime="$RUNTIME" \
        --norandommap --randrepeat=0 \
        --percentile_list=50:90:99:99.9:99.99 --output-format=json >"$5"
}

SERVERS="qemu cp miss hit raw"
run_one() { # server rep
    local s=$1 rep=$2 sock=$WORK/$1.sock
    start_server "$s" "$sock"
    local uri="nbd+unix:///?socket=$sock"
    if [[ $s == hit ]]; then
        fio --name=warm --ioengine=nbd --uri="$uri" --rw=read --bs=1M --iodepth=4 \
            --size="$SIZE" --output-format=json >/dev/null
    fi
    for qd in $QDS; do
        fio_job "$uri" "qd$qd" "$qd" 1 "$WORK/${s}_${rep}_qd$qd.json"
    done
    fio_job "$uri" "qd8x4" 8 4 "$WORK/${s}_${rep}_qd8x4.json"
    peak_kib "$SERVER_PID" >"$WORK/${s}_${rep}.rss"
    stop_server
    echo "   $s rep $rep done" >&2
}

echo "== $R repeats, ${RUNTIME}s per job, image $SIZE with $CLUSTER clusters, $PROFILE build, $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)" >&2
head -c "$SIZE_BYTES" /dev/urandom >"$RAW"
qemu-img convert -f raw -O qcow2 -o "cluster_size=$CLUSTER_BYTES" "$RAW" "$IMG"
for rep in $(seq 1 "$R"); do
    order=$SERVERS
    (( rep % 2 )) || order=$(echo "$SERVERS" | tr ' ' '\n' | tac | tr '\n' ' ')
    for s in $order; do run_one "$s" "$rep"; done
done
echo "== load at the end $(cut -d' ' -f1-3 /proc/loadavg)" >&2

"$PY" - "$WORK" "$R" "$SERVERS" "$QDS" <<'PY'
import json, statistics, sys
work, reps, servers, qds = sys.argv[1], int(sys.argv[2]), sys.argv[3].split(), sys.argv[4].split()
jobs = [f"qd{q}" for q in qds] + ["qd8x4"]
keys = [("iops", "IOPS"), ("avg", "avg us"), ("50", "p50 us"), ("90", "p90 us"),
        ("99", "p99 us"), ("99.9", "p99.9 us"), ("99.99", "p99.99 us")]

def one(s, rep, job):
    text = open(f"{work}/{s}_{rep}_{job}.json").read()
    r = json.loads(text[text.index("{"):])["jobs"][0]["read"]
    pct = r["clat_ns"].get("percentile", {})
    out = {"iops": r["iops"], "avg": r["clat_ns"]["mean"] / 1000}
    for k in ["50", "90", "99", "99.9", "99.99"]:
        v = [x for p, x in pct.items() if abs(float(p) - float(k)) < 1e-6]
        out[k] = v[0] / 1000 if v else 0
    return out

med = {}
for s in servers:
    for j in jobs:
        rs = [one(s, r, j) for r in range(1, reps + 1)]
        med[s, j] = {k: statistics.median(x[k] for x in rs) for k, _ in keys}
for j in jobs:
    print(f"\n{j} (medians of {reps})")
    print(f"{'metric':<10}" + "".join(f"{s:>10}" for s in servers)
          + "".join(f"{s + '/qemu':>11}" for s in servers[1:]) + f"{'hit/raw':>9}")
    for k, label in keys:
        row = [med[s, j][k] for s in servers]
        q = row[0]
        ratios = "".join(f"{(x / q if q else 0):>10.2f}x" for x in row[1:])
        hr = med["hit", j][k] / med["raw", j][k] if med["raw", j][k] else 0
        print(f"{label:<10}" + "".join(f"{x:>10.1f}" for x in row) + ratios + f"{hr:>8.2f}x")
print()
for s in servers:
    rss = [int(open(f"{work}/{s}_{r}.rss").read()) for r in range(1, reps + 1)]
    print(f"peak RSS {s:<5} median {statistics.median(rss) / 1024:.1f} MiB (per repeat: {', '.join(f'{x / 1024:.1f}' for x in rss)})")
PY
