package main

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/go-outbox/outbox"
	"github.com/go-outbox/outbox/internal/testsvc"
)

// binary is outboxctl as built from this package, in a directory of the test run's own.
var binary string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "outboxctl-test")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binary = filepath.Join(dir, "outboxctl")
	if out, err := exec.Command("go", "build", "-o", binary, ".").CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "go build: %v\n%s", err, out)
		os.Exit(1)
	}
	code := m.Run()
	_ = os.RemoveAll(dir)
	os.Exit(code)
}

// fixture is a fresh outbox table and the environment that points outboxctl at it.
type fixture struct {
	db    *sql.DB
	table string
	store *outbox.MySQLStore
	admin *outbox.Admin
	env   []string
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	db := testsvc.OpenDB(t)
	table := testsvc.UniqueTable("t_event")
	store := testsvc.NewStore(t, db, outbox.MySQLConfig{Table: table})
	return &fixture{db: db, table: table, store: store, admin: outbox.NewAdmin(store),
		env: []string{"OUTBOX_DSN=" + testsvc.MySQLDSN(t), "OUTBOX_TABLE=" + table}}
}

// result is one run of the binary.
type result struct {
	stdout, stderr string
	code           int
}

// run executes the built binary with args and f's environment.
func (f *fixture) run(t *testing.T, args ...string) result {
	t.Helper()
	return runEnv(t, f.env, args...)
}

func runEnv(t *testing.T, env []string, args ...string) result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, binary, args...)
	cmd.Env = append(cleanEnv(), env...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	code := 0
	if ee := (*exec.ExitError)(nil); errors.As(err, &ee) {
		code = ee.ExitCode()
	} else {
		require.NoError(t, err)
	}
	return result{out.String(), errb.String(), code}
}

// cleanEnv is the test's environment without the variables outboxctl reads.
func cleanEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "OUTBOX_DSN=") && !strings.HasPrefix(kv, "OUTBOX_TABLE=") {
			env = append(env, kv)
		}
	}
	return env
}

func (f *fixture) insert(t *testing.T, eventType, bizNo string, payload []byte) int64 {
	t.Helper()
	ctx := context.Background()
	tx, err := f.store.BeginTx(ctx, nil)
	require.NoError(t, err)
	eventID, err := tx.InsertEvent(ctx, outbox.EventInput{BizNo: bizNo, EventType: eventType, Payload: payload})
	require.NoError(t, err)
	require.NoError(t, tx.Commit())
	var id int64
	require.NoError(t, f.db.QueryRow("SELECT id FROM `"+f.table+"` WHERE event_id = ?", eventID).Scan(&id))
	return id
}

// set puts a row in status, claimed and last updated age ago.
func (f *fixture) set(t *testing.T, id int64, status outbox.Status, age time.Duration) {
	t.Helper()
	_, err := f.db.Exec("UPDATE `"+f.table+"` SET status = ?, claim_owner = 'node-1', retry_count = 4, reclaim_count = 1,"+
		" last_error = 'broker said no', claimed_at = DATE_SUB(UTC_TIMESTAMP(3), INTERVAL ? MICROSECOND),"+
		" update_time = DATE_SUB(UTC_TIMESTAMP(3), INTERVAL ? MICROSECOND) WHERE id = ?",
		string(status), age.Microseconds(), age.Microseconds(), id)
	require.NoError(t, err)
}

// eventID is the event_id of the row id.
func (f *fixture) eventID(t *testing.T, id int64) string {
	t.Helper()
	ev, err := f.admin.Get(context.Background(), id)
	require.NoError(t, err)
	require.Len(t, ev.EventID, 36)
	return ev.EventID
}

func (f *fixture) status(t *testing.T, id int64) outbox.Status {
	t.Helper()
	ev, err := f.admin.Get(context.Background(), id)
	if errors.Is(err, outbox.ErrNotFound) {
		return ""
	}
	require.NoError(t, err)
	return ev.Status
}

