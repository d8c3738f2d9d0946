#!/usr/bin/env bash
# Erasure-coding speed: `iolift ec bench` runs iolift's codec next to ISA-L
# (Debian libisal2, through its own API) and jerasure (Debian libjerasure2,
# reed_sol_van and cauchy_good) in the same process, alternating
# implementations per cell; each cell is REPS runs of MS milliseconds and
# the bench prints the median and best GB/s (data in: k x chunk bytes per
# operation). This script runs it on one pinned core and on all cores and
# prints the medians side by side with the ratios iolift/ISA-L and
# iolift/jerasure, then the worst ratio over all cells against the targets
# (>= 0.95 of ISA-L, >= 3x jerasure reed_sol_van).
#
#   bench/ec.sh                        # k=6,8,10,12 m=4 and k=4 m=2; 4k,64k,1m
#   REPS=5 MS=20 SIZES=4k,1m bench/ec.sh
#   RAW=DIR bench/ec.sh                # also keep the bench's own rows in DIR
#
# Rows: iolift = the codec as `iolift ec encode` runs it (ISA-L's kernels
# when libisal loads); iolift-native = iolift's own AVX2 kernel;
# iolift-cauchy / jerasure-cauchy = cauchy_good bit-matrix encoding.
set -euo pipefail

REPS=${REPS:-10}
MS=${MS:-30}
SIZES=${SIZES:-4k,64k,1m}
K=${K:-6,8,10,12}
CORE=${CORE:-0}
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$PWD/target}
cargo build --release -q -p iolift --bin iolift
IOLIFT=$CARGO_TARGET_DIR/release/iolift
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

echo "# bench/ec.sh $(date -u +%Y-%m-%dT%H:%MZ) $(uname -n), $(nproc) cores ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')), load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "# libisal2 $(dpkg-query -W -f '${Version}' libisal2 2>/dev/null || echo '?'), libjerasure2 $(dpkg-query -W -f '${Version}' libjerasure2 2>/dev/null || echo '?'); REPS=$REPS MS=$MS; one core = taskset -c $CORE"
args=(ec bench --k "$K" --m 4 --extra 4:2 --sizes "$SIZES" --reps "$REPS" --ms "$MS")
taskset -c "$CORE" "$IOLIFT" "${args[@]}" --threads 1 >"$work/one"
"$IOLIFT" "${args[@]}" --threads 0 >"$work/all"
head -1 "$work/one"
if [[ -n "${RAW:-}" ]]; then mkdir -p "$RAW" && cp "$work/one" "$RAW/one-core.tsv" && cp "$work/all" "$RAW/all-cores.tsv"; fi
echo "# load after: $(cut -d' ' -f1-3 /proc/loadavg)"
cat "$work/one" "$work/all" | awk -F'\t' '
    $1 == "encode" || $1 == "decode" {
        key = $1 FS $2 FS $3 FS $4 FS $5
        if (!(key in seen)) { seen[key] = 1; order[++n] = key }
        med[key, $6] = $7
    }
    function r(a, b) { return (a > 0 && b > 0) ? sprintf("%.2f", a / b) : "-" }
    function v(x) { return x == "" ? "-" : x }
    END {
        printf "%-6s %3s %2s %8s %3s | %8s %8s %8s %8s | %6s %6s %6s | %8s %8s %6s\n",
            "op", "k", "m", "chunk", "thr", "iolift", "native", "isal", "jer-rs",
            "io/isa", "nat/isa", "io/jer", "io-cau", "jer-cau", "ratio"
        worst_isa = 1e9; worst_jer = 1e9; worst_nat = 1e9
        for (i = 1; i <= n; i++) {
            key = order[i]; split(key, f, FS)
            io = med[key, "iolift"]; na = med[key, "iolift-native"]; is = med[key, "isal"]
            je = med[key, "jerasure"]; ic = med[key, "iolift-cauchy"]; jc = med[key, "jerasure-cauchy"]
            printf "%-6s %3s %2s %8s %3s | %8s %8s %8s %8s | %6s %6s %6s | %8s %8s %6s\n",
                f[1], f[2], f[3], f[4], f[5], v(io), v(na), v(is), v(je),
                r(io, is), r(na, is), r(io, je), v(ic), v(jc), r(ic, jc)
            if (io > 0 && is > 0 && io / is < worst_isa) worst_isa = io / is
            if (na > 0 && is > 0 && na / is < worst_nat) worst_nat = na / is
            if (io > 0 && je > 0 && io / je < worst_jer) worst_jer = io / je
        }
        printf "worst iolift/isal %.2f (target >= 0.95: %s); worst iolift-native/isal %.2f; worst iolift/jerasure %.2f (target >= 3: %s)\n",
            worst_isa, ((worst_isa >= 0.95) ? "met" : "MISSED"), worst_nat,
            worst_jer, ((worst_jer >= 3) ? "met" : "MISSED")
    }'
