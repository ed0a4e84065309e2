#!/usr/bin/env bash
# Runs a throwaway MariaDB server on loopback for the tests and the example.
#
#   scripts/mariadb.sh start   install mariadb-server from Debian's packages if it is
#                              missing, start mariadbd, create the test database
#   scripts/mariadb.sh stop    stop the server started by this script
#   scripts/mariadb.sh dsn     print the DSN the tests read from OUTBOX_TEST_MYSQL_DSN
#
# The data directory lives under OUTBOX_MARIADB_DIR (default /tmp/outbox-mariadb), so the
# server never touches a system database that may already exist on the machine.
set -euo pipefail

dir=${OUTBOX_MARIADB_DIR:-/tmp/outbox-mariadb}
port=${OUTBOX_MARIADB_PORT:-3306}
db=${OUTBOX_MARIADB_DATABASE:-outbox_test}
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
	mkdir -p "$dir" /run/mysqld
	chown -R mysql:mysql "$dir" /run/mysqld
	if [ ! -d "$dir/data/mysql" ]; then
		mariadb-install-db --no-defaults --user=mysql --datadir="$dir/data" \
			--auth-root-authentication-method=normal --skip-test-db >"$dir/install.log" 2>&1 ||
			{ cat "$dir/install.log" >&2; exit 1; }
	fi
	# --no-defaults: ignore /etc/mysql so a machine's own settings cannot change the tests.
	# The buffer pool and log sizes suit a 2-core test box; the tests are not about fsync.
	/usr/sbin/mariadbd --no-defaults --user=mysql \
		--datadir="$dir/data" --socket="$sock" --pid-file="$pidfile" \
		--bind-address=127.0.0.1 --port="$port" \
		--innodb-buffer-pool-size=512M --innodb-log-file-size=256M \
		--innodb-flush-log-at-trx-commit=2 --max-connections=500 \
		--skip-name-resolve --log-error="$dir/error.log" >/dev/null 2>&1 &
	for _ in $(seq 1 60); do
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
	if [ -f "$pidfile" ]; then
		kill "$(cat "$pidfile")" 2>/dev/null || true
		for _ in $(seq 1 60); do
			[ -f "$pidfile" ] || break
			sleep 0.5
		done
	fi
	echo "mariadb stopped" >&2
}

case "${1:-}" in
start) start ;;
stop) stop ;;
dsn) dsn ;;
*)
	echo "usage: $0 start|stop|dsn" >&2
	exit 2
	;;
esac
