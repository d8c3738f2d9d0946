#!/usr/bin/env bash
# bench/deliba-grid.sh: DeLiBA's software-baseline grid (seed paper, Sec. III-C and V) on a
# local Ceph cluster, every peer in the same run, interleaved:
#
#   iolift           iolift serve rbd:rbd/img            (fio ioengine=nbd, unix socket)
#   iolift+cs        same with --stage cache --stage scheduler (if those stages exist)
#   iolift-poll      iolift with --poll-us $POLL_US (poll mode; not in the default PEERS)
#   qemu-nbd         qemu-nbd exporting rbd:rbd/img      (fio ioengine=nbd, unix socket)
#   fio-rbd          fio ioengine=rbd                    (librbd direct, no relay)
#
# Workloads: 4k and 128k x seq/rand x read/write; latency (p50, p99) at iodepth 1,
# IOPS and MB/s at iodepth 32. Each cell runs REPS times (peers interleaved within a
# rep, in an order that turns every cell); the table shows medians and ratios, and three
# PNG figures are drawn.
#
#   bench/deliba-grid.sh [OUTDIR]       default OUTDIR: bench/out/deliba-YYYYmmdd-HHMMSS
#
# Environment: REPS=3 RUNTIME=3 RAMP=1 (seconds per run) IMAGE_SIZE=512M
#   IOLIFT=path/to/iolift (default: cargo build --release, $CARGO_TARGET_DIR or target/)
#   PEERS="iolift iolift+cs qemu-nbd fio-rbd"  BS="4k 128k"  RWS="read write randread randwrite"  QDS="1 32"
#   POLL_US=1000 (the iolift-poll peer's --poll-us)
#   NOPLOT=1          skip building bench/plot and drawing the figures (table only)
#   SEQW_REGION=8M    each sequential-write run writes its own region of this size (it wraps
#                     inside it), the next run the next region: memstore OSDs get slower on
#                     objects that have taken many small writes (4k QD1 write p50 1.1 ms ->
#                     5 ms on the first object over a grid, 1.4 ms on a fresh one), so runs
#                     that all start at offset 0 would measure the image's history, and the
#                     peer that runs later in a rep would lose. 0: every run from offset 0.
#   CEPH_DIR=dir for the cluster (default OUTDIR/ceph, on disk)
#   RBD_CACHE=false   librbd's own cache for every peer (written to the cluster's [client]
#                     conf; qemu-nbd gets --cache=none or --cache=writeback to match, since
#                     qemu sets rbd_cache from its cache mode). false: each peer's latency is
#                     a round trip to the OSDs, and "iolift+cs" is the only cached peer.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD

REPS=${REPS:-3}
RUNTIME=${RUNTIME:-3}
RAMP=${RAMP:-1}
IMAGE_SIZE=${IMAGE_SIZE:-512M}
POLL_US=${POLL_US:-1000}
SEQW_REGION=${SEQW_REGION:-8M}
QDS=${QDS:-"1 32"}
RBD_CACHE=${RBD_CACHE:-false}
case "$RBD_CACHE" in true) QEMU_CACHE=writeback ;; false) QEMU_CACHE=none ;; *) echo "RBD_CACHE must be true or false" >&2; exit 2 ;; esac
PEERS=${PEERS:-"iolift iolift+cs qemu-nbd fio-rbd"}
BS_LIST=${BS:-"4k 128k"}
RW_LIST=${RWS:-"read write randread randwrite"}
OUT=${1:-$ROOT/bench/out/deliba-$(date +%Y%m%d-%H%M%S)}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
CEPH_DIR=${CEPH_DIR:-$OUT/ceph}
LOG=$OUT/log
mkdir -p "$LOG"

