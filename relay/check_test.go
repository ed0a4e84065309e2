package relay

import (
	"context"
	"database/sql"
	"fmt"
	"log/slog"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	gomysql "github.com/go-mysql-org/go-mysql/mysql"
	"github.com/go-mysql-org/go-mysql/replication"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/go-outbox/outbox"
	"github.com/go-outbox/outbox/internal/testsvc"
)

// relayServerArgs set a private MariaDB server up as the relay needs it, with server id 7.
var relayServerArgs = []string{"--log-bin", "--binlog-format=ROW", "--binlog-row-metadata=FULL", "--server-id=7"}

// requireRefusal asserts that err is a configuration refusal whose text names each of fix.
func requireRefusal(t *testing.T, err error, fix ...string) {
	t.Helper()
	require.Error(t, err)
	require.ErrorIs(t, err, outbox.ErrInvalidConfig)
	for _, f := range fix {
		assert.Contains(t, err.Error(), f)
	}
}

// One server set up as the relay needs it serves every case that SET GLOBAL, an account
// of its own or a registered binlog client can make: the subtests run one after another,
// each putting back what it changed.
func TestCheckServer(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	srv := testsvc.PrivateMySQL(t, relayServerArgs...)
	root := srv.OpenDB(t)

	t.Run("Passes", func(t *testing.T) {
		before, err := checkServer(ctx, root, 8)
		require.NoError(t, err)
		assert.Equal(t, gomysql.MariaDBFlavor, before.flavor)
		assert.Contains(t, before.version, "MariaDB")
		assert.Equal(t, uint32(7), before.serverID)
		assert.Equal(t, "FULL", before.rowImage)
		assert.Empty(t, before.replicasUnchecked, "root may list the replicas")

		_, err = root.ExecContext(ctx, "CREATE TABLE t_check (id BIGINT AUTO_INCREMENT PRIMARY KEY, v INT)")
		require.NoError(t, err)
		_, err = root.ExecContext(ctx, "INSERT INTO t_check (v) VALUES (1)")
		require.NoError(t, err)
		after, err := checkServer(ctx, root, 8)
		require.NoError(t, err)
		// MariaDB's position is domain-server-sequence; the insert is the newest transaction.
		m := regexp.MustCompile(`^0-7-(\d+)$`).FindStringSubmatch(after.gtidPos)
		require.NotNil(t, m, "GTID position %q", after.gtidPos)
		assert.NotEqual(t, before.gtidPos, after.gtidPos, "the insert moves the position")
		var binlogPos string
		require.NoError(t, root.QueryRowContext(ctx, "SELECT @@GLOBAL.gtid_binlog_pos").Scan(&binlogPos))
		assert.Equal(t, binlogPos, after.gtidPos)

		_, err = root.ExecContext(ctx, "SET GLOBAL binlog_row_image = 'NOBLOB'")
		require.NoError(t, err)
		t.Cleanup(func() { _, _ = root.ExecContext(ctx, "SET GLOBAL binlog_row_image = 'FULL'") })
		noblob, err := checkServer(ctx, root, 8)
		require.NoError(t, err, "NOBLOB is accepted: it leaves out only BLOB and TEXT columns the statement did not set")
		assert.Equal(t, "NOBLOB", noblob.rowImage)
	})

	t.Run("RefusesSettings", func(t *testing.T) {
		for _, tc := range []struct {
			name string
			set  map[string]string // SET GLOBAL name = value, put back to ROW/FULL/FULL after
			fix  []string
		}{
			{"Statement", map[string]string{"binlog_format": "STATEMENT"},
				[]string{"binlog_format=STATEMENT", "run SET GLOBAL binlog_format = 'ROW' (no restart needed)", "binlog_format=ROW in the server's option file"}},
			{"Mixed", map[string]string{"binlog_format": "MIXED"},
				[]string{"binlog_format=MIXED", "SET GLOBAL binlog_format = 'ROW'"}},
			{"MinimalImage", map[string]string{"binlog_row_image": "MINIMAL"},
				[]string{"binlog_row_image=MINIMAL", "SET GLOBAL binlog_row_image = 'FULL'", "no restart", "binlog_row_image=FULL in the server's option file"}},
			{"NoLogMetadata", map[string]string{"binlog_row_metadata": "NO_LOG"},
				[]string{"binlog_row_metadata=NO_LOG", "SET GLOBAL binlog_row_metadata = 'FULL'", "no restart", "binlog_row_metadata=FULL in the server's option file"}},
			{"MinimalMetadata", map[string]string{"binlog_row_metadata": "MINIMAL"},
				[]string{"binlog_row_metadata=MINIMAL", "SET GLOBAL binlog_row_metadata = 'FULL'"}},
			// In the documented order: the format is named first, the metadata later.
			{"FormatBeforeMetadata", map[string]string{"binlog_format": "MIXED", "binlog_row_metadata": "NO_LOG"},
				[]string{"binlog_format=MIXED"}},
		} {
			t.Run(tc.name, func(t *testing.T) {
				for name, value := range tc.set {
					_, err := root.ExecContext(ctx, "SET GLOBAL "+name+" = '"+value+"'")
					require.NoError(t, err)
				}
				t.Cleanup(func() {
					for _, q := range []string{"SET GLOBAL binlog_format = 'ROW'", "SET GLOBAL binlog_row_image = 'FULL'",
						"SET GLOBAL binlog_row_metadata = 'FULL'"} {
						if _, err := root.ExecContext(ctx, q); err != nil {
							t.Errorf("%s: %v", q, err)
						}
					}
				})
				_, err := checkServer(ctx, root, 8)
				requireRefusal(t, err, tc.fix...)
			})
		}
	})

	t.Run("RefusesGrants", func(t *testing.T) {
		for _, tc := range []struct {
			user, grant string
			fix         []string
		}{
			{"relay_noslave", "GRANT SELECT, BINLOG MONITOR ON *.* TO {account}",
				[]string{"account 'relay_noslave'@'127.0.0.1' lacks REPLICATION SLAVE",
					"GRANT REPLICATION SLAVE ON *.* TO 'relay_noslave'@'127.0.0.1'"}},
			{"relay_nomonitor", "GRANT SELECT, REPLICATION SLAVE ON *.* TO {account}",
				[]string{"lacks BINLOG MONITOR", "REPLICATION CLIENT's name",
					"GRANT BINLOG MONITOR ON *.* TO 'relay_nomonitor'@'127.0.0.1'"}},
			{"relay_select", "GRANT SELECT ON *.* TO {account}",
				[]string{"GRANT REPLICATION SLAVE, BINLOG MONITOR ON *.* TO 'relay_select'@'127.0.0.1'"}},
			// ALL on one database is no global grant: replication privileges are global only.
			{"relay_dbonly", "GRANT ALL PRIVILEGES ON outbox_test.* TO {account}",
				[]string{"GRANT REPLICATION SLAVE, BINLOG MONITOR ON *.* TO 'relay_dbonly'@'127.0.0.1'"}},
		} {
			t.Run(tc.user, func(t *testing.T) {
				db := openAs(t, srv, root, tc.user, tc.grant)
				_, err := checkServer(ctx, db, 8)
				requireRefusal(t, err, tc.fix...)
			})
		}
	})

	t.Run("AcceptsGrants", func(t *testing.T) {
		// The least an account needs, REPLICATION CLIENT under its old name, ALL PRIVILEGES,
		// and the privileges held through a default role (SHOW GRANTS lists them only
		// without FOR CURRENT_USER()).
		for user, grant := range map[string]string{
			"relay_least":  "GRANT REPLICATION SLAVE, BINLOG MONITOR ON *.* TO {account}",
			"relay_client": "GRANT REPLICATION SLAVE, REPLICATION CLIENT ON *.* TO {account}",
			"relay_all":    "GRANT ALL PRIVILEGES ON *.* TO {account}",
		} {
			_, err := checkServer(ctx, openAs(t, srv, root, user, grant), 8)
			assert.NoError(t, err, "%s with %s", user, grant)
		}
		for _, q := range []string{
			"CREATE ROLE relay_role",
			"GRANT REPLICATION SLAVE, BINLOG MONITOR ON *.* TO relay_role",
		} {
			_, err := root.ExecContext(ctx, q)
			require.NoError(t, err, q)
		}
		db := openAs(t, srv, root, "relay_byrole", "GRANT relay_role TO {account}", "SET DEFAULT ROLE relay_role FOR {account}")
		_, err := checkServer(ctx, db, 8)
		assert.NoError(t, err, "privileges of the default role count")
	})

	t.Run("RefusesServerID", func(t *testing.T) {
		_, err := checkServer(ctx, root, 0)
		requireRefusal(t, err, "Config.ServerID", "must not be 0", "server_id 7")
		_, err = checkServer(ctx, root, 7)
		requireRefusal(t, err, "Config.ServerID", "7 is the server's own server_id", "choose another id")

		registerReplica(t, srv, root, 99, "replica99.test")
		_, err = checkServer(ctx, root, 99)
		requireRefusal(t, err, "server id (Config.ServerID) 99 is taken by the replica with server_id 99 at replica99.test:",
			"choose an id no replica uses")
		_, err = checkServer(ctx, root, 100)
		assert.NoError(t, err, "another id is free")

		// MariaDB lists the replicas only to REPLICATION MASTER ADMIN: with it the clash is
		// found, without it the relay is told that it could not look.
		admin := openAs(t, srv, root, "relay_admin", "GRANT REPLICATION SLAVE, BINLOG MONITOR, REPLICATION MASTER ADMIN ON *.* TO {account}")
		_, err = checkServer(ctx, admin, 99)
		requireRefusal(t, err, "99 is taken by the replica")
		least := openAs(t, srv, root, "relay_unseeing", "GRANT REPLICATION SLAVE, BINLOG MONITOR ON *.* TO {account}")
		info, err := checkServer(ctx, least, 99)
		require.NoError(t, err)
		assert.Contains(t, info.replicasUnchecked, "GRANT REPLICATION MASTER ADMIN ON *.* TO 'relay_unseeing'@'127.0.0.1'")
		assert.Contains(t, info.replicasUnchecked, "server id 99 was not compared")
	})
}

