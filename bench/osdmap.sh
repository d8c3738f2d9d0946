#!/usr/bin/env bash
# Whole-cluster placement throughput: `iolift osdmap MAP
# --test-map-pgs-dump-all` against `osdmaptool MAP --test-map-pgs-dump-all`
# (Ceph 16.2) on the same map, one core and all cores, alternating, R
# repeats. Prints medians of PGs per second of wall time (decode, mapping
# and the whole report included), iolift/osdmaptool ratios, peak RSS, and
# whether both reports were identical (program name aside) in every run.
#
#   bench/osdmap.sh                    # 10,000 OSDs, pg-bits 7: 1.28M PGs, R=3
#   R=5 OSDS=1000 PGBITS=6 bench/osdmap.sh
#   IOLIFT=path/to/iolift bench/osdmap.sh   # use that binary, build nothing
#
# The map: `osdmaptool --createsimple OSDS --with-default-pool --pg-bits
# PGBITS`, a straw2 crush map from `crushtool --build` (20 OSDs per host,
# 20 hosts per rack, 5 racks per row, rows under the root) imported into
# it, every OSD marked up and in and saved (`iolift osdmap --mark-up-in
# --save`; osdmaptool reads that map like its own). osdmaptool is
# single-threaded: "all cores" runs it unpinned. Where `--device gpu`
# works (a usable GPU), iolift also runs with it (CRUSH on the GPU).
#
# Then the diff of two such maps (DIFF=0 skips it): NEW is the map with
# the CRUSH weight of DIFF_OSDS OSDs halved by crushtool --reweight-item
# and imported by osdmaptool. iolift: `iolift osdmap diff OLD NEW` (all
# cores). Peer, timed together: osdmaptool --test-map-pgs-dump-all of both
# maps (the two at once, one per core) and a diff of their up sets (awk +
# diff). Both must find the same number of PGs whose up set changed.
set -euo pipefail

R=${R:-3}
DIFF=${DIFF:-1}
DIFF_OSDS=${DIFF_OSDS:-20}
OSDS=${OSDS:-10000}
PGBITS=${PGBITS:-7}
CORE=${CORE:-0}
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$PWD/target}
if [ -z "${IOLIFT:-}" ]; then
    cargo build --release -q -p iolift --bin iolift
    IOLIFT=$CARGO_TARGET_DIR/release/iolift
fi
command -v osdmaptool >/dev/null || { echo "osdmaptool not found (apt install ceph-base)" >&2; exit 1; }
NCPU=$(nproc)

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

now() { date +%s.%N; }
# run OUT CMD...: run with peak RSS recorded; prints "seconds rss_kib"
run() {
    local out=$1 t0 t1
    shift
    t0=$(now)
    /usr/bin/time -f "%M" -o "$work/rss" "$@" >"$out" 2>"$work/err" ||
        { echo "failed: $*" >&2; cat "$work/err" >&2; exit 1; }
    t1=$(now)
    echo "$t0 $t1 $(tail -1 "$work/rss")" | awk '{printf "%.6f %d\n", $2 - $1, $3}'
}
median() { sort -g | awk '{a[NR]=$1} END {if (NR % 2) print a[(NR+1)/2]; else print (a[NR/2] + a[NR/2+1]) / 2}'; }

map=$work/map.bin
osdmaptool --createsimple "$OSDS" --with-default-pool --pg-bits "$PGBITS" --clobber "$map" >/dev/null 2>&1
crushtool --build --num_osds "$OSDS" host straw2 20 rack straw2 20 row straw2 5 root straw2 0 \
    -o "$work/crush.bin" >/dev/null 2>&1
osdmaptool "$map" --import-crush "$work/crush.bin" >/dev/null 2>&1
"$IOLIFT" osdmap "$map" --mark-up-in --save >/dev/null 2>&1
PGS=$(osdmaptool "$map" --print 2>/dev/null | awk '/^pool /{for (i = 1; i < NF; i++) if ($i == "pg_num") s += $(i + 1)} END {print s}')