say() { printf '[deliba-grid %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { say "error: $*"; exit 1; }

for t in fio qemu-nbd python3 ceph rbd; do
  command -v "$t" >/dev/null || die "missing $t (scripts/test.sh installs the peers)"
done
# A python3 with libnbd's module (Debian's, not a pyenv/venv one) for flushes between runs.
PY_NBD=""
for py in /usr/bin/python3 "$(command -v python3)"; do
  if "$py" -c 'import nbd' 2>/dev/null; then PY_NBD=$py; break; fi
done
[ -n "$PY_NBD" ] || die "no python3 with the nbd module (install python3-libnbd)"
fio --enghelp=rbd >/dev/null 2>&1 || die "this fio has no rbd engine"
fio --enghelp=nbd >/dev/null 2>&1 || die "this fio has no nbd engine"

# ---- iolift binary and the plotter --------------------------------------------------------
if [ -z "${IOLIFT:-}" ]; then
  say "building iolift (release)"
  cargo build --release -q -p iolift
  IOLIFT=${CARGO_TARGET_DIR:-$ROOT/target}/release/iolift
fi
[ -x "$IOLIFT" ] || die "no iolift binary at $IOLIFT"
PLOT=""
if [ -n "${NOPLOT:-}" ]; then
  say "NOPLOT set: no figures"
elif cargo build --release -q --manifest-path bench/plot/Cargo.toml 2>"$LOG/plot-build.err"; then
  PLOT=${CARGO_TARGET_DIR:-$ROOT/bench/plot/target}/release/deliba-plot
else
  say "warning: bench/plot did not build (see $LOG/plot-build.err): no figures"
fi

# ---- cluster, servers, cleanup ------------------------------------------------------------
PIDS=()
cleanup() {
  local p
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${PIDS[@]}"; do
    for _ in $(seq 50); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$p" 2>/dev/null || true
  done
  "$ROOT/scripts/ceph-local.sh" stop "$CEPH_DIR" || true
}
trap cleanup EXIT
trap 'exit 130' INT TERM

say "starting the Ceph cluster in $CEPH_DIR"
CONF=$(CEPH_LOCAL_IMAGE_SIZE=$IMAGE_SIZE CEPH_LOCAL_CLIENT_CONF="rbd cache = $RBD_CACHE" \
  "$ROOT/scripts/ceph-local.sh" start "$CEPH_DIR" | tail -n 1)
export CEPH_CONF=$CONF
SPEC="rbd:rbd/img,conf=$CONF"

say "prefilling rbd/img ($IMAGE_SIZE) with fio's rbd engine"
fio --name=prefill --ioengine=rbd --clientname=admin --pool=rbd --rbdname=img \
  --rw=write --bs=4M --iodepth=8 --size="$IMAGE_SIZE" --output="$LOG/prefill.txt" >/dev/null

wait_sock() { # $1 = socket, $2 = pid, $3 = log
  local i
  for i in $(seq 300); do
    [ -S "$1" ] && return 0
    kill -0 "$2" 2>/dev/null || { cat "$3" >&2; return 1; }
    sleep 0.1
  done
  cat "$3" >&2
  return 1
}

declare -A URI
start_server() { # $1 = peer
  local sock=$OUT/$1.sock log=$LOG/$1.server.log pid
  rm -f "$sock"
  case "$1" in
    iolift) "$IOLIFT" serve --socket "$sock" "$SPEC" >"$log" 2>&1 & pid=$! ;;
    iolift+cs) "$IOLIFT" serve --socket "$sock" --stage cache --stage scheduler "$SPEC" >"$log" 2>&1 & pid=$! ;;
    iolift-poll) "$IOLIFT" serve --socket "$sock" --poll-us "$POLL_US" "$SPEC" >"$log" 2>&1 & pid=$! ;;
    qemu-nbd) qemu-nbd --persistent --shared=4 --format=raw --cache="$QEMU_CACHE" --socket="$sock" \
                "rbd:rbd/img:conf=$CONF" >"$log" 2>&1 & pid=$! ;;
    *) return 0 ;;
  esac
  PIDS+=("$pid")
  if ! wait_sock "$sock" "$pid" "$log"; then
    say "warning: $1 did not start (see $log); leaving it out"
    return 1
  fi
  URI[$1]="nbd+unix:///?socket=$sock"
}

ACTIVE=()
for p in $PEERS; do
  case "$p" in
    iolift|iolift+cs|iolift-poll|qemu-nbd) if start_server "$p"; then ACTIVE+=("$p"); fi ;;
    fio-rbd) ACTIVE+=("$p") ;;
    *) die "unknown peer $p" ;;
  esac
done
say "peers: ${ACTIVE[*]}"

# ---- the grid ------------------------------------------------------------------------------
RAW=$OUT/raw.csv
echo "peer,bs,rw,iodepth,rep,iops,mbps,lat_p50_us,lat_p99_us,lat_mean_us" >"$RAW"