// snapshot is every row's state, to check that a command changed nothing.
func (f *fixture) snapshot(t *testing.T) string {
	t.Helper()
	rows, err := f.db.Query("SELECT id, status, retry_count, reclaim_count, next_retry_time, claim_owner, claimed_at, update_time FROM `" +
		f.table + "` ORDER BY id")
	require.NoError(t, err)
	defer rows.Close()
	var b strings.Builder
	for rows.Next() {
		var (
			id, retries, reclaims int64
			status, owner         string
			next, claimed, upd    time.Time
		)
		require.NoError(t, rows.Scan(&id, &status, &retries, &reclaims, &next, &owner, &claimed, &upd))
		fmt.Fprintln(&b, id, status, retries, reclaims, next, owner, claimed, upd)
	}
	require.NoError(t, rows.Err())
	return b.String()
}

func TestHelp(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{{"--help"}, {"-h"}, {"stats", "--help"}, {"list", "--help"}, {"show", "--help"},
		{"requeue", "--help"}, {"purge", "-help"}} {
		r := runEnv(t, nil, args...)
		assert.Zero(t, r.code, "%v", args)
		assert.Contains(t, r.stderr, "Usage: outboxctl", "%v", args)
	}
	r := runEnv(t, nil, "purge", "--help")
	assert.Contains(t, r.stderr, "--older-than")
	assert.Contains(t, r.stderr, "never deleted")

	r = runEnv(t, nil)
	assert.Equal(t, exitUsage, r.code)
	r = runEnv(t, nil, "frobnicate")
	assert.Equal(t, exitUsage, r.code)
	assert.Contains(t, r.stderr, `unknown command "frobnicate"`)
}

func TestStats(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	for range 2 {
		f.insert(t, "A", "ORD-W", []byte("{}")) // WAIT, due
	}
	late := f.insert(t, "A", "ORD-L", []byte("{}"))
	_, err := f.db.Exec("UPDATE `"+f.table+"` SET next_retry_time = DATE_ADD(UTC_TIMESTAMP(3), INTERVAL 1 HOUR) WHERE id = ?", late)
	require.NoError(t, err)
	f.set(t, f.insert(t, "A", "ORD-S", []byte("{}")), outbox.StatusSending, 8*time.Minute) // past half of 10m
	f.set(t, f.insert(t, "A", "ORD-S2", []byte("{}")), outbox.StatusSending, time.Minute)
	for _, typ := range []string{"A", "A", "B"} {
		f.set(t, f.insert(t, typ, "ORD-F", []byte("{}")), outbox.StatusFail, time.Hour)
	}
	f.set(t, f.insert(t, "A", "ORD-OK", []byte("{}")), outbox.StatusSuccess, time.Hour)

	r := f.run(t, "stats", "--json", "--lease", "10m", "--count-success")
	require.Zero(t, r.code, r.stderr)
	var st struct {
		Wait, Sending, Fail, Success, Due int64
		SendingPastHalfLease              int64            `json:"sending_past_half_lease"`
		OldestClaimAge                    float64          `json:"oldest_claim_age_seconds"`
		FailByType                        map[string]int64 `json:"fail_by_type"`
	}
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &st), r.stdout)
	assert.EqualValues(t, 3, st.Wait)
	assert.EqualValues(t, 2, st.Due)
	assert.EqualValues(t, 2, st.Sending)
	assert.EqualValues(t, 1, st.SendingPastHalfLease)
	assert.InDelta(t, 480, st.OldestClaimAge, 60)
	assert.EqualValues(t, 3, st.Fail)
	assert.EqualValues(t, 1, st.Success)
	assert.Equal(t, map[string]int64{"A": 2, "B": 1}, st.FailByType)

	r = f.run(t, "stats")
	require.Zero(t, r.code, r.stderr)
	assert.Regexp(t, `(?m)^WAIT\s+3$`, r.stdout)
	assert.Regexp(t, `(?m)^SUCCESS\s+- \(--count-success\)$`, r.stdout, "SUCCESS is not counted unless asked")
	assert.Regexp(t, `(?m)^sending past half lease \(7.5s\)\s+2$`, r.stdout, "by the default lease, 15 s, both claims (1 and 8 minutes old) are past half of it")
	assert.Regexp(t, `(?m)^A\s+2$`, r.stdout)
	assert.Regexp(t, `(?m)^B\s+1$`, r.stdout)
}

