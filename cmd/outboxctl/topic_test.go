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

// --topic selects by topic in list and requeue, given more than once or comma-separated;
// a row written without a topic is selected by the topic its type's route or the default
// gives it (-route, -default-topic); list and show print each event's topic.
func TestTopicFilterAndColumn(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ids := map[string]int64{}
	for _, topic := range []string{"", "orders", "payments", "routed"} {
		typ := "ORDER_CREATED"
		if topic == "routed" {
			typ = "ORDER_PAID"
		}
		id := f.insert(t, typ, "ORD-"+topic, []byte("{}"))
		_, err := f.db.Exec("UPDATE `"+f.table+"` SET topic = ? WHERE id = ?", topic, id) // as a plain INSERT may write it
		require.NoError(t, err)
		if topic == "routed" {
			_, err := f.db.Exec("UPDATE `"+f.table+"` SET topic = '' WHERE id = ?", id)
			require.NoError(t, err)
		}
		f.set(t, id, outbox.StatusFail, time.Hour)
		ids[topic] = id
	}
	routes := []string{"-default-topic", "DEF", "-topics", "orders,payments", "-route", "ORDER_PAID=payments"}
	listIDs := func(args ...string) []int64 {
		t.Helper()
		r := f.run(t, append(append(routes, "list", "--json"), args...)...)
		require.Zero(t, r.code, r.stderr)
		var evs []listed
		require.NoError(t, json.Unmarshal([]byte(r.stdout), &evs))
		var got []int64
		for _, ev := range evs {
			got = append(got, ev.ID)
			assert.Equal(t, map[int64]string{ids[""]: "DEF", ids["orders"]: "orders", ids["payments"]: "payments", ids["routed"]: "payments"}[ev.ID], ev.Topic)
		}
		return got
	}
	assert.Equal(t, []int64{ids["orders"]}, listIDs("--topic", "orders"))
	assert.Equal(t, []int64{ids["routed"], ids["payments"], ids[""]}, listIDs("--topic", "payments,DEF"))
	assert.Equal(t, []int64{ids["routed"], ids["payments"], ids["orders"]}, listIDs("--topic", "orders", "--topic", "payments"))

	r := f.run(t, append(routes, "list", "--topic", "orders")...)
	require.Zero(t, r.code, r.stderr)
	assert.Regexp(t, fmt.Sprintf(`(?m)^%d\s+FAIL\s+ORDER_CREATED\s+ORD-orders\s+orders\s+4\s`, ids["orders"]), r.stdout)
	r = f.run(t, append(routes, "show", fmt.Sprint(ids["routed"]))...)
	require.Zero(t, r.code, r.stderr)
	assert.Regexp(t, `(?m)^topic:\s+payments$`, r.stdout)
	r = f.run(t, "show", fmt.Sprint(ids[""]))
	require.Zero(t, r.code, r.stderr)
	assert.Regexp(t, `(?m)^topic:\s+ORDER_EVENT_TOPIC$`, r.stdout, "without -default-topic, the library's default")

	r = f.run(t, append(routes, "requeue", "--topic", "payments", "--yes")...)
	require.Zero(t, r.code, r.stderr)
	assert.Equal(t, outbox.StatusWait, f.status(t, ids["payments"]))
	assert.Equal(t, outbox.StatusWait, f.status(t, ids["routed"]))
	assert.Equal(t, outbox.StatusFail, f.status(t, ids["orders"]))
	assert.Equal(t, outbox.StatusFail, f.status(t, ids[""]))

	// --to-topic moves a dead letter to another topic of the set; one outside it is refused
	// (exit 2), naming the set, and nothing changes.
	r = f.run(t, append(routes, "requeue", fmt.Sprint(ids["orders"]), "--to-topic", "paymnets")...)
	assert.Equal(t, exitUsage, r.code, r.stderr)
	assert.Contains(t, r.stderr, "DEF, orders, payments")
	assert.Equal(t, outbox.StatusFail, f.status(t, ids["orders"]))
	r = f.run(t, append(routes, "requeue", fmt.Sprint(ids["orders"]), "--to-topic", "payments")...)
	require.Zero(t, r.code, r.stderr)
	assert.Contains(t, r.stdout, "to topic payments")
	assert.Equal(t, outbox.StatusWait, f.status(t, ids["orders"]))
	r = f.run(t, append(routes, "show", fmt.Sprint(ids["orders"]))...)
	require.Zero(t, r.code, r.stderr)
	assert.Regexp(t, `(?m)^topic:\s+payments$`, r.stdout)

	r = f.run(t, "list", "--topic", "no.dots")
	assert.NotZero(t, r.code)
	assert.Contains(t, r.stderr, "not a topic name")
	r = f.run(t, "list", "--topic", "orders,,payments")
	assert.NotZero(t, r.code)
	assert.Contains(t, r.stderr, "empty topic name")
	r = f.run(t, "-default-topic", "a b", "list")
	assert.Equal(t, exitUsage, r.code)
	assert.Contains(t, r.stderr, "Routes.Topic")
}
