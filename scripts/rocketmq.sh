#!/usr/bin/env bash
# Runs a real Apache RocketMQ 5.x name server and one or two brokers (broker-a,
# broker-b: two masters of one cluster, DefaultCluster) on this machine for the
# outbox integration tests, from Apache's jars on Maven Central (no Docker, no
# distribution download). All listen on and advertise 127.0.0.1.
#
# Usage:
#   scripts/rocketmq.sh start            start (or re-check) the name server and the brokers,
#                                        create the topics on every broker
#   scripts/rocketmq.sh status           processes, memory, ports, registration; exit 1 if unhealthy
#   scripts/rocketmq.sh topic NAME       create/update a topic on every broker and wait until
#                                        its route names them all
#   scripts/rocketmq.sh stop [--clean]   stop everything; --clean also deletes the stores, logs
#                                        and config
#   scripts/rocketmq.sh stop-broker [NAME] [--kill]
#                                        stop one broker (default broker-a), an outage for the
#                                        tests; --kill sends SIGKILL (a crash: no shutdown hook,
#                                        no unregistering) instead of SIGTERM
#   scripts/rocketmq.sh start-broker NAME
#                                        start one broker again, with its store, and wait until
#                                        it has registered (its name server must be running);
#                                        `start` also brings back a stopped broker
#
# `start` prints `export` lines on stdout (all other messages go to stderr), so
# `eval "$(scripts/rocketmq.sh start)"` sets OUTBOX_TEST_ROCKETMQ_NAMESRV and
# OUTBOX_TEST_ROCKETMQ_BROKER (and OUTBOX_TEST_ROCKETMQ_BROKER_B with two brokers) for
# the tests, and the OUTBOX_ROCKETMQ_* variables below, so that the tests that stop and
# start a broker through this script act on this instance.
#
# ACL mode (OUTBOX_ROCKETMQ_ACL=1): the brokers run with RocketMQ 5's ACL 2.0
# authentication and authorization (the name server has none). Each broker keeps its
# users and ACLs in its store (store*/config): the super user outbox-admin (created at
# boot; the brokers also sign their own requests with it, and this script's admin
# tool does through $OUTBOX_ROCKETMQ_DIR/conf/tools.yml) and, created by `start` and
# `start-broker`, the normal user outbox-consumer with Pub and Sub on Topic:* and Sub
# on Group:* (enough to produce, and for a push consumer, orderly or not, that starts
# from the first offset: Group Sub covers its %RETRY% topic, queue locks and offsets;
# CONSUME_FROM_LAST_OFFSET/TIMESTAMP on a new group would also need Get on the topic).
# Requests without a valid signature are refused with NO_PERMISSION. An ACL instance
# runs beside a plain one (give it its own OUTBOX_ROCKETMQ_DIR and ports), so `start`
# prints other names for it: OUTBOX_TEST_ROCKETMQ_ACL_NAMESRV, _ACL_BROKER,
# _ACL_ACCESS_KEY/_ACL_SECRET_KEY (the normal user) and _ACL_ADMIN_ACCESS_KEY/
# _ACL_ADMIN_SECRET_KEY (the super user), and none of the plain instance's. A running
# instance keeps its mode: stop it before switching.
#
# Environment (all optional):
#   OUTBOX_ROCKETMQ_DIR      runtime state: stores, logs, pid files (default /tmp/outbox-rocketmq)
#   OUTBOX_ROCKETMQ_ACL      1: ACL mode (see above); 0 (default): no authentication
#   OUTBOX_ROCKETMQ_BROKERS  1 (default: broker-a) or 2 (broker-a and broker-b)
#   OUTBOX_ROCKETMQ_TOPICS   topics `start` creates, space or comma separated
#                            (default ORDER_EVENT_TOPIC)
#   OUTBOX_ROCKETMQ_TIMEOUT  seconds to wait for each step (default 120)
#   OUTBOX_ROCKETMQ_CACHE    jar cache root (default ${XDG_CACHE_HOME:-$HOME/.cache}/outbox-rocketmq)
#   OUTBOX_ROCKETMQ_NAMESRV_PORT, OUTBOX_ROCKETMQ_BROKER_PORT, OUTBOX_ROCKETMQ_BROKER_B_PORT
#                            default 9876, 10911 (broker-a) and BROKER_PORT+10 (broker-b);
#                            each broker also uses its port-2 (its "fast" port) and port+1 (HA)
#   JAVA_HOME                Java 11+ (tested with 17); otherwise `java` on PATH
#   MVN                      Maven command (default mvn)
set -euo pipefail