// The binlog is off on the shared test server (MariaDB's default); log_bin cannot be set
// while a server runs, so the check names the restart. A private server without --log-bin
// stands in if the shared one was started with the binlog on.
func TestCheckServerRefusesBinlogOff(t *testing.T) {
	t.Parallel()
	db := testsvc.OpenDB(t)
	var logBin int
	require.NoError(t, db.QueryRow("SELECT @@GLOBAL.log_bin").Scan(&logBin))
	if logBin != 0 {
		db = testsvc.PrivateMySQL(t, "--binlog-format=ROW", "--binlog-row-metadata=FULL").OpenDB(t)
	}
	_, err := checkServer(context.Background(), db, 8)
	requireRefusal(t, err, "binary log is off (log_bin=OFF)", "--log-bin", "needs a restart")
}

// openAs creates user@127.0.0.1 on srv, runs stmts as root with {account} standing for
// 'user'@'127.0.0.1', and opens a pool as that user on no database (the account may have
// no privilege on any).
func openAs(t *testing.T, srv *testsvc.MySQLServer, root *sql.DB, user string, stmts ...string) *sql.DB {
	t.Helper()
	ctx := context.Background()
	account := "'" + user + "'@'127.0.0.1'"
	for _, q := range append([]string{"CREATE USER {account}"}, stmts...) {
		q = strings.ReplaceAll(q, "{account}", account)
		_, err := root.ExecContext(ctx, q)
		require.NoError(t, err, q)
	}
	db, err := sql.Open("mysql", fmt.Sprintf("%s@tcp(127.0.0.1:%d)/", user, srv.Port()))
	require.NoError(t, err)
	t.Cleanup(func() { _ = db.Close() })
	var cur string
	require.NoError(t, db.QueryRowContext(ctx, "SELECT CURRENT_USER()").Scan(&cur))
	require.Equal(t, user+"@127.0.0.1", cur)
	return db
}

