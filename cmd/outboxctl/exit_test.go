package main

import (
	"context"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/google/uuid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/go-outbox/outbox"
	"github.com/go-outbox/outbox/inbox"
	"github.com/go-outbox/outbox/internal/testsvc"
)

// closedAddr is an address on which nothing listens: a port that was free a moment ago.
func closedAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := l.Addr().String()
	require.NoError(t, l.Close())
	return addr
}

// inboxTable makes an inbox table for group and returns its name and the inbox.
func inboxTable(t *testing.T, group string) (string, *inbox.Inbox) {
	t.Helper()
	db := testsvc.OpenDB(t)
	table := testsvc.UniqueTable("t_inbox")
	in, err := inbox.New(db, inbox.Config{Group: group, Table: table})
	require.NoError(t, err)
	require.NoError(t, in.CreateSchema(context.Background()))
	t.Cleanup(func() { _, _ = db.Exec("DROP TABLE IF EXISTS `" + table + "`, `" + table + "_rejected`") })
	return table, in
}

// Every command's exit status, as the package doc and -h give them: 0 done (nothing found
// or blocked included), 1 the operation failed, 2 bad input, 3 a named event does not
// exist, 4 a named event is not a dead letter, 5 blocked --check found a blocked key.
func TestExitStatuses(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	inboxT, _ := inboxTable(t, "cg_exit")
	ns := testsvc.RocketMQNameServer(t)
	resend := func(id string) []string {
		return []string{"inbox", "resend", "--group", "cg_exit", "--inbox-table", inboxT, "--namesrv", ns, id}
	}
	missingEventID := uuid.NewString()

	// The database cannot be reached: 1, whatever the command.
	down := []string{"OUTBOX_DSN=app:pw@tcp(" + closedAddr(t) + ")/app", "OUTBOX_TABLE=" + f.table}
	for _, args := range [][]string{
		{"stats"}, {"list"}, {"list", "--json"}, {"show", "1"}, {"show", missingEventID}, {"requeue", "1"},
		{"requeue", missingEventID}, {"requeue", "--all"}, {"requeue", "--all", "--yes"}, {"purge", "--older-than", "1h"},
		{"purge", "--older-than", "1h", "--yes"}, {"blocked"}, {"blocked", "--json"}, {"blocked", "--check"},
		{"skip", "1"}, {"skip", missingEventID},
		{"inbox", "rejected", "--group", "cg_exit"}, resend("1"),
	} {
		r := runEnv(t, append(down, "OUTBOX_NAMESRV="+ns), append([]string{"-connect-timeout", "2s"}, args...)...)
		assert.Equal(t, exitFail, r.code, "%v, database down: %s", args, r.stderr)
		assert.Contains(t, r.stderr, "cannot reach the database", "%v", args)
	}
	// A table that does not exist: 1.
	r := runEnv(t, []string{"OUTBOX_DSN=" + testsvc.MySQLDSN(t), "OUTBOX_TABLE=t_no_such_table"}, "blocked")
	assert.Equal(t, exitFail, r.code, r.stderr)
	assert.Contains(t, r.stderr, "table t_no_such_table does not exist")

	// Bad input: 2, nothing read.
	for _, args := range [][]string{
		{}, {"nope"}, {"-nope", "stats"}, {"stats", "--nope"}, {"list", "--status", "LOST"}, {"show"}, {"show", "x"},
		{"requeue"}, {"requeue", "x"}, {"purge"}, {"blocked", "--limit", "-1"}, {"blocked", "extra"}, {"skip"},
		{"skip", "0"}, {"inbox"}, {"inbox", "rejected"}, {"inbox", "resend", "--group", "cg_exit"},
	} {
		r := f.run(t, args...)
		assert.Equal(t, exitUsage, r.code, "%v: %s", args, r.stderr)
	}

	// Nothing there, nothing blocked, nothing to do: 0.
	for _, args := range [][]string{
		{"stats"}, {"list"}, {"list", "--status", "FAIL"}, {"requeue", "--all"}, {"requeue", "--type", "X", "--yes"},
		{"purge", "--older-than", "1h"}, {"purge", "--older-than", "1h", "--yes"}, {"blocked"}, {"blocked", "--check"},
		{"inbox", "rejected", "--group", "cg_exit", "--inbox-table", inboxT},
	} {
		r := f.run(t, args...)
		assert.Equal(t, exitOK, r.code, "%v: %s", args, r.stderr)
		assert.Empty(t, r.stderr, "%v", args)
	}
	r = f.run(t, "blocked")
	assert.Equal(t, "no dead letter has events of its biz no waiting behind it\n", r.stdout)
	r = f.run(t, "list", "--status", "FAIL")
	assert.Equal(t, "no events match the filter\n", r.stdout)
	r = f.run(t, "requeue", "--all", "--yes")
	assert.Equal(t, exitOK, r.code, r.stderr)
	assert.Equal(t, "no FAIL events match the filter: nothing to requeue\n", r.stdout)
	for _, args := range [][]string{{"blocked", "--json"}, {"blocked", "--json", "--check"}, {"list", "--json"}} {
		r := f.run(t, args...)
		assert.Equal(t, exitOK, r.code, "%v: %s", args, r.stderr)
		assert.JSONEq(t, "[]", r.stdout, "%v", args)
	}
	r = f.run(t, "requeue", "--all", "--json")
	assert.Equal(t, exitOK, r.code, r.stderr)
	assert.JSONEq(t, `{"matched": 0, "requeued": 0, "dry_run": true}`, r.stdout)

	// Something blocked: 0, and 5 with --check, the listing printed either way.
	dead := f.insert(t, "ORDER_CREATED", "ORD-1", []byte("{}"))
	f.set(t, dead, outbox.StatusFail, 0)
	waiting := f.insert(t, "ORDER_PAID", "ORD-1", []byte("{}"))
	for _, c := range []struct {
		args []string
		code int
	}{
		{[]string{"blocked"}, exitOK}, {[]string{"blocked", "--json"}, exitOK},
		{[]string{"blocked", "--check"}, exitFound}, {[]string{"blocked", "--check", "--json"}, exitFound},
	} {
		r := f.run(t, c.args...)
		assert.Equal(t, c.code, r.code, "%v: %s", c.args, r.stderr)
		assert.Contains(t, r.stdout, f.eventID(t, dead), "%v", c.args)
		assert.Empty(t, r.stderr, "%v", c.args)
	}

	// A named event that does not exist: 3; one that is not a dead letter: 4. Nothing changes.
	before := f.snapshot(t)
	for _, c := range []struct {
		args []string
		code int
		msg  string
	}{
		{[]string{"show", "99999999"}, exitNotFound, "event not found: id 99999999"},
		{[]string{"show", missingEventID}, exitNotFound, "event not found: event id " + missingEventID},
		{[]string{"show", "--json", missingEventID}, exitNotFound, missingEventID},
		{[]string{"requeue", "99999999"}, exitNotFound, "nothing requeued: id 99999999 does not exist"},
		{[]string{"requeue", fmt.Sprint(dead), missingEventID}, exitNotFound, "no event has event_id " + missingEventID},
		{[]string{"requeue", fmt.Sprint(dead), "99999999", fmt.Sprint(waiting)}, exitNotFound, "id 99999999 does not exist"},
		{[]string{"skip", "99999999"}, exitNotFound, "nothing skipped: id 99999999 does not exist"},
		{[]string{"skip", missingEventID}, exitNotFound, "no event has event_id " + missingEventID},
		{resend("99999999"), exitNotFound, "not found"},
		{[]string{"requeue", fmt.Sprint(waiting)}, exitRefused, fmt.Sprintf("nothing requeued: id %d is WAIT, not FAIL", waiting)},
		{[]string{"requeue", f.eventID(t, waiting)}, exitRefused, fmt.Sprintf("id %d is WAIT, not FAIL", waiting)},
		{[]string{"skip", fmt.Sprint(dead), f.eventID(t, waiting)}, exitRefused, fmt.Sprintf("nothing skipped: id %d is WAIT, not FAIL", waiting)},
	} {
		r := f.run(t, c.args...)
		assert.Equal(t, c.code, r.code, "%v: %s", c.args, r.stderr)
		assert.Contains(t, r.stderr, c.msg, "%v", c.args)
	}
	assert.Equal(t, before, f.snapshot(t))

	// And done: 0.
	r = f.run(t, "requeue", f.eventID(t, dead))
	assert.Equal(t, exitOK, r.code, r.stderr)
	assert.Equal(t, outbox.StatusWait, f.status(t, dead))
	r = f.run(t, "blocked", "--check")
	assert.Equal(t, exitOK, r.code, "blocked no more: %s", r.stderr)
}

