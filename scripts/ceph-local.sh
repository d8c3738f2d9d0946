#!/usr/bin/env bash
# ceph-local.sh: a throwaway single-host Ceph cluster for iolift's tests and benchmarks.
#
#   scripts/ceph-local.sh start  DIR     create and start a cluster under DIR; the last line on
#                                        stdout is the CEPH_CONF to use (DIR/ceph.conf)
#   scripts/ceph-local.sh stop   DIR     kill the cluster's daemons and delete what start made
#                                        (idempotent: fine on a stopped or half-made cluster)
#   scripts/ceph-local.sh status DIR     daemons and `ceph -s`; exit 0 running, 1 not running
#   scripts/ceph-local.sh env    DIR     print `export CEPH_CONF=DIR/ceph.conf` (for eval)
#   scripts/ceph-local.sh kill-osd DIR N SIGKILL osd.N (fault tests); prints its pid
#
# Layout: one monitor (mon.a), one manager (mgr.x) and three memstore OSDs, run as plain
# processes (no systemd, nothing in /etc/ceph or /var/lib/ceph), bound to 127.0.0.1, every
# file under DIR. DIR must be on disk, not tmpfs: memstore keeps objects in the OSDs' RAM,
# but logs and the mon store go to DIR. CRUSH uses "chooseleaf type 0" so the three
# replicas of a size-3 pool may live on the one host. A replicated RBD pool and one image
# are created. Every ceph/rados/rbd call has a timeout, so nothing hangs for ever.
#
# Settings (environment, read by start):
#   CEPH_LOCAL_AUTH=none        none | cephx (generates DIR/keyring for client.admin)
#   CEPH_LOCAL_OSDS=3           number of memstore OSDs
#   CEPH_LOCAL_POOL=rbd         pool name; CEPH_LOCAL_POOL_SIZE=3 replicas, CEPH_LOCAL_PG=32 PGs
#   CEPH_LOCAL_IMAGE=img        image name ("" = none); CEPH_LOCAL_IMAGE_SIZE=256M
#   CEPH_LOCAL_MEMSTORE_MB=2048 capacity each OSD reports (RAM is used only when written;
#                               every 4 MiB object touched costs 4 MiB per replica)
#   CEPH_LOCAL_MGR=1            0: no mgr (rbd I/O still works; `ceph pg ...` would hang)
#   CEPH_LOCAL_TIMEOUT=120      seconds start may take in all
#   CEPH_LOCAL_CLIENT_CONF=     extra lines for the [client] section, \n between lines
#                               (e.g. 'rbd cache = false' as bench/deliba-grid.sh uses)
set -euo pipefail

ME=${0##*/}
err() { printf '%s: error: %s\n' "$ME" "$*" >&2; exit 1; }
note() { printf '%s: %s\n' "$ME" "$*" >&2; }
usage() { sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }

[ $# -ge 2 ] || usage
CMD=$1
RAW_DIR=$2

AUTH=${CEPH_LOCAL_AUTH:-none}
NOSD=${CEPH_LOCAL_OSDS:-3}
POOL=${CEPH_LOCAL_POOL:-rbd}
POOL_SIZE=${CEPH_LOCAL_POOL_SIZE:-3}
PGS=${CEPH_LOCAL_PG:-32}
IMAGE=${CEPH_LOCAL_IMAGE-img}
IMAGE_SIZE=${CEPH_LOCAL_IMAGE_SIZE:-256M}
MEMSTORE_MB=${CEPH_LOCAL_MEMSTORE_MB:-2048}
WITH_MGR=${CEPH_LOCAL_MGR:-1}
TOTAL=${CEPH_LOCAL_TIMEOUT:-120}
CLIENT_CONF=${CEPH_LOCAL_CLIENT_CONF:-}
IP=127.0.0.1

case "$AUTH" in none|cephx) ;; *) err "CEPH_LOCAL_AUTH must be none or cephx, not '$AUTH'";; esac
[[ $NOSD =~ ^[1-9]$ ]] || err "CEPH_LOCAL_OSDS must be 1..9"
[[ $POOL_SIZE =~ ^[1-9]$ ]] || err "CEPH_LOCAL_POOL_SIZE must be 1..9"
[ "$POOL_SIZE" -le "$NOSD" ] || err "CEPH_LOCAL_POOL_SIZE ($POOL_SIZE) > CEPH_LOCAL_OSDS ($NOSD)"
[[ $TOTAL =~ ^[1-9][0-9]*$ ]] || err "CEPH_LOCAL_TIMEOUT must be whole seconds"

