package inbox

import (
	"encoding/json"
	"fmt"
	"strings"

	"github.com/go-outbox/outbox/internal/mysqldialect"
)

// queries holds the inbox's statements with the configured names in place.
type queries struct {
	schema string
	// recordPrefix is the INSERT of an event id, up to the id's literal: the id is written
	// into the text (a UUID, checked, so nothing else can be in it), so that the duplicate
	// check is one statement on the wire, not a PREPARE, an EXECUTE and a CLOSE.
	recordPrefix string
	reject       string
	rejected     string
	getRejected  string
	// getRejectedByEvent reads a rejected row by its event id through uk_group_msg_key:
	// msg_key is the event id of every message that has a valid one.
	getRejectedByEvent string
	dropRejected       string
	purge              string
	retainLock         string
}

func newQueries(table, rejected, group string) queries {
	r := strings.NewReplacer("t_inbox_rejected", mysqldialect.Quote(rejected), "t_inbox", mysqldialect.Quote(table))
	// The group is checked against RocketMQ's rule (letters, digits, _ - % |): safe in quotes.
	g := "'" + group + "'"
	return queries{
		schema:       r.Replace(schemaSQL),
		recordPrefix: "INSERT INTO " + mysqldialect.Quote(table) + " (consumer_group, event_id, consumed_at) VALUES (" + g + ", '",
		// A message rejected again (a redelivery, or the same event resent) adds a delivery
		// and keeps the latest reason.
		reject: "INSERT INTO " + mysqldialect.Quote(rejected) + " (consumer_group, msg_key, event_id, msg_id, topic, reason_class, reason, properties, body, deliveries, first_rejected, last_rejected)" +
			" VALUES (" + g + ", ?, ?, ?, ?, ?, ?, ?, ?, GREATEST(?, 1), UTC_TIMESTAMP(3), UTC_TIMESTAMP(3))" +
			" ON DUPLICATE KEY UPDATE deliveries = deliveries + 1, reason_class = VALUES(reason_class), reason = VALUES(reason)," +
			" last_rejected = VALUES(last_rejected)",
		rejected: "SELECT id, msg_key, event_id, msg_id, topic, reason_class, reason, properties, body, deliveries, first_rejected, last_rejected" +
			" FROM " + mysqldialect.Quote(rejected) + " WHERE consumer_group = " + g + " AND id > ? ORDER BY id LIMIT ?",
		getRejected: "SELECT id, msg_key, event_id, msg_id, topic, reason_class, reason, properties, body, deliveries, first_rejected, last_rejected" +
			" FROM " + mysqldialect.Quote(rejected) + " WHERE consumer_group = " + g + " AND id = ?",
		getRejectedByEvent: "SELECT id, msg_key, event_id, msg_id, topic, reason_class, reason, properties, body, deliveries, first_rejected, last_rejected" +
			" FROM " + mysqldialect.Quote(rejected) + " WHERE consumer_group = " + g + " AND msg_key = ?",
		dropRejected: "DELETE FROM " + mysqldialect.Quote(rejected) + " WHERE consumer_group = " + g + " AND id = ?",
		// Oldest first through idx_consumed_at, a batch at a time, so that no DELETE holds
		// many row locks or fills the redo log.
		purge: "DELETE FROM " + mysqldialect.Quote(table) + " WHERE consumed_at < DATE_SUB(UTC_TIMESTAMP(3), INTERVAL ? MICROSECOND)" +
			" ORDER BY consumed_at LIMIT ?",
		// A named lock per database and table.
		retainLock: mysqldialect.LockName(mysqldialect.InboxPurgeLock, table),
	}
}

// record is the INSERT of eventID, which validEventID has checked.
func (q queries) record(eventID string) string {
	return q.recordPrefix + eventID + "', UTC_TIMESTAMP(3))"
}

// encodeProperties writes a message's properties as a JSON object.
func encodeProperties(p map[string]string) string {
	if len(p) == 0 {
		return "{}"
	}
	b, err := json.Marshal(p)
	if err != nil {
		return "{}" // a map of strings always encodes
	}
	return string(b)
}

func decodeProperties(s string) (map[string]string, error) {
	p := map[string]string{}
	if err := json.Unmarshal([]byte(s), &p); err != nil {
		return nil, fmt.Errorf("inbox: a rejected message's properties: %w", err)
	}
	return p, nil
}
