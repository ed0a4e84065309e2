// Package testsvc gives tests the real services they run against: a MySQL-protocol server
// and a RocketMQ broker.
//
// Each service comes from an environment variable, or, for MySQL on a machine with a Docker
// engine, from testcontainers-go. When neither is there the test skips with a message that
// names the variable, unless OUTBOX_REQUIRE_SERVICES=1 (as CI sets it), which turns a missing
// service into a failure: a test that skips in CI is a failing test.
package testsvc

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/testcontainers/testcontainers-go"
	tcmysql "github.com/testcontainers/testcontainers-go/modules/mysql"

	"github.com/go-outbox/outbox"
)

const (
	// MySQLDSNEnv names the variable holding the test database's DSN, e.g.
	// root@tcp(127.0.0.1:3306)/outbox_test?parseTime=true (scripts/mariadb.sh dsn prints one).
	MySQLDSNEnv = "OUTBOX_TEST_MYSQL_DSN"
	// RequireEnv, set to 1, makes a missing service fail the test instead of skipping it.
	RequireEnv = "OUTBOX_REQUIRE_SERVICES"
)

var mysqlOnce = sync.OnceValues(findMySQL)

// MySQLDSN returns the DSN of the test database, skipping or failing t if there is none.
func MySQLDSN(t testing.TB) string {
	t.Helper()
	return need(t, mysqlOnce)
}

// need returns what find finds, skipping or failing t (see missing) if it finds nothing.
func need[T any](t testing.TB, find func() (T, error)) T {
	t.Helper()
	v, err := find()
	if err != nil {
		missing(t, err)
	}
	return v
}

func missing(t testing.TB, err error) {
	t.Helper()
	if os.Getenv(RequireEnv) == "1" {
		t.Fatalf("required test service missing (%s=1): %v", RequireEnv, err)
	}
	t.Skipf("skipping: %v", err)
}