// registerReplica starts a binlog client that registers with srv as a replica with
// serverID, reporting host, and waits until SHOW SLAVE HOSTS lists it; it stops when t ends.
func registerReplica(t *testing.T, srv *testsvc.MySQLServer, root *sql.DB, serverID uint32, host string) {
	t.Helper()
	ctx := context.Background()
	var (
		file           string
		pos            uint32
		doDB, ignoreDB sql.NullString
	)
	require.NoError(t, root.QueryRowContext(ctx, "SHOW MASTER STATUS").Scan(&file, &pos, &doDB, &ignoreDB))
	syncer := replication.NewBinlogSyncer(replication.BinlogSyncerConfig{
		ServerID:  serverID,
		Flavor:    gomysql.MariaDBFlavor,
		Host:      "127.0.0.1",
		Port:      uint16(srv.Port()),
		User:      "root",
		Localhost: host,
		Logger:    slog.New(slog.DiscardHandler),
	})
	t.Cleanup(syncer.Close)
	_, err := syncer.StartSync(gomysql.Position{Name: file, Pos: pos})
	require.NoError(t, err)
	want := strconv.FormatUint(uint64(serverID), 10)
	require.Eventually(t, func() bool {
		replicas, err := listReplicas(ctx, root, gomysql.MariaDBFlavor)
		require.NoError(t, err)
		for _, r := range replicas {
			if strconv.FormatUint(uint64(r.serverID), 10) == want && r.host == host {
				return true
			}
		}
		return false
	}, 10*time.Second, 50*time.Millisecond, "SHOW SLAVE HOSTS lists server id %d", serverID)
}