IMAGE_BYTES=$(numfmt --from=iec "$IMAGE_SIZE")
REGION_BYTES=$(numfmt --from=iec "$SEQW_REGION")
REGIONS=$(( REGION_BYTES > 0 ? IMAGE_BYTES / REGION_BYTES : 0 ))
SEQW_RUNS=0
run_fio() { # peer bs rw iodepth rep
  local peer=$1 bs=$2 rw=$3 qd=$4 rep=$5 json=$LOG/$1.$2.$3.qd$4.r$5.json eng=()
  local where=(--size="$IMAGE_SIZE")
  case "$peer" in
    fio-rbd) eng=(--ioengine=rbd --clientname=admin --pool=rbd --rbdname=img) ;;
    *) eng=(--ioengine=nbd "--uri=${URI[$peer]}") ;;
  esac
  if [ "$rw" = write ] && [ "$REGIONS" -gt 0 ]; then
    where=(--offset=$(( (SEQW_RUNS % REGIONS) * REGION_BYTES )) --size="$REGION_BYTES")
    SEQW_RUNS=$((SEQW_RUNS + 1))
  fi
  if ! fio --name=g "${eng[@]}" --rw="$rw" --bs="$bs" --iodepth="$qd" "${where[@]}" \
      --time_based --runtime="$RUNTIME" --ramp_time="$RAMP" --lat_percentiles=1 \
      --percentile_list=50:99 --randrepeat=0 --output-format=json --output="$json" \
      >"$LOG/fio.err" 2>&1; then
    say "warning: fio failed for $peer $bs $rw qd$qd rep$rep: $(tail -n 3 "$LOG/fio.err" | tr '\n' ' ')"
    return 0
  fi
  # Outside the measurement: a flush, so that data a peer still holds dirty (the cache
  # stage's write-back) is written before the next peer runs; otherwise its write-back
  # competes with (and takes RBD's exclusive lock from) whoever runs next.
  if [ "$peer" != fio-rbd ] && [[ $rw == *write* ]]; then
    timeout 300 "$PY_NBD" -c 'import nbd, sys; h = nbd.NBD(); h.connect_uri(sys.argv[1]); h.flush(); h.shutdown()' \
      "${URI[$peer]}" >>"$LOG/flush.err" 2>&1 ||
      say "warning: flush of $peer after $bs $rw qd$qd failed"
  fi
  python3 - "$json" "$peer,$bs,$rw,$qd,$rep" >>"$RAW" <<'EOF'
import json, sys
d = json.load(open(sys.argv[1]))
j = d["jobs"][0]
side = j["write"] if j["write"]["io_bytes"] > 0 else j["read"]
lat = side.get("lat_ns", {})
pct = lat.get("percentile", {})
def p(k):
    for key, v in pct.items():
        if abs(float(key) - k) < 1e-6:
            return v / 1000.0
    return float("nan")
print("%s,%.1f,%.2f,%.1f,%.1f,%.1f" % (sys.argv[2], side["iops"], side["bw_bytes"] / 1e6,
      p(50.0), p(99.0), lat.get("mean", float("nan")) / 1000.0))
EOF
}

LOAD0=$(cut -d' ' -f1-3 /proc/loadavg)
total=0
for _ in $BS_LIST; do for _ in $RW_LIST; do for _ in $QDS; do total=$((total + ${#ACTIVE[@]} * REPS)); done; done; done
say "$total fio runs of ${RUNTIME}+${RAMP} s each (about $(( total * (RUNTIME + RAMP + 1) / 60 )) min)"
# The peers' order turns by one every cell and every rep, so that no peer always runs
# right after the same other one (after a writer whose data the OSDs are still
# digesting, say) or always first in a cell.
n=0
k=${#ACTIVE[@]}
for rep in $(seq "$REPS"); do
  cell=0
  for bs in $BS_LIST; do
    for rw in $RW_LIST; do
      for qd in $QDS; do
        for i in $(seq 0 $((k - 1))); do
          peer=${ACTIVE[$(( (i + cell + rep) % k ))]}
          n=$((n + 1))
          run_fio "$peer" "$bs" "$rw" "$qd" "$rep"
        done
        cell=$((cell + 1))
      done
    done
  done
  say "rep $rep/$REPS done ($n/$total runs)"
done

# ---- summary and figures ------------------------------------------------------------------
python3 "$ROOT/bench/deliba-summary.py" "$RAW" "$OUT/summary.csv" | tee "$OUT/table.txt"
{
  echo
  echo "peers: ${ACTIVE[*]}; fio $(fio --version); ceph $(ceph --version | awk '{print $3}');"
  echo "cluster: scripts/ceph-local.sh (1 mon, 1 mgr, 3 memstore OSDs, pool size 3) on 127.0.0.1;"
  echo "image rbd/img $IMAGE_SIZE prefilled; rbd cache = $RBD_CACHE; runs ${RUNTIME}s + ${RAMP}s ramp; medians of $REPS;"
  echo "$(nproc) cores, load average before the grid: $LOAD0, after: $(cut -d' ' -f1-3 /proc/loadavg)."
} | tee -a "$OUT/table.txt"
if [ -n "$PLOT" ]; then
  "$PLOT" "$OUT/summary.csv" "$OUT" && say "figures: $OUT/latency.png $OUT/throughput.png $OUT/iops.png"
fi
say "results in $OUT"