func TestListAndShow(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	text := f.insert(t, "ORDER_CREATED", "ORD-1", []byte(`{"order":"ü"}`))
	binary := f.insert(t, "ORDER_PAID", "ORD-2", []byte{0xff, 0x00, 0x41})
	failed := f.insert(t, "ORDER_PAID", "ORD-3", []byte("{}"))
	f.set(t, failed, outbox.StatusFail, time.Hour)

	r := f.run(t, "list")
	require.Zero(t, r.code, r.stderr)
	lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
	require.Len(t, lines, 4)
	// The row id is labelled id, the UUID consumers see event_id.
	assert.Regexp(t, `^ID\s+STATUS\s+EVENT_TYPE\s+BIZ_NO\s+TOPIC\s+RETRIES\s+RECLAIMS\s+BYTES\s+CREATED \(UTC\)\s+UPDATED \(UTC\)\s+DUE \(UTC\)\s+EVENT_ID\s+LAST_ERROR$`, lines[0])
	assert.Regexp(t, fmt.Sprintf(`^%d\s+FAIL\s+ORDER_PAID\s+ORD-3\s+ORDER_EVENT_TOPIC\s+4\s+1\s+2\s.*\s%s\s+broker said no$`, failed, f.eventID(t, failed)), lines[1])
	assert.Equal(t, strings.Index(lines[0], "EVENT_ID"), strings.Index(lines[1], f.eventID(t, failed)), "the event_id under its header")
	// Aligned: every row's STATUS column starts where the header's does.
	col := strings.Index(lines[0], "STATUS")
	for _, l := range lines[1:] {
		assert.Equal(t, "  ", l[col-2:col], "aligned columns: %q", l)
	}

	r = f.run(t, "list", "--status", "fail", "--json")
	require.Zero(t, r.code, r.stderr)
	var evs []listed
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &evs))
	require.Len(t, evs, 1)
	assert.Equal(t, failed, evs[0].ID)
	assert.Equal(t, f.eventID(t, failed), evs[0].EventID)
	assert.Equal(t, "FAIL", evs[0].Status)
	assert.Nil(t, evs[0].Payload)

	r = f.run(t, "list", "--type", "ORDER_PAID", "--min-id", fmt.Sprint(binary), "--max-id", fmt.Sprint(binary), "--since", "1h", "--json")
	require.Zero(t, r.code, r.stderr)
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &evs))
	require.Len(t, evs, 1)
	assert.Equal(t, binary, evs[0].ID)
	assert.Equal(t, 3, evs[0].PayloadSize)

	r = f.run(t, "list", "--biz-no", "ORD-1", "--limit", "1", "--json")
	require.Zero(t, r.code, r.stderr)
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &evs))
	require.Len(t, evs, 1)
	assert.Equal(t, text, evs[0].ID)

	r = f.run(t, "show", fmt.Sprint(text))
	require.Zero(t, r.code, r.stderr)
	assert.Contains(t, r.stdout, "payload (text):\n{\"order\":\"ü\"}\n")
	assert.Regexp(t, fmt.Sprintf(`(?m)\Aid:\s+%d$`, text), r.stdout, "the row id first, labelled id")
	assert.Regexp(t, fmt.Sprintf(`(?m)^event_id:\s+%s$`, f.eventID(t, text)), r.stdout)
	assert.Regexp(t, `(?m)^status:\s+WAIT$`, r.stdout)
	assert.Regexp(t, `(?m)^biz_no:\s+ORD-1$`, r.stdout)
	assert.Regexp(t, `(?m)^event_type:\s+ORDER_CREATED$`, r.stdout)

	// An event_id names the same event, in any form a UUID is written.
	shown := r.stdout
	for _, name := range []string{f.eventID(t, text), strings.ToUpper(f.eventID(t, text)), "urn:uuid:" + f.eventID(t, text)} {
		r = f.run(t, "show", name)
		require.Zero(t, r.code, "%s: %s", name, r.stderr)
		assert.Equal(t, shown, r.stdout, "show %s", name)
	}

	r = f.run(t, "show", "--json", fmt.Sprint(binary))
	require.Zero(t, r.code, r.stderr)
	var one listed
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &one))
	assert.Equal(t, binary, one.ID)
	assert.Equal(t, f.eventID(t, binary), one.EventID)
	assert.Equal(t, "hex", one.PayloadEncoding)
	require.NotNil(t, one.Payload)
	assert.Equal(t, "ff0041", *one.Payload)

	r = f.run(t, "show", fmt.Sprint(binary))
	assert.Contains(t, r.stdout, "payload (hex):\nff0041\n")

	r = f.run(t, "show", fmt.Sprint(failed), "--json")
	require.Zero(t, r.code, r.stderr)
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &one))
	assert.Equal(t, "broker said no", one.LastError)
	assert.Equal(t, "node-1", one.ClaimOwner)
	assert.NotNil(t, one.ClaimedAt)
}

