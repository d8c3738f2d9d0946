#!/usr/bin/env bash
# The upmap balancer: `iolift osdmap MAP --upmap FILE --upmap-max MAX
# --save` against `osdmaptool MAP --upmap FILE --upmap-max MAX --save`
# (Ceph 16.2) on the same maps, alternating, R repeats each. Prints, per
# map, medians of wall time, changes (command lines) and pairs proposed,
# the largest and the standard deviation of |PG count - target| over the
# OSDs after the changes, peak RSS, the iolift/osdmaptool time ratio, and
# whether the target is met: iolift's deviation (max and stddev) no worse
# than osdmaptool's, no more changes, in <= 1/10 of its time (10,000 OSDs).
#
# Both results are judged by the same referee: osdmaptool
# --test-map-pgs-dump on the saved map gives every PG's set, from which
# the script counts shards per OSD; the target of an OSD is the pool's
# shards times its CRUSH weight share. osdmaptool also checks every
# set: no OSD twice, no two shards on one host (`check=ok`).
#
#   bench/osdmap-upmap.sh                  # R=3, maps 1000:5 and 10000:2
#   R=1 MAPS=1000:5 bench/osdmap-upmap.sh  # OSDS:PGBITS pairs
#   IOLIFT=path/to/iolift bench/osdmap-upmap.sh   # build nothing
#
# The maps: `osdmaptool --createsimple OSDS --with-default-pool --pg-bits
# PGBITS` (one size-3 pool, OSDS << PGBITS PGs), a straw2 crush map from
# `crushtool --build` (10 OSDs per host, 10 hosts per rack, racks under
# the root; the rule puts each replica on its own host) with uneven OSD
# weights (every 7th OSD 2.0, every 5th 0.5, every 11th 1.5, others 1.0),
# every OSD marked up and in (`iolift osdmap --mark-up-in --save`).
set -euo pipefail

R=${R:-3}
MAPS=${MAPS:-1000:5 10000:2}
MAX=${MAX:-100}
DEV=${DEV:-5}
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$PWD/target}
if [ -z "${IOLIFT:-}" ]; then
    cargo build --release -q -p iolift --bin iolift
    IOLIFT=$CARGO_TARGET_DIR/release/iolift
fi
for t in osdmaptool crushtool; do
    command -v $t >/dev/null || { echo "$t not found (apt install ceph-base)" >&2; exit 1; }
done

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
now() { date +%s.%N; }
median() { sort -g | awk '{a[NR]=$1} END {if (NR % 2) print a[(NR+1)/2]; else print (a[NR/2] + a[NR/2+1]) / 2}'; }

mkmap() {
    local out=$1 osds=$2 bits=$3 d=$work/mk
    mkdir -p "$d"
    osdmaptool --createsimple "$osds" --with-default-pool --pg-bits "$bits" --clobber "$out" >/dev/null 2>&1
    crushtool --build --num_osds "$osds" host straw2 10 rack straw2 10 root straw2 0 -o "$d/c" >/dev/null 2>&1
    crushtool -d "$d/c" -o "$d/c.txt"
    awk '/item osd\./ { split($2, a, "."); n = a[2] + 0; w = "1.000"
            if (n % 7 == 0) w = "2.000"; else if (n % 5 == 0) w = "0.500"; else if (n % 11 == 0) w = "1.500"
            sub(/weight [0-9.]+/, "weight " w) } { print }' "$d/c.txt" >"$d/u.txt"
    crushtool -c "$d/u.txt" -o "$d/u"
    crushtool -i "$d/u" --reweight -o "$d/u2" >/dev/null 2>&1
    osdmaptool "$out" --import-crush "$d/u2" >/dev/null 2>&1
    "$IOLIFT" osdmap "$out" --mark-up-in --save >/dev/null 2>&1
    # CRUSH weight and host of every OSD, for the referee
    crushtool -d "$d/u2" | awk '/^host /{h=$2} /item osd\./{sub(/osd\./, "", $2); print $2, $4, h}' >"${out}.w"
}

