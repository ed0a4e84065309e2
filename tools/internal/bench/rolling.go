package bench

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-outbox/outbox"
)

// RestartKind is how a rolling deploy replaces each publisher.
type RestartKind int

const (
	// NoRestart runs the publishers steadily: the baseline.
	NoRestart RestartKind = iota
	// RestartByClose closes each publisher in turn (Publisher.Close) and starts a new one
	// in its place, as a rolling deploy does.
	RestartByClose
	// RestartByKill stops each publisher in turn without Close, as a killed process does:
	// from that moment its store calls and sends fail, so that what it claimed stays
	// SENDING until the lease expires and another publisher reclaims it; a new one starts
	// in its place.
	RestartByKill
)

func (k RestartKind) String() string {
	switch k {
	case RestartByClose:
		return "rolling restart, Close"
	case RestartByKill:
		return "rolling restart, kill"
	}
	return "steady, no restart"
}

// Rolling is a rolling deploy of Instances publishers (batch claims, the no-op sender)
// under a steady load of Rate commits a second, one event each, spread over the running
// publishers' stores (each commit wakes its own publisher): Settle of load, then each
// publisher replaced in turn as Restart says, Settle apart, then Settle more.
type Rolling struct {
	Instances int
	Rate      int
	Settle    time.Duration
	Lease     time.Duration // Tuning.Lease; Tuning.ReclaimInterval is a quarter of it
	Restart   RestartKind
}

// RollingResult is what a rolling deploy's events went through.
type RollingResult struct {
	Events   int
	Restarts int
	// MaxGap is the longest time between two consecutive first sends of any events: the
	// longest the whole fleet published nothing.
	MaxGap time.Duration
	// Latency holds every event's time from just before its commit to its first send,
	// sorted.
	Latency []time.Duration
	// Resent counts events sent more than once.
	Resent int
	// LoadElapsed is how long the load committed: Events / LoadElapsed is its rate.
	LoadElapsed time.Duration
	// LeftSending counts the rows a Close left SENDING under the closed publisher's id.
	LeftSending int
	// Loud counts the warn and error records of the publishers that were not killed.
	Loud int
	// FirstLoud is the first of them.
	FirstLoud string
}

// countLoud adds the warn and error records of a publisher that was not killed.
func (r *RollingResult) countLoud(c *loudCounter) {
	r.Loud += int(c.n.Load())
	if r.FirstLoud == "" {
		c.mu.Lock()
		r.FirstLoud = c.first
		c.mu.Unlock()
	}
}

// Quantile returns the q-quantile of Latency (0 < q <= 1).
func (r RollingResult) Quantile(q float64) time.Duration {
	return LatencyResult{Sorted: r.Latency}.Quantile(q)
}

// errKilled is what a killed publisher's store and sender answer.
var errKilled = errors.New("bench: the process was killed")

// killable is a publisher's store that fails every call once killed.
type killable struct {
	outbox.Store
	killed *atomic.Bool
}

func (k killable) dead() error {
	if k.killed.Load() {
		return errKilled
	}
	return nil
}

func (k killable) Check(ctx context.Context) (outbox.StoreInfo, error) {
	if err := k.dead(); err != nil {
		return outbox.StoreInfo{}, err
	}
	return k.Store.Check(ctx)
}

func (k killable) ClaimDue(ctx context.Context, req outbox.ClaimRequest) (outbox.ClaimResult, error) {
	if err := k.dead(); err != nil {
		return outbox.ClaimResult{}, err
	}
	return k.Store.ClaimDue(ctx, req)
}

func (k killable) Candidates(ctx context.Context, limit int) ([]outbox.Event, error) {
	if err := k.dead(); err != nil {
		return nil, err
	}
	return k.Store.Candidates(ctx, limit)
}

func (k killable) Claim(ctx context.Context, ev outbox.Event, owner string) (bool, error) {
	if err := k.dead(); err != nil {
		return false, err
	}
	return k.Store.Claim(ctx, ev, owner)
}

func (k killable) MarkSuccess(ctx context.Context, ids []int64, owner string) (int64, error) {
	if err := k.dead(); err != nil {
		return 0, err
	}
	return k.Store.MarkSuccess(ctx, ids, owner)
}

