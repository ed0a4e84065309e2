#!/usr/bin/env bash
# Runs a real Apache RocketMQ 5.x name server and broker on this machine for the
# outbox integration tests, from Apache's jars on Maven Central (no Docker, no
# distribution download). Both listen on and advertise 127.0.0.1.
#
# Usage:
#   scripts/rocketmq.sh start            start (or re-check) name server + broker, create topics
#   scripts/rocketmq.sh status           processes, memory, ports, registration; exit 1 if unhealthy
#   scripts/rocketmq.sh topic NAME       create/update a topic and wait until it has a route
#   scripts/rocketmq.sh stop [--clean]   stop both; --clean also deletes the store, logs and config
#   scripts/rocketmq.sh stop-broker      stop the broker alone (an outage, for the tests);
#                                        `start` brings it back with its store
#
# `start` prints `export OUTBOX_TEST_ROCKETMQ_NAMESRV=127.0.0.1:9876` on stdout (all
# other messages go to stderr), so `eval "$(scripts/rocketmq.sh start)"` works.
#
# Environment (all optional):
#   OUTBOX_ROCKETMQ_DIR      runtime state: store, logs, pid files (default /tmp/outbox-rocketmq)
#   OUTBOX_ROCKETMQ_TOPICS   topics `start` creates, space or comma separated
#                            (default ORDER_EVENT_TOPIC)
#   OUTBOX_ROCKETMQ_TIMEOUT  seconds to wait for each step (default 120)
#   OUTBOX_ROCKETMQ_CACHE    jar cache root (default ${XDG_CACHE_HOME:-$HOME/.cache}/outbox-rocketmq)
#   OUTBOX_ROCKETMQ_NAMESRV_PORT, OUTBOX_ROCKETMQ_BROKER_PORT
#                            default 9876 and 10911; the broker also uses BROKER_PORT-2
#                            (its "fast" port) and BROKER_PORT+1 (HA)
#   JAVA_HOME                Java 11+ (tested with 17); otherwise `java` on PATH
#   MVN                      Maven command (default mvn)
set -euo pipefail

readonly ROCKETMQ_VERSION=5.3.3
readonly HOST=127.0.0.1
readonly CLUSTER=DefaultCluster
readonly BROKER_NAME=broker-a
readonly NAMESRV_MAIN=org.apache.rocketmq.namesrv.NamesrvStartup
readonly BROKER_MAIN=org.apache.rocketmq.broker.BrokerStartup
readonly ADMIN_MAIN=org.apache.rocketmq.tools.command.MQAdminStartup

SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
readonly SCRIPT_DIR
readonly TEMPLATES="$SCRIPT_DIR/rocketmq"
readonly CACHE_ROOT="${OUTBOX_ROCKETMQ_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/outbox-rocketmq}"
readonly LIB_DIR="$CACHE_ROOT/$ROCKETMQ_VERSION/lib"
readonly TOPICS="${OUTBOX_ROCKETMQ_TOPICS:-ORDER_EVENT_TOPIC}"
readonly TIMEOUT="${OUTBOX_ROCKETMQ_TIMEOUT:-120}"
readonly NAMESRV_PORT="${OUTBOX_ROCKETMQ_NAMESRV_PORT:-9876}"
readonly BROKER_PORT="${OUTBOX_ROCKETMQ_BROKER_PORT:-10911}"
readonly FAST_PORT=$((BROKER_PORT - 2)) # opened by the broker, not configurable
readonly HA_PORT=$((BROKER_PORT + 1))
readonly NAMESRV_ADDR="$HOST:$NAMESRV_PORT"
readonly MVN="${MVN:-mvn}"
readonly JAVA="${JAVA_HOME:+$JAVA_HOME/bin/}java"

# The work dir becomes the JVMs' user.home, which must be absolute.
mkdir -p "${OUTBOX_ROCKETMQ_DIR:-/tmp/outbox-rocketmq}"
WORK_DIR="$(cd "${OUTBOX_ROCKETMQ_DIR:-/tmp/outbox-rocketmq}" && pwd)"
readonly WORK_DIR
readonly CONF_DIR="$WORK_DIR/conf"
readonly LOG_DIR="$WORK_DIR/logs"
readonly STORE_DIR="$WORK_DIR/store"

