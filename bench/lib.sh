# Shared by the bench scripts that start an NBD server per run
# (bench/nbd.sh, bench/direct.sh): source it after setting WORK.
#
#   "$BIN" serve --socket "$sock" ... 2>"$WORK/$name.log" &
#   SERVER_PID=$!; wait_socket "$name" "$sock"
#   ...; stop_server
#
# cpu_ticks PID: utime+stime of PID in clock ticks (/proc/PID/stat).

SERVER_PID=

cpu_ticks() {
    awk '{ sub(/.*\) /, ""); print $12 + $13 }' "/proc/$1/stat"
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

stop_server() {
    kill "$SERVER_PID" 2>/dev/null || true
    wait "$SERVER_PID" 2>/dev/null || true
    SERVER_PID=
}
