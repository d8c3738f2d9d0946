# Shared by the bench scripts that start a server per run (bench/nbd.sh,
# bench/direct.sh with NBD servers; bench/fs.sh, bench/fs-nfs.sh,
# bench/fs-kv.sh with FUSE mounts; bench/stages.sh for its build): source
# it after setting WORK.
#
#   "$BIN" serve --socket "$sock" ... 2>"$WORK/$name.log" &
#   SERVER_PID=$!; wait_socket "$name" "$sock"
#   ...; stop_server
#
#   "$BIN" fs mount SPEC "$MNT" ... 2>"$LOG" &
#   SERVER_PID=$!; wait_mount "$MNT" "$LOG"
#
#   build_iolift     # BIN unset: cargo build -p iolift (PROFILE, default release)
#   fuse_mount MNT LOG SECONDS "$BIN" fs mount SPEC "$MNT" ...
#   ...; fuse_unmount MNT   # HWM = the server's peak RSS in KiB
#
# cpu_ticks PID: utime+stime of PID in clock ticks (/proc/PID/stat).
# busy_ticks: the whole machine's busy clock ticks (/proc/stat: user, nice,
#   system, irq, softirq).
# peak_kib PID: the peak resident set (VmHWM) of PID in KiB.
# need_root_tools NAME TOOL...: exits unless root and every TOOL is on PATH.
# fs_cells SETUP REPEAT: the file-system cell set through the caller's
#   run_cell, fio_job and meta_job (bench/fs.sh Q2, bench/fs-nfs.sh).
# start_busy / stop_busy: the competing load of BUSY=1 runs (below).

SERVER_PID=

cpu_ticks() {
    awk '{ sub(/.*\) /, ""); print $12 + $13 }' "/proc/$1/stat"
}

busy_ticks() {
    awk '/^cpu / { print $2 + $3 + $4 + $7 + $8 }' /proc/stat
}

peak_kib() {
    awk '/^VmHWM:/ { print $2 }' "/proc/$1/status"
}

need_root_tools() {
    local name=$1; shift
    [[ $(id -u) == 0 ]] || { echo "$name needs root (FUSE mounts)" >&2; exit 1; }
    for t in "$@"; do
        command -v "$t" >/dev/null || { echo "missing $t (scripts/test.sh installs it)" >&2; exit 1; }
    done
}

# The cells, in the order they run: fio 4k random read/write at QD1 and
# QD16, 64k and 1M sequential read/write at QD4 (fio_job NAME RW BS QD),
# then the metadata loops (meta_job stat|create|readdir).
fs_cells() {
    local s=$1 rep=$2
    run_cell "$s" randread-4k-qd1 "$rep" fio_job r randread 4k 1
    run_cell "$s" randwrite-4k-qd1 "$rep" fio_job w randwrite 4k 1
    run_cell "$s" randread-4k-qd16 "$rep" fio_job r randread 4k 16
    run_cell "$s" randwrite-4k-qd16 "$rep" fio_job w randwrite 4k 16
    run_cell "$s" read-64k-qd4 "$rep" fio_job r read 64k 4
    run_cell "$s" write-64k-qd4 "$rep" fio_job w write 64k 4
    run_cell "$s" read-1m-qd4 "$rep" fio_job r read 1M 4
    run_cell "$s" write-1m-qd4 "$rep" fio_job w write 1M 4
    run_cell "$s" stat-10k "$rep" meta_job stat
    run_cell "$s" create-unlink "$rep" meta_job create
    run_cell "$s" readdir-10k "$rep" meta_job readdir
}

# BUSY=1: a fixed competing load, `stress-ng --cpu N --cpu-method int64`
# (N = BUSY_CPUS, default the number of cores: every core has a runnable
# CPU hog besides the benchmark), started once before the first server and
# kept running through every job of every server, so the servers, which
# alternate, meet the same load. int64 is plain integer arithmetic: no
# memory traffic that would make the load depend on cache sizes.
BUSY_PID=
start_busy() {
    [[ ${BUSY:-0} != 0 ]] || return 0
    command -v stress-ng >/dev/null || { echo "BUSY=1 needs stress-ng: run scripts/test.sh, which installs it" >&2; exit 1; }
    stress-ng --cpu "${BUSY_CPUS:-$(nproc)}" --cpu-method int64 --quiet &
    BUSY_PID=$!
    sleep 1
}
stop_busy() {
    if [[ -n $BUSY_PID ]]; then kill "$BUSY_PID" 2>/dev/null || true; wait "$BUSY_PID" 2>/dev/null || true; fi
    BUSY_PID=
}

# wait_socket NAME SOCKET: until SOCKET exists (10 s at most); exits the
# script with the server's log if it dies or never listens.
wait_socket() {
    for _ in $(seq 200); do
        [[ -S $2 ]] && return 0
        kill -0 "$SERVER_PID" 2>/dev/null || { cat "$WORK/$1.log" >&2; exit 1; }
        sleep 0.05
    done
    echo "$1 did not start" >&2; cat "$WORK/$1.log" >&2; exit 1
}

# wait_mount MNT LOG [SECONDS]: until MNT is a mount point (SECONDS, default
# 15, at most); exits the script with LOG (the server's log) if SERVER_PID
# dies first or MNT is never mounted.
wait_mount() {
    for _ in $(seq $((${3:-15} * 20))); do
        mountpoint -q "$1" && return 0
        kill -0 "$SERVER_PID" 2>/dev/null || { cat "$2" >&2; exit 1; }
        sleep 0.05
    done
    echo "$1 was not mounted within ${3:-15} s" >&2; cat "$2" >&2; exit 1
}

# build_iolift: unless BIN is set, builds the iolift binary (release, or
# debug with PROFILE=debug) into CARGO_TARGET_DIR and sets BIN to it.
build_iolift() {
    [[ -z ${BIN:-} ]] || return 0
    if [[ ${PROFILE:-release} == release ]]; then
        nice -n 5 cargo build --release -q -p iolift --bin iolift
        BIN=$CARGO_TARGET_DIR/release/iolift
    else
        nice -n 5 cargo build -q -p iolift --bin iolift
        BIN=$CARGO_TARGET_DIR/debug/iolift
    fi
}

# fuse_mount MNT LOG SECONDS CMD...: starts CMD (a FUSE server that mounts
# MNT) in the background, its stderr to LOG and its stdout to LOG.out, sets
# SERVER_PID and waits for the mount (wait_mount).
fuse_mount() {
    local mnt=$1 log=$2 secs=$3; shift 3
    "$@" >"$log.out" 2>"$log" &
    SERVER_PID=$!
    wait_mount "$mnt" "$log" "$secs"
}

# fuse_unmount MNT: sets HWM to the peak RSS (KiB) of SERVER_PID, unmounts
# MNT (lazily if it is busy) and waits for the server to exit.
fuse_unmount() {
    HWM=$(peak_kib "$SERVER_PID")
    umount "$1" 2>/dev/null || umount -l "$1"
    stop_server
}

stop_server() {
    kill "$SERVER_PID" 2>/dev/null || true
    wait "$SERVER_PID" 2>/dev/null || true
    SERVER_PID=
}