# Flags for every JVM here.
readonly COMMON_JVM=(
  # Stack traces even for exceptions the JIT has seen often (as Apache's scripts do).
  -XX:-OmitStackTraceInFastThrow
  # IPv4 sockets only: 127.0.0.1 is the one address in play.
  -Djava.net.preferIPv4Stack=true
  -Dfile.encoding=UTF-8
  # Java 9+: the store casts its mapped buffers to sun.nio.ch.DirectBuffer
  # (mlock, page-cache checks) and reflects into java.nio; Apache's own scripts
  # omit these, and the broker boots without them, but some code paths need them.
  --add-opens java.base/java.nio=ALL-UNNAMED
  --add-exports java.base/sun.nio.ch=ALL-UNNAMED
  # The store, the name server's kv file and any default log path live under
  # user.home. The processes exit when no RocketMQ home is set; only optional
  # files (ACL, TLS) would be looked up there.
  "-Duser.home=$WORK_DIR"
  "-Drocketmq.home.dir=$WORK_DIR"
  # All processes share one classpath, so each must name its logback file or
  # they all pick the broker's bundled one (many 100 MB files).
  "-Drmq.logback.configurationFile=$CONF_DIR/logback.xml"
)
readonly NAMESRV_JVM=(-Xms128m -Xmx256m -XX:+UseSerialGC "-Doutbox.rmq.logfile=$LOG_DIR/namesrv.log")
readonly BROKER_JVM=(-Xms256m -Xmx512m -XX:MaxDirectMemorySize=256m -XX:+UseG1GC
  "-Doutbox.rmq.logfile=$LOG_DIR/broker.log")
# Short-lived admin tool: small heap, C1 only, for a quick start.
readonly ADMIN_JVM=(-Xms32m -Xmx256m -XX:+UseSerialGC -XX:TieredStopAtLevel=1
  "-Doutbox.rmq.logfile=$LOG_DIR/admin.log")

log() { printf '[rocketmq] %s\n' "$*" >&2; }

# While `start` brings things up, a failure shows the logs' tails
# (DUMP_LOGS_ON_FAIL) and stops the processes this run launched (STARTED).
DUMP_LOGS_ON_FAIL=false
STARTED=()

die() {
  log "ERROR: $*"
  if $DUMP_LOGS_ON_FAIL; then
    dump_logs
  fi
  local name
  for name in "${STARTED[@]}"; do
    stop_proc "$name" || true
  done
  exit 1
}

dump_logs() {
  local f
  for f in "$LOG_DIR/namesrv.out" "$LOG_DIR/namesrv.log" "$LOG_DIR/broker.out" "$LOG_DIR/broker.log"; do
    [[ -s $f ]] || continue
    log "---- last lines of $f"
    tail -n 30 "$f" >&2
  done
}

usage() {
  sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//' >&2
  exit 2
}

check_java() {
  command -v "$JAVA" >/dev/null 2>&1 || die "java not found (set JAVA_HOME or put Java 17 on PATH)"
  local version major
  version="$("$JAVA" -version 2>&1 | awk -F'"' '/version/ { print $2; exit }')"
  major="${version%%.*}"
  if ! [[ $major =~ ^[0-9]+$ ]] || ((major < 11)); then
    die "need Java 11+ (tested with 17), found '$version'"
  fi
}

# Resolves the name server, broker and admin tool jars with their dependencies
# into a cache that survives between runs; a marker file says the copy finished.
fetch_jars() {
  [[ -f $LIB_DIR/.complete ]] && return 0
  command -v "$MVN" >/dev/null 2>&1 || die "Maven ($MVN) not found: it fetches RocketMQ's jars"
  local tmp="$LIB_DIR.partial.$$"
  log "fetching RocketMQ $ROCKETMQ_VERSION jars with Maven into $LIB_DIR (first run only)"
  rm -rf "$tmp"
  mkdir -p "$tmp"
  if ! "$MVN" -q -B -f "$TEMPLATES/pom.xml" "-Drocketmq.version=$ROCKETMQ_VERSION" \
    dependency:copy-dependencies -DincludeScope=runtime "-DoutputDirectory=$tmp" >"$tmp/mvn.log" 2>&1; then
    tail -n 40 "$tmp/mvn.log" >&2
    rm -rf "$tmp"
    die "Maven could not fetch the RocketMQ jars"
  fi
  [[ -f $tmp/rocketmq-broker-$ROCKETMQ_VERSION.jar ]] || die "Maven finished but rocketmq-broker-$ROCKETMQ_VERSION.jar is missing in $tmp"
  rm -f "$tmp/mvn.log"
  touch "$tmp/.complete"
  rm -rf "$LIB_DIR"
  mv "$tmp" "$LIB_DIR"
}

