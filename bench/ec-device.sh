#!/usr/bin/env bash
# Erasure-coded device benchmark: an `ec:` export (k=4, m=2, 64K chunks)
# against a plain export of the same size, same fio jobs, same run,
# alternating servers, medians + ratios + peak RSS. Not a test.
#
#   bench/ec-device.sh                  # R=3 repeats, RUNTIME=1 s per job (~5 min)
#   R=5 RUNTIME=5 bench/ec-device.sh    # steadier, ~25 min
#   EC_OPTS=k=4,m=2,chunk=64K,wb=0 bench/ec-device.sh   # the ec options
#   MEDIA=mem bench/ec-device.sh        # only memory-backed (or MEDIA=file)
#   KEEP=1 bench/ec-device.sh           # keep the fio JSON files
#   JOBS=write:128k QDS=32 SERVERS="plain ec" MEDIA=file bench/ec-device.sh   # a subset
#   BUILD=0 bench/ec-device.sh          # use $CARGO_TARGET_DIR/release/iolift as it is
#   BUILD=0 IOLIFT=path/to/iolift bench/ec-device.sh   # another binary
#   FILE_OPTS=+direct MEDIA=file bench/ec-device.sh     # options of each file child
#   IOLIFT_B=path/to/other SERVERS="plain ec ec-b" JOBS=write:128k MEDIA=file bench/ec-device.sh
#                                       # A/B in one run: ec-b is ec served by IOLIFT_B
#   FILE_OPTS_B=+direct SERVERS="plain ec ec-b" ... # or with other file-child options
#
# Servers, per medium (mem: memory backends; file: files in $WORK):
#   plain      memory:SIZE / file:plain.img,size=SIZE (SIZE = the ec export's size)
#   ec         ec over 6 children of CHILD bytes (memory:CHILD / file:cN.img,size=CHILD)
#   ec-b       the ec server again, by $IOLIFT_B (default $IOLIFT) with
#              file children's options $FILE_OPTS_B (default $FILE_OPTS):
#              the B side of an A/B of two builds or two child settings,
#              alternating with ec in every repeat; printed as its own table
#   ec-deg     the same device with 2 children lost: file: two child files
#              deleted before the start (rebuild=off); mem: the error stage
#              on children 1 and 4 fails their reads from the 200th on, so
#              the first benchmark read drops them (the start reads fewer)
# Each repeat runs every server in turn (the order flips every repeat);
# each server is filled first with 1M sequential writes (whole stripes),
# then runs 4k and 128k, seq and rand, read and write, at iodepth 1 and
# 32, fio ioengine=nbd, one connection. Summary: the median MB/s of each
# job and server, the ratios ec/plain and ec-deg/ec, the server's CPU time
# per GB moved (utime+stime, less sensitive to other load than MB/s),
# each server's peak RSS (VmHWM), and the two targets, each printed as
# met or not met: healthy 128k seq write >= 0.8x plain (QD1 and QD32,
# both media), degraded reads >= 0.5x healthy (every read job).
set -euo pipefail
cd "$(dirname "$0")/.."

R=${R:-3}
RUNTIME=${RUNTIME:-1}
CHILD=${CHILD:-96M}
MEDIA=${MEDIA:-mem file}
THREADS=${THREADS:-2}
TARGET=${CARGO_TARGET_DIR:-target}
IOLIFT=${IOLIFT:-$TARGET/release/iolift}
PY=/usr/bin/python3; [[ -x $PY ]] || PY=python3

command -v fio >/dev/null || { echo "missing fio: run scripts/test.sh, which installs it" >&2; exit 1; }
fio --enghelp=nbd >/dev/null 2>&1 || { echo "this fio has no nbd engine" >&2; exit 1; }
if [[ ${BUILD:-1} != 0 ]]; then
    echo "== building iolift (release)" >&2
    cargo build --release -p iolift --bin iolift >&2
fi

WORK=$(mktemp -d /tmp/iolift-ecbench.XXXXXX)
. bench/lib.sh
cleanup() {
    if [[ -n $SERVER_PID ]]; then kill "$SERVER_PID" 2>/dev/null || true; wait "$SERVER_PID" 2>/dev/null || true; fi
    if [[ -z ${KEEP:-} ]]; then rm -rf "$WORK"; else echo "results kept in $WORK" >&2; fi
}
trap cleanup EXIT