// A row another program wrote with a plain SQL INSERT (docs/other-writers.md) has the
// database's UUID() as its event_id, a version-1 UUID: list shows it, show and requeue
// take it as they take InsertEvent's.
func TestPlainSQLInsertedRow(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	res, err := f.db.Exec("INSERT INTO `"+f.table+"` (biz_no, event_type, payload) VALUES (?, ?, ?)",
		"ORD-SQL", "ORDER_CREATED", []byte(`{"order":"ORD-SQL"}`))
	require.NoError(t, err)
	id, err := res.LastInsertId()
	require.NoError(t, err)
	eventID := f.eventID(t, id)

	r := f.run(t, "list", "--json")
	require.Zero(t, r.code, r.stderr)
	var evs []listed
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &evs))
	require.Len(t, evs, 1)
	assert.Equal(t, eventID, evs[0].EventID)
	assert.Equal(t, "WAIT", evs[0].Status)

	r = f.run(t, "show", eventID)
	require.Zero(t, r.code, r.stderr)
	assert.Regexp(t, fmt.Sprintf(`(?m)\Aid:\s+%d$`, id), r.stdout)
	assert.Contains(t, r.stdout, "payload (text):\n{\"order\":\"ORD-SQL\"}\n")

	f.set(t, id, outbox.StatusFail, time.Minute)
	r = f.run(t, "requeue", eventID)
	require.Zero(t, r.code, r.stderr)
	assert.Equal(t, outbox.StatusWait, f.status(t, id))
}