# Writes this run's config files from the templates next to this script.
render_config() {
  mkdir -p "$CONF_DIR" "$LOG_DIR" "$STORE_DIR"
  local f store
  # The store path goes into a sed replacement: escape \ | and &.
  store="$(printf '%s' "$STORE_DIR" | sed -e 's/[\\|&]/\\&/g')"
  for f in namesrv.conf broker.conf; do
    sed -e "s|@HOST@|$HOST|g" -e "s|@NAMESRV_PORT@|$NAMESRV_PORT|g" \
      -e "s|@BROKER_PORT@|$BROKER_PORT|g" -e "s|@HA_PORT@|$HA_PORT|g" \
      -e "s|@STORE_DIR@|$store|g" "$TEMPLATES/$f" >"$CONF_DIR/$f"
  done
  cp "$TEMPLATES/logback.xml" "$CONF_DIR/logback.xml"
}

# The broker refuses every send while its store's partition is over 90 % full
# (a hard cap in DefaultMessageStore, not configurable upwards).
check_disk() {
  local used
  used="$(df -P "$WORK_DIR" | awk 'NR == 2 { sub("%", "", $5); print $5 }')"
  [[ $used =~ ^[0-9]+$ ]] || return 0
  if ((used >= 89)); then
    die "the disk under $WORK_DIR is ${used}% full; the broker refuses sends above 90%." \
      "Free space or point OUTBOX_ROCKETMQ_DIR at another disk (e.g. a tmpfs such as /dev/shm/outbox-rocketmq)."
  fi
  if ((used >= 80)); then
    log "warning: the disk under $WORK_DIR is ${used}% full (the broker refuses sends above 90%)"
  fi
}

pid_of() { cat "$WORK_DIR/$1.pid" 2>/dev/null || true; }

main_class_of() {
  case $1 in
    namesrv) echo "$NAMESRV_MAIN" ;;
    broker) echo "$BROKER_MAIN" ;;
  esac
}

# True if the pid file names a live process running the expected main class
# (guards against a stale pid file whose pid was reused).
is_running() {
  local pid args
  pid="$(pid_of "$1")"
  [[ -n $pid ]] && alive "$pid" || return 1
  args="$(ps -p "$pid" -o args= 2>/dev/null)" || return 1
  [[ $args == *"$(main_class_of "$1")"* ]]
}

# True while the process exists and is not a zombie waiting to be reaped.
alive() {
  local state
  state="$(ps -o stat= -p "$1" 2>/dev/null)" || return 1
  [[ -n $state && $state != Z* ]]
}

port_open() { (exec 3<>"/dev/tcp/$HOST/$1") 2>/dev/null; }

# admin_expect REGEX ARGS...: runs the admin tool (MQAdminStartup ARGS) until
# its output matches the extended REGEX (success) or it exits (failure); the
# output is left in ADMIN_OUT. The tool's JVM idles ~2 s after its work (Netty's
# graceful shutdown) and exits 0 even when the command failed, so its output is
# what counts, and once it matched the JVM is stopped rather than waited for.
ADMIN_OUT=""
admin_expect() {
  local regex=$1
  shift
  local out rc=1 deadline=$((SECONDS + 60))
  out="$(mktemp "${TMPDIR:-/tmp}/outbox-rocketmq-admin.XXXXXX")"
  "$JAVA" "${COMMON_JVM[@]}" "${ADMIN_JVM[@]}" -cp "$LIB_DIR/*" "$ADMIN_MAIN" "$@" \
    </dev/null >"$out" 2>&1 9>&- &
  local pid=$!
  while :; do
    if grep -Eq -- "$regex" "$out"; then
      rc=0
      break
    fi
    if ! kill -0 "$pid" 2>/dev/null; then
      grep -Eq -- "$regex" "$out" && rc=0
      break
    fi
    ((SECONDS < deadline)) || break
    sleep 0.1
  done
  kill "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
  ADMIN_OUT="$(cat "$out")"
  rm -f "$out"
  return "$rc"
}

broker_registered() {
  local sp='[[:space:]]+'
  admin_expect "^${CLUSTER}${sp}${BROKER_NAME}${sp}0${sp}${HOST//./\\.}:${BROKER_PORT}${sp}" \
    clusterList -n "$NAMESRV_ADDR"
}

