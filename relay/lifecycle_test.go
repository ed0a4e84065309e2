package relay_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/go-outbox/outbox"
	"github.com/go-outbox/outbox/relay"
)

// okSender accepts every event, and counts them.
func okSender(n *atomic.Int64) outbox.Sender {
	return outbox.SenderFunc(func(context.Context, outbox.Event) error { n.Add(1); return nil })
}

// account creates user@127.0.0.1 on the env's server with grants ({account} stands for
// 'user'@'127.0.0.1', {db} for the database, {table} and {cp} for the env's tables, quoted)
// and returns its DSN on the env's database.
func (e *env) account(t *testing.T, user string, grants ...string) string {
	t.Helper()
	r := strings.NewReplacer("{account}", "'"+user+"'@'127.0.0.1'", "{db}", "`outbox_test`",
		"{table}", "`"+e.table+"`", "{cp}", "`"+e.relayTbl+"`")
	for _, q := range append([]string{"CREATE USER {account}"}, grants...) {
		_, err := e.db.Exec(r.Replace(q))
		require.NoError(t, err, r.Replace(q))
	}
	return fmt.Sprintf("%s@tcp(127.0.0.1:%d)/outbox_test", user, e.srv.Port())
}

// relayGrants are the grants the relay documents, one statement each.
var relayGrants = map[string]string{
	"SELECT on the outbox table":     "GRANT SELECT ON {db}.{table} TO {account}",
	"UPDATE on the outbox table":     "GRANT UPDATE ON {db}.{table} TO {account}",
	"SELECT on the checkpoint table": "GRANT SELECT ON {db}.{cp} TO {account}",
	"INSERT on the checkpoint table": "GRANT INSERT ON {db}.{cp} TO {account}",
	"UPDATE on the checkpoint table": "GRANT UPDATE ON {db}.{cp} TO {account}",
	"REPLICATION SLAVE":              "GRANT REPLICATION SLAVE ON *.* TO {account}",
	"BINLOG MONITOR":                 "GRANT BINLOG MONITOR ON *.* TO {account}",
}

// grantsBut returns relayGrants without the one named.
func grantsBut(missing string) []string {
	var out []string
	for name, g := range relayGrants {
		if name != missing {
			out = append(out, g)
		}
	}
	return out
}

// runs runs r.Run(ctx) on a goroutine of its own; the channel has its result.
func runs(r *relay.Relay, ctx context.Context) <-chan error {
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	return done
}

// result waits for a run's result; a run that does not end fails the test.
func result(t *testing.T, done <-chan error, what string) error {
	t.Helper()
	select {
	case err := <-done:
		return err
	case <-time.After(30 * time.Second):
		t.Fatalf("%s: Run did not return", what)
		return nil
	}
}

// A relay whose Run ended, because its context was cancelled or because it refused the
// account, runs again: the second Run relays (it used to say "Run is already running").
func TestRelayRunsAgainAfterItEnded(t *testing.T) {
	t.Parallel()
	e := newEnv(t, newServer(t), outbox.Unordered)

	t.Run("AfterItsContextEnded", func(t *testing.T) {
		var sent atomic.Int64
		r, err := relay.New(e.dsn, okSender(&sent), e.config("relay-again"))
		require.NoError(t, err)
		defer func() { require.NoError(t, r.Close()) }()
		ctx, cancel := context.WithCancel(context.Background())
		done := runs(r, ctx)
		waitLeader(t, r)
		e.insert(t, 5, byIndex("first"))
		waitFor(t, 20*time.Second, "the first events SUCCESS", func() bool { return e.statuses(t)["SUCCESS"] == 5 })
		cancel()
		require.NoError(t, result(t, done, "the cancelled run"), "a run stopped by its context returns nil")
		assert.False(t, r.Health().Leader)

		e.insert(t, 5, byIndex("second"))
		ctx, cancel = context.WithCancel(context.Background())
		defer cancel()
		done = runs(r, ctx)
		waitLeader(t, r)
		waitFor(t, 20*time.Second, "the second events SUCCESS", func() bool { return e.statuses(t)["SUCCESS"] == 10 })
		assert.Equal(t, int64(10), sent.Load())
		cancel()
		require.NoError(t, result(t, done, "the second run"))
	})

	t.Run("AfterARefusal", func(t *testing.T) {
		dsn := e.account(t, "relay_refused", grantsBut("BINLOG MONITOR")...)
		var sent atomic.Int64
		r, err := relay.New(dsn, okSender(&sent), e.config("relay-refused"))
		require.NoError(t, err)
		defer func() { require.NoError(t, r.Close()) }()
		err = result(t, runs(r, context.Background()), "the refused run")
		requireConfigError(t, err, "lacks BINLOG MONITOR")

		_, err = e.db.Exec("GRANT BINLOG MONITOR ON *.* TO 'relay_refused'@'127.0.0.1'")
		require.NoError(t, err)
		e.insert(t, 3, byIndex("after-grant"))
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		done := runs(r, ctx)
		waitLeader(t, r)
		waitFor(t, 20*time.Second, "the events SUCCESS", func() bool { return e.statuses(t)["SUCCESS"] == 13 })
		cancel()
		require.NoError(t, result(t, done, "the run after the grant"))
	})
}