SOCK=$WORK/nbd.sock
URI="nbd+unix:///?socket=$SOCK"
EC_OPTS=${EC_OPTS:-k=4,m=2,chunk=64K}

ec_spec() { # $1 medium, $2 degraded (0/1)
    local kids=() i c
    for i in 0 1 2 3 4 5; do
        if [[ $1 == mem ]]; then c="memory:$CHILD"; else c="file:$WORK/c$i.img+size=$CHILD${FILE_OPTS:-}"; fi
        if [[ $2 == 1 && $1 == mem && ( $i == 1 || $i == 4 ) ]]; then c="error:after=200+ops=read>$c"; fi
        kids+=("$c")
    done
    local IFS=';'
    local extra=""; [[ $2 == 1 ]] && extra=",rebuild=off"
    echo "ec:${kids[*]},$EC_OPTS$extra"
}

start() { # $1 name, $2 spec, $3 binary (default $IOLIFT)
    rm -f "$SOCK"
    "${3:-$IOLIFT}" serve --socket "$SOCK" --threads "$THREADS" "$2" 2>"$WORK/$1.log" &
    SERVER_PID=$!
    wait_socket "$1" "$SOCK"
}

job() { # $1 out.json, $2 rw, $3 bs, $4 iodepth; the server's CPU ticks to $1.cpu
    local t0; t0=$(cpu_ticks "$SERVER_PID")
    fio --name=j --ioengine=nbd --uri="$URI" --rw="$2" --bs="$3" --iodepth="$4" \
        --time_based --runtime="$RUNTIME" --size="$SIZE" --randrepeat=0 \
        --output-format=json --output="$1" >/dev/null
    echo $(( $(cpu_ticks "$SERVER_PID") - t0 )) >"$1.cpu"
}

fill() {
    fio --name=fill --ioengine=nbd --uri="$URI" --rw=write --bs=1M --iodepth=8 \
        --size="$SIZE" >/dev/null
}

JOBS=${JOBS:-"read:4k write:4k randread:4k randwrite:4k read:128k write:128k randread:128k randwrite:128k"}
QDS=${QDS:-"1 32"}
SERVERS=${SERVERS:-"plain ec ec-deg"}

run_server() { # $1 medium, $2 server, $3 repeat
    local med=$1 srv=$2 rep=$3 spec name=$1-$2 bin=$IOLIFT
    case $srv in
        plain) if [[ $med == mem ]]; then spec="memory:$SIZE"; else spec="file:$WORK/plain.img,size=$SIZE"; fi ;;
        ec) spec=$(ec_spec "$med" 0) ;;
        ec-deg) spec=$(ec_spec "$med" 1) ;;
        ec-b) spec=$(FILE_OPTS=${FILE_OPTS_B-${FILE_OPTS:-}} ec_spec "$med" 0); bin=${IOLIFT_B:-$IOLIFT} ;;
    esac
    if [[ $med == file ]]; then
        rm -f "$WORK"/plain.img
        [[ $srv == ec-deg ]] || rm -f "$WORK"/c*.img
    fi
    start "$name" "$spec" "$bin"
    [[ $srv == ec-deg && $med == file ]] || fill
    local j rw bs qd
    for j in $JOBS; do
        rw=${j%%:*}; bs=${j##*:}
        for qd in $QDS; do
            job "$WORK/$name.$rw.$bs.qd$qd.r$rep.json" "$rw" "$bs" "$qd"
        done
    done
    echo "$(peak_kib "$SERVER_PID")" >>"$WORK/$name.rss"
    stop_server
    if [[ $med == file && ( $srv == ec || $srv == ec-b ) ]]; then
        rm -f "$WORK"/c1.img "$WORK"/c4.img # the next ec-deg run starts degraded
    fi
}

# the ec export's size, so the plain one matches it
start size "$(ec_spec mem 0)"
SIZE=$(nbdinfo --size "$URI")
stop_server
echo "== ec export $SIZE bytes over 6 x $CHILD children; RUNTIME=$RUNTIME R=$R; $(uptime)" >&2

for rep in $(seq "$R"); do
    for med in $MEDIA; do
        order=$SERVERS; (( rep % 2 == 0 )) && order=$(echo "$SERVERS" | awk '{ for (i = NF; i > 0; i--) printf "%s ", $i }')
        for srv in $order; do
            echo "-- repeat $rep $med $srv" >&2
            run_server "$med" "$srv" "$rep"
        done
    done
