package relay_test

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/go-outbox/outbox"
	"github.com/go-outbox/outbox/internal/testsvc"
)

// ceRow is what the table holds of an event that its message's CloudEvents properties
// carry; time is create_time as the server writes it, RFC 3339 in UTC to the millisecond.
type ceRow struct {
	bizNo, eventType, time string
	payload                []byte
}

// ceRows reads the table's events by event id, their create_time formatted by the server
// itself, not by a Go driver's time zone.
func (e *env) ceRows(t *testing.T) map[string]ceRow {
	t.Helper()
	rows, err := e.db.Query("SELECT event_id, biz_no, event_type, payload, " +
		"CONCAT(LEFT(DATE_FORMAT(create_time, '%Y-%m-%dT%H:%i:%s.%f'), 23), 'Z') FROM " + e.table)
	require.NoError(t, err)
	defer rows.Close()
	out := map[string]ceRow{}
	for rows.Next() {
		var id string
		var r ceRow
		require.NoError(t, rows.Scan(&id, &r.bizNo, &r.eventType, &r.payload, &r.time))
		out[id] = r
	}
	require.NoError(t, rows.Err())
	return out
}

// The relay sends through a RocketMQSender with CloudEvents on, so a consumer of the real
// broker reads every relayed event as a CloudEvent in binary content mode: CE_id the event
// id, CE_type its type, CE_source the sender's source, CE_time the row's create_time (RFC
// 3339, UTC, to the millisecond), CE_specversion 1.0, CE_contenttype the default; eventId,
// eventType and bizNo as without CloudEvents, the payload as the body. Events come by both
// of the relay's paths: committed before it starts (its sweep reads them from the table)
// and while it runs (read from the binlog, from InsertEvent and from a plain SQL insert
// whose id and time are the server's defaults).
func TestRelaySendsCloudEvents(t *testing.T) {
	t.Parallel()
	e := newEnv(t, newServer(t), outbox.Unordered)
	topic := testsvc.NewTopic(t, "relay-ce")
	e.routeTo(t, topic)
	c := testsvc.Consume(t, topic)
	source := "/outbox-relay-test/" + strings.ToLower(topic)
	sender, err := outbox.NewRocketMQSender(outbox.RocketMQConfig{NameServers: []string{testsvc.RocketMQNameServer(t)}, GroupName: testsvc.UniqueTable("relay"), CloudEventsSource: source})
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, sender.Close()) })

	before := e.insert(t, 5, byIndex("before"))
	r, _ := start(t, e.dsn, sender, e.config("relay-1"))
	waitLeader(t, r)
	during := e.insert(t, 10, byIndex("during"))
	_, err = e.db.Exec("INSERT INTO "+e.table+" (biz_no, event_type, payload) VALUES (?, ?, ?)", "plain-1", "ORDER_PAID", []byte(`{"plain":1}`))
	require.NoError(t, err)
	const n = 16
	c.WaitDistinct(t, n, 60*time.Second)
	waitFor(t, 10*time.Second, "every row SUCCESS", func() bool { return e.statuses(t)["SUCCESS"] == n })

	rows := e.ceRows(t)
	require.Len(t, rows, n)
	deliveries := c.Deliveries()
	for id := range rows {
		assert.Equal(t, 1, deliveries[id], "event %s", id)
	}
	for _, id := range append(before, during...) {
		assert.Contains(t, rows, id)
	}
	for _, m := range c.Messages() {
		id := m.GetProperty(outbox.PropertyEventID)
		row, ok := rows[id]
		require.True(t, ok, "eventId %q is no event's", id)
		assert.Equal(t, id, m.GetProperty("CE_id"))
		assert.Equal(t, row.eventType, m.GetProperty("CE_type"))
		assert.Equal(t, source, m.GetProperty("CE_source"))
		assert.Equal(t, row.time, m.GetProperty("CE_time"), "event %s: CE_time is create_time", id)
		at, err := time.Parse(time.RFC3339Nano, m.GetProperty("CE_time"))
		require.NoError(t, err, "CE_time is RFC 3339")
		assert.Equal(t, time.UTC, at.Location(), "CE_time is UTC")
		assert.Equal(t, "1.0", m.GetProperty("CE_specversion"))
		assert.Equal(t, "application/json", m.GetProperty("CE_contenttype"), "the default")
		var ce []string
		for k := range m.GetProperties() {
			if strings.HasPrefix(k, "CE_") {
				ce = append(ce, k)
			}
		}
		assert.ElementsMatch(t, []string{"CE_contenttype", "CE_id", "CE_source", "CE_specversion", "CE_time", "CE_type"}, ce,
			"no other CE_ property")
		assert.Equal(t, row.eventType, m.GetProperty(outbox.PropertyEventType))
		assert.Equal(t, row.bizNo, m.GetProperty(outbox.PropertyBizNo))
		assert.Equal(t, row.payload, m.Body)
	}
	st := r.Stats()
	assert.Equal(t, int64(n), st.Sent)
	assert.Equal(t, int64(len(before)), st.Swept, "the events committed before the relay started came from the table")
}