# ---- DIR ------------------------------------------------------------------------------------
case "$RAW_DIR" in
  *[[:space:]\;\#\$\'\"\\=,]*) err "DIR must not contain spaces or any of ;#\$'\"\\=,: $RAW_DIR";;
esac
if [ "$CMD" = start ]; then mkdir -p -- "$RAW_DIR" || err "cannot create $RAW_DIR"; fi
if [ -d "$RAW_DIR" ]; then DIR=$(cd -- "$RAW_DIR" && pwd -P); else DIR=$RAW_DIR; fi
[ "$DIR" != / ] || err "refusing to use / as DIR"
CONF=$DIR/ceph.conf
STATE=$DIR/ceph-local.state      # marks a DIR made by this script

# ---- helpers --------------------------------------------------------------------------------
# A ceph CLI call that cannot hang: $1 = seconds.
cli() { local t=$1; shift; timeout -k 3 "$t" ceph -c "$CONF" --connect-timeout "$t" "$@"; }

# Free: no TCP socket of any state on the port (a listener, a connection, TIME_WAIT).
port_free() { ! ss -Htan "sport = :$1" 2>/dev/null | grep -q .; }
pick_port() { # $1 = first candidate, $2 = port to avoid
  local p
  for ((p = $1; p < $1 + 500; p++)); do
    if [ "$p" != "${2:-}" ] && port_free "$p"; then echo "$p"; return 0; fi
  done
  return 1
}

# Pid of daemon $1 (mon.a, mgr.x, osd.N) if it runs from this DIR.
daemon_pid() {
  local pf=$DIR/run/$1.pid pid
  [ -s "$pf" ] || return 1
  pid=$(<"$pf")
  [ -r "/proc/$pid/cmdline" ] || return 1
  tr '\0' ' ' <"/proc/$pid/cmdline" | grep -qF -- " $CONF " || return 1
  echo "$pid"
}

# Every ceph daemon whose command line names this DIR's ceph.conf (catches daemons whose
# pid file is gone).
all_pids() {
  local f pid cmd
  for f in /proc/[0-9]*/cmdline; do
    cmd=$( { tr '\0' ' ' <"$f"; } 2>/dev/null) || continue
    case "$cmd" in ceph-mon\ *|ceph-mgr\ *|ceph-osd\ *|*/ceph-mon\ *|*/ceph-mgr\ *|*/ceph-osd\ *) ;; *) continue;; esac
    case "$cmd" in *" $CONF "*) ;; *) continue;; esac
    pid=${f#/proc/}; echo "${pid%/cmdline}"
  done
}

kill_all() {
  local pids n
  pids=$(all_pids | tr '\n' ' ')
  [ -n "${pids// }" ] || return 0
  # shellcheck disable=SC2086
  kill -KILL $pids 2>/dev/null || true
  for ((n = 0; n < 100; n++)); do
    pids=$(all_pids | tr '\n' ' ')
    [ -n "${pids// }" ] || return 0
    sleep 0.1
  done
  err "daemons still alive 10 s after SIGKILL: $pids"
}

remove_dir_contents() {
  rm -rf -- "$DIR"/{ceph.conf,keyring,mon.keyring,monmap,run,log,mon,mgr,osd,crash,tmp}
  rm -f -- "$STATE"
  rmdir -- "$DIR" 2>/dev/null || true
}

DEADLINE=0
# until_ok DESCRIPTION CMD...: retry CMD every 0.5 s until the start deadline.
until_ok() {
  local what=$1; shift
  while ! "$@" >/dev/null 2>&1; do
    if [ "$(date +%s)" -ge "$DEADLINE" ]; then
      note "gave up waiting for: $what (CEPH_LOCAL_TIMEOUT=${TOTAL}s); logs in $DIR/log"
      return 1
    fi
    sleep 0.5
  done
}

