package outbox_test

import (
	"context"
	"database/sql"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/go-outbox/outbox"
	"github.com/go-outbox/outbox/internal/testsvc"
)

func TestMain(m *testing.M) {
	if os.Getenv(importProbeEnv) != "" {
		os.Exit(runImportProbe())
	}
	if os.Getenv(closeProbeEnv) != "" {
		os.Exit(runCloseProbe())
	}
	if os.Getenv(childEnv) != "" {
		os.Exit(runChild())
	}
	os.Exit(testsvc.RunWithLeakCheck(m))
}

// bundle is what most tests need: a fresh outbox table and direct access to it.
type bundle struct {
	db    *sql.DB
	store *outbox.MySQLStore
}

func setup(t *testing.T) *bundle {
	t.Helper()
	db := testsvc.OpenDB(t)
	return &bundle{db: db, store: testsvc.NewStore(t, db, outbox.MySQLConfig{})}
}

// routeTo makes b's store send the events inserted from now on to topic, its default: a
// store on the same table, made as b's was but for its routes.
func (b *bundle) routeTo(topic string, others ...string) {
	b.store = outbox.WithRoutesForTest(b.store, outbox.Routes{Topic: topic, Topics: others})
}

// insert commits n events in one transaction through the library and returns their ids.
func (b *bundle) insert(t testing.TB, n int) []int64 {
	t.Helper()
	ctx := context.Background()
	tx, err := b.store.BeginTx(ctx, nil)
	require.NoError(t, err)
	ids := make([]int64, n)
	for i := range n {
		ids[i], err = outbox.InsertForTest(ctx, tx, outbox.EventInput{
			BizNo:     fmt.Sprintf("ORD-%d", i),
			EventType: "ORDER_CREATED",
			Payload:   fmt.Appendf(nil, `{"order":%d}`, i),
		})
		require.NoError(t, err)
	}
	require.NoError(t, tx.Commit())
	return ids
}

// insertPayload commits one event with the given biz no and payload and returns its id.
func (b *bundle) insertPayload(t testing.TB, bizNo string, payload []byte) int64 {
	t.Helper()
	ctx := context.Background()
	tx, err := b.store.BeginTx(ctx, nil)
	require.NoError(t, err)
	id, err := outbox.InsertForTest(ctx, tx, outbox.EventInput{BizNo: bizNo, EventType: "ORDER_CREATED", Payload: payload})
	require.NoError(t, err)
	require.NoError(t, tx.Commit())
	return id
}

// eventIDs returns every row's event id, by row id.
func (b *bundle) eventIDs(t testing.TB) map[int64]string {
	t.Helper()
	return testsvc.EventIDs(t, b.db, outbox.TableForTest(b.store))
}

// admin returns the operator's calls on the bundle's table.
func (b *bundle) admin() *outbox.Admin { return outbox.NewAdmin(b.store) }

func (b *bundle) get(t testing.TB, id int64) outbox.Event {
	t.Helper()
	ev, err := b.admin().Get(context.Background(), id)
	require.NoError(t, err)
	return ev
}

// exec runs a statement on the bundle's table; {t} stands for the table name.
func (b *bundle) exec(t testing.TB, query string, args ...any) {
	t.Helper()
	_, err := b.db.Exec(strings.ReplaceAll(query, "{t}", "`"+outbox.TableForTest(b.store)+"`"), args...)
	require.NoError(t, err)
}

// column reads one column of the row id, as text.
func (b *bundle) column(t testing.TB, id int64, column string) string {
	t.Helper()
	var v string
	require.NoError(t, b.db.QueryRow("SELECT "+column+" FROM `"+outbox.TableForTest(b.store)+"` WHERE id = ?", id).Scan(&v))
	return v
}

// lastID is the largest id of the bundle's table.
func (b *bundle) lastID(t testing.TB) int64 {
	t.Helper()
	var id int64
	require.NoError(t, b.db.QueryRow("SELECT MAX(id) FROM `"+outbox.TableForTest(b.store)+"`").Scan(&id))
	return id
}

// makeDue makes an event due now, so that a test need not wait out a backoff.
func (b *bundle) makeDue(t testing.TB, id int64) {
	// Due now, as when its time has just come: a time further back would be behind the
	// steady claims' scan floor, as no real retry time is (see store_mysql_floor.go).
	b.exec(t, "UPDATE {t} SET next_retry_time = UTC_TIMESTAMP(3) WHERE id = ?", id)
}

