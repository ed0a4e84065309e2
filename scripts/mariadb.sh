#!/usr/bin/env bash
# Runs a throwaway MariaDB server on loopback for the tests and the example.
#
#   scripts/mariadb.sh start     install mariadb-server from Debian's packages if it is
#                                missing, start mariadbd, create the test database
#   scripts/mariadb.sh stop      stop the server started by this script (a clean shutdown),
#                                and wait until its process has exited
#   scripts/mariadb.sh restart   stop, then start again with the same data: every
#                                connection is dropped and the port is closed meanwhile
#   scripts/mariadb.sh kill      SIGKILL the server, as a crash would; `start` brings it back
#                                through InnoDB's crash recovery
#   scripts/mariadb.sh status    exit 0 if the server answers, 1 if not
#   scripts/mariadb.sh dsn       print the DSN the tests read from OUTBOX_TEST_MYSQL_DSN
#
# The data directory lives under OUTBOX_MARIADB_DIR (default /tmp/outbox-mariadb), so the
# server never touches a system database that may already exist on the machine. Several
# servers can run side by side, each with its own OUTBOX_MARIADB_DIR and OUTBOX_MARIADB_PORT
# (default 3306); the fault tests start a private one this way, to restart it.
#
# Environment (all optional): OUTBOX_MARIADB_DATABASE (default outbox_test),
# OUTBOX_MARIADB_BUFFER_POOL (default 512M), OUTBOX_MARIADB_LOG_FILE_SIZE (default 256M),
# OUTBOX_MARIADB_ARGS (more mariadbd options, split on spaces, e.g. "--log-bin
# --binlog-format=STATEMENT --server-id=1").
set -euo pipefail

dir=${OUTBOX_MARIADB_DIR:-/tmp/outbox-mariadb}
port=${OUTBOX_MARIADB_PORT:-3306}
db=${OUTBOX_MARIADB_DATABASE:-outbox_test}
buffer_pool=${OUTBOX_MARIADB_BUFFER_POOL:-512M}
log_file_size=${OUTBOX_MARIADB_LOG_FILE_SIZE:-256M}
read -r -a extra_args <<<"${OUTBOX_MARIADB_ARGS:-}"
sock=$dir/mysqld.sock
pidfile=$dir/mysqld.pid

dsn() {
	# parseTime so DATETIME columns scan into time.Time; the tests compare times in SQL,
	# so the session time zone does not matter.
	echo "root@tcp(127.0.0.1:${port})/${db}?parseTime=true"
}

client() {
	mariadb --no-defaults --protocol=socket --socket="$sock" -uroot "$@"
}

running() {
	[ -S "$sock" ] && client -e 'SELECT 1' >/dev/null 2>&1
}

# gone reports whether process $1 has exited (a zombie nobody has reaped yet counts).
gone() {
	! kill -0 "$1" 2>/dev/null || [ "$(ps -o stat= -p "$1" 2>/dev/null | cut -c1)" = Z ]
}

# alive reports whether the process in the pid file still runs.
alive() {
	[ -f "$pidfile" ] && ! gone "$(cat "$pidfile")"
}

install() {
	if command -v mariadbd >/dev/null 2>&1 || [ -x /usr/sbin/mariadbd ]; then
		return
	fi
	if [ "$(id -u)" -ne 0 ]; then
		echo "mariadb-server is not installed and this is not root: install it with apt-get" >&2
		exit 1
	fi
	echo "installing mariadb-server from Debian's packages" >&2
	apt-get update -qq
	# policy-rc.d on containers refuses to start the packaged service; that is fine,
	# this script starts its own server below.
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq mariadb-server >/dev/null
}

start() {
	if running; then
		echo "mariadb already running on 127.0.0.1:${port}" >&2
		dsn
		return
	fi
	install
	# A temporary directory of its own: several servers (the tests start private ones) must
	# never share one, where one's cleanup could remove another's internal temporary tables.
	mkdir -p "$dir/tmp" /run/mysqld
	chown -R mysql:mysql "$dir" /run/mysqld
	if [ ! -d "$dir/data/mysql" ]; then
		mariadb-install-db --no-defaults --user=mysql --datadir="$dir/data" \
			--auth-root-authentication-method=normal --skip-test-db >"$dir/install.log" 2>&1 ||
			{ cat "$dir/install.log" >&2; exit 1; }
	fi
	# --no-defaults: ignore /etc/mysql so a machine's own settings cannot change the tests.
	# The buffer pool and log sizes suit a 2-core test box; the tests are not about fsync.
	/usr/sbin/mariadbd --no-defaults --user=mysql \
		--datadir="$dir/data" --socket="$sock" --pid-file="$pidfile" --tmpdir="$dir/tmp" \
		--bind-address=127.0.0.1 --port="$port" \
		--innodb-buffer-pool-size="$buffer_pool" --innodb-log-file-size="$log_file_size" \
		--innodb-flush-log-at-trx-commit=2 --max-connections=500 \
		--skip-name-resolve --log-error="$dir/error.log" ${extra_args[@]+"${extra_args[@]}"} >/dev/null 2>&1 &
	for _ in $(seq 1 600); do
		if running; then
			break
		fi
		sleep 0.5
	done
	if ! running; then
		echo "mariadbd did not come up; its log:" >&2
		tail -n 30 "$dir/error.log" >&2 || true
		exit 1
	fi
	# Root over TCP without a password: a loopback-only test server.
	client -e "CREATE DATABASE IF NOT EXISTS \`${db}\`;
		ALTER USER 'root'@'localhost' IDENTIFIED VIA mysql_native_password USING PASSWORD('');
		CREATE USER IF NOT EXISTS 'root'@'127.0.0.1' IDENTIFIED BY '';
		GRANT ALL ON *.* TO 'root'@'127.0.0.1' WITH GRANT OPTION;"
	echo "mariadb running on 127.0.0.1:${port}, database ${db}" >&2
	dsn
}

stop() {
	if alive; then
		kill "$(cat "$pidfile")" 2>/dev/null || true
		# A clean shutdown removes the pid file; wait for the process itself, so that a
		# start right after this one finds the port and the data files free.
		for _ in $(seq 1 600); do
			alive || break
			sleep 0.1
		done
		if alive; then
			echo "mariadbd (pid $(cat "$pidfile")) did not stop within 60 s" >&2
			exit 1
		fi
	fi
	echo "mariadb stopped" >&2
}

crash() {
	if alive; then
		local pid
		pid=$(cat "$pidfile")
		kill -KILL "$pid" 2>/dev/null || true
		for _ in $(seq 1 600); do
			gone "$pid" && break
			sleep 0.1
		done
		if ! gone "$pid"; then
			echo "mariadbd (pid $pid) survived SIGKILL for 60 s" >&2
			exit 1
		fi
		# The server had no chance to remove it; a later stop must not signal a reused pid.
		rm -f "$pidfile"
	fi
	echo "mariadb killed" >&2
}

case "${1:-}" in
start) start ;;
stop) stop ;;
restart)
	stop
	start
	;;
kill) crash ;;
status)
	if running; then
		echo "mariadb running on 127.0.0.1:${port}" >&2
	else
		echo "mariadb not running on 127.0.0.1:${port}" >&2
		exit 1
	fi
	;;
dsn) dsn ;;
*)
	echo "usage: $0 start|stop|restart|kill|status|dsn" >&2
	exit 2
	;;
esac