func requireConfigError(t *testing.T, err error, says ...string) {
	t.Helper()
	require.Error(t, err)
	require.ErrorIs(t, err, outbox.ErrInvalidConfig)
	for _, s := range says {
		assert.Contains(t, err.Error(), s)
	}
}

// Start, Run, Stop and Close as the lifecycle says: a second Start or Run while running is
// ErrAlreadyRunning; Stop is bounded by its context, says what is left, may be called again
// and when not running; Start works again after Stop; Close may be called twice, and Start
// and Run after it return outbox.ErrClosed.
func TestRelayLifecycle(t *testing.T) {
	t.Parallel()
	e := newEnv(t, newServer(t), outbox.Unordered)
	release := make(chan struct{})
	var calls atomic.Int64
	cfg := e.config("relay-life")
	cfg.OnDeadLetter = func(context.Context, outbox.Event, error) {
		calls.Add(1)
		<-release
	}
	refuse := outbox.SenderFunc(func(context.Context, outbox.Event) error { return outbox.Permanent(errors.New("refused")) })
	r, err := relay.New(e.dsn, refuse, cfg)
	require.NoError(t, err)

	require.NoError(t, r.Stop(context.Background()), "Stop before Start")
	require.NoError(t, r.Start(context.Background()))
	require.ErrorIs(t, r.Start(context.Background()), outbox.ErrAlreadyRunning)
	require.ErrorIs(t, r.Run(context.Background()), outbox.ErrAlreadyRunning)
	waitLeader(t, r)

	// A dead letter whose OnDeadLetter does not return holds Stop: bounded, it says so.
	e.insert(t, 1, byIndex("dead"))
	waitFor(t, 20*time.Second, "OnDeadLetter called", func() bool { return calls.Load() == 1 })
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	err = r.Stop(ctx)
	cancel()
	require.ErrorIs(t, err, context.DeadlineExceeded)
	assert.Contains(t, err.Error(), "OnDeadLetter is still running")
	close(release)
	require.NoError(t, r.Stop(context.Background()), "a later Stop waits for the shutdown")
	require.NoError(t, r.Stop(context.Background()), "Stop twice")
	assert.False(t, r.Health().Leader)

	// Concurrent Starts: one runs, the others are refused.
	var wg sync.WaitGroup
	var started, refused atomic.Int64
	for range 4 {
		wg.Go(func() {
			switch err := r.Start(context.Background()); {
			case err == nil:
				started.Add(1)
			case errors.Is(err, outbox.ErrAlreadyRunning):
				refused.Add(1)
			default:
				t.Errorf("Start: %v", err)
			}
		})
	}
	wg.Wait()
	assert.Equal(t, int64(1), started.Load(), "one Start after Stop runs")
	assert.Equal(t, int64(3), refused.Load())
	waitLeader(t, r)

	require.NoError(t, r.Close())
	require.NoError(t, r.Close(), "Close twice")
	require.ErrorIs(t, r.Start(context.Background()), outbox.ErrClosed)
	require.ErrorIs(t, r.Run(context.Background()), outbox.ErrClosed)
	require.NoError(t, r.Stop(context.Background()))
	_, mode, _ := e.checkpoint(t)
	assert.Equal(t, "polling", mode, "the leader handed the table back")
}