func (k killable) ReleaseForRetry(ctx context.Context, id int64, owner string, retryCount int, delay time.Duration, class, reason string) (bool, error) {
	if err := k.dead(); err != nil {
		return false, err
	}
	return k.Store.ReleaseForRetry(ctx, id, owner, retryCount, delay, class, reason)
}

func (k killable) MarkFail(ctx context.Context, id int64, owner string, retryCount int, class, reason string) ([]outbox.Failure, bool, error) {
	if err := k.dead(); err != nil {
		return nil, false, err
	}
	return k.Store.MarkFail(ctx, id, owner, retryCount, class, reason)
}

func (k killable) ReclaimExpired(ctx context.Context, lease time.Duration, maxReclaims int) (int64, []outbox.Event, error) {
	if err := k.dead(); err != nil {
		return 0, nil, err
	}
	return k.Store.ReclaimExpired(ctx, lease, maxReclaims)
}

func (k killable) ReleaseOwned(ctx context.Context, owner, reason string) (int64, error) {
	if err := k.dead(); err != nil {
		return 0, err
	}
	return k.Store.ReleaseOwned(ctx, owner, reason)
}

func (k killable) Purge(ctx context.Context, olderThan time.Duration, opts outbox.PurgeOptions) (int64, error) {
	if err := k.dead(); err != nil {
		return 0, err
	}
	return k.Store.Purge(ctx, olderThan, opts)
}

// loudCounter counts warn and error records and keeps the first.
type loudCounter struct {
	n     atomic.Int64
	mu    sync.Mutex
	first string
}

func (c *loudCounter) Enabled(_ context.Context, l slog.Level) bool { return l >= slog.LevelWarn }
func (c *loudCounter) WithAttrs([]slog.Attr) slog.Handler           { return c }
func (c *loudCounter) WithGroup(string) slog.Handler                { return c }
func (c *loudCounter) Handle(_ context.Context, r slog.Record) error {
	if c.n.Add(1) == 1 {
		s := r.Message
		r.Attrs(func(a slog.Attr) bool { s += fmt.Sprintf(" %s=%v", a.Key, a.Value); return true })
		c.mu.Lock()
		c.first = s
		c.mu.Unlock()
	}
	return nil
}

// rollingWriters is how many goroutines commit a rolling deploy's load.
const rollingWriters = 4

// rollingInstance is one publisher of a rolling deploy, with its own pool.
type rollingInstance struct {
	id     string
	store  *outbox.MySQLStore
	pub    *outbox.Publisher
	killed *atomic.Bool
	logs   *loudCounter
	close  func()
}

