package main

import (
	"context"
	"encoding/json"
	"fmt"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/go-outbox/outbox"
)

// fail claims the event as owner and records a failure of class with message: a retry,
// or with dead a dead letter.
func (f *fixture) fail(t *testing.T, id int64, owner, class, message string, dead bool) {
	t.Helper()
	ctx := context.Background()
	_, err := f.db.Exec("UPDATE `"+f.table+"` SET next_retry_time = UTC_TIMESTAMP(3) WHERE id = ?", id)
	require.NoError(t, err)
	res, err := f.store.ClaimDue(ctx, outbox.ClaimRequest{Owner: owner, Limit: 1, MaxBytes: 1 << 20})
	require.NoError(t, err)
	require.Len(t, res.Events, 1)
	require.Equal(t, id, res.Events[0].ID)
	ok := false
	if dead {
		_, ok, err = f.store.MarkFail(ctx, id, owner, 4, class, message)
	} else {
		ok, err = f.store.ReleaseForRetry(ctx, id, owner, 1, 0, class, message)
	}
	require.NoError(t, err)
	require.True(t, ok)
}

// show prints the failure history as a table (time, instance, class, message), oldest first,
// one line each (a message's newlines as spaces); --json has it whole; an event without
// one says so. A requeue keeps it. A history written by hand that is not the library's is
// printed as far as it can be read.
func TestShowPrintsTheFailureHistory(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	id := f.insert(t, "ORDER_PAID", "ORD-2", []byte("{}"))
	f.fail(t, id, "node-1", "retryable", "broker busy\nsecond line", false)
	f.fail(t, id, "node-2", "unavailable", "unavailable: no route", false)
	f.fail(t, id, "node-1", "permanent", `permanent: "too large" ü`, true)
	clean := f.insert(t, "ORDER_CREATED", "ORD-1", []byte("{}"))

	r := f.run(t, "show", fmt.Sprint(clean))
	require.Zero(t, r.code, r.stderr)
	assert.Contains(t, r.stdout, "\nfailures: none\npayload (text):")

	r = f.run(t, "show", fmt.Sprint(id))
	require.Zero(t, r.code, r.stderr)
	out := r.stdout[strings.Index(r.stdout, "failures ("):strings.Index(r.stdout, "payload (text):")]
	lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	require.Len(t, lines, 5, out)
	assert.Equal(t, "failures (3, oldest first):", lines[0])
	assert.Regexp(t, `^  TIME \(UTC\)\s+INSTANCE\s+CLASS\s+MESSAGE$`, lines[1])
	stamp := `\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3}`
	assert.Regexp(t, `^  `+stamp+`\s+node-1\s+retryable\s+broker busy second line$`, lines[2])
	assert.Regexp(t, `^  `+stamp+`\s+node-2\s+unavailable\s+unavailable: no route$`, lines[3])
	assert.Regexp(t, `^  `+stamp+`\s+node-1\s+permanent\s+`+regexp.QuoteMeta(`permanent: "too large" ü`)+`$`, lines[4])
	assert.Equal(t, strings.Index(lines[1], "CLASS"), strings.Index(lines[2], "retryable"), "aligned")

	r = f.run(t, "show", "--json", fmt.Sprint(id))
	require.Zero(t, r.code, r.stderr)
	var one listed
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &one))
	require.Len(t, one.Failures, 3)
	assert.Equal(t, "broker busy\nsecond line", one.Failures[0].Message, "whole, newline and all")
	assert.Equal(t, "node-2", one.Failures[1].Instance)
	assert.Equal(t, "permanent", one.Failures[2].Class)
	for _, fl := range one.Failures {
		require.NotNil(t, fl.At)
	}
	var raw map[string]any
	r = f.run(t, "show", "--json", fmt.Sprint(clean))
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &raw))
	assert.Equal(t, []any{}, raw["failures"], "an event without a history has an empty list")

	// A requeue (by outboxctl) keeps the history.
	r = f.run(t, "requeue", fmt.Sprint(id))
	require.Zero(t, r.code, r.stderr)
	assert.Equal(t, outbox.StatusWait, f.status(t, id))
	r = f.run(t, "show", "--json", fmt.Sprint(id))
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &one))
	assert.Len(t, one.Failures, 3, "requeued, the history stays")

	// A value written by hand.
	_, err := f.db.Exec("UPDATE `"+f.table+"` SET failures = ? WHERE id = ?", "garbage\n{\"at\": \"then\", \"class\": \"retryable\", \"message\": \"m\"}", clean)
	require.NoError(t, err)
	r = f.run(t, "show", fmt.Sprint(clean))
	require.Zero(t, r.code, r.stderr)
	assert.Regexp(t, `(?m)^  -\s+-\s+-\s+garbage$`, r.stdout)
	assert.Regexp(t, `(?m)^  -\s+-\s+retryable\s+m$`, r.stdout)
	r = f.run(t, "show", "--json", fmt.Sprint(clean))
	require.Zero(t, r.code, r.stderr)
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &one))
	require.Len(t, one.Failures, 2)
	assert.Nil(t, one.Failures[0].At)
	assert.Equal(t, "garbage", one.Failures[0].Message)
}