// OnDeadLetter's calls never overlap, and Close or Stop called from inside it returns.
func TestRelayOnDeadLetterMayStopTheRelay(t *testing.T) {
	t.Parallel()
	e := newEnv(t, newServer(t), outbox.Unordered)
	refuse := outbox.SenderFunc(func(context.Context, outbox.Event) error { return outbox.Permanent(errors.New("refused")) })
	for _, how := range []string{"Close", "Stop"} {
		t.Run(how, func(t *testing.T) {
			var (
				r                  *relay.Relay
				inside, overlapped atomic.Int64
				calls              atomic.Int64
				returned           = make(chan error, 1)
			)
			cfg := e.config("relay-dl-" + how)
			cfg.OnDeadLetter = func(ctx context.Context, ev outbox.Event, cause error) {
				if inside.Add(1) > 1 {
					overlapped.Add(1)
				}
				defer inside.Add(-1)
				time.Sleep(5 * time.Millisecond) // long enough for an overlap to show
				if calls.Add(1) == 10 {
					if how == "Close" {
						returned <- r.Close()
					} else {
						returned <- r.Stop(ctx)
					}
				}
			}
			var err error
			r, err = relay.New(e.dsn, refuse, cfg)
			require.NoError(t, err)
			defer r.Close()
			require.NoError(t, r.Start(context.Background()))
			waitLeader(t, r)
			e.insert(t, 30, byIndex("dl-"+how))
			select {
			case err := <-returned:
				require.NoError(t, err, "%s from inside OnDeadLetter", how)
			case <-time.After(60 * time.Second):
				t.Fatalf("%s called from inside OnDeadLetter did not return", how)
			}
			assert.False(t, r.Health().Leader, "the relay stopped")
			require.NoError(t, r.Close(), "Close from outside waits for the calls left")
			assert.Zero(t, overlapped.Load(), "OnDeadLetter's calls overlapped")
			assert.GreaterOrEqual(t, calls.Load(), int64(10))
		})
	}
}

// Start refuses, at once and naming it, an account that lacks any of the grants the relay
// documents; with all of them it starts.
func TestRelayStartRefusesAMissingGrant(t *testing.T) {
	t.Parallel()
	e := newEnv(t, newServer(t), outbox.Unordered)
	fix := map[string][]string{
		"SELECT on the outbox table":     {"lacks SELECT on the outbox table outbox_test." + e.table, "GRANT SELECT ON `outbox_test`.`" + e.table + "` TO"},
		"UPDATE on the outbox table":     {"lacks UPDATE on the outbox table outbox_test." + e.table, "GRANT UPDATE ON `outbox_test`.`" + e.table + "` TO"},
		"SELECT on the checkpoint table": {"lacks SELECT on the checkpoint table outbox_test." + e.relayTbl, "GRANT SELECT ON `outbox_test`.`" + e.relayTbl + "` TO"},
		"INSERT on the checkpoint table": {"lacks INSERT on the checkpoint table outbox_test." + e.relayTbl, "GRANT INSERT ON `outbox_test`.`" + e.relayTbl + "` TO"},
		"UPDATE on the checkpoint table": {"lacks UPDATE on the checkpoint table outbox_test." + e.relayTbl, "GRANT UPDATE ON `outbox_test`.`" + e.relayTbl + "` TO"},
		"REPLICATION SLAVE":              {"lacks REPLICATION SLAVE", "GRANT REPLICATION SLAVE ON *.* TO"},
		"BINLOG MONITOR":                 {"lacks BINLOG MONITOR", "GRANT BINLOG MONITOR ON *.* TO"},
	}
	i := 0
	for missing := range relayGrants {
		i++
		user := fmt.Sprintf("relay_g%d", i)
		t.Run(strings.ReplaceAll(missing, " ", "_"), func(t *testing.T) {
			dsn := e.account(t, user, grantsBut(missing)...)
			r, err := relay.New(dsn, okSender(new(atomic.Int64)), e.config(user))
			require.NoError(t, err)
			defer r.Close()
			err = r.Start(context.Background())
			requireConfigError(t, err, append(fix[missing], "TO '"+user+"'@'127.0.0.1'")...)
			assert.False(t, r.Health().Leader)
		})
	}
	t.Run("AllOfThem", func(t *testing.T) {
		var grants []string
		for _, g := range relayGrants {
			grants = append(grants, g)
		}
		dsn := e.account(t, "relay_all_grants", grants...)
		var sent atomic.Int64
		r, err := relay.New(dsn, okSender(&sent), e.config("relay-all-grants"))
		require.NoError(t, err)
		require.NoError(t, r.Start(context.Background()))
		waitLeader(t, r)
		e.insert(t, 3, byIndex("granted"))
		waitFor(t, 20*time.Second, "the events SUCCESS", func() bool { return e.statuses(t)["SUCCESS"] == 3 })
		require.NoError(t, r.Close())
	})
}