topic_has_route() {
  admin_expect "\"${HOST//./\\.}:${BROKER_PORT}\"" topicRoute -n "$NAMESRV_ADDR" -t "$1"
}

# wait_until DESCRIPTION PROCESS-OR-EMPTY COMMAND...: polls COMMAND for up to
# TIMEOUT seconds; gives up early if the named process died.
wait_until() {
  local what=$1 proc=$2
  shift 2
  local deadline=$((SECONDS + TIMEOUT))
  until "$@"; do
    if [[ -n $proc ]] && ! is_running "$proc"; then
      die "the $proc process exited while waiting for: $what"
    fi
    ((SECONDS < deadline)) || die "timed out after ${TIMEOUT}s waiting for: $what"
    sleep 0.5
  done
}

# launch NAME JAVA-ARGS...: starts a detached JVM (own session, no terminal, no
# inherited stdin/stdout) logging to $LOG_DIR/NAME.out. The child writes its own
# pid before exec'ing java, so the pid file is right however setsid forks.
launch() {
  local name=$1
  shift
  local pidfile="$WORK_DIR/$name.pid" out="$LOG_DIR/$name.out"
  rm -f "$pidfile"
  # A fresh file per run (the previous one kept as .1), so that waiting for
  # "boot success" never matches an earlier run's line.
  [[ -f $out ]] && mv -f "$out" "$out.1"
  printf '==== %s starting %s\n' "$name" "$(date '+%F %T')" >"$out"
  # shellcheck disable=SC2016 # $$ and $@ belong to the inner shell
  setsid nohup bash -c 'echo $$ >"$0"; exec "$@"' "$pidfile" "$JAVA" "$@" \
    </dev/null >>"$out" 2>&1 9>&- &
  local _
  for _ in $(seq 50); do
    [[ -s $pidfile ]] && break
    sleep 0.1
  done
  [[ -s $pidfile ]] || die "could not start $name (see $out)"
  STARTED+=("$name")
}

start_namesrv() {
  port_open "$NAMESRV_PORT" && die "port $NAMESRV_PORT is taken by another process (no name server of ours runs)"
  log "starting name server on $NAMESRV_ADDR"
  launch namesrv "${COMMON_JVM[@]}" "${NAMESRV_JVM[@]}" -cp "$LIB_DIR/*" \
    "$NAMESRV_MAIN" -c "$CONF_DIR/namesrv.conf"
  wait_until "name server listening on $NAMESRV_ADDR" namesrv port_open "$NAMESRV_PORT"
  wait_until "name server boot message" namesrv grep -q "The Name Server boot success" "$LOG_DIR/namesrv.out"
}

start_broker() {
  local port
  for port in "$BROKER_PORT" "$FAST_PORT" "$HA_PORT"; do
    port_open "$port" && die "port $port is taken by another process (no broker of ours runs)"
  done
  log "starting broker $BROKER_NAME on $HOST:$BROKER_PORT"
  launch broker "${COMMON_JVM[@]}" "${BROKER_JVM[@]}" -cp "$LIB_DIR/*" \
    "$BROKER_MAIN" -c "$CONF_DIR/broker.conf"
  wait_until "broker boot message" broker grep -q "The broker\[.*boot success" "$LOG_DIR/broker.out"
}

valid_topic() { [[ $1 =~ ^[A-Za-z0-9_%|-]{1,127}$ ]]; }

ensure_topic() {
  local topic=$1
  valid_topic "$topic" || die "invalid topic name '$topic' (letters, digits, _ - % |; at most 127)"
  if ! admin_expect "^create topic to ${HOST//./\\.}:${BROKER_PORT} success" \
    updateTopic -n "$NAMESRV_ADDR" -c "$CLUSTER" -t "$topic"; then
    printf '%s\n' "$ADMIN_OUT" >&2
    die "could not create topic $topic"
  fi
  wait_until "a route for topic $topic" broker topic_has_route "$topic"
  log "topic $topic ready"
}

ensure_topics() {
  local topics topic
  read -r -a topics <<<"${TOPICS//,/ }"
  for topic in "${topics[@]}"; do ensure_topic "$topic"; done
}

print_env() { echo "export OUTBOX_TEST_ROCKETMQ_NAMESRV=$NAMESRV_ADDR"; }

