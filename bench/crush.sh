#!/usr/bin/env bash
# CRUSH mapping throughput: `iolift crush test` vs `crushtool --test` (Ceph
# 16.2) on the same maps with the same flags, one core and all cores,
# alternating, R repeats; prints medians of mappings/s, iolift/crushtool
# ratios and peak RSS, and checks that both reports are identical in every
# run.
#
#   bench/crush.sh              # R=3
#   R=5 TARGET_S=2 bench/crush.sh
#   BASE=/path/to/old/iolift bench/crush.sh   # also time an earlier build
#   MAPS="tree-1k uniform-1k" bench/crush.sh  # a subset of the maps
#   IOLIFT=/path/to/iolift bench/crush.sh     # time that binary, build nothing
#
# One mapping = one x through rule 0 with --num-rep 3. Maps come from
# `crushtool --build` (1,000 OSDs, 10 per host, 10 hosts per rack, for each
# bucket algorithm; 10,000 OSDs straw2). N (the x range) is calibrated so
# that one crushtool run takes about TARGET_S seconds.
#
# One core: `taskset -c CORE` (iolift with --threads 1), rate = N / CPU
# seconds (user + sys of the whole command), so that other processes
# sharing the core slow neither side's figure much. All cores: rate = N /
# wall seconds (iolift on every core; crushtool is single-threaded).
set -euo pipefail

R=${R:-3}
TARGET_S=${TARGET_S:-2}
CORE=${CORE:-0}
BASE=${BASE:-}
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$PWD/target}
if [ -z "${IOLIFT:-}" ]; then
    cargo build --release -q -p iolift --bin iolift
    IOLIFT=$CARGO_TARGET_DIR/release/iolift
fi
command -v crushtool >/dev/null || { echo "crushtool not found (apt install ceph-common)" >&2; exit 1; }
[ -x /usr/bin/time ] || { echo "/usr/bin/time not found (apt install time)" >&2; exit 1; }
[ -z "$BASE" ] || [ -x "$BASE" ] || { echo "BASE=$BASE is not an executable" >&2; exit 1; }
NCPU=$(nproc)

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# run CMD...: run it; stdout to $work/out; appends "wall cpu maxrss_kb" to $work/t
run() {
    /usr/bin/time -o "$work/time" -f "%e %U %S %M" "$@" >"$work/out" 2>"$work/err" \
        || { echo "failed: $*" >&2; cat "$work/err" >&2; exit 1; }
    awk '{printf "%s %.3f %s\n", $1, $2 + $3, $4}' "$work/time" >>"$work/t"
}
# rate N FILE FIELD: N / median of FIELD (1 wall, 2 cpu) over the lines of FILE
median() { sort -g | awk '{a[NR]=$1} END {if (NR % 2) print a[(NR+1)/2]; else print (a[NR/2] + a[NR/2+1]) / 2}'; }
rate() { awk -v f="$3" '{print $f}' "$2" | median | awk -v n="$1" '{printf "%.0f", ($1 > 0) ? n / $1 : 0}'; }
rss_mb() { awk '{print $3}' "$1" | median | awk '{printf "%.1f", $1 / 1024}'; }

build_map() { # name osds alg
    crushtool --build --num_osds "$2" host "$3" 10 rack "$3" 10 root "$3" 0 -o "$work/$1" >/dev/null 2>&1
}
all_maps="straw2-1k straw-1k list-1k tree-1k uniform-1k straw2-10k"
maps=${MAPS:-$all_maps}
for alg in straw2 straw list tree uniform; do
    build_map "$alg-1k" 1000 "$alg"
done
build_map straw2-10k 10000 straw2

flags() { echo --rule 0 --num-rep 3 --min-x 0 --max-x "$1" --show-statistics; }

