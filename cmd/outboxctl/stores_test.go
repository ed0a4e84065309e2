package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/go-outbox/outbox"
	"github.com/go-outbox/outbox/internal/testsvc"
)

// shards are two databases of one service, each with an outbox table of the same name, as
// a sharded service has them, and the flags that name them to outboxctl.
type shards struct {
	a, b  *fixture
	dsnA  string
	dsnB  string
	flags []string // -store a=... -store b=...
	env   []string // OUTBOX_TABLE
}

func newShards(t *testing.T) *shards {
	t.Helper()
	table := testsvc.UniqueTable("t_event")
	dsnA := testsvc.MySQLDSN(t)
	dbA := testsvc.OpenDB(t)
	// The second database, on the same server.
	name := testsvc.UniqueTable("outbox_shard")
	ctx := context.Background()
	_, err := dbA.ExecContext(ctx, "CREATE DATABASE `"+name+"`")
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = dbA.ExecContext(ctx, "DROP DATABASE IF EXISTS `"+name+"`") })
	cfg, err := mysql.ParseDSN(dsnA)
	require.NoError(t, err)
	cfg.DBName, cfg.ParseTime = name, true
	dsnB := cfg.FormatDSN()
	dbB, err := sql.Open("mysql", dsnB)
	require.NoError(t, err)
	t.Cleanup(func() { _ = dbB.Close() })
	fix := func(db *sql.DB) *fixture {
		store := testsvc.NewStore(t, db, outbox.MySQLConfig{Table: table})
		return &fixture{db: db, table: table, store: store, admin: outbox.NewAdmin(store)}
	}
	return &shards{a: fix(dbA), b: fix(dbB), dsnA: dsnA, dsnB: dsnB,
		flags: []string{"-store", "shard-a=" + dsnA, "-store", "shard-b=" + dsnB},
		env:   []string{"OUTBOX_TABLE=" + table}}
}

// run runs outboxctl with the shards' stores and then args.
func (s *shards) run(t *testing.T, args ...string) result {
	t.Helper()
	return runEnv(t, s.env, append(append([]string{}, s.flags...), args...)...)
}