osds_up() { cli 10 osd stat -f json | grep -q "\"num_up_osds\":$NOSD,"; }
mgr_up() { cli 10 mgr stat -f json | grep -q '"available":true'; }
probe_io() {
  local obj=probe.$$
  echo "ceph-local probe" >"$DIR/tmp/probe"
  timeout -k 3 20 rados -c "$CONF" -p "$POOL" put "$obj" "$DIR/tmp/probe" &&
    [ "$(timeout -k 3 20 rados -c "$CONF" -p "$POOL" get "$obj" -)" = "ceph-local probe" ] &&
    timeout -k 3 20 rados -c "$CONF" -p "$POOL" rm "$obj"
}

# ---- start ----------------------------------------------------------------------------------
write_conf() {
  cat >"$CONF" <<EOF
# written by scripts/ceph-local.sh: a throwaway test cluster on $IP
[global]
fsid = $FSID
mon host = [v2:$IP:$PORT2,v1:$IP:$PORT1]
mon initial members = a
public network = $IP/32
public addr = $IP
cluster addr = $IP
ms bind ipv6 = false
auth cluster required = $AUTH
auth service required = $AUTH
auth client required = $AUTH
auth allow insecure global id reclaim = false
keyring = $DIR/keyring
run dir = $DIR/run
admin socket = $DIR/run/\$name.asok
pid file = $DIR/run/\$name.pid
crash dir = $DIR/crash
log file = $DIR/log/\$name.log
log to syslog = false
err to syslog = false
osd pool default size = $POOL_SIZE
osd pool default min size = $(( POOL_SIZE > 1 ? POOL_SIZE - POOL_SIZE / 2 : 1 ))
osd pool default pg num = 8
osd pool default pgp num = 8
osd pool default pg autoscale mode = off
osd crush chooseleaf type = 0
mon allow pool delete = true
mon allow pool size one = true
mon warn on pool no redundancy = false
mon max pg per osd = 1000
mon data avail warn = 1
mon data avail crit = 0
paxos propose interval = 0.1
mgr stats period = 1

[mon]
mon data = $DIR/mon/\$name
mon cluster log file = $DIR/log/cluster.log

[mgr]
mgr data = $DIR/mgr/\$name
keyring = $DIR/mgr/\$name/keyring
mgr initial modules = status

[osd]
osd data = $DIR/osd/\$name
keyring = $DIR/osd/\$name/keyring
osd objectstore = memstore
memstore device bytes = $(( MEMSTORE_MB * 1024 * 1024 ))
osd fast shutdown = true
osd op num shards = 2
osd op num threads per shard = 2

[client]
admin socket =
log file = $DIR/log/client.\$pid.log
EOF
  if [ -n "$CLIENT_CONF" ]; then printf '%b\n' "$CLIENT_CONF" >>"$CONF"; fi
}

start_daemon() { # $1 = binary, $2 = id; the daemons fork once initialised
  if ! "$1" -c "$CONF" -i "$2" >"$DIR/log/$1.$2.out" 2>&1; then
    tail -n 20 "$DIR/log/$1.$2.out" >&2 || true
    err "$1 -i $2 failed to start (logs in $DIR/log)"
  fi
}

on_start_exit() {
  local rc=$?
  if [ "$rc" != 0 ]; then
    note "start failed (exit $rc): stopping what was started; logs kept in $DIR/log"
    kill_all || true
    rm -rf -- "$DIR"/{ceph.conf,keyring,mon.keyring,monmap,run,mon,mgr,osd,crash,tmp}
    rm -f -- "$STATE"
  fi
}