echo "# bench/crush.sh $(date -u +%Y-%m-%dT%H:%MZ) $(uname -n), $NCPU cores ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')), R=$R, load$(uptime | sed 's/.*load average//')"
echo "# crushtool: ceph-common $(dpkg-query -W -f '${Version}' ceph-common 2>/dev/null || echo "?") (single-threaded); one core = taskset -c $CORE (+ --threads 1 for iolift)"
[ -z "$BASE" ] || echo "# base: $BASE"
hdr_base=""; [ -z "$BASE" ] || hdr_base=$(printf " %10s %6s" "base/s" "i/base")
printf "%-11s %8s | %11s %11s %6s%s | %11s %11s %6s | %9s %9s | %s\n" \
    map N "crushtool/s" "iolift/s" ratio "$hdr_base" "crushtool/s" "iolift/s" ratio "ct MB" "iolift MB" "output"
printf "%-11s %8s | %-$((30 + ${#hdr_base}))s | %-30s | %-19s |\n" "" "" "one core (per CPU second)" "all cores (per wall second)" "peak RSS, one core"
status=0
for m in $maps; do
    map="$work/$m"
    [ -f "$map" ] || { echo "unknown map $m (maps: $all_maps)" >&2; exit 1; }
    # Calibrate N on one core.
    n0=20000
    : >"$work/t"
    run taskset -c "$CORE" crushtool -i "$map" --test $(flags $((n0 - 1)))
    t=$(awk '{print $2}' "$work/t")
    n=$(awk -v n0=$n0 -v t="$t" -v s="$TARGET_S" 'BEGIN {n = (t > 0) ? int(n0 * s / t) : n0 * 10; if (n < n0) n = n0; print n}')
    maxx=$((n - 1))
    for f in c1 i1 b1 ca ia; do : >"$work/$f"; done
    same=yes
    for ((rep = 0; rep < R; rep++)); do
        : >"$work/t"; run taskset -c "$CORE" crushtool -i "$map" --test $(flags $maxx); cat "$work/t" >>"$work/c1"
        cp "$work/out" "$work/ref"
        : >"$work/t"; run taskset -c "$CORE" "$IOLIFT" crush test -i "$map" $(flags $maxx) --threads 1; cat "$work/t" >>"$work/i1"
        cmp -s "$work/out" "$work/ref" || same=NO
        if [ -n "$BASE" ]; then
            : >"$work/t"; run taskset -c "$CORE" "$BASE" crush test -i "$map" $(flags $maxx) --threads 1; cat "$work/t" >>"$work/b1"
            cmp -s "$work/out" "$work/ref" || same=NO
        fi
        : >"$work/t"; run crushtool -i "$map" --test $(flags $maxx); cat "$work/t" >>"$work/ca"
        cmp -s "$work/out" "$work/ref" || same=NO
        : >"$work/t"; run "$IOLIFT" crush test -i "$map" $(flags $maxx); cat "$work/t" >>"$work/ia"
        cmp -s "$work/out" "$work/ref" || same=NO
    done
    c1=$(rate "$n" "$work/c1" 2); i1=$(rate "$n" "$work/i1" 2)
    ca=$(rate "$n" "$work/ca" 1); ia=$(rate "$n" "$work/ia" 1)
    col_base=""
    if [ -n "$BASE" ]; then
        b1=$(rate "$n" "$work/b1" 2)
        col_base=$(awk -v b="$b1" -v i="$i1" 'BEGIN {printf " %10d %5.2fx", b, (b > 0) ? i / b : 0}')
    fi
    [ "$same" = yes ] && out=identical || { out=DIFFERENT; status=1; }
    awk -v m="$m" -v n="$n" -v c1="$c1" -v i1="$i1" -v ca="$ca" -v ia="$ia" -v cb="$col_base" \
        -v rc="$(rss_mb "$work/c1")" -v ri="$(rss_mb "$work/i1")" -v out="$out" 'BEGIN {
        printf "%-11s %8d | %11d %11d %5.2fx%s | %11d %11d %5.2fx | %9s %9s | %s\n",
            m, n, c1, i1, (c1 > 0) ? i1 / c1 : 0, cb, ca, ia, (ca > 0) ? ia / ca : 0, rc, ri, out }'
done
echo "# one core: mappings per CPU second (user+sys of the whole command: decode and report included); all cores: per wall second; medians of $R; MB = median peak RSS of the one-core runs"
exit $status