cmd_start() {
  check_java
  fetch_jars
  if is_running namesrv && is_running broker && broker_registered; then
    log "already running and healthy (name server $NAMESRV_ADDR, broker $HOST:$BROKER_PORT)"
    ensure_topics
    print_env
    return 0
  fi
  check_disk
  render_config
  DUMP_LOGS_ON_FAIL=true
  local t0=$SECONDS
  is_running namesrv || start_namesrv
  is_running broker || start_broker
  wait_until "broker $BROKER_NAME registered at $NAMESRV_ADDR as $HOST:$BROKER_PORT" broker broker_registered
  ensure_topics
  STARTED=()
  DUMP_LOGS_ON_FAIL=false
  log "RocketMQ $ROCKETMQ_VERSION ready in $((SECONDS - t0))s (logs: $LOG_DIR)"
  print_env
}

# Resident memory of a process, from /proc (Linux).
rss_of() { awk '/^VmRSS:/ { printf "%d MiB", $2 / 1024 }' "/proc/$1/status" 2>/dev/null || echo "?"; }

cmd_status() {
  local healthy=0 name pid
  for name in namesrv broker; do
    pid="$(pid_of "$name")"
    if is_running "$name"; then
      log "$name: running, pid $pid, RSS $(rss_of "$pid")"
      if command -v ss >/dev/null 2>&1; then
        ss -Hltnp 2>/dev/null | grep "pid=$pid," | awk '{ print "  listening on " $4 }' >&2 || true
      fi
    else
      log "$name: not running"
      healthy=1
    fi
  done
  if ((healthy == 0)); then
    check_java
    if broker_registered; then
      log "broker $BROKER_NAME registered at $NAMESRV_ADDR as $HOST:$BROKER_PORT"
    else
      log "broker $BROKER_NAME not (yet) registered at $NAMESRV_ADDR"
      healthy=1
    fi
  fi
  log "work dir: $WORK_DIR"
  return "$healthy"
}

cmd_topic() {
  [[ $# -eq 1 ]] || usage
  if ! is_running namesrv || ! is_running broker; then
    die "RocketMQ is not running (run: $0 start)"
  fi
  check_java
  ensure_topic "$1"
}

# stop_proc NAME: SIGTERM (the broker's shutdown hook flushes the store and
# unregisters), then SIGKILL after 60 s.
stop_proc() {
  local name=$1 pid _
  pid="$(pid_of "$name")"
  if is_running "$name"; then
    log "stopping $name (pid $pid)"
    kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 600); do
      alive "$pid" || break
      sleep 0.1
    done
    if alive "$pid"; then
      log "$name did not stop within 60s: killing it"
      kill -KILL "$pid" 2>/dev/null || true
      sleep 1
    fi
  fi
  rm -f "$WORK_DIR/$name.pid"
}

cmd_stop() {
  local clean=false
  case ${1:-} in
    "") ;;
    --clean) clean=true ;;
    *) usage ;;
  esac
  if ! is_running broker && ! is_running namesrv; then
    log "nothing of ours was running"
  fi
  # Broker first, so it can unregister from a live name server.
  stop_proc broker
  stop_proc namesrv
  if $clean; then
    # Only what this script creates: the work dir may be a shared folder.
    rm -rf "$STORE_DIR" "$LOG_DIR" "$CONF_DIR" "$WORK_DIR/namesrv" "$WORK_DIR/.lock"
    rmdir "$WORK_DIR" 2>/dev/null || true
    log "stopped; removed the store, logs and config under $WORK_DIR"
  elif [[ -d $STORE_DIR ]]; then
    log "stopped (store kept in $STORE_DIR)"
  fi
}

main() {
  [[ $# -ge 1 ]] || usage
  local cmd=$1
  shift
  case $cmd in
    start | stop | stop-broker | topic)
      # One start/stop/topic at a time (e.g. parallel test packages); the JVMs
      # are started with fd 9 closed so they never hold this lock.
      if command -v flock >/dev/null 2>&1; then
        exec 9>"$WORK_DIR/.lock"
        flock 9
      fi
      ;;
  esac
  case $cmd in
    start) [[ $# -eq 0 ]] || usage; cmd_start ;;
    stop) cmd_stop "$@" ;;
    stop-broker) [[ $# -eq 0 ]] || usage; stop_proc broker ;;
    status) [[ $# -eq 0 ]] || usage; cmd_status ;;
    topic) cmd_topic "$@" ;;
    -h | --help | help) usage ;;
    *) usage ;;
  esac
}

main "$@"