// Several stores: -on NAME runs a command against one, -on all against each, in order,
// text under a heading per store and JSON as one array; a database that cannot be reached
// fails its own run and the others go on.
func TestStores(t *testing.T) {
	t.Parallel()
	s := newShards(t)
	for range 2 {
		s.a.insert(t, "A", "ORD-A", []byte("{}"))
	}
	for range 3 {
		s.b.insert(t, "B", "ORD-B", []byte("{}"))
	}
	failedA := s.a.insert(t, "A", "ORD-AF", []byte("{}"))
	s.a.set(t, failedA, outbox.StatusFail, time.Hour)
	failedB := s.b.insert(t, "B", "ORD-BF", []byte("{}"))
	s.b.set(t, failedB, outbox.StatusFail, time.Hour)

	r := s.run(t, "-on", "shard-b", "list", "--json")
	require.Zero(t, r.code, r.stderr)
	var rows []listed
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &rows))
	require.Len(t, rows, 4)
	for _, row := range rows {
		assert.Equal(t, "B", row.EventType, "shard-b's rows only")
	}

	r = s.run(t, "-on", "all", "stats", "--json")
	require.Zero(t, r.code, r.stderr)
	var each []struct {
		Store  string         `json:"store"`
		Result map[string]any `json:"result"`
		Error  string         `json:"error"`
	}
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &each), r.stdout)
	require.Len(t, each, 2)
	assert.Equal(t, "shard-a", each[0].Store)
	assert.Equal(t, 2.0, each[0].Result["wait"])
	assert.Equal(t, "shard-b", each[1].Store)
	assert.Equal(t, 3.0, each[1].Result["wait"])

	r = s.run(t, "-on", "all", "stats")
	require.Zero(t, r.code, r.stderr)
	assert.Regexp(t, `(?s)^== store shard-a ==\nSTATUS\s+ROWS\nWAIT\s+2\n.*\n== store shard-b ==\nSTATUS\s+ROWS\nWAIT\s+3\n`, r.stdout)

	// A filter runs against each table: both dead letters back to WAIT.
	r = s.run(t, "-on", "all", "requeue", "--type", "A", "--yes")
	assert.Equal(t, exitOK, r.code, "shard-b has no FAIL event of type A, which is no failure: %s", r.stderr)
	assert.Contains(t, r.stdout, "== store shard-b ==\nno FAIL events match the filter: nothing to requeue")
	assert.Equal(t, outbox.StatusWait, s.a.status(t, failedA))
	assert.Equal(t, outbox.StatusFail, s.b.status(t, failedB))
	r = s.run(t, "-on", "all", "requeue", "--all", "--yes")
	assert.Equal(t, exitOK, r.code, "shard-a has none left: %s", r.stderr)
	assert.Equal(t, outbox.StatusWait, s.b.status(t, failedB), "shard-b's requeued")

	// By id: the one store named.
	s.b.set(t, failedB, outbox.StatusFail, time.Hour)
	r = s.run(t, "-on", "shard-b", "show", fmt.Sprint(failedB))
	require.Zero(t, r.code, r.stderr)
	assert.Regexp(t, `(?m)^event_type:\s+B$`, r.stdout)

	// A database that is down fails its run alone.
	down := runEnv(t, s.env, "-store", "shard-a="+s.dsnA, "-store", "gone=root@tcp(127.0.0.1:1)/x", "-store", "shard-b="+s.dsnB,
		"-connect-timeout", "1s", "-on", "all", "stats")
	assert.Equal(t, exitFail, down.code)
	assert.Contains(t, down.stderr, "outboxctl stats on gone: cannot reach the database at 127.0.0.1:1")
	assert.Regexp(t, `(?s)== store shard-a ==\nSTATUS.*== store gone ==\n\n== store shard-b ==\nSTATUS\s+ROWS\nWAIT\s+3\n`, down.stdout)

	// A file of stores, comments and blank lines skipped; a single store needs no -on.
	file := filepath.Join(t.TempDir(), "stores")
	require.NoError(t, os.WriteFile(file, []byte("# the service's shards\n\nshard-b = "+s.dsnB+"\n"), 0o600))
	r = runEnv(t, s.env, "-stores", file, "stats", "--json")
	require.Zero(t, r.code, r.stderr)
	assert.Contains(t, r.stdout, `"wait": 3`)
}

