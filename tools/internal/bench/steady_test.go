package bench_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/go-outbox/outbox/internal/testsvc"
	"github.com/go-outbox/outbox/tools/internal/bench"
)

// TestSteady runs a short steady state with three instances, eager and coalescing: every
// committed event is sent (Run fails otherwise), and the server's counters saw the writers'
// statements and claim transactions.
func TestSteady(t *testing.T) {
	env := bench.Env{DSN: testsvc.MySQLDSN(t)}
	for _, eager := range []bool{true, false} {
		res, err := bench.Steady{Rate: 200, Instances: 3, Duration: time.Second, Eager: eager}.Run(context.Background(), env)
		require.NoError(t, err)
		require.Positive(t, res.Committed)
		require.Len(t, res.Latency, res.Committed, "every committed event has a commit-to-send time")
		require.Positive(t, res.Batches, "the publishers claimed and sent")
		require.LessOrEqual(t, res.Batches, int64(res.Committed))
		require.GreaterOrEqual(t, res.Writer.Questions, 3.0, "a writer transaction is at least BEGIN, INSERT, COMMIT")
		require.Zero(t, res.Errors)
	}
}

// TestService runs the service view briefly: orders are committed alone and with each way of
// publishing, and with the publishers, as with each reference relay, every event is sent.
func TestService(t *testing.T) {
	env := bench.Env{DSN: testsvc.MySQLDSN(t)}
	res, err := bench.Service{Writers: 4, Instances: 3, Duration: 500 * time.Millisecond, References: true}.Run(context.Background(), env)
	require.NoError(t, err)
	require.Positive(t, res.AloneOrders())
	binlog, err := bench.ReadBinlogSettings(context.Background(), env)
	require.NoError(t, err)
	require.Contains(t, []string{"ROW", "MIXED", "STATEMENT"}, binlog.Format)
	for _, p := range []bench.SteadyResult{res.Eager, res.Coalescing, res.ReadOnly, res.OneWrite, res.TwoWrites} {
		require.Positive(t, p.Committed)
		require.Positive(t, p.Writer.RedoBytes, "a writer transaction writes redo")
		if binlog.On {
			require.Positive(t, p.Writer.BinlogBytes, "a writer transaction is logged")
		} else {
			require.LessOrEqual(t, p.Writer.BinlogBytes, 0.0, "nothing is logged with the binary log off (MariaDB: 0; MySQL: unknown)")
		}
		require.Len(t, p.Latency, p.Committed, "every order's event was sent")
		require.Positive(t, p.Batches)
		require.Zero(t, p.Errors, p.FirstError)
	}
}

// TestServicePaired keeps the ways named and measures the writers alone before each: the
// ways not named are not run, and each that is has its own writers-alone rate to be costed
// against. An unknown way is refused by name.
func TestServicePaired(t *testing.T) {
	env := bench.Env{DSN: testsvc.MySQLDSN(t)}
	res, err := bench.Service{Writers: 2, Instances: 2, Duration: 300 * time.Millisecond, References: true,
		Ways: []string{"coalescing", "readonly"}, Paired: true}.Run(context.Background(), env)
	require.NoError(t, err)
	for _, p := range []bench.SteadyResult{res.Coalescing, res.ReadOnly} {
		require.Positive(t, p.Committed)
		require.Positive(t, p.AloneRate, "the writers alone were measured before the way")
		require.InDelta(t, 100*(1-p.Rate()/p.AloneRate), res.CostPercent(p), 1e-9, "costed against its own")
	}
	require.Zero(t, res.Eager.Committed, "a way not named does not run")
	require.Zero(t, res.OneWrite.Committed)

	_, err = bench.Service{Writers: 1, Instances: 1, Duration: time.Millisecond, Ways: []string{"relays"}}.Run(context.Background(), env)
	require.ErrorContains(t, err, `unknown way "relays"`)
	_, err = bench.Service{Writers: 1, Instances: 1, Duration: time.Millisecond, Ways: []string{"relay"}}.Run(context.Background(), env)
	require.ErrorContains(t, err, "none of the ways relay runs here")
}

// TestWritePath measures every variant briefly: each committed orders, on a table without
// the index it names.
func TestWritePath(t *testing.T) {
	env := bench.Env{DSN: testsvc.MySQLDSN(t)}
	vs, err := bench.WritePath{Writers: 2, Duration: 200 * time.Millisecond, Rounds: 2, Prefill: 3000}.Run(context.Background(), env)
	require.NoError(t, err)
	require.Len(t, vs, 2+len(bench.SecondaryIndexes))
	for _, v := range vs {
		require.Len(t, v.Rounds, 2, v.Name)
		for _, r := range v.Rounds {
			require.Positive(t, r.Committed, v.Name)
		}
	}
}