readonly ROCKETMQ_VERSION=5.3.3
readonly HOST=127.0.0.1
readonly CLUSTER=DefaultCluster
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
readonly BROKER_B_PORT="${OUTBOX_ROCKETMQ_BROKER_B_PORT:-$((BROKER_PORT + 10))}"
readonly BROKER_COUNT="${OUTBOX_ROCKETMQ_BROKERS:-1}"
readonly NAMESRV_ADDR="$HOST:$NAMESRV_PORT"
readonly MVN="${MVN:-mvn}"
readonly ACL="${OUTBOX_ROCKETMQ_ACL:-0}"
# ACL mode's users (test credentials for a loopback-only instance).
readonly ACL_ADMIN_USER=outbox-admin ACL_ADMIN_PASSWORD=outbox-admin-secret
readonly ACL_USER=outbox-consumer ACL_PASSWORD=outbox-consumer-secret
readonly JAVA="${JAVA_HOME:+$JAVA_HOME/bin/}java"

# The work dir becomes the JVMs' user.home, which must be absolute.
mkdir -p "${OUTBOX_ROCKETMQ_DIR:-/tmp/outbox-rocketmq}"
WORK_DIR="$(cd "${OUTBOX_ROCKETMQ_DIR:-/tmp/outbox-rocketmq}" && pwd)"
readonly WORK_DIR
readonly CONF_DIR="$WORK_DIR/conf"
readonly LOG_DIR="$WORK_DIR/logs"

case $BROKER_COUNT in
  1) BROKERS=(broker-a) ;;
  2) BROKERS=(broker-a broker-b) ;;
  *)
    printf '[rocketmq] ERROR: OUTBOX_ROCKETMQ_BROKERS must be 1 or 2, not %s\n' "$BROKER_COUNT" >&2
    exit 2
    ;;
esac
readonly BROKERS
readonly ALL_BROKERS=(broker-a broker-b)

case $ACL in
  0 | 1) ;;
  *)
    printf '[rocketmq] ERROR: OUTBOX_ROCKETMQ_ACL must be 0 or 1, not %s\n' "$ACL" >&2
    exit 2
    ;;
esac
acl_on() { [[ $ACL == 1 ]]; }

# Each broker's process name (its pid, conf, .out and .log files), store and port.
# broker-a keeps the names of the time when there was one broker ("broker", "store"),
# so that an instance started by an earlier version of this script is still found.
proc_of() {
  case $1 in
    broker-a) echo broker ;;
    broker-b) echo broker-b ;;
  esac
}
store_of() {
  case $1 in
    broker-a) echo "$WORK_DIR/store" ;;
    broker-b) echo "$WORK_DIR/store-b" ;;
  esac
}
port_of() {
  case $1 in
    broker-a) echo "$BROKER_PORT" ;;
    broker-b) echo "$BROKER_B_PORT" ;;
  esac
}
valid_broker() { [[ $1 == broker-a || $1 == broker-b ]]; }

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
# Each broker adds -Doutbox.rmq.logfile=$LOG_DIR/<process name>.log.
readonly BROKER_JVM=(-Xms256m -Xmx512m -XX:MaxDirectMemorySize=256m -XX:+UseG1GC)
# Short-lived admin tool: small heap, C1 only, for a quick start.
# Its name server is always ours: a client without one asks an HTTP "address server"
# (a DNS lookup of jmenv.tbsite.net first); every call passes -n anyway.
readonly ADMIN_JVM=(-Xms32m -Xmx256m -XX:+UseSerialGC -XX:TieredStopAtLevel=1
  "-Doutbox.rmq.logfile=$LOG_DIR/admin.log" "-Drocketmq.namesrv.addr=$NAMESRV_ADDR")

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
  for f in "$LOG_DIR"/namesrv.{out,log} "$LOG_DIR"/broker.{out,log} "$LOG_DIR"/broker-b.{out,log}; do
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