// Every bad naming of stores is refused with exit 2 and a message that says what is
// wrong; nothing is read or changed.
func TestStoresBadInput(t *testing.T) {
	t.Parallel()
	s := newShards(t)
	failed := s.a.insert(t, "A", "ORD", []byte("{}"))
	s.a.set(t, failed, outbox.StatusFail, time.Hour)
	s.b.set(t, s.b.insert(t, "B", "ORD", []byte("{}")), outbox.StatusFail, time.Hour)
	beforeA, beforeB := s.a.snapshot(t), s.b.snapshot(t)
	file := filepath.Join(t.TempDir(), "stores")
	require.NoError(t, os.WriteFile(file, []byte("shard-a="+s.dsnA+"\nshard-a="+s.dsnB+"\n"), 0o600))
	a, b := "shard-a="+s.dsnA, "shard-b="+s.dsnB
	for _, c := range []struct {
		args []string
		msg  string
	}{
		{[]string{"-store", a, "-store", b, "-on", "shard-c", "stats"}, `-on shard-c: unknown store "shard-c" (the stores are shard-a, shard-b)`},
		{[]string{"-store", a, "-store", b, "stats"}, "2 stores are given (shard-a, shard-b): choose one with -on NAME, or every one with -on all"},
		{[]string{"-on", "shard-a", "stats"}, "no store is given"},
		{[]string{"-dsn", s.dsnA, "-store", a, "stats"}, "give -dsn or -store, not both"},
		{[]string{"-store", a, "-store", "shard-a=" + s.dsnB, "stats"}, `store "shard-a" is named twice`},
		{[]string{"-stores", file, "stats"}, `line 2: store "shard-a" is named twice`},
		{[]string{"-stores", filepath.Join(t.TempDir(), "none"), "stats"}, "-stores: open"},
		{[]string{"-store", "=" + s.dsnA, "stats"}, "the store has no name"},
		{[]string{"-store", "shard 1=" + s.dsnA, "stats"}, `store name "shard 1" is not a bounded label`},
		{[]string{"-store", "tenant/eu=" + s.dsnA, "stats"}, `store name "tenant/eu" is not a bounded label`},
		{[]string{"-store", "münchen=" + s.dsnA, "stats"}, "is not a bounded label"},
		{[]string{"-store", strings.Repeat("s", 65) + "=" + s.dsnA, "stats"}, "is 65 bytes long, at most 64"},
		{[]string{"-store", "all=" + s.dsnA, "stats"}, `store name "all" is taken`},
		{[]string{"-store", "root@tcp(127.0.0.1:1)/x", "stats"}, "want NAME=DSN"},
		{[]string{"-store", "shard-a=", "stats"}, `store "shard-a" has no DSN`},
		{[]string{"-store", "shard-a=not a dsn", "stats"}, "malformed DSN"},
		{[]string{"-store", a, "-store", b, "-on", "all", "show", fmt.Sprint(failed)}, "ids are per table: name the store with -on NAME, not -on all"},
		{[]string{"-store", a, "-store", b, "-on", "all", "requeue", fmt.Sprint(failed)}, "ids are per table"},
		{[]string{"-store", a, "-store", b, "-on", "all", "skip", fmt.Sprint(failed)}, "ids are per table"},
		{[]string{"-store", a, "-store", b, "-on", "all", "inbox", "resend", "--group", "g", "1"}, "ids are per table"},
		{[]string{"-store", a, "-store", b, "-on", "all", "requeue", "--type", "A", "--batch", "0", "--yes"}, "--batch must be between 1 and 10000"},
	} {
		r := runEnv(t, s.env, c.args...)
		assert.Equal(t, exitUsage, r.code, "%v: stderr %s", c.args, r.stderr)
		assert.Contains(t, r.stderr, c.msg, "%v", c.args)
		assert.NotContains(t, r.stdout, "STATUS", "%v: nothing read", c.args)
	}
	assert.Equal(t, beforeA, s.a.snapshot(t), "no bad input changed anything")
	assert.Equal(t, beforeB, s.b.snapshot(t), "no bad input changed anything")

	// Bad input under -on all stops at the first store: the flag is bad for each.
	r := runEnv(t, s.env, "-store", a, "-store", b, "-on", "all", "stats", "--lease", "0s")
	assert.Equal(t, exitUsage, r.code)
	assert.Equal(t, 1, strings.Count(r.stderr, "--lease must be positive"), r.stderr)
}

// A -store given without its NAME= (or a name that takes in part of a DSN) is refused with
// an error that never shows the password, whatever the password holds.
func TestStoresErrorsHideThePassword(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		store, secret, msg string
	}{
		{"root:s3cret@tcp(127.0.0.1:1)/x?parseTime=true", "s3cret", "is not a bounded label"},
		{"root:s3cret@tcp(127.0.0.1:1)/" + strings.Repeat("x", 40) + "?parseTime=true", "s3cret", "bytes long, at most 64"},
		{"root:s3cret@tcp(127.0.0.1:1)/x", "s3cret", "want NAME=DSN"},
		{"root:p@ss@tcp(127.0.0.1:1)/x", "ss@tcp", "want NAME=DSN"},
	} {
		r := runEnv(t, nil, "-store", c.store, "stats")
		assert.Equal(t, exitUsage, r.code, "%s: stderr %s", c.store, r.stderr)
		assert.Contains(t, r.stderr, c.msg, c.store)
		assert.NotContains(t, r.stderr, c.secret, c.store)
		assert.Contains(t, r.stderr, "root:***@", c.store)
	}
}
