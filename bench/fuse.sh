#!/usr/bin/env bash
# bench/fuse.sh: kernel block device without the nbd module, iolift vs nbdfuse.
#
#   iolift   : iolift attach memory:SIZE          (FUSE file served in-process -> loop, dio)
#   nbdfuse  : nbdkit memory SIZE + nbdfuse        (FUSE file -> libnbd -> NBD -> nbdkit -> loop, dio)
#
# fio (direct=1, ioengine=io_uring) on the raw loop device, then on a file in an
# ext4 made on it: 4k randread/randwrite at QD1 and QD32, 128k sequential
# read/write at QD8. Peers alternate within every repetition (same time window);
# the table shows medians over REPS runs and the ratio iolift / nbdfuse.
# Root only (FUSE mount, losetup). Run it alone: it saturates a 2-core box for
# about REPS * 12 * 2 * (RUNTIME+RAMP+1) seconds.
#
#   bench/fuse.sh [OUTDIR]            default OUTDIR: bench/out/fuse-YYYYmmdd-HHMMSS
#
# Environment: REPS=3 RUNTIME=4 RAMP=1 SIZE=1G (device) AREA=256M (fio region)
#   IOLIFT=path/to/iolift (default: cargo build --release into $CARGO_TARGET_DIR or target/)
#   FUSE_THREADS=2 (iolift attach --fuse-threads)
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD

REPS=${REPS:-3}
RUNTIME=${RUNTIME:-4}
RAMP=${RAMP:-1}
SIZE=${SIZE:-1G}
AREA=${AREA:-256M}
FUSE_THREADS=${FUSE_THREADS:-2}
OUT=${1:-$ROOT/bench/out/fuse-$(date +%Y%m%d-%H%M%S)}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
LOG=$OUT/log
mkdir -p "$LOG"

say() { printf '[fuse-bench %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { say "error: $*"; exit 1; }

[ "$(id -u)" = 0 ] || die "needs root (FUSE mount, losetup)"
[ -e /dev/fuse ] || die "no /dev/fuse"
for t in fio nbdkit nbdfuse losetup mkfs.ext4 python3; do
  command -v "$t" >/dev/null || die "missing $t (scripts/test.sh installs the peers)"
done

if [ -z "${IOLIFT:-}" ]; then
  say "building iolift (release)"
  cargo build --release -q -p iolift
  IOLIFT=${CARGO_TARGET_DIR:-$ROOT/target}/release/iolift
fi
[ -x "$IOLIFT" ] || die "no iolift binary at $IOLIFT"

W=$OUT/work
mkdir -p "$W/mnt-iolift" "$W/mnt-nbdfuse" "$W/nbdfuse"
IOLIFT_FILE=$W/iolift/disk.img
DEV_IOLIFT=""
DEV_NBDFUSE=""

cleanup() {
  set +e
  for m in "$W/mnt-iolift" "$W/mnt-nbdfuse"; do
    mountpoint -q "$m" && umount "$m"
  done
  [ -n "$DEV_IOLIFT" ] && "$IOLIFT" detach "$DEV_IOLIFT" 2>>"$LOG/cleanup.err"
  mountpoint -q "$W/iolift" && umount -l "$W/iolift"
  [ -n "$DEV_NBDFUSE" ] && losetup -d "$DEV_NBDFUSE"
  sleep 0.2
  mountpoint -q "$W/nbdfuse" && { fusermount3 -u "$W/nbdfuse" 2>/dev/null || umount -l "$W/nbdfuse"; }
  [ -f "$W/nbdkit.pid" ] && kill "$(cat "$W/nbdkit.pid")" 2>/dev/null
  return 0
}
trap cleanup EXIT

wait_for() { # file timeout_s
  local i=0
  while [ ! -s "$1" ]; do
    sleep 0.1; i=$((i + 1))
    if [ $i -gt $(($2 * 10)) ]; then die "timeout waiting for $1"; fi
  done
  return 0
}

# ---- peers ---------------------------------------------------------------------------
say "iolift attach memory:$SIZE"
DEV_IOLIFT=$(IOLIFT_LOG=warn "$IOLIFT" attach --daemon --fuse-threads "$FUSE_THREADS" \
  --file "$IOLIFT_FILE" "memory:$SIZE")
say "  -> $DEV_IOLIFT"

say "nbdkit memory $SIZE + nbdfuse"
nbdkit -U "$W/nbdkit.sock" -P "$W/nbdkit.pid" memory "$SIZE" 2>"$LOG/nbdkit.err"
wait_for "$W/nbdkit.pid" 10
nbdfuse -P "$W/nbdfuse.pid" "$W/nbdfuse/disk.img" --unix "$W/nbdkit.sock" \
  >"$LOG/nbdfuse.out" 2>"$LOG/nbdfuse.err" &
wait_for "$W/nbdfuse.pid" 10
DEV_NBDFUSE=$(losetup -f --show --direct-io=on "$W/nbdfuse/disk.img")
say "  -> $DEV_NBDFUSE"
for d in "$DEV_IOLIFT" "$DEV_NBDFUSE"; do
  [ "$(cat /sys/block/"$(basename "$d")"/loop/dio)" = 1 ] || die "$d: no direct I/O"
done

# Fill the fio region so reads return real data on both peers.
for d in "$DEV_IOLIFT" "$DEV_NBDFUSE"; do
  fio --name=fill --filename="$d" --rw=write --bs=1M --iodepth=8 --ioengine=io_uring \
    --direct=1 --size="$AREA" >/dev/null
done

# ---- runs ----------------------------------------------------------------------------
JOBS="randread:4k:1 randwrite:4k:1 randread:4k:32 randwrite:4k:32 read:128k:8 write:128k:8"
RESULTS=$OUT/results.tsv
printf 'target\tjob\tpeer\trep\tiops\tmbps\tp50_us\n' >"$RESULTS"

run_fio() { # target job peer rep file
  local target=$1 job=$2 peer=$3 rep=$4 file=$5
  local rw bs qd
  IFS=: read -r rw bs qd <<<"$job"
  local json=$LOG/$target-$rw-$bs-qd$qd-$peer-$rep.json
  # Let the previous run's write-back (ext4 journal, dirty metadata) finish
  # first, so that it does not eat this run's CPU on a small machine.
  sync
  sleep 1
  fio --name=b --filename="$file" --rw="$rw" --bs="$bs" --iodepth="$qd" \
    --ioengine=io_uring --direct=1 --size="$AREA" --time_based --runtime="$RUNTIME" \
    --ramp_time="$RAMP" --norandommap --randrepeat=0 --output-format=json >"$json"
  python3 - "$json" "$target" "$job" "$peer" "$rep" >>"$RESULTS" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))["jobs"][0]