// ageClaim moves an event's claimed_at d into the past.
func (b *bundle) ageClaim(t testing.TB, id int64, d time.Duration) {
	b.exec(t, "UPDATE {t} SET claimed_at = DATE_SUB(UTC_TIMESTAMP(3), INTERVAL ? MICROSECOND) WHERE id = ?", d.Microseconds(), id)
}

// secondsFromNow returns (column - the database's UTC now) in seconds, by the database clock.
func (b *bundle) secondsFromNow(t testing.TB, id int64, column string) float64 {
	t.Helper()
	var us int64
	err := b.db.QueryRow(strings.ReplaceAll(
		"SELECT TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(3), "+column+") FROM {t} WHERE id = ?",
		"{t}", "`"+outbox.TableForTest(b.store)+"`"), id).Scan(&us)
	require.NoError(t, err)
	return float64(us) / 1e6
}

func (b *bundle) countStatus(t testing.TB, status outbox.Status) int {
	t.Helper()
	var n int
	require.NoError(t, b.db.QueryRow("SELECT COUNT(*) FROM `"+outbox.TableForTest(b.store)+"` WHERE status = ?", string(status)).Scan(&n))
	return n
}

// claimModeEnv selects the claim mode the whole suite runs with: "batch" (the default) or
// "per-row". CI runs the suite once in each.
const claimModeEnv = "OUTBOX_TEST_CLAIM_MODE"

// testPerRow reports whether this run claims per row (Tuning.ClaimPerRow).
var testPerRow = func() bool {
	switch m := os.Getenv(claimModeEnv); m {
	case "", "batch":
		return false
	case "per-row":
		return true
	default:
		panic(claimModeEnv + " must be batch or per-row, not " + m)
	}
}()

// claimModeName names this run's claim mode.
func claimModeName() string {
	if testPerRow {
		return "per-row"
	}
	return "batch"
}

// fastConfig is a publisher config for tests: quick loops, a short lease, logs captured,
// and this run's claim mode.
func fastConfig(id string, logs *logSink) outbox.Config {
	return outbox.Config{
		InstanceID:   id,
		PollInterval: 5 * time.Millisecond,
		Logger:       slog.New(logs),
		Tuning: outbox.Tuning{
			ClaimPerRow:     testPerRow,
			ReclaimInterval: 50 * time.Millisecond,
			Lease:           10 * time.Second,
			SendTimeout:     time.Second,
		},
	}
}

func newPublisher(t testing.TB, store outbox.Store, sender outbox.Sender, cfg outbox.Config) *outbox.Publisher {
	t.Helper()
	p, err := outbox.NewPublisher(store, sender, cfg)
	require.NoError(t, err)
	return p
}

// recorder is a Sender that records what it was given and answers with fail(ev), one event
// at a time (as a SenderFunc does).
type recorder struct {
	mu   sync.Mutex
	sent map[int64]int
	evs  []outbox.Event
	fail func(ev outbox.Event) error
}

func newRecorder() *recorder { return &recorder{sent: map[int64]int{}} }

func (r *recorder) Send(ctx context.Context, evs []outbox.Event, keyOrder bool) []error {
	return outbox.SenderFunc(r.sendOne).Send(ctx, evs, keyOrder)
}

func (r *recorder) Info() outbox.SenderInfo { return outbox.SenderInfo{} }

func (r *recorder) Check(context.Context, []string) error { return nil }

func (r *recorder) sendOne(_ context.Context, ev outbox.Event) error {
	if r.fail != nil {
		if err := r.fail(ev); err != nil {
			return err
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.sent[ev.ID]++
	r.evs = append(r.evs, ev)
	return nil
}

func (r *recorder) count(id int64) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.sent[id]
}

// events returns what it was given, in order.
func (r *recorder) events() []outbox.Event {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.evs)
}

func (r *recorder) total() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.evs)
}

// logSink is a slog.Handler that keeps every record, to assert on levels.
type logSink struct {
	mu   sync.Mutex
	recs []slog.Record
}

func (s *logSink) Enabled(context.Context, slog.Level) bool { return true }
func (s *logSink) WithAttrs([]slog.Attr) slog.Handler       { return s }
func (s *logSink) WithGroup(string) slog.Handler            { return s }
func (s *logSink) Handle(_ context.Context, r slog.Record) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.recs = append(s.recs, r.Clone())
	return nil
}