cmd_start() {
  local b
  for b in ceph ceph-mon ceph-osd ceph-authtool monmaptool rados rbd timeout ss; do
    command -v "$b" >/dev/null || err "'$b' not found: install ceph-mon ceph-osd ceph-mgr ceph-common"
  done
  if [ "$WITH_MGR" = 1 ]; then command -v ceph-mgr >/dev/null || err "'ceph-mgr' not found: install ceph-mgr"; fi
  [ "$(stat -f -c %T "$DIR")" != tmpfs ] || err "$DIR is on tmpfs; use a directory on disk"
  if [ -f "$STATE" ]; then
    if [ -n "$(all_pids)" ] && cli 10 -s >/dev/null 2>&1; then
      note "a cluster is already running in $DIR (stop it first to recreate)"
      echo "$CONF"; return 0
    fi
    note "removing a stopped or broken cluster in $DIR"
    kill_all; remove_dir_contents; mkdir -p -- "$DIR"
  elif [ -n "$(ls -A -- "$DIR")" ]; then
    err "$DIR is not empty and was not made by $ME; refusing to touch it"
  fi
  DEADLINE=$(( $(date +%s) + TOTAL ))
  FSID=$(cat /proc/sys/kernel/random/uuid)
  # Clusters started at the same time (the tests run in parallel) must not pick the same
  # mon ports: picking them and the mon's bind happen under one lock. Both ports come from
  # below 6800, where OSDs and mgrs bind theirs (ms_bind_port_min..max), so a daemon of
  # another cluster cannot take them between the pick and the bind either.
  exec {PORT_LOCK}>/tmp/ceph-local.ports.lock
  flock -w 300 "$PORT_LOCK" || err "another ceph-local.sh held the port lock for 300 s"
  PORT2=$(pick_port $(( 3300 + RANDOM % 200 ))) || err "no free port for the mon"
  PORT1=$(pick_port $(( 3500 + RANDOM % 200 )) "$PORT2") || err "no free port for the mon"
  mkdir -p "$DIR"/{run,log,mon,mgr,osd,crash,tmp}
  printf 'FSID=%s\nPORT2=%s\nPORT1=%s\nPOOL=%s\nIMAGE=%s\nAUTH=%s\nNOSD=%s\n' \
    "$FSID" "$PORT2" "$PORT1" "$POOL" "$IMAGE" "$AUTH" "$NOSD" >"$STATE"
  trap on_start_exit EXIT
  write_conf

  # Keys: with auth none they are made anyway (cheap) so that cephx is one setting away.
  ceph-authtool --create-keyring "$DIR/mon.keyring" --gen-key -n mon. --cap mon 'allow *' >/dev/null
  ceph-authtool --create-keyring "$DIR/keyring" --gen-key -n client.admin \
    --cap mon 'allow *' --cap osd 'allow *' --cap mgr 'allow *' --cap mds 'allow *' >/dev/null
  ceph-authtool "$DIR/mon.keyring" --import-keyring "$DIR/keyring" >/dev/null
  chmod 600 "$DIR/keyring" "$DIR/mon.keyring"
  monmaptool --create --fsid "$FSID" --addv a "[v2:$IP:$PORT2,v1:$IP:$PORT1]" "$DIR/monmap" >/dev/null
  ceph-mon -c "$CONF" -i a --mkfs --monmap "$DIR/monmap" --keyring "$DIR/mon.keyring" \
    >"$DIR/log/mkfs.mon.out" 2>&1 || { cat "$DIR/log/mkfs.mon.out" >&2; err "ceph-mon --mkfs failed"; }
  # The mon must not inherit the lock's descriptor: a daemon holding it
  # would keep every other start waiting for as long as it lives.
  start_daemon ceph-mon a {PORT_LOCK}>&-
  until_ok "the monitor to answer" cli 10 mon stat
  exec {PORT_LOCK}>&-

  if [ "$WITH_MGR" = 1 ]; then
    mkdir -p "$DIR/mgr/mgr.x"
    cli 20 auth get-or-create mgr.x mon 'allow profile mgr' osd 'allow *' mds 'allow *' \
      -o "$DIR/mgr/mgr.x/keyring" >/dev/null 2>&1 || err "cannot create the mgr key"
    start_daemon ceph-mgr x
  fi

  local i uuid id key
  for ((i = 0; i < NOSD; i++)); do
    uuid=$(cat /proc/sys/kernel/random/uuid)
    mkdir -p "$DIR/osd/osd.$i"
    key=$(ceph-authtool --gen-print-key)
    printf '{"cephx_secret": "%s"}\n' "$key" >"$DIR/tmp/osd.$i.json"
    id=$(cli 20 osd new "$uuid" -i "$DIR/tmp/osd.$i.json") || err "ceph osd new failed"
    rm -f "$DIR/tmp/osd.$i.json"
    [ "$id" = "$i" ] || err "the mon gave osd id '$id', expected $i"
    ceph-authtool --create-keyring "$DIR/osd/osd.$i/keyring" -n "osd.$i" --add-key "$key" >/dev/null
    ceph-osd -c "$CONF" -i "$i" --mkfs --osd-uuid "$uuid" >"$DIR/log/mkfs.osd.$i.out" 2>&1 ||
      { tail -n 20 "$DIR/log/mkfs.osd.$i.out" >&2; err "ceph-osd --mkfs failed for osd.$i"; }
  done
  for ((i = 0; i < NOSD; i++)); do start_daemon ceph-osd "$i"; done
  until_ok "$NOSD OSDs up" osds_up

  if [ -n "$POOL" ]; then
    cli 30 osd pool create "$POOL" "$PGS" "$PGS" replicated >/dev/null 2>"$DIR/log/pool.err" ||
      { cat "$DIR/log/pool.err" >&2; err "cannot create pool $POOL"; }
    cli 30 osd pool set "$POOL" size "$POOL_SIZE" --yes-i-really-mean-it >/dev/null 2>&1 || true
    timeout -k 3 60 rbd -c "$CONF" pool init "$POOL" || err "rbd pool init $POOL failed"
    until_ok "I/O on pool $POOL" probe_io
    if [ -n "$IMAGE" ]; then
      timeout -k 3 60 rbd -c "$CONF" create --size "$IMAGE_SIZE" "$POOL/$IMAGE" ||
        err "cannot create image $POOL/$IMAGE"
    fi
  fi
  if [ "$WITH_MGR" = 1 ]; then until_ok "the mgr to become available" mgr_up; fi
  trap - EXIT
  note "cluster up in $(( TOTAL - (DEADLINE - $(date +%s)) )) s: pool ${POOL:-none} (size $POOL_SIZE), image ${IMAGE:+$POOL/$IMAGE ($IMAGE_SIZE)}, auth $AUTH"
  echo "$CONF"
}