# Writes this run's config files from the templates next to this script: the name
# server's, and one per broker (conf/broker.conf for broker-a, conf/broker-b.conf).
render_config() {
  mkdir -p "$CONF_DIR" "$LOG_DIR"
  sed -e "s|@HOST@|$HOST|g" -e "s|@NAMESRV_PORT@|$NAMESRV_PORT|g" \
    "$TEMPLATES/namesrv.conf" >"$CONF_DIR/namesrv.conf"
  local name store port
  for name in "${ALL_BROKERS[@]}"; do
    port="$(port_of "$name")"
    mkdir -p "$(store_of "$name")"
    # The store path goes into a sed replacement: escape \ | and &.
    store="$(store_of "$name" | sed -e 's/[\\|&]/\\&/g')"
    sed -e "s|@HOST@|$HOST|g" -e "s|@NAMESRV_PORT@|$NAMESRV_PORT|g" \
      -e "s|@BROKER_NAME@|$name|g" -e "s|@BROKER_PORT@|$port|g" \
      -e "s|@HA_PORT@|$((port + 1))|g" -e "s|@STORE_DIR@|$store|g" \
      "$TEMPLATES/broker.conf" >"$CONF_DIR/$(proc_of "$name").conf"
    if acl_on; then acl_broker_config >>"$CONF_DIR/$(proc_of "$name").conf"; fi
  done
  cp "$TEMPLATES/logback.xml" "$CONF_DIR/logback.xml"
  if acl_on; then
    write_tools_config
  else
    rm -f "$CONF_DIR/tools.yml"
  fi
}

# ACL mode's broker settings (fields of AuthConfig, read from the broker's config
# file like the others). The default authentication and authorization providers are
# implied; the metadata providers have no default: the "local" ones keep users and
# ACLs in RocksDB under <storePathRootDir>/config. initAuthenticationUser creates the
# super user at boot if missing; innerClientAuthenticationCredentials is what the
# broker signs its own outgoing requests with (also created as a super user).
acl_broker_config() {
  cat <<EOF_ACL

# --- ACL 2.0, added by scripts/rocketmq.sh because OUTBOX_ROCKETMQ_ACL=1 ---
authenticationEnabled=true
authorizationEnabled=true
authenticationMetadataProvider=org.apache.rocketmq.auth.authentication.provider.LocalAuthenticationMetadataProvider
authorizationMetadataProvider=org.apache.rocketmq.auth.authorization.provider.LocalAuthorizationMetadataProvider
initAuthenticationUser={"username":"$ACL_ADMIN_USER","password":"$ACL_ADMIN_PASSWORD"}
innerClientAuthenticationCredentials={"accessKey":"$ACL_ADMIN_USER","secretKey":"$ACL_ADMIN_PASSWORD"}
EOF_ACL
}

# The admin tool (MQAdminStartup) signs its requests with the credentials in
# <rocketmq.home.dir>/conf/tools.yml, i.e. $CONF_DIR/tools.yml here; it has no
# command-line option for them.
write_tools_config() {
  mkdir -p "$CONF_DIR"
  (
    umask 077
    printf 'accessKey: %s\nsecretKey: %s\n' "$ACL_ADMIN_USER" "$ACL_ADMIN_PASSWORD" >"$CONF_DIR/tools.yml"
  )
}

# The mode a broker of ours was started in, from its rendered config: acl or plain.
mode_of_conf() {
  if grep -q '^authenticationEnabled=true' "$CONF_DIR/$(proc_of "$1").conf" 2>/dev/null; then
    echo acl
  else
    echo plain
  fi
}

