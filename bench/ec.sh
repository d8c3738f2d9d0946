#!/usr/bin/env bash
# Erasure-coding speed: `iolift ec bench` runs iolift's codec next to ISA-L
# (Debian libisal2, through its own API: its own matrix and inversion) and
# jerasure (Debian libjerasure2, reed_sol_van and cauchy_good) in the same
# process, alternating implementations per cell; each cell is REPS runs of
# MS milliseconds and the bench prints the median and best GB/s (data in:
# k x chunk bytes per operation) and its peak RSS. This script runs it on
# one pinned core and on all cores and prints the medians side by side
# with the ratios, then the minimum and median of each ratio over the
# cells (per column of one/all cores, encode/decode) against the targets:
# >= 0.95 of ISA-L, >= 3x jerasure reed_sol_van. isal/jer is ISA-L's own
# ratio to jerasure in the same run. With a CUDA device (/dev/nvidiactl)
# it also runs `iolift ec bench --device gpu` for k=8, m=4.
#
#   bench/ec.sh                        # k=6,8,10,12 m=4 and 4:2, 8:2, 16:4; 4k,64k,1m
#   REPS=5 MS=20 SIZES=4k,1m bench/ec.sh
#   RAW=DIR bench/ec.sh                # also keep the bench's own rows in DIR
#   CLOCK=cpu bench/ec.sh              # time by each thread's CPU time (busy machine)
#
# Rows: iolift = the codec as `iolift ec encode` runs it (engine auto:
# iolift's own AVX2 kernel on an AVX2 CPU); io-isal = the same matrices on
# ISA-L's kernels (engine isal); iolift-cauchy / jerasure-cauchy =
# cauchy_good bit-matrix encoding.
set -euo pipefail

REPS=${REPS:-10}
MS=${MS:-30}
SIZES=${SIZES:-4k,64k,1m}
K=${K:-6,8,10,12}
EXTRA=${EXTRA:-4:2,8:2,16:4}
CORE=${CORE:-0}
CLOCK=${CLOCK:-wall}
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$PWD/target}
cargo build --release -q -p iolift --bin iolift
IOLIFT=$CARGO_TARGET_DIR/release/iolift
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

echo "# bench/ec.sh $(date -u +%Y-%m-%dT%H:%MZ) $(uname -n), $(nproc) cores ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')), load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "# libisal2 $(dpkg-query -W -f '${Version}' libisal2 2>/dev/null || echo '?'), libjerasure2 $(dpkg-query -W -f '${Version}' libjerasure2 2>/dev/null || echo '?'); REPS=$REPS MS=$MS CLOCK=$CLOCK; one core = taskset -c $CORE"
args=(ec bench --k "$K" --m 4 --extra "$EXTRA" --sizes "$SIZES" --reps "$REPS" --ms "$MS" --clock "$CLOCK")
taskset -c "$CORE" "$IOLIFT" "${args[@]}" --threads 1 >"$work/one"
echo "# load between: $(cut -d' ' -f1-3 /proc/loadavg)"
"$IOLIFT" "${args[@]}" --threads 0 >"$work/all"
head -1 "$work/one"
echo "# peak RSS (iolift and its peers, one process): one core $(awk '/^# peak RSS/{print $4, $5}' "$work/one"), all cores $(awk '/^# peak RSS/{print $4, $5}' "$work/all")"
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
    # ratio a/b of the cell into list `name` of its group (op, threads)
    function add(name, grp, a, b) {
        if (a > 0 && b > 0) { cnt[name, grp]++; val[name, grp, cnt[name, grp]] = a / b
            cnt[name, "all"]++; val[name, "all", cnt[name, "all"]] = a / b }
    }
    function stats(name, grp,    m, i, j, t, x) {
        m = cnt[name, grp]; if (m == 0) return "-"
        for (i = 1; i <= m; i++) x[i] = val[name, grp, i]
        for (i = 2; i <= m; i++) { t = x[i]; for (j = i - 1; j >= 1 && x[j] > t; j--) x[j + 1] = x[j]; x[j + 1] = t }
        return sprintf("%.2f / %.2f", x[1], (m % 2) ? x[(m + 1) / 2] : (x[m / 2] + x[m / 2 + 1]) / 2)
    }
    END {
        printf "%-6s %3s %2s %8s %3s | %8s %8s %8s %8s | %6s %6s %6s %7s | %8s %8s %6s\n",
            "op", "k", "m", "chunk", "thr", "iolift", "io-isal", "isal", "jer-rs",
            "io/isa", "io/jer", "isa/jer", "ioi/isa", "io-cau", "jer-cau", "ratio"
        ngrp = 0
        for (i = 1; i <= n; i++) {
            key = order[i]; split(key, f, FS)
            io = med[key, "iolift"]; ii = med[key, "iolift-isal"]; is = med[key, "isal"]
            je = med[key, "jerasure"]; ic = med[key, "iolift-cauchy"]; jc = med[key, "jerasure-cauchy"]
            printf "%-6s %3s %2s %8s %3s | %8s %8s %8s %8s | %6s %6s %6s %7s | %8s %8s %6s\n",
                f[1], f[2], f[3], f[4], f[5], v(io), v(ii), v(is), v(je),
                r(io, is), r(io, je), r(is, je), r(ii, is), v(ic), v(jc), r(ic, jc)
            grp = f[1] " thr=" f[5]
            if (!(grp in gseen)) { gseen[grp] = 1; groups[++ngrp] = grp }
            add("io/isa", grp, io, is); add("io/jer", grp, io, je); add("isa/jer", grp, is, je)
        }
        print "per-cell ratios, min / median:"
        printf "  %-16s %13s %13s %13s\n", "", "iolift/isal", "iolift/jer", "isal/jer"
        for (g = 1; g <= ngrp; g++)
            printf "  %-16s %13s %13s %13s\n", groups[g], stats("io/isa", groups[g]), stats("io/jer", groups[g]), stats("isa/jer", groups[g])
        printf "  %-16s %13s %13s %13s\n", "all cells", stats("io/isa", "all"), stats("io/jer", "all"), stats("isa/jer", "all")
        split(stats("io/isa", "all"), a, " / "); split(stats("io/jer", "all"), b, " / ")
        printf "worst iolift/isal %.2f (target >= 0.95: %s); worst iolift/jerasure %.2f (target >= 3: %s)\n",
            a[1], ((a[1] >= 0.95) ? "met" : "MISSED"), b[1], ((b[1] >= 3) ? "met" : "MISSED")
    }'
if [[ -e /dev/nvidiactl ]]; then
    echo "# GPU (k=8, m=4):"
    "$IOLIFT" ec bench --device gpu --k 8 --extra '' --sizes "$SIZES" --ms 200
else
    echo "# GPU: none on this machine (no /dev/nvidiactl), no GPU column"
fi