// count returns how many records at level have a message containing msg.
func (s *logSink) count(level slog.Level, msg string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, r := range s.recs {
		if r.Level == level && strings.Contains(r.Message, msg) {
			n++
		}
	}
	return n
}

// mentioning counts the records whose message or an attribute's value contains text.
func (s *logSink) mentioning(text string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, r := range s.recs {
		found := strings.Contains(r.Message, text)
		r.Attrs(func(a slog.Attr) bool {
			found = found || strings.Contains(a.Value.String(), text)
			return !found
		})
		if found {
			n++
		}
	}
	return n
}

// atLeast counts records at level or above.
func (s *logSink) atLeast(level slog.Level) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var msgs []string
	for _, r := range s.recs {
		if r.Level >= level {
			msg := r.Message
			r.Attrs(func(a slog.Attr) bool {
				if a.Key == "error" {
					msg += ": " + a.Value.String()
				}
				return true
			})
			msgs = append(msgs, msg)
		}
	}
	return msgs
}

// hookStore wraps a real store and lets a test act at one step of the protocol, in either
// claim mode: afterCandidates runs after the per-row SELECT, or just before a batch claim
// (with no events); beforeClaim before a per-row claim, or before a batch claim (with a
// zero Event); afterClaim after each claim won (per row, or for each event of a batch).
type hookStore struct {
	outbox.Store
	afterCandidates func(ctx context.Context, evs []outbox.Event)
	beforeClaim     func(ctx context.Context, ev outbox.Event) error
	afterClaim      func(ctx context.Context, ev outbox.Event, won bool)
	beforeRelease   func(ctx context.Context, id int64) error
}

func (h *hookStore) ClaimDue(ctx context.Context, req outbox.ClaimRequest) (outbox.ClaimResult, error) {
	if h.afterCandidates != nil {
		h.afterCandidates(ctx, nil)
	}
	if h.beforeClaim != nil {
		if err := h.beforeClaim(ctx, outbox.Event{}); err != nil {
			return outbox.ClaimResult{}, err
		}
	}
	res, err := h.Store.ClaimDue(ctx, req)
	if err == nil && h.afterClaim != nil {
		for _, ev := range res.Events {
			h.afterClaim(ctx, ev, true)
		}
	}
	return res, err
}

// claimDue is a batch claim of up to limit events and maxBytes payload bytes for owner, that
// records no success.
func claimDue(ctx context.Context, s outbox.Store, owner string, limit, maxBytes int) ([]outbox.Event, bool, error) {
	res, err := s.ClaimDue(ctx, outbox.ClaimRequest{Owner: owner, Limit: limit, MaxBytes: maxBytes})
	return res.Events, res.More, err
}

func (h *hookStore) ReleaseForRetry(ctx context.Context, id int64, owner string, retryCount int, delay time.Duration, class, reason string) (bool, error) {
	if h.beforeRelease != nil {
		if err := h.beforeRelease(ctx, id); err != nil {
			return false, err
		}
	}
	return h.Store.ReleaseForRetry(ctx, id, owner, retryCount, delay, class, reason)
}

func (h *hookStore) Candidates(ctx context.Context, limit int) ([]outbox.Event, error) {
	evs, err := h.Store.Candidates(ctx, limit)
	if err == nil && h.afterCandidates != nil {
		h.afterCandidates(ctx, evs)
	}
	return evs, err
}

func (h *hookStore) Claim(ctx context.Context, ev outbox.Event, owner string) (bool, error) {
	if h.beforeClaim != nil {
		if err := h.beforeClaim(ctx, ev); err != nil {
			return false, err
		}
	}
	won, err := h.Store.Claim(ctx, ev, owner)
	if err == nil && h.afterClaim != nil {
		h.afterClaim(ctx, ev, won)
	}
	return won, err
}

// signalRounds wraps store so that the returned channel receives a signal (coalesced) each
// time a round starts its claim.
func signalRounds(store outbox.Store) (*hookStore, <-chan struct{}) {
	started := make(chan struct{}, 1)
	return &hookStore{Store: store, afterCandidates: func(context.Context, []outbox.Event) {
		select {
		case started <- struct{}{}:
		default:
		}
	}}, started
}
