package outbox_test

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/go-outbox/outbox"
	"github.com/go-outbox/outbox/internal/testsvc"
)

// historyBenchDSN names a server that nothing else uses: the benchmark reads the server's
// global counters (statements, redo, binary log), which count every session's work.
const historyBenchDSN = "OUTBOX_HISTORY_BENCH_DSN"

// serverCounters are the server-wide counters the benchmark reads.
type serverCounters struct{ questions, redo, binlog int64 }

func readCounters(b *testing.B, db *sql.DB) serverCounters {
	b.Helper()
	var c serverCounters
	rows, err := db.Query("SHOW GLOBAL STATUS WHERE Variable_name IN ('Questions', 'Innodb_lsn_current', 'Binlog_bytes_written')")
	require.NoError(b, err)
	defer rows.Close()
	for rows.Next() {
		var name string
		var v int64
		require.NoError(b, rows.Scan(&name, &v))
		switch name {
		case "Questions":
			c.questions = v
		case "Innodb_lsn_current":
			c.redo = v
		case "Binlog_bytes_written":
			c.binlog = v
		}
	}
	require.NoError(b, rows.Err())
	return c
}

// BenchmarkFailureHistoryCost measures, per event, the statements, redo and binary log of
// the happy path (insert, batch claim, acknowledgement) and of a failure recorded (claim and
// retry), on a table with the failures column and on one without it (the layout before the
// history), with the same statements otherwise: the claims and acknowledgements name no
// history, and a release of class "" is the release statement of before. Run it alone, on a
// private server:
//
//	OUTBOX_HISTORY_BENCH_DSN='root@tcp(127.0.0.1:3461)/outbox_test?parseTime=true' \
//	  go test -run '^$' -bench FailureHistoryCost -benchtime 1x .
func BenchmarkFailureHistoryCost(b *testing.B) {
	dsn := os.Getenv(historyBenchDSN)
	if dsn == "" {
		b.Skip(historyBenchDSN + " is not set (a server nothing else uses)")
	}
	db, err := sql.Open("mysql", dsn)
	require.NoError(b, err)
	b.Cleanup(func() { _ = db.Close() })
	ctx := context.Background()
	const events, batch = 4000, 200
	// Each layout twice, in turn, so that what the server does meanwhile for the earlier
	// tables (InnoDB's purge of their old row versions) weighs on both alike.
	for _, layout := range []string{"before (no failures column)", "after (failures column)", "before (no failures column)", "after (failures column)"} {
		withColumn := layout[0] == 'a'
		table := testsvc.UniqueTable("t_history_bench")
		store, err := outbox.NewMySQLStore(db, outbox.MySQLConfig{Table: table})
		require.NoError(b, err)
		require.NoError(b, store.CreateSchema(ctx))
		b.Cleanup(func() { _, _ = db.Exec("DROP TABLE IF EXISTS `" + table + "`") })
		if !withColumn {
			// A copy, so that the table is the layout of before (an instant DROP leaves
			// the column in the table's metadata).
			_, err := db.Exec("ALTER TABLE `" + table + "` DROP COLUMN failures, ALGORITHM=COPY")
			require.NoError(b, err)
		}
		insert := func() {
			for i := 0; i < events; i += batch {
				tx, err := store.BeginTx(ctx, nil)
				require.NoError(b, err)
				for j := range batch {
					_, err := tx.InsertEvent(ctx, outbox.EventInput{BizNo: fmt.Sprintf("ORD-%d", i+j), EventType: "ORDER_CREATED",
						Payload: fmt.Appendf(nil, `{"order":%d,"amount":"129.90","currency":"EUR"}`, i+j)})
					require.NoError(b, err)
				}
				require.NoError(b, tx.Commit())
			}
		}
		claim := func(succeeded []int64) []outbox.Event {
			res, err := store.ClaimDue(ctx, outbox.ClaimRequest{Owner: "bench-instance-1", Limit: batch, MaxBytes: 1 << 20, Succeeded: succeeded})
			require.NoError(b, err)
			return res.Events
		}
		var line string
		report := func(what string, from, to serverCounters, probes int64) {
			per := func(d int64) float64 { return float64(d) / events }
			line += fmt.Sprintf("  %s: %.3f statements, %.0f B redo, %.0f B binlog;", what,
				per(to.questions-from.questions-probes), per(to.redo-from.redo), per(to.binlog-from.binlog))
		}

		// The happy path: insert, claim in batches (each claim recording the last one's
		// successes), and the last acknowledgement.
		c0 := readCounters(b, db)
		insert()
		c1 := readCounters(b, db)
		var last []int64
		for {
			evs := claim(last)
			if len(evs) == 0 {
				break
			}
			last = last[:0]
			for _, ev := range evs {
				last = append(last, ev.ID)
			}
		}
		c2 := readCounters(b, db)
		report("insert", c0, c1, 1)
		report("claim and acknowledge", c1, c2, 1)
		var notNull int
		require.NoError(b, db.QueryRow("SELECT COUNT(*) FROM `"+table+"` WHERE status <> 'SUCCESS'").Scan(&notNull))
		require.Zero(b, notNull)

		// A failure: claim, then a retry recorded, per event (the first failure of each).
		insert()
		c3 := readCounters(b, db)
		class := ""
		if withColumn {
			class = "retryable"
		}
		for {
			evs := claim(nil)
			if len(evs) == 0 {
				break
			}
			for _, ev := range evs {
				ok, err := store.ReleaseForRetry(ctx, ev.ID, "bench-instance-1", 1, 3600e9, class,
					"send: rocketmq: the broker is busy (code 2, system busy, start flow control for a while)")
				require.NoError(b, err)
				require.True(b, ok)
			}
		}
		c4 := readCounters(b, db)
		report("claim and first failure", c3, c4, 1)
		b.Logf("%s, per event:%s", layout, line)
	}
}