// -on all exits with the worst of the stores' statuses: a store that fails outweighs
// another's blocked key, which outweighs a store with none.
func TestExitStatusOnAll(t *testing.T) {
	t.Parallel()
	s := newShards(t)
	r := s.run(t, "-on", "all", "blocked", "--check")
	assert.Equal(t, exitOK, r.code, r.stderr)
	dead := s.b.insert(t, "ORDER_CREATED", "ORD-1", []byte("{}"))
	s.b.set(t, dead, outbox.StatusFail, 0)
	s.b.insert(t, "ORDER_PAID", "ORD-1", []byte("{}"))
	r = s.run(t, "-on", "all", "blocked")
	assert.Equal(t, exitOK, r.code, r.stderr)
	r = s.run(t, "-on", "all", "blocked", "--check")
	assert.Equal(t, exitFound, r.code, r.stderr)
	assert.Empty(t, r.stderr)
	r = s.run(t, "-on", "all", "blocked", "--check", "--json")
	assert.Equal(t, exitFound, r.code, r.stderr)
	assert.NotContains(t, r.stdout, `"error"`, "a blocked key is a finding, not an error")

	flags := append([]string{"-connect-timeout", "2s", "-store", "shard-down=app:pw@tcp(" + closedAddr(t) + ")/app"}, s.flags...)
	r = runEnv(t, s.env, append(flags, "-on", "all", "blocked", "--check")...)
	assert.Equal(t, exitFail, r.code, r.stderr)
	assert.Contains(t, r.stderr, "outboxctl blocked on shard-down: cannot reach the database")
	assert.Contains(t, r.stdout, "== store shard-b ==")
}