// recorder keeps the records a logger receives.
type recorder struct {
	mu   sync.Mutex
	recs []slog.Record
}

func (h *recorder) Enabled(context.Context, slog.Level) bool { return true }
func (h *recorder) Handle(_ context.Context, r slog.Record) error {
	h.mu.Lock()
	h.recs = append(h.recs, r.Clone())
	h.mu.Unlock()
	return nil
}
func (h *recorder) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *recorder) WithGroup(string) slog.Handler      { return h }

// find returns the messages at level of the records that contain s.
func (h *recorder) find(level slog.Level, s string) []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []string
	for _, r := range h.recs {
		if r.Level == level && strings.Contains(r.Message, s) {
			out = append(out, r.Message)
		}
	}
	return out
}

// On a server whose binlog or InnoDB log is not synced at each commit, Start warns, naming
// the setting, what it risks and the fix, and runs; with both synced it does not warn.
func TestRelayWarnsOfUnsyncedLogs(t *testing.T) {
	t.Parallel()
	srv := newServer(t, "--sync-binlog=0", "--innodb-flush-log-at-trx-commit=2")
	e := newEnv(t, srv, outbox.Unordered)
	logs := &recorder{}
	cfg := e.config("relay-unsynced")
	cfg.Logger = slog.New(logs)
	r, err := relay.New(e.dsn, okSender(new(atomic.Int64)), cfg)
	require.NoError(t, err)
	defer r.Close()
	require.NoError(t, r.Start(context.Background()), "unsynced logs are warned of, not refused")
	sync0 := logs.find(slog.LevelWarn, "sync_binlog=0")
	require.Len(t, sync0, 1)
	assert.Contains(t, sync0[0], "set sync_binlog=1")
	flush2 := logs.find(slog.LevelWarn, "innodb_flush_log_at_trx_commit=2")
	require.Len(t, flush2, 1)
	assert.Contains(t, flush2[0], "set innodb_flush_log_at_trx_commit=1")
	assert.Contains(t, flush2[0], "already have published")
	waitLeader(t, r)
	require.NoError(t, r.Stop(context.Background()))

	_, err = e.db.Exec("SET GLOBAL innodb_flush_log_at_trx_commit = 0")
	require.NoError(t, err)
	require.NoError(t, r.Start(context.Background()))
	assert.Len(t, logs.find(slog.LevelWarn, "innodb_flush_log_at_trx_commit=0"), 1)
	require.NoError(t, r.Stop(context.Background()))

	for _, q := range []string{"SET GLOBAL sync_binlog = 1", "SET GLOBAL innodb_flush_log_at_trx_commit = 1"} {
		_, err = e.db.Exec(q)
		require.NoError(t, err)
	}
	synced := &recorder{}
	cfg.Logger = slog.New(synced)
	r2, err := relay.New(e.dsn, okSender(new(atomic.Int64)), cfg)
	require.NoError(t, err)
	defer r2.Close()
	require.NoError(t, r2.Start(context.Background()))
	assert.Empty(t, synced.find(slog.LevelWarn, "sync_binlog"))
	assert.Empty(t, synced.find(slog.LevelWarn, "innodb_flush_log_at_trx_commit"))
}