// The cases no server here can show (MySQL, and a MariaDB before 10.5), checked on the
// settings and grants as those servers report them, from their documentation.
func TestCheckSettingsWithoutServer(t *testing.T) {
	t.Parallel()
	mysql8 := map[string]string{
		"version": "8.0.36", "log_bin": "ON", "binlog_format": "ROW", "binlog_row_image": "FULL",
		"binlog_row_metadata": "FULL", "server_id": "3", "gtid_mode": "ON",
		"gtid_executed": "3E11FA47-71CA-11E1-9E33-C80AA9429562:1-5,\n7C6A1C2F-71CA-11E1-9E33-C80AA9429562:1-2",
	}
	info, err := checkSettings(mysql8)
	require.NoError(t, err)
	assert.Equal(t, gomysql.MySQLFlavor, info.flavor)
	assert.Equal(t, uint32(3), info.serverID)
	assert.Equal(t, "3E11FA47-71CA-11E1-9E33-C80AA9429562:1-5,7C6A1C2F-71CA-11E1-9E33-C80AA9429562:1-2", info.gtidPos)

	mysql8["gtid_mode"] = "OFF"
	_, err = checkSettings(mysql8)
	requireRefusal(t, err, "gtid_mode=OFF", "--gtid-mode=ON --enforce-gtid-consistency=ON")
	mysql8["gtid_mode"] = "ON"

	mysql8["binlog_format"] = "MIXED"
	_, err = checkSettings(mysql8)
	requireRefusal(t, err, "run SET PERSIST binlog_format = 'ROW'")

	// MariaDB 10.4 and MySQL 5.7 have no binlog_row_metadata: SHOW GLOBAL VARIABLES leaves it out.
	mariadb104 := map[string]string{
		"version": "10.4.34-MariaDB-log", "log_bin": "ON", "binlog_format": "ROW", "binlog_row_image": "FULL",
		"server_id": "1", "gtid_binlog_pos": "0-1-5",
	}
	_, err = checkSettings(mariadb104)
	requireRefusal(t, err, "version 10.4.34-MariaDB-log", "has no binlog_row_metadata setting",
		"MariaDB 10.5 or later, or MySQL 8.0 or later")
}

func TestParseGlobalGrants(t *testing.T) {
	t.Parallel()
	// MySQL 8 lists each global privilege (no ALL PRIVILEGES) and its dynamic ones apart.
	p := parseGlobalGrants([]string{
		"GRANT SELECT, RELOAD, SHOW DATABASES, REPLICATION SLAVE, REPLICATION CLIENT ON *.* TO `relay`@`%`",
		"GRANT BACKUP_ADMIN ON *.* TO `relay`@`%`",
		"GRANT INSERT, UPDATE ON `app`.* TO `relay`@`%`",
		"GRANT `r_relay`@`%` TO `relay`@`%`",
	})
	assert.True(t, p.has("REPLICATION SLAVE"))
	assert.True(t, p.has("REPLICATION CLIENT"))
	assert.True(t, p.has("BACKUP_ADMIN"))
	assert.False(t, p.has("INSERT"), "a database's grant is not global")
	// MariaDB: ALL PRIVILEGES, and PROXY and role lines that grant nothing global.
	p = parseGlobalGrants([]string{
		"GRANT ALL PRIVILEGES ON *.* TO `root`@`127.0.0.1` WITH GRANT OPTION",
		"GRANT PROXY ON ``@`%` TO `root`@`127.0.0.1` WITH GRANT OPTION",
	})
	assert.True(t, p.has("REPLICATION SLAVE"))
	p = parseGlobalGrants([]string{"GRANT PROXY ON ``@`%` TO `u`@`%`", "GRANT USAGE ON *.* TO `u`@`%`"})
	assert.False(t, p.has("REPLICATION SLAVE"))
}
