#!/usr/bin/env bash
# THE GPU check of the offload engine (crates/iolift-offload): run on a
# machine with a CUDA GPU.
# Builds, checks GPU == CPU mapper bit for bit, and erasure coding GPU ==
# CPU codec byte for byte, times everything, writes the results. One command:
#
#   scripts/gpu-check.sh                 # results in target/gpu-check/<UTC time>/
#   OUT=/some/dir scripts/gpu-check.sh   # results in $OUT
#
# Knobs: IOLIFT_GPU_RANDOM (random inputs per map, default 10000000),
# IOLIFT_BIN (a prebuilt iolift binary: skips cargo, and with it the Rust
# GPU tests of step 4),
# IOLIFT_NVRTC (path of libnvrtc.so.12 if it is not found by itself),
# IOLIFT_KERNEL_CACHE (PTX cache dir; a cache filled elsewhere lets the GPU
# run without NVRTC), CARGO_TARGET_DIR. Exit status: 0 when every check
# passed; the timings are recorded either way.
# Dry run of this script on a machine without a GPU (small sizes, CPU device):
#   IOLIFT_CHECK_DEVICE=cpu IOLIFT_CHECK_QUICK=1 scripts/gpu-check.sh
set -uo pipefail
cd "$(dirname "$0")/.."
DEV=${IOLIFT_CHECK_DEVICE:-gpu}
QUICK=${IOLIFT_CHECK_QUICK:-0}
if [[ "$QUICK" == 1 ]]; then
    RANDOM_N=${IOLIFT_GPU_RANDOM:-20000}; PGS=4096; PGS4=8192; BATCH=1000; QF=--quick; OSDS2=1000
else
    RANDOM_N=${IOLIFT_GPU_RANDOM:-10000000}; PGS=1048576; PGS4=4194304; BATCH=1000000; QF=; OSDS2=10000
fi
OUT=${OUT:-target/gpu-check/$(date -u +%Y%m%dT%H%M%SZ)}
mkdir -p "$OUT"
LOG="$OUT/gpu-check.txt"
fail=0
log() { printf '%s\n' "$*" | tee -a "$LOG" >&2; }
run() { # run NAME CMD...: tee output into $OUT/NAME.txt, record status
    local name=$1; shift
    log "== $name: $*"
    local t0=$EPOCHREALTIME
    "$@" > >(tee "$OUT/$name.txt") 2>&1
    local rc=$?
    log "== $name: exit $rc in $(awk -v a="$t0" -v b="$EPOCHREALTIME" 'BEGIN{printf "%.1f", b-a}') s"
    ((rc == 0)) || fail=1
    return $rc
}

log "iolift gpu-check $(git rev-parse --short HEAD 2>/dev/null) at $(date -u)"
if command -v nvidia-smi >/dev/null; then
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv | tee -a "$LOG"
else
    log "nvidia-smi not found"
fi
nproc | sed 's/^/cpu cores: /' | tee -a "$LOG"

# 1. build
BIN=${IOLIFT_BIN:-}
if [[ -z "$BIN" ]]; then
    run build cargo build --release -p iolift --bin iolift || { log "build failed"; exit 1; }
    BIN=${CARGO_TARGET_DIR:-target}/release/iolift
fi
run device "$BIN" offload info --device "$DEV" || { log "no usable GPU: stopping (see $OUT/device.txt)"; exit 1; }

# 2. kernels compile (NVRTC) -- the device step above already compiled or loaded the cached PTX
"$BIN" offload kernels --arch compute_90 >"$OUT/nvrtc.txt" 2>&1 || log "NVRTC not loadable here (the PTX cache was used)"