func TestRequeue(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	var paid []int64
	for range 5 {
		id := f.insert(t, "ORDER_PAID", "ORD-P", []byte("{}"))
		f.set(t, id, outbox.StatusFail, time.Hour)
		paid = append(paid, id)
	}
	other := f.insert(t, "ORDER_CREATED", "ORD-C", []byte("{}"))
	f.set(t, other, outbox.StatusFail, time.Hour)
	sent := f.insert(t, "ORDER_PAID", "ORD-P", []byte("{}"))
	f.set(t, sent, outbox.StatusSuccess, time.Hour)

	// A filter without --yes reports and changes nothing.
	before := f.snapshot(t)
	r := f.run(t, "requeue", "--type", "ORDER_PAID")
	require.Zero(t, r.code, r.stderr)
	assert.Contains(t, r.stdout, "5 FAIL events match; nothing changed")
	assert.Equal(t, before, f.snapshot(t))

	r = f.run(t, "requeue", "--type", "ORDER_PAID", "--yes", "--batch", "2")
	require.Zero(t, r.code, r.stderr)
	assert.Contains(t, r.stdout, "requeued 5 of 5 matching FAIL events in 3 batches")
	assert.Equal(t, 3, strings.Count(r.stderr, "requeue batch"), r.stderr)
	assert.Contains(t, r.stderr, fmt.Sprintf("requeue batch 1: ids %d..%d, 2 given, 2 requeued", paid[0], paid[1]))
	for _, id := range paid {
		ev, err := f.admin.Get(context.Background(), id)
		require.NoError(t, err)
		assert.Equal(t, outbox.StatusWait, ev.Status)
		assert.Zero(t, ev.RetryCount)
		assert.Zero(t, ev.ReclaimCount)
		assert.Empty(t, ev.ClaimOwner)
		assert.True(t, ev.ClaimedAt.IsZero())
	}
	assert.Equal(t, outbox.StatusFail, f.status(t, other))
	assert.Equal(t, outbox.StatusSuccess, f.status(t, sent))

	// By id: all FAIL or nothing.
	before = f.snapshot(t)
	r = f.run(t, "requeue", fmt.Sprint(other), fmt.Sprint(sent))
	assert.Equal(t, exitRefused, r.code)
	assert.Contains(t, r.stderr, fmt.Sprintf("nothing requeued: id %d is SUCCESS, not FAIL", sent))
	r = f.run(t, "requeue", fmt.Sprint(other), "99999999")
	assert.Equal(t, exitNotFound, r.code)
	assert.Contains(t, r.stderr, "nothing requeued: id 99999999 does not exist")
	r = f.run(t, "requeue", f.eventID(t, sent))
	assert.Equal(t, exitRefused, r.code)
	assert.Contains(t, r.stderr, fmt.Sprintf("nothing requeued: id %d is SUCCESS, not FAIL", sent), "an event_id names its row")
	r = f.run(t, "requeue", fmt.Sprint(other), "0190a3c5-0000-7000-8000-000000000000")
	assert.Equal(t, exitNotFound, r.code)
	assert.Contains(t, r.stderr, "event not found: no event has event_id 0190a3c5-0000-7000-8000-000000000000")
	assert.Equal(t, before, f.snapshot(t))

	r = f.run(t, "requeue", f.eventID(t, other), "--json")
	require.Zero(t, r.code, r.stderr)
	var out struct{ Matched, Requeued int64 }
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &out))
	assert.EqualValues(t, 1, out.Requeued)
	assert.Equal(t, outbox.StatusWait, f.status(t, other))

	// Nothing left to requeue: a filter that matches nothing says so, and is no failure.
	r = f.run(t, "requeue", "--all", "--yes")
	assert.Equal(t, exitOK, r.code, r.stderr)
	assert.Contains(t, r.stdout, "no FAIL events match")
}