echo "# bench/osdmap.sh $(date -u +%Y-%m-%dT%H:%MZ) $(uname -n), $NCPU cores ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')), R=$R"
echo "# map: $OSDS OSDs, $PGS PGs (--createsimple --pg-bits $PGBITS + crushtool --build straw2 host 20 rack 20 row 5 root)"
echo "# osdmaptool: ceph-base $(dpkg-query -W -f '${Version}' ceph-base 2>/dev/null || echo "?"); one core = taskset -c $CORE (+ --threads 1 for iolift); load before: $(cut -d' ' -f1-3 /proc/loadavg)"
flags=(--test-map-pgs-dump-all)
same=yes
for ((rep = 0; rep < R; rep++)); do
    read -r t m < <(run "$work/ref" taskset -c "$CORE" osdmaptool "$map" "${flags[@]}")
    echo "$PGS $t $m" | awk '{print $1 / $2, $3}' >>"$work/o1"
    sed -i 's/^osdmaptool: /iolift: /' "$work/ref"
    read -r t m < <(run "$work/out" taskset -c "$CORE" "$IOLIFT" osdmap "$map" "${flags[@]}" --threads 1)
    echo "$PGS $t $m" | awk '{print $1 / $2, $3}' >>"$work/i1"
    cmp -s "$work/out" "$work/ref" || same=NO
    read -r t m < <(run "$work/out" osdmaptool "$map" "${flags[@]}")
    echo "$PGS $t $m" | awk '{print $1 / $2, $3}' >>"$work/oa"
    read -r t m < <(run "$work/out" "$IOLIFT" osdmap "$map" "${flags[@]}")
    echo "$PGS $t $m" | awk '{print $1 / $2, $3}' >>"$work/ia"
    cmp -s "$work/out" "$work/ref" || same=NO
done
col() { cut -d' ' -f"$2" <"$work/$1" | median; }
o1=$(col o1 1); i1=$(col i1 1); oa=$(col oa 1); ia=$(col ia 1)
printf "%-10s | %14s %14s %6s | %14s %14s %6s | %s\n" "" "osdmaptool/s" "iolift/s" ratio "osdmaptool/s" "iolift/s" ratio output
printf "%-10s | %-37s | %-37s |\n" "" "------------- one core --------------" "------------- all cores -------------"
printf "%-10s | %14.0f %14.0f %6.2f | %14.0f %14.0f %6.2f | %s\n" "PGs/s" "$o1" "$i1" \
    "$(echo "$i1 $o1" | awk '{print $1 / $2}')" "$oa" "$ia" "$(echo "$ia $oa" | awk '{print $1 / $2}')" \
    "$([ "$same" = yes ] && echo identical || echo DIFFERENT)"
printf "%-10s | %14.1f %14.1f %6s | %14.1f %14.1f %6s |\n" "RSS MiB" \
    "$(echo "$(col o1 2)" | awk '{print $1 / 1024}')" "$(echo "$(col i1 2)" | awk '{print $1 / 1024}')" "" \
    "$(echo "$(col oa 2)" | awk '{print $1 / 1024}')" "$(echo "$(col ia 2)" | awk '{print $1 / 1024}')" ""
