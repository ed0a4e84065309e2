package bench_test

import (
	"context"
	"log/slog"
	"os"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/go-outbox/outbox"
	"github.com/go-outbox/outbox/internal/testsvc"
	"github.com/go-outbox/outbox/tools/internal/bench"
)

// TestConsumeDatabasePath consumes pre-made messages each way on a private server, whose
// counters only the consumers move: the plain consumer costs BEGIN, INSERT, COMMIT per
// message; the inbox adds its INSERT and nothing else, unless its TxOptions name an
// isolation level, which costs the SET TRANSACTION the driver sends before every BEGIN.
func TestConsumeDatabasePath(t *testing.T) {
	env := bench.Env{DSN: testsvc.PrivateMySQL(t).DSN()}
	const n = 400
	per := map[bench.Consumer]bench.PerEvent{}
	for _, c := range bench.Consumers {
		res, err := bench.Consume{Consumer: c, Messages: n, Workers: 4}.Run(context.Background(), env)
		require.NoError(t, err, c)
		require.Equal(t, n, res.Messages)
		require.Equal(t, n, res.Effects, "%s: one effect row per message", c)
		require.Equal(t, n, res.Distinct, c)
		require.Positive(t, res.Rate(), c)
		require.Positive(t, res.PerMessage.RedoBytes, c)
		t.Logf("%s: %.0f msgs/s, %.2f statements (%s), %.0f B redo per message", c, res.Rate(), res.PerMessage.Questions, bench.Breakdown(res.PerMessage.Com), res.PerMessage.RedoBytes)
		per[c] = res.PerMessage
	}
	plain := per[bench.PlainConsumer]
	require.Equal(t, map[string]float64{"begin": 1, "insert": 1, "commit": 1}, plain.Com)
	require.Equal(t, 3.0, plain.Questions)
	for _, c := range []bench.Consumer{bench.InboxConsumer, bench.InboxReadCommittedSession} {
		require.Equal(t, map[string]float64{"begin": 1, "insert": 2, "commit": 1}, per[c].Com,
			"%s: the inbox adds one statement, its INSERT, besides BEGIN and COMMIT", c)
		require.Equal(t, 4.0, per[c].Questions, c)
	}
	require.Equal(t, map[string]float64{"set_option": 1, "begin": 1, "insert": 2, "commit": 1}, per[bench.InboxReadCommittedTx].Com,
		"an isolation level in TxOptions is a SET TRANSACTION per message")
	require.Equal(t, 5.0, per[bench.InboxReadCommittedTx].Questions)
}

// TestConsumeThroughRocketMQ publishes a few hundred events and consumes them each way: every
// event's effect is committed once.
func TestConsumeThroughRocketMQ(t *testing.T) {
	outbox.RouteRocketMQClientLogs(slog.New(slog.DiscardHandler))
	ns := testsvc.RocketMQNameServer(t)
	env := bench.Env{DSN: testsvc.MySQLDSN(t)}
	broker := os.Getenv(testsvc.RocketMQBrokerEnv)
	if broker == "" {
		broker = "127.0.0.1:10911"
	}
	ctx := context.Background()
	topic, err := bench.NewTopic(ctx, []string{ns}, broker, 300)
	require.NoError(t, err)
	t.Cleanup(topic.Delete)
	for _, c := range []bench.Consumer{bench.PlainConsumer, bench.InboxConsumer} {
		res, err := bench.Consume{Consumer: c, Workers: 4, Topic: topic}.Run(ctx, env)
		require.NoError(t, err, c)
		require.Equal(t, 300, res.Messages)
		require.Equal(t, 300, res.Effects, "%s: one effect row per message", c)
		require.Equal(t, 300, res.Distinct, c)
		require.Zero(t, res.Errors, c)
		require.Positive(t, res.FlowingRate(), c)
		require.GreaterOrEqual(t, res.Elapsed, res.Flowing, c)
	}
}

// BenchmarkPlainHandle and BenchmarkInboxHandle consume 2,000 pre-made messages per op with
// 8 goroutines, the handler in a transaction of its own and through inbox.Handle, and report
// messages/s and the server's statements per message (its global counters: exact on a
// server nothing else uses):
//
//	OUTBOX_TEST_MYSQL_DSN=... go -C tools test -run '^$' -bench 'PlainHandle|InboxHandle' ./internal/bench
func BenchmarkPlainHandle(b *testing.B) { benchmarkHandle(b, bench.PlainConsumer) }

func BenchmarkInboxHandle(b *testing.B) { benchmarkHandle(b, bench.InboxConsumer) }

func benchmarkHandle(b *testing.B, c bench.Consumer) {
	env := bench.Env{DSN: testsvc.MySQLDSN(b)}
	const n = 2000
	var secs, stmts, redo float64
	runs := 0
	for b.Loop() {
		res, err := bench.Consume{Consumer: c, Messages: n, Workers: 8}.Run(context.Background(), env)
		if err != nil {
			b.Fatal(err)
		}
		secs += res.Elapsed.Seconds()
		stmts += res.PerMessage.Questions
		redo += res.PerMessage.RedoBytes
		runs++
	}
	b.ReportMetric(float64(n*runs)/secs, "msgs/s")
	b.ReportMetric(stmts/float64(runs), "stmts/msg")
	b.ReportMetric(redo/float64(runs), "redo-B/msg")
}
