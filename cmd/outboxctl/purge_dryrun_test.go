package main

import (
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/go-outbox/outbox"
	"github.com/go-outbox/outbox/internal/testsvc"
)

// On a partitioned table whose rows have reached the catch-all partition, purge without
// --yes counts what purge --yes then deletes: the catch-all's old sent rows too.
func TestPurgeDryRunCountsTheCatchAll(t *testing.T) {
	t.Parallel()
	db := testsvc.OpenDB(t)
	table := testsvc.UniqueTable("t_event")
	testsvc.NewStore(t, db, outbox.MySQLConfig{Table: table, PartitionIDs: 1000})
	f := &fixture{db: db, table: table, env: []string{"OUTBOX_DSN=" + testsvc.MySQLDSN(t), "OUTBOX_TABLE=" + table}}
	at := "DATE_SUB(UTC_TIMESTAMP(3), INTERVAL 40 DAY)"
	for lo := 1; lo <= 5000; lo += 500 { // ids 3000 and up are in the catch-all
		var q strings.Builder
		q.WriteString("INSERT INTO `" + table + "` (id, event_id, biz_no, event_type, payload, status, next_retry_time, claim_owner, claimed_at, create_time, update_time) VALUES ")
		for id := lo; id < lo+500; id++ {
			if id > lo {
				q.WriteByte(',')
			}
			fmt.Fprintf(&q, "(%d, UUID(), 'ORD', 'A', '{}', 'SUCCESS', %s, 'node-1', %s, %s, %s)", id, at, at, at, at)
		}
		_, err := db.Exec(q.String())
		require.NoError(t, err)
	}

	r := f.run(t, "purge", "--older-than", "720h")
	require.Zero(t, r.code, r.stderr)
	assert.Contains(t, r.stdout, "4999 SUCCESS or SKIPPED events are older than 720h0m0s; nothing deleted")
	r = f.run(t, "purge", "--older-than", "720h", "--yes")
	require.Zero(t, r.code, r.stderr)
	assert.Contains(t, r.stdout, "deleted 4999 SUCCESS or SKIPPED events")
}