# 3. GPU == CPU: the corpus (every bucket algorithm, tunables profile, rule
#    shape, choose_args) and synthetic straw2 1,000- and 10,000-OSD maps,
#    x = 0..1023 for sizes 1/3/6 and $RANDOM_N random inputs per map.
MAPS=()
for f in crates/iolift-offload/tests/maps/*.bin; do MAPS+=(--map "$f"); done
run check "$BIN" crush check --device "$DEV" --random "$RANDOM_N" "${MAPS[@]}" --synthetic --osds 1000,$OSDS2

# 4. the Rust test suite's GPU tests (corpus, pool on streams, whole pool);
#    ignored by a plain `cargo test`, run here with --ignored, where a
#    missing GPU is a failure
if [[ -z "${IOLIFT_BIN:-}" && "$DEV" == gpu* ]]; then
    run gpu-tests cargo test --release -p iolift-offload --test gpu -- --ignored --nocapture
fi

# 4b. `iolift crush test --device gpu` gives the same report as --device cpu
#     (x = 0..9999 over every rule and numrep: 10^5 x made 839 MB reports)
for f in crates/iolift-offload/tests/maps/straw2-choose_args-jewel.bin crates/iolift-offload/tests/maps/tree-argonaut-toptree.bin; do
    b=$(basename "$f" .bin)
    "$BIN" crush test -i "$f" --show-mappings --show-statistics --min-x 0 --max-x 9999 --device cpu >"$OUT/crush-test-$b-cpu.txt" 2>&1
    if "$BIN" crush test -i "$f" --show-mappings --show-statistics --min-x 0 --max-x 9999 --device "$DEV" >"$OUT/crush-test-$b-dev.txt" 2>&1 &&
        cmp -s "$OUT/crush-test-$b-cpu.txt" "$OUT/crush-test-$b-dev.txt"; then
        log "crush test --device $DEV == --device cpu on $b"
    else
        log "crush test --device $DEV differs from --device cpu on $b (or failed)"; fail=1
    fi
done
run crush-bench "$BIN" crush bench --device "$DEV" --osds 1000 --max-batch $BATCH $QF

# 5. timings (targets, H100: >= 1e8 mappings/s on 1,000 OSDs 3-replica;
#    1M-PG pool on 10,000 OSDs < 100 ms; round trip <= 20 us; >= 1e7 tasks/s)
run bench-dev-1000 "$BIN" crush bench --device "$DEV" --osds 1000 --pes 4 --max-batch $BATCH $QF
# the pool without spinning waiters (IOLIFT_POOL_SPIN_US=0), short run
IOLIFT_POOL_SPIN_US=0 run bench-dev-nospin "$BIN" crush bench --device "$DEV" --osds 1000 --pes 4 --max-batch 10000 --quick
run bench-dev-10000 "$BIN" crush bench --device "$DEV" --osds $OSDS2 --pes 4 --max-batch $BATCH $QF
run pool-dev-rep "$BIN" crush map-pool --device "$DEV" --osds $OSDS2 --pg-num $PGS --size 3
run pool-dev-ec "$BIN" crush map-pool --device "$DEV" --osds $OSDS2 --pg-num $PGS --size 6 --ec
run pool-dev-4m "$BIN" crush map-pool --device "$DEV" --osds $OSDS2 --pg-num $PGS4 --size 3
# 5b. thread-kernel variants (launch bounds, block size): exact on the
#     synthetic maps, and their kernel-only rates (check's mappings/s)
if [[ "$DEV" == gpu* && "$QUICK" != 1 ]]; then
    for v in lb6 lb8 b256; do
        if [[ $v == b256 ]]; then
            IOLIFT_BLOCK=256 run check-$v "$BIN" crush check --device "$DEV" --random 2000000 --synthetic --osds 1000,$OSDS2
        else
            IOLIFT_THREAD_KERNEL=$v run check-$v "$BIN" crush check --device "$DEV" --random 2000000 --synthetic --osds 1000,$OSDS2
        fi
    done
fi
# the same on this machine's CPU cores, for the ratios
run bench-cpu-1000 "$BIN" crush bench --device cpu --osds 1000 --max-batch $((BATCH < 100000 ? BATCH : 100000)) $QF
run pool-cpu-rep "$BIN" crush map-pool --device cpu --osds $OSDS2 --pg-num $PGS --size 3

# 6. erasure coding (the Rust GPU tests of step 4 include gpu::ec::*: GPU ==
#    CPU codec on 256 MiB random batches, staged, device-resident, pool,
#    decode). `iolift ec encode/decode --device gpu` == --device cpu on a
#    random object (every shard, and the object decoded without shards 0
#    and 1); the dry run takes the same path on the CPU device.
if [[ "$DEV" == gpu* || "$DEV" == cuda* ]]; then ECENV=(); else ECENV=(env IOLIFT_EC_GPU_DEVICE=cpu); fi
EC_MB=$([[ "$QUICK" == 1 ]] && echo 4 || echo 256)
ECDIR="$OUT/ec-cli"; mkdir -p "$ECDIR/cpu" "$ECDIR/gpu"
head -c $((EC_MB * 1048576 + 12345)) /dev/urandom >"$ECDIR/object"
for prof in plugin=isa,technique=reed_sol_van,k=8,m=4 plugin=jerasure,technique=reed_sol_van,k=6,m=3 plugin=isa,technique=cauchy,k=4,m=2; do
    n=$("$BIN" ec validate-profile "$prof" chunk_count)
    ok=1
    for d in cpu gpu; do
        cp "$ECDIR/object" "$ECDIR/$d/obj"
        "${ECENV[@]}" "$BIN" ec encode --device $d "$prof" 65536 "$(seq -s, 0 $((n - 1)))" "$ECDIR/$d/obj" >>"$OUT/ec-cli.txt" 2>&1 || ok=0
        rm -f "$ECDIR/$d/obj"
        "${ECENV[@]}" "$BIN" ec decode --device $d "$prof" 65536 "$(seq -s, 2 $((n - 1)))" "$ECDIR/$d/obj" >>"$OUT/ec-cli.txt" 2>&1 || ok=0
    done
    for ((i = 0; i < n; i++)); do cmp -s "$ECDIR/cpu/obj.$i" "$ECDIR/gpu/obj.$i" || ok=0; done
    cmp -s "$ECDIR/cpu/obj" "$ECDIR/gpu/obj" || ok=0
    cmp -s -n $((EC_MB * 1048576 + 12345)) "$ECDIR/gpu/obj" "$ECDIR/object" || ok=0
    if ((ok)); then log "ec encode/decode --device gpu == --device cpu ($prof, $EC_MB MiB): identical"
    else log "ec encode/decode --device gpu differs from --device cpu ($prof) or failed: MISMATCH"; fail=1; fi
    rm -f "$ECDIR"/cpu/* "$ECDIR"/gpu/*
done
rm -rf "$ECDIR"
# 6b. encode GB/s, k=8,m=4: GPU with the data on the device and from host
#     memory (each checked against the CPU codec), and this machine's CPU
if [[ "$DEV" == gpu* || "$DEV" == cuda* ]]; then
    run ec-bench-gpu "$BIN" ec bench --device gpu --k 8 --m 4 --extra "" --sizes 4k,64k,1m --ms 500
fi
if [[ "$QUICK" == 1 ]]; then
    run ec-bench-cpu "$BIN" ec bench --device cpu --k 8 --m 4 --extra "" --sizes 64k --threads 0 --reps 2 --ms 20
else
    run ec-bench-cpu "$BIN" ec bench --device cpu --k 8 --m 4 --extra "" --sizes 4k,64k,1m --threads 1,0
fi

log "summary:"
ec_lines=$(grep -h "^ec encode/decode" "$LOG")
grep -h -E "mappings/s|round trip|tasks/s, batches of (1|1000|1000000):|whole pool|identical|MISMATCH|inputs compared|gpu encode" "$OUT"/check*.txt "$OUT"/bench-*.txt "$OUT"/pool-*.txt "$OUT"/ec-bench-gpu.txt 2>/dev/null | tee -a "$LOG"
printf '%s\n' "$ec_lines" | tee -a "$LOG"
if ((fail)); then log "gpu-check: FAILED (see $OUT)"; exit 1; fi
log "gpu-check: all checks passed; results in $OUT"
