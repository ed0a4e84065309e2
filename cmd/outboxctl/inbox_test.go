package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/go-outbox/outbox"
	"github.com/go-outbox/outbox/inbox"
	"github.com/go-outbox/outbox/internal/testsvc"
)

// rejectOne makes in reject a message of event id (a handler that refuses it for good) and
// returns the rejected row's id.
func rejectOne(t *testing.T, in *inbox.Inbox, eventID string) int64 {
	t.Helper()
	return rejectOneFrom(t, in, eventID, "T")
}

// rejectOneFrom is rejectOne of a message consumed from topic, where a resend sends it.
func rejectOneFrom(t *testing.T, in *inbox.Inbox, eventID, topic string) int64 {
	t.Helper()
	ctx := context.Background()
	msg := &inbox.Message{EventID: eventID, EventType: "ORDER_CREATED", BizNo: "ORD-1", Body: []byte(`{"n":1}`),
		Properties: map[string]string{outbox.PropertyEventID: eventID, outbox.PropertyEventType: "ORDER_CREATED", outbox.PropertyBizNo: "ORD-1"},
		Topic:      topic, MsgID: "MSG-1", Deliveries: 1}
	o, err := in.Handle(ctx, msg, func(context.Context, *sql.Tx, *inbox.Message) error {
		return outbox.Permanent(errors.New("the payload has no user"))
	})
	require.NoError(t, err)
	require.Equal(t, inbox.Rejected, o)
	rows, err := in.Rejected(ctx, 0, 10)
	require.NoError(t, err)
	for _, r := range rows {
		if r.Message.EventID == eventID {
			return r.ID
		}
	}
	t.Fatalf("no rejected row for %s", eventID)
	return 0
}

// outboxctl inbox rejected lists a group's rejected messages, named as everywhere (id the
// row, event_id the UUID), and another group's are not among them; inbox resend publishes
// one again as the same event and deletes its row.
func TestInboxRejectedAndResend(t *testing.T) {
	t.Parallel()
	db := testsvc.OpenDB(t)
	table := testsvc.UniqueTable("t_inbox")
	in, err := inbox.New(db, inbox.Config{Group: "cg_points", Table: table})
	require.NoError(t, err)
	require.NoError(t, in.CreateSchema(context.Background()))
	other, err := inbox.New(db, inbox.Config{Group: "cg_mail", Table: table})
	require.NoError(t, err)
	t.Cleanup(func() {
		_, _ = db.Exec("DROP TABLE IF EXISTS `" + table + "`, `" + table + "_rejected`")
	})
	eventID := uuid.Must(uuid.NewV7()).String()
	topic := testsvc.NewTopic(t, "INBOX_RESEND")
	id := rejectOneFrom(t, in, eventID, topic)
	rejectOne(t, other, uuid.Must(uuid.NewV7()).String())

	env := []string{"OUTBOX_DSN=" + testsvc.MySQLDSN(t)}
	r := runEnv(t, env, "inbox", "rejected", "--group", "cg_points", "--inbox-table", table, "--json")
	require.Equal(t, 0, r.code, r.stderr)
	var rows []map[string]any
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &rows))
	require.Len(t, rows, 1, "only the group's own")
	assert.EqualValues(t, id, rows[0]["id"])
	assert.Equal(t, eventID, rows[0]["event_id"])
	assert.Equal(t, "permanent", rows[0]["reason_class"])
	assert.Contains(t, rows[0]["reason"], "the payload has no user")
	r = runEnv(t, env, "inbox", "rejected", "--group", "cg_points", "--inbox-table", table)
	require.Equal(t, 0, r.code, r.stderr)
	assert.Contains(t, r.stdout, "ID  ")
	assert.Contains(t, r.stdout, "EVENT_ID")
	assert.Contains(t, r.stdout, eventID)

	// Bad input changes nothing and exits 2.
	for _, args := range [][]string{
		{"inbox"},
		{"inbox", "rejected"},
		{"inbox", "rejected", "--group", "no spaces allowed", "--inbox-table", table},
		{"inbox", "resend", "--group", "cg_points", "--inbox-table", table, "--namesrv", "127.0.0.1:9876"},
		{"inbox", "resend", "--group", "cg_points", "--inbox-table", table, "--namesrv", "127.0.0.1:9876", "x"},
		{"inbox", "resend", "--group", "cg_points", "--inbox-table", table, fmt.Sprint(id)},
	} {
		r := runEnv(t, env, args...)
		assert.Equal(t, 2, r.code, "%v: %s", args, r.stderr)
	}

	c := testsvc.Consume(t, topic)
	ns := testsvc.RocketMQNameServer(t)
	r = runEnv(t, env, "inbox", "resend", "--group", "cg_points", "--inbox-table", table, "--namesrv", ns, fmt.Sprint(id))
	require.Equal(t, 0, r.code, r.stderr)
	assert.Contains(t, r.stdout, fmt.Sprintf("rejected message %d resent", id))
	c.WaitDistinct(t, 1, 30*time.Second)
	msgs := c.Messages()
	require.NotEmpty(t, msgs)
	assert.Equal(t, eventID, msgs[0].GetProperty(outbox.PropertyEventID), "the same event")
	assert.Equal(t, `{"n":1}`, string(msgs[0].Body))
	left, err := in.Rejected(context.Background(), 0, 10)
	require.NoError(t, err)
	assert.Empty(t, left, "the row is gone once the broker took the message")

	r = runEnv(t, env, "inbox", "resend", "--group", "cg_points", "--inbox-table", table, "--namesrv", ns, fmt.Sprint(id))
	assert.Equal(t, exitNotFound, r.code, "a second resend finds nothing")
	assert.Contains(t, r.stderr, "not found")
}