// Two relays of different tables with one ServerID would knock each other's binlog streams
// off (the server keeps one client per server id): the second is refused at Start, whatever
// its grants (the documented ones do not list the replicas), or, if the first started
// streaming after its Start, its run ends with the refusal. A standby of the same table
// with the same ServerID is not refused.
func TestRelaysOfTwoTablesRefuseOneServerID(t *testing.T) {
	t.Parallel()
	srv := newServer(t)
	a, b := newEnv(t, srv, outbox.Unordered), newEnv(t, srv, outbox.Unordered)
	var grants []string
	for _, g := range relayGrants {
		grants = append(grants, g)
	}
	// The documented grants, on both envs' tables.
	dsn := a.account(t, "relay_sid", grants...)
	for _, g := range []string{"GRANT SELECT, UPDATE ON {db}.{table} TO {account}", "GRANT SELECT, INSERT, UPDATE ON {db}.{cp} TO {account}"} {
		_, err := b.db.Exec(strings.NewReplacer("{db}", "`outbox_test`", "{table}", "`"+b.table+"`", "{cp}", "`"+b.relayTbl+"`",
			"{account}", "'relay_sid'@'127.0.0.1'").Replace(g))
		require.NoError(t, err)
	}
	cfgA, cfgB := a.config("relay-sid-a"), b.config("relay-sid-b")
	cfgA.ServerID, cfgB.ServerID = 4242, 4242

	var sentA atomic.Int64
	ra, err := relay.New(dsn, okSender(&sentA), cfgA)
	require.NoError(t, err)
	defer ra.Close()
	require.NoError(t, ra.Start(context.Background()))
	waitLeader(t, ra)

	rb, err := relay.New(dsn, okSender(new(atomic.Int64)), cfgB)
	require.NoError(t, err)
	defer rb.Close()
	err = rb.Start(context.Background())
	requireConfigError(t, err, "server id (Config.ServerID) 4242 is in use by the binlog stream of a relay of another table",
		"outbox_test."+b.table)

	// A standby of a's table with the same id starts, and stands by.
	cfgA2 := cfgA
	cfgA2.InstanceID = "relay-sid-a2"
	ra2, err := relay.New(dsn, okSender(new(atomic.Int64)), cfgA2)
	require.NoError(t, err)
	defer ra2.Close()
	require.NoError(t, ra2.Start(context.Background()), "a standby of the same table")
	assert.False(t, ra2.Health().Leader)

	// b's relay started while nothing streamed with the id, and leads only later: its run
	// ends with the refusal, and a's stream goes on.
	require.NoError(t, ra.Close())
	leader := waitLeader(t, ra2)
	require.Equal(t, ra2, leader)
	hold, err := b.db.Conn(context.Background())
	require.NoError(t, err)
	defer hold.Close()
	var got int
	require.NoError(t, hold.QueryRowContext(context.Background(), "SELECT GET_LOCK(?, 0)", "outbox-relay:outbox_test."+b.table).Scan(&got))
	require.Equal(t, 1, got, "the test holds b's leadership")
	require.NoError(t, ra2.Close())
	rb2, err := relay.New(dsn, okSender(new(atomic.Int64)), cfgB)
	require.NoError(t, err)
	defer rb2.Close()
	done := runs(rb2, context.Background())
	ra3, err := relay.New(dsn, okSender(&sentA), cfgA)
	require.NoError(t, err)
	defer ra3.Close()
	require.NoError(t, ra3.Start(context.Background()))
	waitLeader(t, ra3)
	_, err = hold.ExecContext(context.Background(), "DO RELEASE_LOCK(?)", "outbox-relay:outbox_test."+b.table)
	require.NoError(t, err)
	err = result(t, done, "b's relay")
	requireConfigError(t, err, "server id (Config.ServerID) 4242 is in use")
	assert.Contains(t, rb2.Health().LastError, "4242 is in use")

	before := sentA.Load()
	a.insert(t, 5, byIndex("after-clash"))
	waitFor(t, 20*time.Second, "a's events SUCCESS", func() bool { return a.statuses(t)["SUCCESS"] == 5 })
	assert.Equal(t, before+5, sentA.Load())
	assert.Zero(t, ra3.Stats().Handovers, "a's stream was not knocked off")
}