met() { awk -v a="$1" -v b="$2" 'BEGIN {print (a >= b) ? "met" : "NOT met"}'; }
echo "# target one core >= 2x osdmaptool's PGs/s: $(met "$(echo "$i1 $o1" | awk '{print $1 / $2}')" 2)"
if "$IOLIFT" osdmap "$map" --test-map-pgs --device gpu >/dev/null 2>&1; then
    for ((rep = 0; rep < R; rep++)); do
        read -r t m < <(run "$work/out" "$IOLIFT" osdmap "$map" "${flags[@]}" --device gpu)
        echo "$PGS $t $m" | awk '{print $1 / $2, $3}' >>"$work/ig"
        cmp -s "$work/out" "$work/ref" || same=NO
    done
    ig=$(col ig 1)
    printf "%-10s | %14.0f PGs/s with --device gpu, %.2fx osdmaptool one core, RSS %.1f MiB\n" "GPU" "$ig" \
        "$(echo "$ig $o1" | awk '{print $1 / $2}')" "$(col ig 2 | awk '{print $1 / 1024}')"
    echo "# target >= 20x osdmaptool with a GPU: $(met "$(echo "$ig $o1" | awk '{print $1 / $2}')" 20)"
else
    echo "# target >= 20x osdmaptool with a GPU: not measured (--device gpu: no usable GPU here)"
fi
if [ "$DIFF" = 1 ]; then
    new=$work/new.bin
    cp "$map" "$new"
    osdmaptool "$new" --export-crush "$work/c0.bin" >/dev/null 2>&1
    cur=$work/c0.bin
    for ((i = 0; i < DIFF_OSDS; i++)); do
        o=$(( (i * 7919) % OSDS ))
        crushtool -i "$cur" --reweight-item "osd.$o" 0.5 -o "$work/c$((i + 1)).bin" >/dev/null 2>&1
        cur=$work/c$((i + 1)).bin
    done
    osdmaptool "$new" --import-crush "$cur" >/dev/null 2>&1
    # peer: both dumps at once, then the PGs whose up set differs
    peer_diff() {
        osdmaptool "$map" --test-map-pgs-dump-all >"$work/da" 2>/dev/null &
        osdmaptool "$new" --test-map-pgs-dump-all >"$work/db" 2>/dev/null
        wait
        ups() { awk '/ raw \(/ {split($0, a, " up \\("); split(a[2], b, "]"); print $1, b[1]}' "$1"; }
        diff <(ups "$work/da") <(ups "$work/db") | grep -c '^<' || true
    }
    for ((rep = 0; rep < R; rep++)); do
        read -r t m < <(run "$work/pd" bash -c "$(declare -f peer_diff); map=$map new=$new work=$work; peer_diff")
        echo "$t $m" >>"$work/dp"
        read -r t m < <(run "$work/id" "$IOLIFT" osdmap diff "$map" "$new")
        echo "$t $m" >>"$work/di"
    done
    pc=$(cat "$work/pd"); ic=$(awk '/^pgs changed/ {print $3}' "$work/id")
    dp=$(col dp 1); di=$(col di 1)
    echo "# diff: $DIFF_OSDS OSDs reweighted to 0.5 by crushtool; PGs whose up set changed: osdmaptool+diff $pc, iolift $ic ($([ "$pc" = "$ic" ] && echo agree || echo DISAGREE))"
    printf "%-10s | %14s %14s %6s\n" "diff" "peer s" "iolift s" ratio
    printf "%-10s | %14.2f %14.2f %6.2f\n" "seconds" "$dp" "$di" "$(echo "$dp $di" | awk '{print $1 / $2}')"
    printf "%-10s | %14.1f %14.1f\n" "RSS MiB" "$(col dp 2 | awk '{print $1 / 1024}')" "$(col di 2 | awk '{print $1 / 1024}')"
    echo "# target diff of two $OSDS-OSD maps ($PGS PGs) in seconds (< 10 s wall): $(awk -v d="$di" 'BEGIN {print (d < 10) ? "met" : "NOT met"}')"
    [ "$pc" = "$ic" ] || same=NO
fi
echo "# per run PGs/s: osdmaptool 1 core $(cut -d' ' -f1 "$work/o1" | xargs printf '%.0f ' ), iolift 1 core $(cut -d' ' -f1 "$work/i1" | xargs printf '%.0f ')"
echo "# load after: $(cut -d' ' -f1-3 /proc/loadavg)"
[ "$same" = yes ]