func TestPurge(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	var old []int64
	for range 5 {
		id := f.insert(t, "A", "ORD", []byte("{}"))
		f.set(t, id, outbox.StatusSuccess, 40*24*time.Hour)
		old = append(old, id)
	}
	recent := f.insert(t, "A", "ORD", []byte("{}"))
	f.set(t, recent, outbox.StatusSuccess, time.Hour)
	keep := map[int64]outbox.Status{recent: outbox.StatusSuccess}
	for _, st := range []outbox.Status{outbox.StatusWait, outbox.StatusSending, outbox.StatusFail} {
		id := f.insert(t, "A", "ORD", []byte("{}"))
		f.set(t, id, st, 40*24*time.Hour)
		keep[id] = st
	}

	before := f.snapshot(t)
	r := f.run(t, "purge", "--older-than", "720h")
	require.Zero(t, r.code, r.stderr)
	assert.Contains(t, r.stdout, "5 SUCCESS or SKIPPED events are older than 720h0m0s; nothing deleted")
	assert.Equal(t, before, f.snapshot(t))

	r = f.run(t, "purge", "--older-than", "720h", "--batch", "2", "--pause", "1ms", "--yes")
	require.Zero(t, r.code, r.stderr)
	assert.Contains(t, r.stdout, "deleted 5 SUCCESS or SKIPPED events older than 720h0m0s in 3 batches")
	assert.Equal(t, 3, strings.Count(r.stderr, "purge batch"), r.stderr)
	for _, id := range old {
		assert.Empty(t, f.status(t, id), "old SUCCESS row %d deleted", id)
	}
	for id, st := range keep {
		assert.Equal(t, st, f.status(t, id), "row %d kept", id)
	}

	r = f.run(t, "purge", "--older-than", "720h", "--yes", "--json")
	require.Zero(t, r.code, r.stderr)
	var out struct{ Deleted int64 }
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &out))
	assert.Zero(t, out.Deleted)
}

// On a partitioned table, outboxctl purge drops the old partition of sent events whole (one
// batch in the log), adds partitions ahead, and leaves the partition of an unsent event.
func TestPurgePartitioned(t *testing.T) {
	t.Parallel()
	db := testsvc.OpenDB(t)
	table := testsvc.UniqueTable("t_event")
	testsvc.NewStore(t, db, outbox.MySQLConfig{Table: table, PartitionIDs: 1000})
	f := &fixture{db: db, table: table, env: []string{"OUTBOX_DSN=" + testsvc.MySQLDSN(t), "OUTBOX_TABLE=" + table}}
	at := "DATE_SUB(UTC_TIMESTAMP(3), INTERVAL 40 DAY)"
	for lo := 1; lo <= 1500; lo += 500 {
		var q strings.Builder
		q.WriteString("INSERT INTO `" + table + "` (id, event_id, biz_no, event_type, payload, status, next_retry_time, claim_owner, claimed_at, create_time, update_time) VALUES ")
		for id := lo; id < lo+500; id++ {
			if id > lo {
				q.WriteByte(',')
			}
			status := "SUCCESS"
			if id == 1200 {
				status = "WAIT"
			}
			fmt.Fprintf(&q, "(%d, UUID(), 'ORD', 'A', '{}', '%s', %s, 'node-1', %s, %s, %s)", id, status, at, at, at, at)
		}
		_, err := db.Exec(q.String())
		require.NoError(t, err)
	}

	r := f.run(t, "purge", "--older-than", "720h")
	require.Zero(t, r.code, r.stderr)
	assert.Contains(t, r.stdout, "999 SUCCESS or SKIPPED events are older than 720h0m0s; nothing deleted")

	r = f.run(t, "purge", "--older-than", "720h", "--yes")
	require.Zero(t, r.code, r.stderr)
	assert.Contains(t, r.stdout, "deleted 999 SUCCESS or SKIPPED events older than 720h0m0s in 1 batches")
	var parts string
	require.NoError(t, db.QueryRow(`SELECT GROUP_CONCAT(PARTITION_NAME ORDER BY PARTITION_ORDINAL_POSITION)
	FROM information_schema.PARTITIONS WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = ?`, table).Scan(&parts))
	assert.Equal(t, "p2000,p3000,p4000,pmax", parts)
	var status string
	require.NoError(t, db.QueryRow("SELECT status FROM `"+table+"` WHERE id = 1200").Scan(&status))
	assert.Equal(t, "WAIT", status)
}