// Start refuses Ordering KeyOrder on a table created unordered, as the store's Check does.
func TestRelayRefusesKeyOrderOnAnUnorderedTable(t *testing.T) {
	t.Parallel()
	e := newEnv(t, newServer(t), outbox.Unordered)
	cfg := e.config("relay-order")
	cfg.Ordering = outbox.KeyOrder
	r, err := relay.New(e.dsn, okSender(new(atomic.Int64)), cfg)
	require.NoError(t, err)
	defer r.Close()
	requireConfigError(t, r.Start(context.Background()), "Config.Ordering key", "cannot serve the store", "lacks an index idx_biz_no_status")
}

// Health().Position at a term's start is the position the term resumes from, not the one
// this relay recorded in an earlier term.
func TestRelayHealthPositionAtATermsStart(t *testing.T) {
	t.Parallel()
	e := newEnv(t, newServer(t), outbox.Unordered)
	cfg := func(id string) relay.Config {
		c := e.config(id)
		c.CheckpointInterval, c.FallbackAfter = 2*time.Second, 6*time.Second
		return c
	}
	kill := func() {
		t.Helper()
		var conn sql.NullInt64
		require.NoError(t, e.db.QueryRow("SELECT IS_USED_LOCK(?)", "outbox-relay:outbox_test."+e.table).Scan(&conn))
		require.True(t, conn.Valid)
		_, err := e.db.Exec(fmt.Sprintf("KILL %d", conn.Int64))
		require.NoError(t, err)
	}
	a, err := relay.New(e.dsn, okSender(new(atomic.Int64)), cfg("relay-pos-a"))
	require.NoError(t, err)
	defer a.Close()
	require.NoError(t, a.Start(context.Background()))
	waitLeader(t, a)
	e.insert(t, 3, byIndex("a"))
	waitFor(t, 20*time.Second, "a's position recorded", func() bool {
		_, _, g := e.checkpoint(t)
		return a.Health().Position == g && e.statuses(t)["SUCCESS"] == 3
	})
	old := a.Health().Position

	b, err := relay.New(e.dsn, okSender(new(atomic.Int64)), cfg("relay-pos-b"))
	require.NoError(t, err)
	defer b.Close()
	require.NoError(t, b.Start(context.Background()))
	kill()
	waitFor(t, 30*time.Second, "b to lead", func() bool { return b.Health().Leader })
	e.insert(t, 3, byIndex("b"))
	waitFor(t, 20*time.Second, "b's position recorded", func() bool {
		_, _, g := e.checkpoint(t)
		return g != old && b.Health().Position == g && e.statuses(t)["SUCCESS"] == 6
	})
	require.NotEqual(t, old, b.Health().Position)
	epochB := b.Health().Epoch

	kill()
	var h relay.Health
	deadline := time.Now().Add(30 * time.Second)
	for {
		if h = a.Health(); h.Leader && h.Epoch > epochB {
			break
		}
		require.True(t, time.Now().Before(deadline), "a leads again")
		time.Sleep(5 * time.Millisecond)
	}
	_, _, resumed := e.checkpoint(t)
	assert.NotEqual(t, old, h.Position, "the position of a's earlier term")
	assert.Equal(t, resumed, h.Position, "the position a's term resumes from")
}