// inbox resend takes a rejected message's event id (the id a consumer logs) as well as its
// row's id; an event id the group has no rejected message of exits 3 and resends nothing.
func TestInboxResendByEventID(t *testing.T) {
	t.Parallel()
	db := testsvc.OpenDB(t)
	table := testsvc.UniqueTable("t_inbox")
	in, err := inbox.New(db, inbox.Config{Group: "cg_points", Table: table})
	require.NoError(t, err)
	require.NoError(t, in.CreateSchema(context.Background()))
	t.Cleanup(func() {
		_, _ = db.Exec("DROP TABLE IF EXISTS `" + table + "`, `" + table + "_rejected`")
	})
	eventID, kept := uuid.Must(uuid.NewV7()).String(), uuid.Must(uuid.NewV7()).String()
	topic := testsvc.NewTopic(t, "INBOX_RESEND_EVENT")
	rejectOneFrom(t, in, eventID, topic)
	keptID := rejectOneFrom(t, in, kept, topic)

	env := []string{"OUTBOX_DSN=" + testsvc.MySQLDSN(t)}
	c := testsvc.Consume(t, topic)
	ns := testsvc.RocketMQNameServer(t)
	resend := func(ref string) result {
		return runEnv(t, env, "inbox", "resend", "--group", "cg_points", "--inbox-table", table, "--namesrv", ns, ref)
	}

	r := resend(uuid.Must(uuid.NewV7()).String())
	assert.Equal(t, exitNotFound, r.code, "an event id with no rejected message: %s", r.stderr)

	r = resend(strings.ToUpper(eventID))
	require.Equal(t, 0, r.code, r.stderr)
	c.WaitDistinct(t, 1, 30*time.Second)
	msgs := c.Messages()
	require.NotEmpty(t, msgs)
	assert.Equal(t, eventID, msgs[0].GetProperty(outbox.PropertyEventID), "the event named")
	left, err := in.Rejected(context.Background(), 0, 10)
	require.NoError(t, err)
	require.Len(t, left, 1, "only the one named was resent")
	assert.Equal(t, keptID, left[0].ID)
}
