#!/usr/bin/env bash
# CRUSH mapping throughput: `iolift crush test` vs `crushtool --test` (Ceph
# 16.2) on the same maps with the same flags, one core and all cores,
# alternating, R repeats; prints medians of mappings/s and iolift/crushtool
# ratios, and checks that both reports are identical in every run.
#
#   bench/crush.sh              # R=3
#   R=5 TARGET_S=2 bench/crush.sh
#
# One mapping = one x through rule 0 with --num-rep 3. Maps come from
# `crushtool --build` (1,000 OSDs, 10 per host, 10 hosts per rack, for each
# bucket algorithm; 10,000 OSDs straw2). N (the x range) is calibrated so
# that one crushtool run takes about TARGET_S seconds.
set -euo pipefail

R=${R:-3}
TARGET_S=${TARGET_S:-2}
CORE=${CORE:-0}
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$PWD/target}
cargo build --release -q -p iolift --bin iolift
IOLIFT=$CARGO_TARGET_DIR/release/iolift
command -v crushtool >/dev/null || { echo "crushtool not found (apt install ceph-common)" >&2; exit 1; }
NCPU=$(nproc)

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

now() { date +%s.%N; }
# secs CMD...: run, print elapsed seconds; stdout to $work/out
secs() {
    local t0 t1
    t0=$(now)
    "$@" >"$work/out" 2>"$work/err" || { echo "failed: $*" >&2; cat "$work/err" >&2; exit 1; }
    t1=$(now)
    echo "$t0 $t1" | awk '{printf "%.6f\n", $2 - $1}'
}
median() { sort -g | awk '{a[NR]=$1} END {if (NR % 2) print a[(NR+1)/2]; else print (a[NR/2] + a[NR/2+1]) / 2}'; }

build_map() { # name osds alg
    crushtool --build --num_osds "$2" host "$3" 10 rack "$3" 10 root "$3" 0 -o "$work/$1" >/dev/null 2>&1
}
maps=()
for alg in straw2 straw list tree uniform; do
    build_map "$alg-1k" 1000 "$alg"
    maps+=("$alg-1k")
done
build_map straw2-10k 10000 straw2
maps+=(straw2-10k)

flags() { echo --rule 0 --num-rep 3 --min-x 0 --max-x "$1" --show-statistics; }

echo "# bench/crush.sh $(date -u +%Y-%m-%dT%H:%MZ) $(uname -n), $NCPU cores ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')), R=$R"
echo "# crushtool: ceph-common $(dpkg-query -W -f '${Version}' ceph-common 2>/dev/null || echo "?") (single-threaded); one core = taskset -c $CORE (+ --threads 1 for iolift)"
printf "%-11s %9s | %12s %12s %6s | %12s %12s %6s | %s\n" \
    map N "crushtool/s" "iolift/s" ratio "crushtool/s" "iolift/s" ratio "output"
printf "%-11s %9s | %-33s | %-33s |\n" "" "" "------------ one core ------------" "------------ all cores -----------"
status=0
for m in "${maps[@]}"; do
    map="$work/$m"
    # Calibrate N on one core.
    n0=20000
    t=$(secs taskset -c "$CORE" crushtool -i "$map" --test $(flags $((n0 - 1))))
    n=$(awk -v n0=$n0 -v t="$t" -v s="$TARGET_S" 'BEGIN {n = int(n0 * s / t); if (n < n0) n = n0; print n}')
    maxx=$((n - 1))
    : >"$work/c1"; : >"$work/i1"; : >"$work/ca"; : >"$work/ia"
    same=yes
    for ((rep = 0; rep < R; rep++)); do
        t=$(secs taskset -c "$CORE" crushtool -i "$map" --test $(flags $maxx)); echo "$n $t" | awk '{print $1 / $2}' >>"$work/c1"
        cp "$work/out" "$work/ref"
        t=$(secs taskset -c "$CORE" "$IOLIFT" crush test -i "$map" $(flags $maxx) --threads 1); echo "$n $t" | awk '{print $1 / $2}' >>"$work/i1"
        cmp -s "$work/out" "$work/ref" || same=NO
        t=$(secs crushtool -i "$map" --test $(flags $maxx)); echo "$n $t" | awk '{print $1 / $2}' >>"$work/ca"
        cmp -s "$work/out" "$work/ref" || same=NO
        t=$(secs "$IOLIFT" crush test -i "$map" $(flags $maxx)); echo "$n $t" | awk '{print $1 / $2}' >>"$work/ia"
        cmp -s "$work/out" "$work/ref" || same=NO
    done
    c1=$(median <"$work/c1"); i1=$(median <"$work/i1")
    ca=$(median <"$work/ca"); ia=$(median <"$work/ia")
    [ "$same" = yes ] && out=identical || { out=DIFFERENT; status=1; }
    awk -v m="$m" -v n="$n" -v c1="$c1" -v i1="$i1" -v ca="$ca" -v ia="$ia" -v out="$out" 'BEGIN {
        printf "%-11s %9d | %12.0f %12.0f %5.2fx | %12.0f %12.0f %5.2fx | %s\n", m, n, c1, i1, i1 / c1, ca, ia, ia / ca, out }'
done
echo "# mappings/s = x values / wall seconds of the whole command (decode and report included), median of $R"
exit $status