// Close is bounded by Config.StopTimeout: an OnDeadLetter that does not return holds it no
// longer, and Close says what is left; the relay's connections are closed all the same.
func TestRelayCloseIsBounded(t *testing.T) {
	t.Parallel()
	e := newEnv(t, newServer(t), outbox.Unordered)
	release := make(chan struct{})
	called := make(chan struct{}, 1)
	cfg := e.config("relay-bounded")
	cfg.StopTimeout = 300 * time.Millisecond
	cfg.OnDeadLetter = func(context.Context, outbox.Event, error) {
		called <- struct{}{}
		<-release
	}
	refuse := outbox.SenderFunc(func(context.Context, outbox.Event) error { return outbox.Permanent(errors.New("refused")) })
	r, err := relay.New(e.dsn, refuse, cfg)
	require.NoError(t, err)
	require.NoError(t, r.Start(context.Background()))
	waitLeader(t, r)
	e.insert(t, 1, byIndex("bounded"))
	select {
	case <-called:
	case <-time.After(30 * time.Second):
		t.Fatal("OnDeadLetter was not called")
	}
	err = r.Close()
	require.ErrorIs(t, err, context.DeadlineExceeded)
	assert.Contains(t, err.Error(), "OnDeadLetter is still running")
	close(release)
	require.ErrorIs(t, r.Start(context.Background()), outbox.ErrClosed)
	require.NoError(t, r.Close(), "Close again waits for the call left")
	_, mode, _ := e.checkpoint(t)
	assert.Equal(t, "polling", mode, "the leader handed the table back before the wait for OnDeadLetter")
}

// A server that cannot be reached at Start is no refusal: Start returns nil, the relay says
// why it does not lead yet, and checks again until the server answers; then it relays.
func TestRelayStartWaitsForAnUnreachableServer(t *testing.T) {
	t.Parallel()
	srv := newServer(t)
	e := newEnv(t, srv, outbox.Unordered)
	e.insert(t, 3, byIndex("before-outage"))
	srv.Stop(t)
	logs := &recorder{}
	cfg := e.config("relay-unreachable")
	cfg.Logger = slog.New(logs)
	var sent atomic.Int64
	r, err := relay.New(e.dsn, okSender(&sent), cfg)
	require.NoError(t, err)
	defer func() { require.NoError(t, r.Close()) }()
	require.NoError(t, r.Start(context.Background()), "an unreachable server is not refused")
	assert.NotEmpty(t, r.Health().LastError)
	assert.NotEmpty(t, logs.find(slog.LevelWarn, "cannot check the server yet"))
	assert.False(t, r.Health().Leader)
	srv.Start(t)
	waitLeader(t, r)
	waitFor(t, 30*time.Second, "the events SUCCESS", func() bool { return e.statuses(t)["SUCCESS"] == 3 })
	assert.Equal(t, int64(3), sent.Load())
}

// A Stop whose ctx ends while a send is in flight (a sender that does not heed its ctx) says
// what the leader leaves undone, and a later Stop waits for the shutdown; then the relay may
// start again.
func TestRelayStopSaysWhatIsLeft(t *testing.T) {
	t.Parallel()
	e := newEnv(t, newServer(t), outbox.Unordered)
	release := make(chan struct{})
	sending := make(chan struct{}, 1)
	var sent atomic.Int64
	sender := outbox.SenderFunc(func(context.Context, outbox.Event) error {
		select {
		case sending <- struct{}{}:
			<-release // the first send holds on, whatever its ctx
		default:
		}
		sent.Add(1)
		return nil
	})
	r, err := relay.New(e.dsn, sender, e.config("relay-left"))
	require.NoError(t, err)
	defer r.Close()
	require.NoError(t, r.Start(context.Background()))
	waitLeader(t, r)
	e.insert(t, 1, byIndex("held"))
	select {
	case <-sending:
	case <-time.After(30 * time.Second):
		t.Fatal("nothing sent")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	err = r.Stop(ctx)
	cancel()
	require.ErrorIs(t, err, context.DeadlineExceeded)
	assert.Contains(t, err.Error(), "the leader is still shutting down in the background")
	assert.Contains(t, err.Error(), "sent again")
	require.ErrorIs(t, r.Start(context.Background()), outbox.ErrAlreadyRunning, "the shutdown goes on")
	close(release)
	require.NoError(t, r.Stop(context.Background()))
	assert.False(t, r.Health().Leader)
	require.NoError(t, r.Start(context.Background()), "started again after Stop")
	waitLeader(t, r)
	waitFor(t, 20*time.Second, "the event SUCCESS", func() bool { return e.statuses(t)["SUCCESS"] == 1 })
	require.NoError(t, r.Close())
}
