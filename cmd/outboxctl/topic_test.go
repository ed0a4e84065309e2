package main

import (
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/go-outbox/outbox"
)

// --topic selects by topic in list and requeue, given more than once or comma-separated,
// "-" naming the default topic; list and show print each event's topic.
func TestTopicFilterAndColumn(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ids := map[string]int64{}
	for _, topic := range []string{"", "orders", "payments"} {
		id := f.insert(t, "ORDER_CREATED", "ORD-"+topic, []byte("{}"))
		_, err := f.db.Exec("UPDATE `"+f.table+"` SET topic = ? WHERE id = ?", topic, id) // as a plain INSERT may write it
		require.NoError(t, err)
		f.set(t, id, outbox.StatusFail, time.Hour)
		ids[topic] = id
	}
	listIDs := func(args ...string) []int64 {
		t.Helper()
		r := f.run(t, append([]string{"list", "--json"}, args...)...)
		require.Zero(t, r.code, r.stderr)
		var evs []listed
		require.NoError(t, json.Unmarshal([]byte(r.stdout), &evs))
		var got []int64
		for _, ev := range evs {
			got = append(got, ev.ID)
			assert.Equal(t, map[int64]string{ids[""]: "", ids["orders"]: "orders", ids["payments"]: "payments"}[ev.ID], ev.Topic)
		}
		return got
	}
	assert.Equal(t, []int64{ids["orders"]}, listIDs("--topic", "orders"))
	assert.Equal(t, []int64{ids["payments"], ids[""]}, listIDs("--topic", "payments,-"))
	assert.Equal(t, []int64{ids["payments"], ids["orders"]}, listIDs("--topic", "orders", "--topic", "payments"))

	r := f.run(t, "list", "--topic", "orders")
	require.Zero(t, r.code, r.stderr)
	assert.Regexp(t, fmt.Sprintf(`(?m)^%d\s+FAIL\s+ORDER_CREATED\s+ORD-orders\s+orders\s+4\s`, ids["orders"]), r.stdout)
	r = f.run(t, "show", fmt.Sprint(ids["payments"]))
	require.Zero(t, r.code, r.stderr)
	assert.Regexp(t, `(?m)^topic:\s+payments$`, r.stdout)
	r = f.run(t, "show", fmt.Sprint(ids[""]))
	require.Zero(t, r.code, r.stderr)
	assert.Regexp(t, `(?m)^topic:\s+- \(the sender's default topic\)$`, r.stdout)

	r = f.run(t, "requeue", "--topic", "payments", "--yes")
	require.Zero(t, r.code, r.stderr)
	assert.Equal(t, outbox.StatusWait, f.status(t, ids["payments"]))
	assert.Equal(t, outbox.StatusFail, f.status(t, ids["orders"]))
	assert.Equal(t, outbox.StatusFail, f.status(t, ids[""]))

	r = f.run(t, "list", "--topic", "no.dots")
	assert.NotZero(t, r.code)
	assert.Contains(t, r.stderr, "not a topic name")
	r = f.run(t, "list", "--topic", "orders,,payments")
	assert.NotZero(t, r.code)
	assert.Contains(t, r.stderr, "empty topic name")
}