// outboxctl -h gives the table of exit statuses.
func TestHelpGivesTheExitStatuses(t *testing.T) {
	t.Parallel()
	r := runEnv(t, nil, "-h")
	assert.Equal(t, exitOK, r.code)
	help := strings.Join(strings.Fields(r.stderr), " ")
	for _, line := range []string{
		"Exit status (every command):",
		"0 done, including nothing matched, nothing blocked, nothing to requeue or purge",
		"1 the operation failed: database unreachable",
		"2 bad input",
		"3 an event (ID) or rejected message named on the command line does not exist",
		"4 an event named on the command line is not a dead letter (requeue, skip)",
		"5 blocked --check: some key is blocked",
	} {
		assert.Contains(t, help, line)
	}
}

// The event_id lookup goes through Admin, which finds an id as a row holds it: a plain SQL
// INSERT may write it in upper case, and on a partitioned table the index is idx_event_id.
func TestEventIDLookupThroughAdmin(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	upper := strings.ToUpper(uuid.NewString())
	res, err := f.db.Exec("INSERT INTO `"+f.table+"` (event_id, biz_no, event_type, payload, status) VALUES (?, 'ORD-U', 'A', '{}', 'FAIL')", upper)
	require.NoError(t, err)
	id, err := res.LastInsertId()
	require.NoError(t, err)
	r := f.run(t, "show", strings.ToLower(upper))
	require.Equal(t, exitOK, r.code, r.stderr)
	assert.Regexp(t, fmt.Sprintf(`(?m)\Aid:\s+%d$`, id), r.stdout)
	r = f.run(t, "requeue", strings.ToLower(upper))
	require.Equal(t, exitOK, r.code, r.stderr)
	assert.Equal(t, outbox.StatusWait, f.status(t, id))

	// A partitioned table (outboxctl is not told: it finds the row all the same).
	db := testsvc.OpenDB(t)
	table := testsvc.UniqueTable("t_event")
	store := testsvc.NewStore(t, db, outbox.MySQLConfig{Table: table, PartitionIDs: 1000})
	p := &fixture{db: db, table: table, store: store, admin: outbox.NewAdmin(store),
		env: []string{"OUTBOX_DSN=" + testsvc.MySQLDSN(t), "OUTBOX_TABLE=" + table}}
	pid := p.insert(t, "A", "ORD-P", []byte("{}"))
	p.set(t, pid, outbox.StatusFail, 0)
	r = p.run(t, "show", p.eventID(t, pid))
	require.Equal(t, exitOK, r.code, r.stderr)
	assert.Regexp(t, fmt.Sprintf(`(?m)\Aid:\s+%d$`, pid), r.stdout)
	r = p.run(t, "skip", p.eventID(t, pid))
	require.Equal(t, exitOK, r.code, r.stderr)
	assert.Equal(t, outbox.StatusSkipped, p.status(t, pid))
}