// Every bad input: a clear message, a non-zero exit, and the table as it was.
func TestBadInput(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	failed := f.insert(t, "A", "ORD", []byte("{}"))
	f.set(t, failed, outbox.StatusFail, time.Hour)
	old := f.insert(t, "A", "ORD", []byte("{}"))
	f.set(t, old, outbox.StatusSuccess, 40*24*time.Hour)
	before := f.snapshot(t)

	unreachable := []string{"OUTBOX_DSN=root@tcp(127.0.0.1:1)/outbox_test", "OUTBOX_TABLE=" + f.table}
	missingTable := []string{"OUTBOX_DSN=" + testsvc.MySQLDSN(t), "OUTBOX_TABLE=no_such_outbox"}
	for _, c := range []struct {
		env  []string
		args []string
		code int
		msg  string
	}{
		{f.env, []string{"list", "--status", "DONE"}, exitUsage, `unknown status "DONE"`},
		{f.env, []string{"list", "--min-id", "9", "--max-id", "3"}, exitUsage, "id range 9..3 is empty"},
		{f.env, []string{"list", "--since", "yesterday"}, exitUsage, `--since "yesterday" is neither a time`},
		{f.env, []string{"list", "--limit", "x"}, exitUsage, `invalid value "x" for flag -limit`},
		{f.env, []string{"show"}, exitUsage, "show takes exactly one id or event_id"},
		{f.env, []string{"show", "abc"}, exitUsage, `"abc" is neither an id (a positive integer) nor an event_id (a UUID)`},
		{f.env, []string{"show", "0"}, exitUsage, `"0" is neither an id`},
		{f.env, []string{"show", "99999999"}, exitNotFound, "event not found: id 99999999"},
		{f.env, []string{"show", "0190a3c5-0000-7000-8000-000000000000"}, exitNotFound, "event not found: event id 0190a3c5-0000-7000-8000-000000000000"},
		{f.env, []string{"requeue", "abc"}, exitUsage, `"abc" is neither an id`},
		{f.env, []string{"requeue"}, exitUsage, "say which events"},
		{f.env, []string{"requeue", "--status", "WAIT", "--yes"}, exitUsage, "flag provided but not defined: -status"},
		{f.env, []string{"requeue", "--type", "A", "--until", "10 minutes", "--yes"}, exitUsage, `--until "10 minutes"`},
		{f.env, []string{"requeue", fmt.Sprint(failed), "--type", "A", "--yes"}, exitUsage, "not both"},
		{f.env, []string{"requeue", "--type", "A", "--batch", "0", "--yes"}, exitUsage, "--batch must be between 1 and 10000"},
		{f.env, []string{"purge", "--yes"}, exitUsage, "--older-than is required"},
		{f.env, []string{"purge", "--older-than", "30d", "--yes"}, exitUsage, `--older-than "30d" is not a positive duration`},
		{f.env, []string{"purge", "--older-than", "-5h", "--yes"}, exitUsage, "not a positive duration"},
		{f.env, []string{"purge", "--older-than", "720h", "--pause", "soon", "--yes"}, exitUsage, `invalid value "soon" for flag -pause`},
		{f.env, []string{"stats", "--lease", "0s"}, exitUsage, "--lease must be positive"},
		{f.env, []string{"stats", "extra"}, exitUsage, `unexpected argument "extra"`},
		{unreachable, []string{"stats"}, exitFail, "cannot reach the database at 127.0.0.1:1"},
		{unreachable, []string{"purge", "--older-than", "720h", "--yes"}, exitFail, "cannot reach the database"},
		{unreachable, []string{"requeue", "--all", "--yes"}, exitFail, "cannot reach the database"},
		{[]string{"OUTBOX_DSN=not a dsn"}, []string{"list"}, exitUsage, "malformed DSN"},
		{nil, []string{"list"}, exitUsage, "no database: give -dsn or set OUTBOX_DSN"},
		{missingTable, []string{"list"}, exitFail, "table no_such_outbox does not exist"},
		{nil, []string{"-dsn", "root@tcp(127.0.0.1:1)/x", "-connect-timeout", "1s", "list"}, exitFail, "cannot reach the database"},
	} {
		r := runEnv(t, c.env, c.args...)
		assert.Equal(t, c.code, r.code, "%v: stderr %s", c.args, r.stderr)
		assert.Contains(t, r.stderr, c.msg, "%v", c.args)
		assert.Empty(t, r.stdout, "%v: nothing on stdout", c.args)
	}
	assert.Equal(t, before, f.snapshot(t), "no bad input changed anything")

	// Flags instead of the environment, for completeness.
	r := runEnv(t, nil, "-dsn", testsvc.MySQLDSN(t), "-table", f.table, "show", fmt.Sprint(failed))
	require.Zero(t, r.code, r.stderr)
	assert.Regexp(t, `(?m)^status:\s+FAIL$`, r.stdout)
}