side = "read" if j["read"]["io_bytes"] > 0 else "write"
s = j[side]
p50 = s.get("clat_ns", {}).get("percentile", {}).get("50.000000", 0) / 1000
print(f"{sys.argv[2]}\t{sys.argv[3]}\t{sys.argv[4]}\t{sys.argv[5]}\t{s['iops']:.0f}\t{s['bw_bytes']/1e6:.1f}\t{p50:.0f}")
PY
}

run_matrix() { # target file-for-iolift file-for-nbdfuse
  local target=$1 fi=$2 fn=$3
  for rep in $(seq 1 "$REPS"); do
    for job in $JOBS; do
      # Alternate which peer goes first.
      if [ $((rep % 2)) = 1 ]; then order="iolift nbdfuse"; else order="nbdfuse iolift"; fi
      for peer in $order; do
        if [ $peer = iolift ]; then f=$fi; else f=$fn; fi
        run_fio "$target" "$job" "$peer" "$rep" "$f"
      done
    done
    say "$target: rep $rep/$REPS done"
  done
}

say "raw loop devices: $REPS reps x 6 jobs x 2 peers, ${RUNTIME}s each"
run_matrix loop "$DEV_IOLIFT" "$DEV_NBDFUSE"

say "ext4 on the loop devices"
for p in iolift nbdfuse; do
  if [ $p = iolift ]; then d=$DEV_IOLIFT; else d=$DEV_NBDFUSE; fi
  mkfs.ext4 -F -q -E nodiscard "$d"
  mount "$d" "$W/mnt-$p"
  fio --name=layout --filename="$W/mnt-$p/fio.dat" --rw=write --bs=1M --iodepth=8 \
    --ioengine=io_uring --direct=1 --size="$AREA" >/dev/null
done
run_matrix ext4 "$W/mnt-iolift/fio.dat" "$W/mnt-nbdfuse/fio.dat"

# ---- table ---------------------------------------------------------------------------
python3 - "$RESULTS" "$REPS" <<'PY' | tee "$OUT/summary.md"
import csv, statistics, sys
rows = list(csv.DictReader(open(sys.argv[1]), delimiter="\t"))
reps = sys.argv[2]
cells = {}
for r in rows:
    cells.setdefault((r["target"], r["job"]), {}).setdefault(r["peer"], []).append(r)
print(f"medians over {reps} runs per cell; peers alternated within each run\n")
print("| target | job | iolift IOPS | nbdfuse IOPS | ratio | iolift MB/s | nbdfuse MB/s | p50 us iolift / nbdfuse |")
print("| --- | --- | --- | --- | --- | --- | --- | --- |")
ratios = []
for (t, job), peers in cells.items():
    def med(p, k):
        return statistics.median(float(x[k]) for x in peers.get(p, [])) if peers.get(p) else 0.0
    ii, ni = med("iolift", "iops"), med("nbdfuse", "iops")
    ratio = ii / ni if ni else float("nan")
    ratios.append(ratio)
    rw, bs, qd = job.split(":")
    print(f"| {t} | {rw} {bs} QD{qd} | {ii:.0f} | {ni:.0f} | {ratio:.2f}x | "
          f"{med('iolift','mbps'):.0f} | {med('nbdfuse','mbps'):.0f} | "
          f"{med('iolift','p50_us'):.0f} / {med('nbdfuse','p50_us'):.0f} |")
g = statistics.geometric_mean([r for r in ratios if r == r and r > 0])
print(f"\ngeometric mean of the IOPS ratios: {g:.2f}x (target >= 1.5x)")
PY
say "results: $OUT/summary.md, raw: $RESULTS"
