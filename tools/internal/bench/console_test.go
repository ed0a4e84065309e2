package bench_test

import (
	"context"
	"database/sql"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/go-outbox/outbox"
	"github.com/go-outbox/outbox/internal/testsvc"
	"github.com/go-outbox/outbox/tools/internal/bench"
)

// TestConsoleTable loads a small console table and checks that it holds the mix it says,
// as the library's own calls read it: the counts by status, the sent-per-minute history of
// the last hour, the blocked keys and the group's rejected messages.
func TestConsoleTable(t *testing.T) {
	ctx := context.Background()
	env := bench.Env{DSN: testsvc.MySQLDSN(t)}
	ct, err := bench.LoadConsole(ctx, env, 20_000)
	if err != nil {
		t.Fatal(err)
	}
	defer ct.Drop()
	m := ct.Mix
	if m.Fail == 0 || m.Skipped == 0 || m.Blocked == 0 || m.RejectedOfGroup == 0 {
		t.Fatalf("mix without dead letters, skipped rows, blocked keys or rejected messages: %+v", m)
	}
	if got := m.History + m.Recent + m.Wait + m.Sending + m.Fail + m.Skipped; got != m.Rows {
		t.Fatalf("mix adds up to %d rows, want %d: %+v", got, m.Rows, m)
	}
	db, err := sql.Open("mysql", env.DSN)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	store, err := outbox.NewMySQLStore(db, outbox.MySQLConfig{Table: ct.Name, RelayTable: ct.Relay})
	if err != nil {
		t.Fatal(err)
	}
	st, err := store.Stats(ctx, outbox.StatsOptions{Lease: bench.ConsoleLease, SentPerMinute: true, CountSucceeded: true})
	if err != nil {
		t.Fatal(err)
	}
	if st.Wait != int64(m.Wait) || st.Sending != int64(m.Sending) || st.Fail != int64(m.Fail) || st.Skipped != int64(m.Skipped) ||
		st.Success != int64(m.History+m.Recent) || len(st.FailByType) != m.FailTypes {
		t.Fatalf("Stats %+v, want the mix %+v", st, m)
	}
	if st.RelayMode != "relay" || st.RelayLeader != "orders-1" || st.RelayEpoch != 3 {
		t.Fatalf("Stats: relay %q, leader %q, epoch %d; want the checkpoint row's relay, orders-1, 3", st.RelayMode, st.RelayLeader, st.RelayEpoch)
	}
	if st.Due == 0 || st.Due >= st.Wait || st.SendingPastHalfLease != 0 {
		t.Fatalf("Stats: %d due of %d WAIT, %d SENDING past half the lease; want some due, not all, and no claim past it", st.Due, st.Wait, st.SendingPastHalfLease)
	}
	// The last hour's sends are spread evenly over it: every minute but the oldest and the
	// current one (cut by the hour's edges) has about Recent/60 of them.
	var sent int64
	for i, n := range st.SentPerMinute {
		sent += n
		if i > 0 && i < 59 && (n < int64(m.Recent/60)*9/10 || n > int64(m.Recent/60)*11/10) {
			t.Fatalf("minute %d of the last hour: %d sent, want about %d: %v", i, n, m.Recent/60, st.SentPerMinute)
		}
	}
	if sent > int64(m.Recent) || sent < int64(m.Recent)*9/10 {
		t.Fatalf("%d sent in the last hour, want at most %d and about as many", sent, m.Recent)
	}
	for _, ordered := range []bool{false, true} {
		if ordered {
			if _, err := ct.KeyOrder(ctx); err != nil {
				t.Fatal(err)
			}
		}
		cfg := outbox.MySQLConfig{Table: ct.Name}
		if ordered {
			cfg.Ordering = outbox.KeyOrder
		}
		s, err := outbox.NewMySQLStore(db, cfg)
		if err != nil {
			t.Fatal(err)
		}
		blocked, err := outbox.NewAdmin(s).Blocked(ctx, 0, 10_000)
		if err != nil {
			t.Fatal(err)
		}
		var waiting int64
		for _, b := range blocked {
			waiting += b.Waiting
		}
		if len(blocked) != m.Blocked || waiting != int64(m.BlockedWaiting) {
			t.Fatalf("ordered %v: %d blocked keys with %d waiting, want %d with %d", ordered, len(blocked), waiting, m.Blocked, m.BlockedWaiting)
		}
	}
	run, closeRun, err := ct.Overview(env)
	if err != nil {
		t.Fatal(err)
	}
	defer closeRun()
	if err := run(ctx); err != nil {
		t.Fatal(err)
	}
}

// BenchmarkConsoleOverview times what the console's overview runs (Stats with sent per
// minute and the SKIPPED count, the first pages of dead letters, blocked keys and rejected messages) on a console
// table of OUTBOX_BENCH_CONSOLE_ROWS events (100,000 unless set; the benchmark program's
// -console runs it on 1,000,000), loaded once:
//
//	OUTBOX_BENCH_CONSOLE_ROWS=1000000 go -C tools test -run '^$' -bench ConsoleOverview ./internal/bench
func BenchmarkConsoleOverview(b *testing.B) {
	ctx := context.Background()
	env := bench.Env{DSN: testsvc.MySQLDSN(b)}
	rows := 100_000
	if v := os.Getenv("OUTBOX_BENCH_CONSOLE_ROWS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil {
			b.Fatalf("OUTBOX_BENCH_CONSOLE_ROWS: %v", err)
		}
		rows = n
	}
	ct, err := bench.LoadConsole(ctx, env, rows)
	if err != nil {
		b.Fatal(err)
	}
	defer ct.Drop()
	run, closeRun, err := ct.Overview(env)
	if err != nil {
		b.Fatal(err)
	}
	defer closeRun()
	var worst time.Duration
	for b.Loop() {
		start := time.Now()
		if err := run(ctx); err != nil {
			b.Fatal(err)
		}
		worst = max(worst, time.Since(start))
	}
	b.ReportMetric(float64(worst.Microseconds())/1000, "max-ms")
}
