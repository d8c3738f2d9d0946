# Shared by the bench scripts that start a server per run (bench/nbd.sh,
# bench/direct.sh with NBD servers; bench/fs-nfs.sh, bench/fs-kv.sh with
# FUSE mounts): source it after setting WORK.
#
#   "$BIN" serve --socket "$sock" ... 2>"$WORK/$name.log" &
#   SERVER_PID=$!; wait_socket "$name" "$sock"
#   ...; stop_server
#
#   "$BIN" fs mount SPEC "$MNT" ... 2>"$LOG" &
#   SERVER_PID=$!; wait_mount "$MNT" "$LOG"
#
# cpu_ticks PID: utime+stime of PID in clock ticks (/proc/PID/stat).
# peak_kib PID: the peak resident set (VmHWM) of PID in KiB.
# start_busy / stop_busy: the competing load of BUSY=1 runs (below).

SERVER_PID=

cpu_ticks() {
    awk '{ sub(/.*\) /, ""); print $12 + $13 }' "/proc/$1/stat"
}

peak_kib() {
    awk '/^VmHWM:/ { print $2 }' "/proc/$1/status"
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

stop_server() {
    kill "$SERVER_PID" 2>/dev/null || true
    wait "$SERVER_PID" 2>/dev/null || true
    SERVER_PID=
}