# Refuses to mix modes (a running broker keeps the mode it was started in), and in ACL
# mode gives the admin tool its credentials.
check_mode() {
  local want=plain name
  acl_on && want=acl
  for name in "${ALL_BROKERS[@]}"; do
    broker_running "$name" || continue
    if [[ $(mode_of_conf "$name") != "$want" ]]; then
      die "broker $name runs in $(mode_of_conf "$name") mode, but OUTBOX_ROCKETMQ_ACL=$ACL asks for $want;" \
        "stop this instance first ($0 stop)"
    fi
  done
  if acl_on; then write_tools_config; fi
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
    broker | broker-b) echo "$BROKER_MAIN" ;;
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

broker_running() { is_running "$(proc_of "$1")"; }

# True while the process exists and is not a zombie waiting to be reaped.
alive() {
  local state
  state="$(ps -o stat= -p "$1" 2>/dev/null)" || return 1
  [[ -n $state && $state != Z* ]]
}

port_open() { (exec 3<>"/dev/tcp/$HOST/$1") 2>/dev/null; }

# admin_expect REGEX... -- ARGS...: runs the admin tool (MQAdminStartup ARGS)
# until its output matches every extended REGEX (success) or it exits (failure);
# the output is left in ADMIN_OUT. The tool's JVM idles ~2 s after its work
# (Netty's graceful shutdown) and exits 0 even when the command failed, so its
# output is what counts, and once it matched the JVM is stopped rather than
# waited for.
ADMIN_OUT=""
admin_expect() {
  local regexes=()
  while [[ $1 != -- ]]; do
    regexes+=("$1")
    shift
  done
  shift
  local out rc=1 deadline=$((SECONDS + 60))
  out="$(mktemp "${TMPDIR:-/tmp}/outbox-rocketmq-admin.XXXXXX")"
  "$JAVA" "${COMMON_JVM[@]}" "${ADMIN_JVM[@]}" -cp "$LIB_DIR/*" "$ADMIN_MAIN" "$@" \
    </dev/null >"$out" 2>&1 9>&- &
  local pid=$!
  while :; do
    if all_match "$out" "${regexes[@]}"; then
      rc=0
      break
    fi
    if ! kill -0 "$pid" 2>/dev/null; then
      all_match "$out" "${regexes[@]}" && rc=0
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

# all_match FILE REGEX...: every REGEX matches some line of FILE.
all_match() {
  local file=$1 regex
  shift
  for regex in "$@"; do
    grep -Eq -- "$regex" "$file" || return 1
  done
}

addr_re() { printf '%s' "${HOST//./\\.}:$(port_of "$1")"; }

broker_registered() {
  local sp='[[:space:]]+'
  admin_expect "^${CLUSTER}${sp}$1${sp}0${sp}$(addr_re "$1")${sp}" -- \
    clusterList -n "$NAMESRV_ADDR"
}

# A route for the topic that names every broker of this instance.
topic_has_route() {
  local topic=$1 name regexes=()
  for name in "${BROKERS[@]}"; do regexes+=("\"$(addr_re "$name")\""); done
  admin_expect "${regexes[@]}" -- topicRoute -n "$NAMESRV_ADDR" -t "$topic"
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

# start_broker NAME: launches the broker and waits for its boot message (not for
# its registration).
start_broker() {
  local name=$1 proc port p
  proc="$(proc_of "$name")"
  port="$(port_of "$name")"
  for p in "$port" "$((port - 2))" "$((port + 1))"; do
    port_open "$p" && die "port $p is taken by another process (no $name of ours runs)"
  done
  log "starting broker $name on $HOST:$port"
  launch "$proc" "${COMMON_JVM[@]}" "${BROKER_JVM[@]}" "-Doutbox.rmq.logfile=$LOG_DIR/$proc.log" \
    -cp "$LIB_DIR/*" "$BROKER_MAIN" -c "$CONF_DIR/$proc.conf"
  wait_until "broker $name boot message" "$proc" grep -q "The broker\[.*boot success" "$LOG_DIR/$proc.out"
}

wait_registered() {
  local name=$1
  wait_until "broker $name registered at $NAMESRV_ADDR as $HOST:$(port_of "$name")" \
    "$(proc_of "$name")" broker_registered "$name"
}

valid_topic() { [[ $1 =~ ^[A-Za-z0-9_%|-]{1,127}$ ]]; }

# ensure_topic NAME: creates the topic on every master of the cluster (updateTopic
# -c), checks that each broker of this instance said success, and waits until the
# name server's route for it names them all.
ensure_topic() {
  local topic=$1 name regexes=()
  valid_topic "$topic" || die "invalid topic name '$topic' (letters, digits, _ - % |; at most 127)"
  for name in "${BROKERS[@]}"; do regexes+=("^create topic to $(addr_re "$name") success"); done
  if ! admin_expect "${regexes[@]}" -- updateTopic -n "$NAMESRV_ADDR" -c "$CLUSTER" -t "$topic"; then
    printf '%s\n' "$ADMIN_OUT" >&2
    die "could not create topic $topic on ${BROKERS[*]}"
  fi
  wait_until "a route for topic $topic on ${BROKERS[*]}" "" topic_has_route "$topic"
  log "topic $topic ready on ${BROKERS[*]}"
}

ensure_topics() {
  local topics topic
  read -r -a topics <<<"${TOPICS//,/ }"
  for topic in "${topics[@]}"; do ensure_topic "$topic"; done
}

# In ACL mode, each broker's store (its users and ACLs) gets the normal user once;
# this file in the store records that.
readonly ACL_MARKER=.outbox-acl-user

# acl_setup cluster | broker NAME: creates the normal user and grants it Pub and Sub on
# every topic and Sub on every group, on the whole cluster (one admin run per step,
# each broker must say success) or on broker NAME only (then an existing user is fine;
# createAcl merges into an existing ACL anyway).
acl_setup() {
  local target=() user_re=() topic_re=() group_re=() name addr
  if [[ $1 == cluster ]]; then
    target=(-n "$NAMESRV_ADDR" -c "$CLUSTER")
    for name in "${BROKERS[@]}"; do
      addr="$(addr_re "$name")"
      user_re+=("^create user to $addr success")
      topic_re+=("^create acl to $addr success")
    done
  else
    addr="$(addr_re "$2")"
    target=(-n "$NAMESRV_ADDR" -b "$HOST:$(port_of "$2")")
    user_re=("^create user to $addr success|The user is existed")
    topic_re=("^create acl to $addr success")
  fi
  group_re=("${topic_re[@]}")
  admin_expect "${user_re[@]}" -- createUser "${target[@]}" -u "$ACL_USER" -p "$ACL_PASSWORD" -t Normal &&
    admin_expect "${topic_re[@]}" -- createAcl "${target[@]}" -s "User:$ACL_USER" \
      -r 'Topic:*' -a Pub,Sub -d Allow &&
    admin_expect "${group_re[@]}" -- createAcl "${target[@]}" -s "User:$ACL_USER" \
      -r 'Group:*' -a Sub -d Allow
}

# ensure_acl_user NAME...: in ACL mode, sets up the normal user on those (running,
# registered) brokers whose store does not have it yet.
ensure_acl_user() {
  acl_on || return 0
  local name need=()
  for name in "$@"; do
    [[ -f $(store_of "$name")/$ACL_MARKER ]] || need+=("$name")
  done
  ((${#need[@]} > 0)) || return 0
  # All of them at once if all need it, else (or if that failed) one by one.
  if [[ ${need[*]} != "${BROKERS[*]}" ]] || ! acl_setup cluster; then
    for name in "${need[@]}"; do
      if ! acl_setup broker "$name"; then
        printf '%s\n' "$ADMIN_OUT" >&2
        die "could not create the ACL user $ACL_USER on $name"
      fi
    done
  fi
  for name in "${need[@]}"; do touch "$(store_of "$name")/$ACL_MARKER"; done
  log "ACL user $ACL_USER (Pub, Sub on Topic:*; Sub on Group:*) ready on ${need[*]}"
}

print_env() {
  if acl_on; then
    echo "export OUTBOX_TEST_ROCKETMQ_ACL_NAMESRV=$NAMESRV_ADDR"
    echo "export OUTBOX_TEST_ROCKETMQ_ACL_BROKER=$HOST:$BROKER_PORT"
    echo "export OUTBOX_TEST_ROCKETMQ_ACL_ACCESS_KEY=$ACL_USER"
    echo "export OUTBOX_TEST_ROCKETMQ_ACL_SECRET_KEY=$ACL_PASSWORD"
    echo "export OUTBOX_TEST_ROCKETMQ_ACL_ADMIN_ACCESS_KEY=$ACL_ADMIN_USER"
    echo "export OUTBOX_TEST_ROCKETMQ_ACL_ADMIN_SECRET_KEY=$ACL_ADMIN_PASSWORD"
    return
  fi
  echo "export OUTBOX_TEST_ROCKETMQ_NAMESRV=$NAMESRV_ADDR"
  echo "export OUTBOX_TEST_ROCKETMQ_BROKER=$HOST:$BROKER_PORT"
  if ((BROKER_COUNT == 2)); then
    echo "export OUTBOX_TEST_ROCKETMQ_BROKER_B=$HOST:$BROKER_B_PORT"
  fi
  # For the tests that stop and start a broker through this script.
  printf 'export OUTBOX_ROCKETMQ_DIR=%q\n' "$WORK_DIR"
  echo "export OUTBOX_ROCKETMQ_BROKERS=$BROKER_COUNT"
  echo "export OUTBOX_ROCKETMQ_NAMESRV_PORT=$NAMESRV_PORT"
  echo "export OUTBOX_ROCKETMQ_BROKER_PORT=$BROKER_PORT"
  echo "export OUTBOX_ROCKETMQ_BROKER_B_PORT=$BROKER_B_PORT"
}

all_healthy() {
  local name
  is_running namesrv || return 1
  for name in "${BROKERS[@]}"; do
    broker_running "$name" && broker_registered "$name" || return 1
  done
}

cmd_start() {
  check_java
  fetch_jars
  check_mode
  if all_healthy; then
    log "already running and healthy (name server $NAMESRV_ADDR, brokers ${BROKERS[*]})"
    ensure_acl_user "${BROKERS[@]}"
    ensure_topics
    print_env
    return 0
  fi
  check_disk
  render_config
  DUMP_LOGS_ON_FAIL=true
  local t0=$SECONDS name
  is_running namesrv || start_namesrv
  for name in "${BROKERS[@]}"; do
    broker_running "$name" || start_broker "$name"
  done
  for name in "${BROKERS[@]}"; do wait_registered "$name"; done
  ensure_acl_user "${BROKERS[@]}"
  ensure_topics
  STARTED=()
  DUMP_LOGS_ON_FAIL=false
  log "RocketMQ $ROCKETMQ_VERSION ready in $((SECONDS - t0))s (logs: $LOG_DIR)"
  print_env
}

# start-broker NAME: one broker, against a name server that is already up (ours or
# not: a second broker can join any name server on this host).
cmd_start_broker() {
  [[ $# -eq 1 ]] || usage
  local name=$1
  valid_broker "$name" || die "unknown broker '$name' (broker-a or broker-b)"
  check_java
  fetch_jars
  port_open "$NAMESRV_PORT" || die "no name server answers on $NAMESRV_ADDR (run: $0 start)"
  check_mode
  if ! broker_running "$name"; then
    check_disk
    render_config
    DUMP_LOGS_ON_FAIL=true
    start_broker "$name"
  fi
  wait_registered "$name"
  ensure_acl_user "$name"
  STARTED=()
  DUMP_LOGS_ON_FAIL=false
  log "broker $name running and registered at $NAMESRV_ADDR"
}

# Resident memory of a process, from /proc (Linux).
rss_of() { awk '/^VmRSS:/ { printf "%d MiB", $2 / 1024 }' "/proc/$1/status" 2>/dev/null || echo "?"; }

# report_proc PROC LABEL: prints whether it runs, with pid, memory and ports.
report_proc() {
  local proc=$1 label=$2 pid
  pid="$(pid_of "$proc")"
  if is_running "$proc"; then
    log "$label: running, pid $pid, RSS $(rss_of "$pid")"
    if command -v ss >/dev/null 2>&1; then
      ss -Hltnp 2>/dev/null | grep "pid=$pid," | awk '{ print "  listening on " $4 }' >&2 || true
    fi
    return 0
  fi
  log "$label: not running"
  return 1
}

# status: the name server and both brokers; only those this instance is meant to
# run (OUTBOX_ROCKETMQ_BROKERS) decide the exit status.
cmd_status() {
  local healthy=0 name expected
  report_proc namesrv namesrv || healthy=1
  for name in "${ALL_BROKERS[@]}"; do
    expected=false
    [[ " ${BROKERS[*]} " == *" $name "* ]] && expected=true
    if report_proc "$(proc_of "$name")" "$name"; then
      check_java
      if broker_registered "$name"; then
        log "  registered at $NAMESRV_ADDR as $HOST:$(port_of "$name")"
      else
        log "  not (yet) registered at $NAMESRV_ADDR"
        $expected && healthy=1
      fi
    elif $expected; then
      healthy=1
    fi
  done
  log "work dir: $WORK_DIR (brokers expected: ${BROKERS[*]})"
  return "$healthy"
}

cmd_topic() {
  [[ $# -eq 1 ]] || usage
  local name
  is_running namesrv || die "RocketMQ is not running (run: $0 start)"
  for name in "${BROKERS[@]}"; do
    broker_running "$name" || die "broker $name is not running (run: $0 start)"
  done
  check_java
  check_mode
  ensure_topic "$1"
}

# stop_proc NAME [SIGNAL]: SIGTERM (the broker's shutdown hook flushes the store
# and unregisters), then SIGKILL after 60 s; with SIGNAL KILL, SIGKILL at once.
stop_proc() {
  local name=$1 signal=${2:-TERM} pid _
  pid="$(pid_of "$name")"
  if is_running "$name"; then
    log "stopping $name (pid $pid, SIG$signal)"
    kill -"$signal" "$pid" 2>/dev/null || true
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

cmd_stop_broker() {
  local name=broker-a signal=TERM arg
  for arg in "$@"; do
    case $arg in
      --kill) signal=KILL ;;
      broker-a | broker-b) name=$arg ;;
      *) die "stop-broker: unknown argument '$arg' (broker-a, broker-b, --kill)" ;;
    esac
  done
  broker_running "$name" || log "broker $name was not running"
  stop_proc "$(proc_of "$name")" "$signal"
}

cmd_stop() {
  local clean=false name
  case ${1:-} in
    "") ;;
    --clean) clean=true ;;
    *) usage ;;
  esac
  if ! is_running namesrv && ! broker_running broker-a && ! broker_running broker-b; then
    log "nothing of ours was running"
  fi
  # Brokers first, so they can unregister from a live name server.
  for name in "${ALL_BROKERS[@]}"; do stop_proc "$(proc_of "$name")"; done
  stop_proc namesrv
  if $clean; then
    # Only what this script creates: the work dir may be a shared folder.
    rm -rf "$(store_of broker-a)" "$(store_of broker-b)" "$LOG_DIR" "$CONF_DIR" \
      "$WORK_DIR/namesrv" "$WORK_DIR/.lock"
    rmdir "$WORK_DIR" 2>/dev/null || true
    log "stopped; removed the stores, logs and config under $WORK_DIR"
  else
    log "stopped (stores kept under $WORK_DIR)"
  fi
}

main() {
  [[ $# -ge 1 ]] || usage
  local cmd=$1
  shift
  case $cmd in
    start | stop | stop-broker | start-broker | topic)
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
    stop-broker) cmd_stop_broker "$@" ;;
    start-broker) cmd_start_broker "$@" ;;
    status) [[ $# -eq 0 ]] || usage; cmd_status ;;
    topic) cmd_topic "$@" ;;
    -h | --help | help) usage ;;
    *) usage ;;
  esac
}

main "$@"
