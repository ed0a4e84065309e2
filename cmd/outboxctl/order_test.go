package main

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/go-outbox/outbox"
)

// blocked lists the dead letters with events of their biz no waiting behind them, with the
// count; skip marks dead letters SKIPPED, all given or none, and unblocks their keys.
func TestBlockedAndSkip(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	r := f.run(t, "blocked")
	assert.Equal(t, exitOK, r.code, "nothing blocked is no failure")
	assert.Contains(t, r.stdout, "no dead letter has events of its biz no waiting behind it")

	dead := f.insert(t, "ORDER_CREATED", "ORD-1", []byte("{}"))
	f.set(t, dead, outbox.StatusFail, time.Hour)
	f.insert(t, "ORDER_PAID", "ORD-1", []byte("{}"))
	f.insert(t, "ORDER_CANCELLED", "ORD-1", []byte("{}"))
	lone := f.insert(t, "ORDER_CREATED", "ORD-2", []byte("{}")) // a dead letter with nothing behind it
	f.set(t, lone, outbox.StatusFail, time.Hour)
	sent := f.insert(t, "ORDER_CREATED", "ORD-3", []byte("{}"))
	f.set(t, sent, outbox.StatusSuccess, time.Hour)

	r = f.run(t, "blocked")
	require.Zero(t, r.code, r.stderr)
	assert.Regexp(t, `(?m)^ID\s+BIZ_NO\s+EVENT_TYPE\s+WAITING BEHIND\s+RETRIES\s+FAILED \(UTC\)\s+EVENT_ID\s+LAST_ERROR$`, r.stdout)
	assert.Regexp(t, fmt.Sprintf(`(?m)^%d\s+ORD-1\s+ORDER_CREATED\s+2\s+4\s+.*\s%s\s+broker said no$`, dead, f.eventID(t, dead)), r.stdout)
	assert.NotContains(t, r.stdout, "ORD-2")
	r = f.run(t, "blocked", "--after", fmt.Sprint(dead))
	require.Zero(t, r.code, r.stderr)
	assert.Contains(t, r.stdout, "no dead letter has events of its biz no waiting behind it", "the next page is empty")
	r = f.run(t, "blocked", "--after", fmt.Sprint(dead-1))
	assert.Contains(t, r.stdout, "ORD-1", "the page after the id before it")

	r = f.run(t, "blocked", "--json")
	require.Zero(t, r.code, r.stderr)
	var rows []struct {
		ID      int64  `json:"id"`
		EventID string `json:"event_id"`
		BizNo   string `json:"biz_no"`
		Status  string `json:"status"`
		Waiting int64  `json:"waiting"`
	}
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &rows), r.stdout)
	require.Len(t, rows, 1)
	assert.Equal(t, dead, rows[0].ID)
	assert.Equal(t, f.eventID(t, dead), rows[0].EventID)
	assert.Equal(t, "ORD-1", rows[0].BizNo)
	assert.Equal(t, "FAIL", rows[0].Status)
	assert.Equal(t, int64(2), rows[0].Waiting)

	// All FAIL or nothing.
	before := f.snapshot(t)
	r = f.run(t, "skip", fmt.Sprint(dead), fmt.Sprint(sent))
	assert.Equal(t, exitRefused, r.code)
	assert.Contains(t, r.stderr, fmt.Sprintf("nothing skipped: id %d is SUCCESS, not FAIL", sent))
	r = f.run(t, "skip", fmt.Sprint(dead), "99999999")
	assert.Equal(t, exitNotFound, r.code)
	assert.Contains(t, r.stderr, "nothing skipped: id 99999999 does not exist")
	assert.Equal(t, before, f.snapshot(t))

	// By id and by event_id alike.
	r = f.run(t, "skip", fmt.Sprint(dead), f.eventID(t, lone), "--json")
	require.Zero(t, r.code, r.stderr)
	var out struct{ Skipped []int64 }
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &out), r.stdout)
	assert.Equal(t, []int64{dead, lone}, out.Skipped)
	assert.Contains(t, r.stderr, fmt.Sprintf("skipped id %d", dead))
	assert.Contains(t, r.stderr, fmt.Sprintf("skipped id %d", lone))
	assert.Equal(t, outbox.StatusSkipped, f.status(t, dead))
	assert.Equal(t, outbox.StatusSkipped, f.status(t, lone))

	r = f.run(t, "blocked")
	assert.Equal(t, exitOK, r.code, "nothing blocked any more")
	r = f.run(t, "list", "--status", "skipped")
	require.Zero(t, r.code, r.stderr)
	assert.Contains(t, r.stdout, "SKIPPED")
	r = f.run(t, "stats", "--count-success")
	require.Zero(t, r.code, r.stderr)
	assert.Regexp(t, `(?m)^SKIPPED\s+2$`, r.stdout)

	f.set(t, dead, outbox.StatusSkipped, 40*24*time.Hour)
	r = f.run(t, "purge", "--older-than", "720h", "--yes")
	require.Zero(t, r.code, r.stderr)
	assert.Contains(t, r.stdout, "deleted 1 SUCCESS or SKIPPED events")
	_, err := f.admin.Get(context.Background(), dead)
	require.ErrorIs(t, err, outbox.ErrNotFound)
}

func TestBlockedAndSkipBadInput(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	for _, c := range []struct {
		args []string
		code int
		msg  string
	}{
		{[]string{"skip"}, exitUsage, "skip takes one or more ids or event_ids"},
		{[]string{"skip", "abc"}, exitUsage, `"abc" is neither an id (a positive integer) nor an event_id (a UUID)`},
		{[]string{"skip", "0"}, exitUsage, `"0" is neither an id`},
		{[]string{"blocked", "--limit", "-1"}, exitUsage, "--limit must be between 0 and 10000"},
		{[]string{"blocked", "extra"}, exitUsage, `unexpected argument "extra"`},
		{[]string{"blocked", "--after", "-5"}, exitUsage, "--after is an id"},
	} {
		r := f.run(t, c.args...)
		assert.Equal(t, c.code, r.code, "%v: stderr %s", c.args, r.stderr)
		assert.Contains(t, r.stderr, c.msg, "%v", c.args)
		assert.Empty(t, r.stdout)
	}
	for _, cmd := range []string{"blocked", "skip"} {
		r := f.run(t, cmd, "--help")
		assert.Zero(t, r.code)
		assert.Contains(t, r.stderr, "Usage: outboxctl [global flags] "+cmd)
	}
}