// A delayed event's due time, by the database clock, is printed by list (the DUE column),
// show (its due line) and their JSON (due_time), as Get returns it; an event that is not
// waiting has none.
func TestListAndShowPrintTheDueTime(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ctx := context.Background()
	tx, err := f.store.BeginTx(ctx, nil)
	require.NoError(t, err)
	eventID, err := tx.InsertEvent(ctx, outbox.EventInput{BizNo: "ORD-9", EventType: "ORDER_EXPIRED", Payload: []byte("{}"), Delay: time.Hour})
	require.NoError(t, err)
	require.NoError(t, tx.Commit())
	var delayed int64
	require.NoError(t, f.db.QueryRow("SELECT id FROM `"+f.table+"` WHERE event_id = ?", eventID).Scan(&delayed))
	sent := f.insert(t, "ORDER_CREATED", "ORD-8", []byte("{}"))
	f.set(t, sent, outbox.StatusSuccess, time.Minute)
	ev, err := f.admin.Get(ctx, delayed)
	require.NoError(t, err)
	assert.Equal(t, time.Hour, ev.NextRetryTime.Sub(ev.CreateTime), "due an hour after the insert, by the database clock")
	dueAt := ev.NextRetryTime.UTC().Format("2006-01-02 15:04:05.000")

	r := f.run(t, "list")
	require.Zero(t, r.code, r.stderr)
	lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
	require.Len(t, lines, 3)
	col := strings.Index(lines[0], "DUE (UTC)")
	require.Positive(t, col)
	assert.Regexp(t, fmt.Sprintf(`^%d\s+SUCCESS\s`, sent), lines[1])
	assert.Equal(t, "- ", lines[1][col:col+2], "no due time for a sent event: %q", lines[1])
	assert.Regexp(t, fmt.Sprintf(`^%d\s+WAIT\s`, delayed), lines[2])
	assert.Equal(t, dueAt, lines[2][col:col+len(dueAt)], "the due time under its header: %q", lines[2])

	r = f.run(t, "show", fmt.Sprint(delayed))
	require.Zero(t, r.code, r.stderr)
	assert.Regexp(t, `(?m)^due \(UTC\):\s+`+regexp.QuoteMeta(dueAt)+`$`, r.stdout)
	r = f.run(t, "show", fmt.Sprint(sent))
	require.Zero(t, r.code, r.stderr)
	assert.Regexp(t, `(?m)^due \(UTC\):\s+-$`, r.stdout)

	r = f.run(t, "show", "--json", fmt.Sprint(delayed))
	require.Zero(t, r.code, r.stderr)
	var one listed
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &one))
	require.NotNil(t, one.DueTime)
	assert.True(t, one.DueTime.Equal(ev.NextRetryTime), "due_time %s, next_retry_time %s", one.DueTime, ev.NextRetryTime)
	r = f.run(t, "list", "--status", "SUCCESS", "--json")
	require.Zero(t, r.code, r.stderr)
	var evs []listed
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &evs))
	require.Len(t, evs, 1)
	assert.Nil(t, evs[0].DueTime, "no due time for a sent event")
}
