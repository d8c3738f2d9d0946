#!/usr/bin/env bash
# bench/stages.sh: what the block-layer stages (cache, scheduler) buy over slow
# backends, measured with fio ioengine=nbd against `iolift serve`.
#
#   backends  file    file:IMG,size=SIZE,direct   (O_DIRECT on the local disk)
#             d50     memory:SIZE under a delay:all=50us stage
#             d500    memory:SIZE under a delay:all=500us stage
#   configs   base    no stage
#             cache   --stage cache              (32M, 4k blocks, write-back)
#             sched   --stage scheduler
#             cs      --stage cache --stage scheduler
#   workloads 4k and 128k x read, write, randread, randwrite, iodepth $QD
#
# Every (backend, config) pair has its own server (and its own backend), all
# started up front; each rep runs every workload on every config in turn, so
# configs are interleaved in time. A `stats:name=below` stage at the bottom of
# every stack counts the requests that reach the backend (from --metrics).
# The table shows medians over REPS: IOPS, mean and p99 completion latency,
# backend requests per client request, and ratios against `base`.
#
#   bench/stages.sh [OUTDIR]      default OUTDIR: bench/out/stages-YYYYmmdd-HHMMSS
#
# Environment: REPS=3 RUNTIME=2 RAMP=0 (seconds) QD=16 SIZE=256M
#   BACKENDS="file d50 d500" CONFIGS="base cache sched cs" BS="4k 128k"
#   RWS="read write randread randwrite"
#   IOLIFT=path/to/iolift (default: cargo build --release; $CARGO_TARGET_DIR or target/)
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD

REPS=${REPS:-3}
RUNTIME=${RUNTIME:-2}
RAMP=${RAMP:-0}
QD=${QD:-16}
SIZE=${SIZE:-256M}
BACKENDS=${BACKENDS:-"file d50 d500"}
CONFIGS=${CONFIGS:-"base cache sched cs"}
BS_LIST=${BS:-"4k 128k"}
RW_LIST=${RWS:-"read write randread randwrite"}
OUT=${1:-$ROOT/bench/out/stages-$(date +%Y%m%d-%H%M%S)}
mkdir -p "$OUT/runs"
OUT=$(cd "$OUT" && pwd)

say() { printf '[stages %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { say "error: $*"; exit 1; }

PY=/usr/bin/python3
"$PY" -c 'import nbd' 2>/dev/null || die "missing python3-libnbd"
for t in fio python3 nbdinfo; do
  command -v "$t" >/dev/null || die "missing $t (scripts/test.sh installs the peers)"
done
fio --enghelp=nbd >/dev/null 2>&1 || die "this fio has no nbd engine"

# build_iolift (bench/lib.sh): a release build unless IOLIFT names a binary.
source bench/lib.sh
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target}
[ -n "${IOLIFT:-}" ] || say "building iolift (release)"
BIN=${IOLIFT:-} PROFILE=release
build_iolift
IOLIFT=$BIN
[ -x "$IOLIFT" ] || die "no iolift binary at $IOLIFT"

PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -f "$OUT"/*.img
}
trap cleanup EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

stages_for() { # config -> --stage args (top first)
  case "$1" in
    base) ;;
    cache) echo "--stage cache:size=32M,block=4k" ;;
    sched) echo "--stage scheduler" ;;
    cs) echo "--stage cache:size=32M,block=4k --stage scheduler" ;;
    *) die "unknown config $1" ;;
  esac
}

backend_for() { # backend name, config -> "extra stages|backend spec"
  case "$1" in
    file) echo "|file:$OUT/$1-$2.img,size=$SIZE,direct" ;;
    d50) echo "--stage delay:all=50us|memory:$SIZE" ;;
    d500) echo "--stage delay:all=500us|memory:$SIZE" ;;
    *) die "unknown backend $1" ;;
  esac
}

# ---- start one server per (backend, config) ------------------------------------------------
declare -A SOCK PORT
for be in $BACKENDS; do
  for cf in $CONFIGS; do
    k=$be-$cf
    sock=$OUT/$k.sock
    port=$(free_port)
    IFS='|' read -r extra spec <<<"$(backend_for "$be" "$cf")"
    # shellcheck disable=SC2046
    "$IOLIFT" serve --socket "$sock" --metrics "127.0.0.1:$port" \
      $(stages_for "$cf") --stage stats:name=below $extra "$spec" \
      >"$OUT/$k.server.log" 2>&1 &
    PIDS+=($!)
    SOCK[$k]=$sock
    PORT[$k]=$port
  done
done
for k in "${!SOCK[@]}"; do
  for _ in $(seq 100); do
    nbdinfo --size "nbd+unix:///?socket=${SOCK[$k]}" >/dev/null 2>&1 && break
    sleep 0.1
  done
  nbdinfo --size "nbd+unix:///?socket=${SOCK[$k]}" >/dev/null 2>&1 || die "server $k did not start: $(cat "$OUT/$k.server.log")"
done
say "servers up: ${!SOCK[*]}"

below_requests() { # key -> total requests seen by the stats:name=below stage
  python3 - "${PORT[$1]}" <<'EOF'
import sys, urllib.request
body = urllib.request.urlopen("http://127.0.0.1:%s/metrics" % sys.argv[1], timeout=10).read().decode()
n = 0
for l in body.splitlines():
    if l.startswith('iolift_stats_requests_total{stage="stats",instance="below"'):
        n += float(l.split()[-1])
print(int(n))
EOF
}

# Lay the data down once so reads hit written blocks (file: allocated extents).
FPIDS=()
for k in "${!SOCK[@]}"; do
  fio --name=prefill --ioengine=nbd --uri="nbd+unix:///?socket=${SOCK[$k]}" --rw=write --bs=1M \
    --iodepth=8 --size="$SIZE" --output="$OUT/runs/prefill-$k.txt" >/dev/null 2>&1 &
  FPIDS+=($!)
done
wait "${FPIDS[@]}" || die "prefill failed"
say "prefilled"

echo "backend config bs rw rep iops mean_us p99_us client_reqs backend_reqs" >"$OUT/results.txt"
total=0
for rep in $(seq "$REPS"); do
  for be in $BACKENDS; do
    for bs in $BS_LIST; do
      for rw in $RW_LIST; do
        for cf in $CONFIGS; do
          k=$be-$cf
          j=$OUT/runs/$k-$bs-$rw-$rep.json
          b0=$(below_requests "$k")
          fio --name=j --ioengine=nbd --uri="nbd+unix:///?socket=${SOCK[$k]}" --rw="$rw" --bs="$bs" \
            --iodepth="$QD" --size="$SIZE" --time_based --runtime="$RUNTIME" --ramp_time="$RAMP" \
            --output-format=json --output="$j" >/dev/null 2>&1 || die "fio failed: $k $bs $rw"
          # Flush so that write-back caused by this run is counted with it.
          "$PY" -c 'import nbd,sys; h=nbd.NBD(); h.connect_uri(sys.argv[1]); h.flush(); h.shutdown()' \
            "nbd+unix:///?socket=${SOCK[$k]}" || die "flush failed: $k"
          b1=$(below_requests "$k")
          python3 - "$j" "$be" "$cf" "$bs" "$rw" "$rep" "$((b1 - b0))" "$RUNTIME" "$RAMP" >>"$OUT/results.txt" <<'EOF'
import json, sys
j, be, cf, bs, rw, rep, below, runtime, ramp = sys.argv[1:]
d = json.load(open(j))["jobs"][0]
x = d["write" if "write" in rw else "read"]
iops = x["iops"]
mean = x["clat_ns"]["mean"] / 1000
p99 = x["clat_ns"].get("percentile", {}).get("99.000000", 0) / 1000
# fio counts ios after the ramp; the below counter covers the ramp too.
client = x["total_ios"] * (float(runtime) + float(ramp)) / float(runtime)
below = int(below)
print(be, cf, bs, rw, rep, "%.0f" % iops, "%.1f" % mean, "%.1f" % p99, client, "%.0f" % below)
EOF
          total=$((total + 1))
        done
      done
    done
  done
  say "rep $rep done ($total runs)"
done

python3 - "$OUT/results.txt" "$CONFIGS" <<'EOF' | tee "$OUT/table.txt"
import sys, statistics
from collections import defaultdict
rows = [l.split() for l in open(sys.argv[1]).read().splitlines()[1:]]
configs = sys.argv[2].split()
R = defaultdict(list)
for be, cf, bs, rw, rep, iops, mean, p99, client, below in rows:
    R[(be, cf, bs, rw)].append((float(iops), float(mean), float(p99), float(client), float(below)))
def med(k, i):
    v = R.get(k)
    return statistics.median(x[i] for x in v) if v else float("nan")
reps = min(len(v) for v in R.values())
print("medians of %d runs per cell; ratios vs base (IOPS: >1 better; latency: <1 better);" % reps)
print("bk/req: backend requests per client request (below the stages)\n")
hdr = "%-5s %-5s %-9s" % ("bknd", "bs", "rw")
for cf in configs:
    hdr += " | %-6s %8s %8s %6s" % (cf, "IOPS", "mean_us", "bk/req")
print(hdr)
print("-" * len(hdr))
keys = sorted({(be, bs, rw) for be, cf, bs, rw in R}, key=lambda k: (k[0], int(k[1][:-1]), k[2]))
verdict = defaultdict(lambda: {"helps": [], "hurts": [], "neutral": []})
for be, bs, rw in keys:
    line = "%-5s %-5s %-9s" % (be, bs, rw)
    base = med((be, "base", bs, rw), 0)
    basel = med((be, "base", bs, rw), 1)
    for cf in configs:
        k = (be, cf, bs, rw)
        iops, lat = med(k, 0), med(k, 1)
        client = med(k, 3); below = med(k, 4)
        ratio = "" if cf == "base" else "x%.2f" % (iops / base if base else float("nan"))
        bk = below / client if client else float("nan")
        line += " | %-6s %8.0f %8.1f %6.2f" % (ratio, iops, lat, bk)
        if cf != "base" and base:
            r = iops / base
            tag = "helps" if r >= 1.10 else "hurts" if r <= 0.90 else "neutral"
            verdict[cf][tag].append("%s/%s/%s(x%.2f)" % (be, bs, rw, r))
    print(line)
print()
for cf in configs:
    if cf == "base":
        continue
    print("%s:" % cf)
    for tag in ("helps", "hurts", "neutral"):
        print("  %-7s %s" % (tag, " ".join(verdict[cf][tag]) or "-"))
EOF
say "results in $OUT (results.txt, table.txt, runs/)"