# ---- stop / status / env / kill-osd ---------------------------------------------------------
cmd_stop() {
  if [ ! -d "$DIR" ]; then return 0; fi
  if [ ! -f "$STATE" ] && [ -z "$(all_pids)" ]; then
    if [ -z "$(ls -A -- "$DIR")" ]; then rmdir -- "$DIR" 2>/dev/null || true; return 0; fi
    [ -f "$CONF" ] || err "$DIR was not made by $ME; not touching it"
  fi
  kill_all
  remove_dir_contents
}

cmd_status() {
  [ -f "$STATE" ] || { echo "no cluster in $DIR"; return 1; }
  # shellcheck disable=SC1090
  . "$STATE"
  local d pid down=0 i names="mon.a"
  [ -d "$DIR/mgr/mgr.x" ] && names+=" mgr.x"
  for ((i = 0; i < NOSD; i++)); do names+=" osd.$i"; done
  echo "conf: $CONF"
  for d in $names; do
    if pid=$(daemon_pid "$d"); then
      printf '%-6s pid %-8s rss %5d MiB\n' "$d" "$pid" $(( $(awk '/^VmRSS/{print $2}' "/proc/$pid/status") / 1024 ))
    else
      printf '%-6s not running\n' "$d"; down=1
    fi
  done
  daemon_pid mon.a >/dev/null || return 1
  cli 15 -s || return 1
  return "$down"
}

cmd_kill_osd() {
  local n=${1:-} pid
  [[ $n =~ ^[0-9]$ ]] || err "kill-osd needs an OSD number"
  pid=$(daemon_pid "osd.$n") || err "osd.$n is not running in $DIR"
  kill -KILL "$pid"
  echo "$pid"
}

case "$CMD" in
  start) [ $# -eq 2 ] || usage; cmd_start ;;
  stop) [ $# -eq 2 ] || usage; cmd_stop ;;
  status) [ $# -eq 2 ] || usage; cmd_status ;;
  env) [ $# -eq 2 ] || usage; [ -f "$CONF" ] || err "no cluster in $DIR"; echo "export CEPH_CONF=$CONF" ;;
  kill-osd) [ $# -eq 3 ] || usage; cmd_kill_osd "$3" ;;
  *) usage ;;
esac