# judge MAP: "max stddev check" of |count - target| from osdmaptool's sets
judge() {
    osdmaptool "$1" --test-map-pgs-dump 2>/dev/null | awk -v wfile="$1.w" '
        BEGIN { while ((getline l < wfile) > 0) { split(l, f, " "); w[f[1]] = f[2]; host[f[1]] = f[3]; tw += f[2] } }
        /^[0-9]+\.[0-9a-f]+\t\[/ {
            s = $2; gsub(/[\[\]]/, "", s); n = split(s, o, ",")
            delete seen
            for (i = 1; i <= n; i++) {
                c[o[i]]++; shards++
                if ((host[o[i]]) in seen) bad++
                seen[host[o[i]]] = 1
            }
        }
        END {
            for (k in w) { d = c[k] - shards * w[k] / tw; if (d < 0) d = -d; if (d > mx) mx = d; sq += d * d; m++ }
            printf "%.2f %.3f %s\n", mx, sqrt(sq / m), (bad ? "BAD(" bad ")" : "ok")
        }'
}

# one TOOL MAP: balance a copy; prints "secs rss_kib changes pairs max stddev check"
one() {
    local tool=$1 src=$2 m=$work/run.bin t0 t1 j
    cp "$src" "$m"
    cp "$src.w" "$m.w"
    t0=$(now)
    if [ "$tool" = osdmaptool ]; then
        /usr/bin/time -f "%M" -o "$work/rss" osdmaptool "$m" --upmap "$work/cmds" \
            --upmap-max "$MAX" --upmap-deviation "$DEV" --save >"$work/out" 2>"$work/err" ||
            { cat "$work/err" >&2; exit 1; }
    else
        /usr/bin/time -f "%M" -o "$work/rss" "$IOLIFT" osdmap "$m" --upmap "$work/cmds" \
            --upmap-max "$MAX" --upmap-deviation "$DEV" --save >"$work/out" 2>"$work/err" ||
            { cat "$work/err" >&2; exit 1; }
    fi
    t1=$(now)
    j=$(judge "$m")
    echo "$t0 $t1 $(tail -1 "$work/rss") $(grep -c . "$work/cmds" || true) \
        $(awk '/pg-upmap-items/ {p += (NF - 4) / 2} END {print p + 0}' "$work/cmds") $j" |
        awk '{printf "%.3f %d %d %d %s %s %s\n", $2 - $1, $3, $4, $5, $6, $7, $8}'
}

echo "# bench/osdmap-upmap.sh $(date -u +%Y-%m-%dT%H:%MZ) $(uname -n), $(nproc) cores, R=$R, --upmap-max $MAX --upmap-deviation $DEV"
echo "# osdmaptool: ceph-base $(dpkg-query -W -f '${Version}' ceph-base 2>/dev/null || echo "?"); load before: $(cut -d' ' -f1-3 /proc/loadavg)"
printf "%-22s %-10s %9s %8s %7s %6s %8s %8s %6s\n" map tool "time s" "rss MiB" changes pairs "max dev" "stddev" check
for spec in $MAPS; do
    osds=${spec%%:*}
    bits=${spec##*:}
    map=$work/map-$osds.bin
    mkmap "$map" "$osds" "$bits"
    j=$(judge "$map")
    label="$osds OSDs $((osds << bits)) PGs"
    printf "%-22s %-10s %9s %8s %7s %6s %8s %8s %6s\n" "$label" "(before)" - - - - $j
    : >"$work/o"
    : >"$work/i"
    for ((rep = 0; rep < R; rep++)); do
        one osdmaptool "$map" >>"$work/o"
        one iolift "$map" >>"$work/i"
    done
    for tool in o i; do
        name=$([ $tool = o ] && echo osdmaptool || echo iolift)
        col() { cut -d' ' -f"$1" <"$work/$tool" | median; }
        checks=$(cut -d' ' -f7 <"$work/$tool" | sort -u | tr '\n' ' ')
        printf "%-22s %-10s %9.3f %8.1f %7s %6s %8.2f %8.3f %6s\n" "$label" "$name" "$(col 1)" \
            "$(echo "$(col 2)" | awk '{print $1 / 1024}')" "$(col 3)" "$(col 4)" "$(col 5)" "$(col 6)" "$checks"
        eval "${tool}_t=$(col 1) ${tool}_c=$(col 3) ${tool}_m=$(col 5) ${tool}_s=$(col 6)"
    done
    ratio=$(awk -v a="$i_t" -v b="$o_t" 'BEGIN {printf "%.3f", a / b}')
    met=$(awk -v it="$i_t" -v ot="$o_t" -v ic="$i_c" -v oc="$o_c" -v im="$i_m" -v om="$o_m" \
        -v is="$i_s" -v os="$o_s" 'BEGIN {
            ok = (im <= om + 1e-9 && is <= os + 1e-9 && ic <= oc && it <= ot / 10)
            print (ok ? "met" : "not met")}')
    echo "$label: time iolift/osdmaptool $ratio; target (max and stddev <= osdmaptool's, changes <= osdmaptool's, time <= 1/10): $met"
done