// Run runs the deploy and reports what its events went through.
func (r Rolling) Run(ctx context.Context, env Env) (RollingResult, error) {
	var res RollingResult
	t, err := newTable(ctx, env)
	if err != nil {
		return res, err
	}
	defer t.drop()

	var mu sync.Mutex
	sentAt := map[string]time.Time{} // first send, by event id
	sends := map[string]int{}
	record := func(_ context.Context, ev outbox.Event) error {
		now := time.Now()
		mu.Lock()
		defer mu.Unlock()
		if _, ok := sentAt[ev.EventID]; !ok {
			sentAt[ev.EventID] = now
		}
		sends[ev.EventID]++
		return nil
	}
	var seq atomic.Int64
	start := func() (*rollingInstance, error) {
		db, err := env.open()
		if err != nil {
			return nil, err
		}
		store, err := outbox.NewMySQLStore(db, outbox.MySQLConfig{Table: t.name})
		if err != nil {
			_ = db.Close()
			return nil, err
		}
		in := &rollingInstance{id: fmt.Sprintf("roll-%d", seq.Add(1)), store: store, killed: &atomic.Bool{}, logs: &loudCounter{}}
		killed := in.killed
		sender := outbox.SenderFunc(func(ctx context.Context, ev outbox.Event) error {
			if killed.Load() {
				return errKilled
			}
			return record(ctx, ev)
		})
		in.pub, err = outbox.NewPublisher(killable{benchStore{store}, killed}, sender, outbox.Config{
			InstanceID: in.id,
			Logger:     slog.New(in.logs),
			Tuning: outbox.Tuning{
				Lease:           r.Lease,
				ReclaimInterval: r.Lease / 4,
				SendTimeout:     r.Lease / 10,
			},
		})
		if err == nil {
			err = in.pub.Start(ctx)
		}
		if err != nil {
			_ = db.Close()
			return nil, err
		}
		in.close = func() { _ = in.pub.Close(); _ = db.Close() }
		return in, nil
	}

	var live atomic.Pointer[[]*rollingInstance] // the publishers the writers commit through
	var all []*rollingInstance
	for range r.Instances {
		in, err := start()
		if err != nil {
			for _, in := range all {
				in.close()
			}
			return res, err
		}
		all = append(all, in)
	}
	live.Store(new(slices.Clone(all)))
	var zombies sync.WaitGroup // the killed publishers' Close
	defer func() {
		for _, in := range all {
			in.close()
		}
		zombies.Wait()
	}()

	// The load: Rate commits a second over rollingWriters writers (a commit waits for its
	// fsync), round robin over the live publishers' stores. The first error ends the run.
	committedAt := map[string]time.Time{}
	loadDone := make(chan error, 1)
	stopLoad := make(chan struct{})
	var writers sync.WaitGroup
	for w := range rollingWriters {
		writers.Go(func() {
			tick := time.NewTicker(time.Second * rollingWriters / time.Duration(r.Rate))
			defer tick.Stop()
			for i := w; ; i += rollingWriters {
				select {
				case <-stopLoad:
					return
				case <-tick.C:
				}
				ins := *live.Load()
				id, at, err := commitOne(ctx, ins[i%len(ins)].store, i, true)
				if err != nil {
					select {
					case loadDone <- err:
					default:
					}
					return
				}
				mu.Lock()
				committedAt[id] = at
				mu.Unlock()
			}
		})
	}

	loadStart := time.Now()
	pause := func() error {
		select {
		case err := <-loadDone:
			return fmt.Errorf("load: %w", err)
		case <-time.After(r.Settle):
			return nil
		}
	}
	if err := pause(); err != nil {
		return res, err
	}
	if r.Restart != NoRestart {
		for k := range r.Instances {
			old := all[k]
			rest := slices.DeleteFunc(slices.Clone(*live.Load()), func(in *rollingInstance) bool { return in == old })
			live.Store(&rest) // its writers go to the others, as a load balancer does
			if r.Restart == RestartByKill {
				old.killed.Store(true)
				zombies.Go(old.close) // it answers nothing from now on; its Close only ends its goroutines
			} else {
				old.close()
				var n int
				if err := t.db.QueryRowContext(ctx, "SELECT COUNT(*) FROM `"+t.name+"` WHERE status = 'SENDING' AND claim_owner = ?", old.id).Scan(&n); err != nil {
					return res, err
				}
				res.LeftSending += n
			}
			in, err := start()
			if err != nil {
				return res, err
			}
			all[k] = in
			res.Restarts++
			if !old.killed.Load() { // a killed process's own records are no part of it
				res.countLoud(old.logs)
			}
			live.Store(new(append(slices.Clone(*live.Load()), in)))
			if err := pause(); err != nil {
				return res, err
			}
		}
	}
	close(stopLoad)
	res.LoadElapsed = time.Since(loadStart)
	writers.Wait()
	select {
	case err := <-loadDone:
		return res, fmt.Errorf("load: %w", err)
	default:
	}

	mu.Lock()
	want := len(committedAt)
	mu.Unlock()
	deadline := time.Now().Add(2*r.Lease + 30*time.Second)
	for {
		mu.Lock()
		n := 0
		for id := range committedAt {
			if _, ok := sentAt[id]; ok {
				n++
			}
		}
		mu.Unlock()
		if n == want {
			break
		}
		if time.Now().After(deadline) {
			return res, fmt.Errorf("rolling: %d of %d events sent", n, want)
		}
		time.Sleep(20 * time.Millisecond)
	}
	for _, in := range all {
		in.close()
		res.countLoud(in.logs)
	}
	all = nil
	zombies.Wait()

	mu.Lock()
	defer mu.Unlock()
	res.Events = want
	firsts := make([]time.Time, 0, len(sentAt))
	for id, c := range committedAt {
		s := sentAt[id]
		res.Latency = append(res.Latency, s.Sub(c))
		firsts = append(firsts, s)
		if sends[id] > 1 {
			res.Resent++
		}
	}
	slices.Sort(res.Latency)
	slices.SortFunc(firsts, func(a, b time.Time) int { return a.Compare(b) })
	for i := 1; i < len(firsts); i++ {
		res.MaxGap = max(res.MaxGap, firsts[i].Sub(firsts[i-1]))
	}
	return res, nil
}