// A purge beside another purge of the table (a publisher's retention) does nothing and
// exits 1.
func TestExitStatusPurgeBusy(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	for range 2 {
		f.set(t, f.insert(t, "A", "ORD", []byte("{}")), outbox.StatusSuccess, 40*24*time.Hour)
	}
	var r result
	ran := false
	_, err := f.store.Purge(context.Background(), 720*time.Hour, outbox.PurgeOptions{BatchRows: 1, Exclusive: true,
		OnBatch: func(int64) {
			if !ran {
				ran = true
				r = f.run(t, "purge", "--older-than", "720h", "--yes")
			}
		}})
	require.NoError(t, err)
	require.True(t, ran)
	assert.Equal(t, exitFail, r.code, r.stderr)
	assert.Contains(t, r.stderr, "another purge of this table is running")
}

// A requeue that changed rows before it failed exits 1 and says how many it changed.
func TestExitStatusRequeueFailsMidway(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	first, second := f.insert(t, "A", "ORD-1", []byte("{}")), f.insert(t, "A", "ORD-2", []byte("{}"))
	f.set(t, first, outbox.StatusFail, 0)
	f.set(t, second, outbox.StatusFail, 0)
	// Another session holds the second row, longer than outboxctl's session waits for a lock.
	tx, err := f.db.Begin()
	require.NoError(t, err)
	defer tx.Rollback() //nolint:errcheck // the test's lock only
	_, err = tx.Exec("SELECT id FROM `"+f.table+"` WHERE id = ? FOR UPDATE", second)
	require.NoError(t, err)
	cfg, err := mysql.ParseDSN(testsvc.MySQLDSN(t))
	require.NoError(t, err)
	cfg.Params = map[string]string{"innodb_lock_wait_timeout": "1"}

	r := runEnv(t, []string{"OUTBOX_DSN=" + cfg.FormatDSN(), "OUTBOX_TABLE=" + f.table}, "requeue", "--all", "--yes", "--batch", "1")
	assert.Equal(t, exitFail, r.code, r.stderr)
	assert.Contains(t, r.stderr, "after 1 requeued in 1 whole batches")
	require.NoError(t, tx.Rollback())
	assert.Equal(t, outbox.StatusWait, f.status(t, first))
	assert.Equal(t, outbox.StatusFail, f.status(t, second))
}