done
echo "== done; $(uptime)" >&2

"$PY" - "$WORK" "$MEDIA" "$(getconf CLK_TCK)" <<'PYEOF'
import json, glob, os, statistics, sys
work, media, tck = sys.argv[1], sys.argv[2].split(), int(sys.argv[3])
def one(path):
    j = json.load(open(path))["jobs"][0]
    b = j["read"]["io_bytes"] + j["write"]["io_bytes"]
    mb = (j["read"]["bw_bytes"] + j["write"]["bw_bytes"]) / 1e6
    cpu = int(open(path + ".cpu").read()) / tck if os.path.exists(path + ".cpu") else float("nan")
    return mb, (cpu / (b / 1e9) if b else float("nan"))
def med(name, job, i):
    v = [one(p)[i] for p in glob.glob(f"{work}/{name}.{job}.r*.json")]
    return statistics.median(v) if v else float("nan")
jobs = [f"{rw}.{bs}.qd{qd}" for bs in ("4k", "128k") for rw in ("read", "write", "randread", "randwrite") for qd in (1, 32)]
t1, t2 = [], []
for m in media:
    print(f"\n{m}-backed: median MB/s; server CPU seconds per GB moved")
    print(f"{'job':20} {'plain':>8} {'ec':>8} {'ec-deg':>8} {'ec/plain':>8} {'deg/ec':>7}   {'cpu plain':>9} {'ec':>6} {'ec-deg':>6}")
    for j in jobs:
        if not glob.glob(f"{work}/{m}-*.{j}.r*.json"):
            continue
        p, e, d = (med(f"{m}-{s}", j, 0) for s in ("plain", "ec", "ec-deg"))
        cp, ce, cd = (med(f"{m}-{s}", j, 1) for s in ("plain", "ec", "ec-deg"))
        print(f"{j:20} {p:8.1f} {e:8.1f} {d:8.1f} {e/p:8.2f} {d/e:7.2f}   {cp:9.2f} {ce:6.2f} {cd:6.2f}")
        if j.startswith("write.128k"):
            t1.append((f"{m} {j}", e / p))
        if "read" in j:
            t2.append((f"{m} {j}", d / e))
    if glob.glob(f"{work}/{m}-ec-b.*.json"):
        print(f"A/B {m}-backed: ec (A) against ec-b (B), median MB/s and server CPU seconds per GB")
        print(f"{'job':20} {'A':>8} {'B':>8} {'B/A':>6} {'A/plain':>8} {'B/plain':>8}   {'cpu A':>6} {'B':>6} {'B/A':>6}")
        for j in jobs:
            if not glob.glob(f"{work}/{m}-ec-b.{j}.r*.json"):
                continue
            p, a, b = (med(f"{m}-{s}", j, 0) for s in ("plain", "ec", "ec-b"))
            ca, cb = (med(f"{m}-{s}", j, 1) for s in ("ec", "ec-b"))
            print(f"{j:20} {a:8.1f} {b:8.1f} {b/a:6.2f} {a/p:8.2f} {b/p:8.2f}   {ca:6.2f} {cb:6.2f} {cb/ca:6.2f}")
    for s in ("plain", "ec", "ec-b", "ec-deg"):
        f = f"{work}/{m}-{s}.rss"
        if os.path.exists(f):
            v = [int(x) for x in open(f).read().split()]
            print(f"peak RSS {m}-{s}: {statistics.median(v)/1024:.0f} MiB (median of {len(v)})")
print()
for name, cells, lim in (("healthy 128k seq write >= 0.8x plain", t1, 0.8), ("degraded reads >= 0.5x healthy", t2, 0.5)):
    cells = [(c, r) for c, r in cells if r == r]  # a server left out gives nan
    if not cells:
        print(f"target {name}: not measured (no cells in this run)")
        continue
    bad = [f"{c} {r:.2f}" for c, r in cells if not r >= lim]
    lo = min(r for _, r in cells)
    print(f"target {name}: {'met' if not bad else 'NOT MET'} (lowest {lo:.2f} of {len(cells)} cells)")
    for b in bad:
        print(f"  under: {b}")
PYEOF