func findMySQL() (string, error) {
	if dsn := os.Getenv(MySQLDSNEnv); dsn != "" {
		return dsn, nil
	}
	if !dockerReachable() {
		return "", fmt.Errorf("no MySQL server: set %s (bash scripts/mariadb.sh start prints one), or make a Docker engine reachable for testcontainers-go", MySQLDSNEnv)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	// The container is removed by testcontainers' reaper when the test process exits.
	c, err := tcmysql.Run(ctx, "mysql:8.0", tcmysql.WithDatabase("outbox_test"),
		tcmysql.WithUsername("root"), tcmysql.WithPassword("outbox"))
	if err != nil {
		return "", fmt.Errorf("no MySQL server: %s is unset and testcontainers could not start MySQL 8: %w", MySQLDSNEnv, err)
	}
	return c.ConnectionString(ctx, "parseTime=true")
}

func dockerReachable() (ok bool) {
	defer func() {
		if recover() != nil {
			ok = false
		}
	}()
	provider, err := testcontainers.ProviderDefault.GetProvider()
	if err != nil {
		return false
	}
	defer provider.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return provider.Health(ctx) == nil
}

// OpenDB opens a new connection pool on the test database and closes it when t ends. Each
// call is a pool of its own, as separate service instances would have. params are extra DSN
// parameters, e.g. "time_zone='+08:00'".
func OpenDB(t testing.TB, params ...string) *sql.DB {
	t.Helper()
	dsn := MySQLDSN(t)
	return openDB(t, dsn, MySQLDSNEnv+"="+dsn, "", params...)
}

// openDB opens a pool on dsn (where names it in errors), as user with no password unless
// user is empty, and closes it when t ends.
func openDB(t testing.TB, dsn, where, user string, params ...string) *sql.DB {
	t.Helper()
	cfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		t.Fatalf("parse DSN %q: %v", dsn, err)
	}
	cfg.ParseTime = true
	if user != "" {
		cfg.User, cfg.Passwd = user, ""
	}
	for _, p := range params {
		k, v, _ := strings.Cut(p, "=")
		if cfg.Params == nil {
			cfg.Params = map[string]string{}
		}
		cfg.Params[k] = v
	}
	db, err := sql.Open("mysql", cfg.FormatDSN())
	if err != nil {
		t.Fatalf("open test database: %v", err)
	}
	db.SetMaxIdleConns(8)
	t.Cleanup(func() { _ = db.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := db.PingContext(ctx); err != nil {
		missing(t, fmt.Errorf("MySQL at %s does not answer: %w", where, err))
	}
	return db
}

// UniqueTable returns a fresh table name, so that tests can run in parallel on one database.
func UniqueTable(prefix string) string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return prefix + "_" + hex.EncodeToString(b[:])
}

// NewStore creates a fresh outbox table on db and returns its store; the table is dropped
// when t ends (unless OUTBOX_KEEP_TABLES=1, for looking at it afterwards).
func NewStore(t testing.TB, db *sql.DB, cfg outbox.MySQLConfig) *outbox.MySQLStore {
	t.Helper()
	if cfg.Table == "" {
		cfg.Table = UniqueTable("t_event")
	}
	store, err := outbox.NewMySQLStore(db, cfg)
	if err != nil {
		t.Fatalf("new store: %v", err)
	}
	ctx := context.Background()
	if err := store.CreateSchema(ctx); err != nil {
		t.Fatalf("create schema: %v", err)
	}
	t.Cleanup(func() {
		if os.Getenv("OUTBOX_KEEP_TABLES") == "1" {
			return
		}
		if _, err := db.ExecContext(ctx, "DROP TABLE IF EXISTS `"+cfg.Table+"`"); err != nil {
			t.Errorf("drop table %s: %v", cfg.Table, err)
		}
	})
	return store
}

// NewStoreOn returns a store for an existing table on db, as a second instance would open it.
func NewStoreOn(t testing.TB, db *sql.DB, table string) *outbox.MySQLStore {
	t.Helper()
	store, err := outbox.NewMySQLStore(db, outbox.MySQLConfig{Table: table})
	if err != nil {
		t.Fatalf("new store: %v", err)
	}
	return store
}

// NewDatabase creates a database of t's own on the test server, opens a pool on it, and
// drops the database when t ends: for tests whose table names are not theirs to choose
// (a fuzzer's, say), so that no name can meet another test's table.
func NewDatabase(t testing.TB) *sql.DB {
	t.Helper()
	admin := OpenDB(t)
	name := UniqueTable("outbox_db")
	ctx := context.Background()
	if _, err := admin.ExecContext(ctx, "CREATE DATABASE `"+name+"`"); err != nil {
		t.Fatalf("create database %s: %v", name, err)
	}
	t.Cleanup(func() {
		if _, err := admin.ExecContext(ctx, "DROP DATABASE IF EXISTS `"+name+"`"); err != nil {
			t.Errorf("drop database %s: %v", name, err)
		}
	})
	cfg, err := mysql.ParseDSN(MySQLDSN(t))
	if err != nil {
		t.Fatalf("parse %s: %v", MySQLDSNEnv, err)
	}
	cfg.DBName = name
	return openDB(t, cfg.FormatDSN(), "database "+name+" on "+MySQLDSNEnv, "")
}

// EventIDs returns the event id of every row of an outbox table, by row id.
func EventIDs(t testing.TB, db *sql.DB, table string) map[int64]string {
	t.Helper()
	rows, err := db.Query("SELECT id, event_id FROM `" + table + "`")
	if err != nil {
		t.Fatalf("read the event ids of %s: %v", table, err)
	}
	defer rows.Close()
	ids := map[int64]string{}
	for rows.Next() {
		var (
			id      int64
			eventID string
		)
		if err := rows.Scan(&id, &eventID); err != nil {
			t.Fatalf("read the event ids of %s: %v", table, err)
		}
		ids[id] = eventID
	}
	if err := rows.Err(); err != nil {
		t.Fatalf("read the event ids of %s: %v", table, err)
	}
	return ids
}

// ServerStatus runs a SHOW STATUS statement (query, e.g. "SHOW GLOBAL STATUS LIKE 'Com\\_%'")
// and returns its counters by name.
func ServerStatus(t testing.TB, db *sql.DB, query string) map[string]int64 {
	t.Helper()
	rows, err := db.Query(query)
	if err != nil {
		t.Fatalf("%s: %v", query, err)
	}
	defer rows.Close()
	out := map[string]int64{}
	for rows.Next() {
		var (
			name string
			v    int64
		)
		if err := rows.Scan(&name, &v); err != nil {
			t.Fatalf("%s: %v", query, err)
		}
		out[name] = v
	}
	if err := rows.Err(); err != nil {
		t.Fatalf("%s: %v", query, err)
	}
	return out
}
