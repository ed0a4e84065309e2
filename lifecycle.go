package outbox

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/go-outbox/outbox/internal/every"
)

// lifecycle is a publisher's state between Start, Stop and Close, under its own mutex, which
// is never held across a store, broker or callback call:
//
//   - closed: Close was called. Start, Run, PublishPending and Reclaim refuse with ErrClosed.
//   - run: the current run, from Start until its shutdown has finished. A run still
//     stopping after a Stop whose context ended is still the current one: Start refuses
//     it with ErrAlreadyRunning, and a later Stop waits for it again.
//   - calls: the PublishPending and Reclaim calls in progress. Their contexts derive from
//     closing, which Close cancels, so that they stop claiming at Close.
//
// The sender is released (closed, when the publisher owns it) once closed is set, no run
// is current and no call is in progress, so never under a send: whoever brings that about
// releases it (Close, the end of a run, the end of a call), and Close waits for it.
type lifecycle struct {
	mu        sync.Mutex
	closed    bool
	run       *runState
	calls     int
	releasing bool
	released  chan struct{} // closed once the sender is released
	closeErr  error         // the sender's Close's; written before released is closed

	closing       context.Context
	cancelClosing context.CancelFunc
}

// runState is one run, from Start until its shutdown has finished.
type runState struct {
	cancel context.CancelFunc // stops the run
	done   chan struct{}      // closed when the run has stopped
}

func (l *lifecycle) init() {
	l.released = make(chan struct{})
	l.closing, l.cancelClosing = context.WithCancel(context.Background())
}

// errClosed is Start's (and the calls') refusal after Close.
var errClosed = fmt.Errorf("%w: the publisher was closed", ErrClosed)

// Start checks that the publisher can run and then publishes in the background until ctx is
// cancelled or [Publisher.Stop] or [Publisher.Close] is called: a scan loop that runs a
// round ([Publisher.PublishPending]) and then waits [Config.PollInterval] (fixed delay:
// rounds never overlap) or until a commit wakes it and its coalescing window
// ([Tuning.CoalesceDelay]) has passed, and beside it a reclaim loop that runs
// [Publisher.Reclaim] at once and then every [Tuning.ReclaimInterval], and, when
// [Config.Retention] is set, a retention loop that purges old SUCCESS events every
// [Tuning.RetentionInterval]. In batch mode the successes of one round are recorded by the
// next round's claim, in its transaction, or on their own if no round comes within 50 ms.
//
// Before it returns, Start refuses, and nothing runs:
//   - after Close, with [ErrClosed];
//   - while this publisher runs (or is still stopping), with [ErrAlreadyRunning];
//   - with what [Store.Check] and [Sender.Check] refuse, in one error that names each
//     problem once: a table that does not exist ([ErrNoTable]); a table that cannot serve
//     the store ([ErrInvalidConfig]; for a MySQL store: the columns and indexes it lacks,
//     with the statements that add them, key order's index and SKIPPED, the partitions
//     [MySQLConfig.PartitionIDs] asks for, a missing [MySQLConfig.RelayTable]; see
//     [MySQLStore.Check]); and the store's topics ([StoreInfo.Topics]) that the sender
//     cannot send to ([ErrInvalidConfig]).
//
// The publisher keeps no state beyond its own value, and so checks nothing across
// publishers; what they share is the caller's to keep apart:
//   - Two publishers of one table with one [Config.InstanceID] both run, and each takes
//     the other's claims for its own: when one stops, or a claim's COMMIT outcome is
//     unknown, it returns the other's events in flight to WAIT, and they are sent again
//     (duplicates, none lost). Leave InstanceID empty and each publisher has its own.
//   - Two stores under one [Config.StoreName] share its metric series and log attribute.
//   - A sender that one publisher owns (no [Config.SharedSender]) and another uses is
//     closed under the other by the owner's Close: the other's sends then fail with
//     [ErrClosed], which it treats as a broker outage (as an error marked [Unavailable]):
//     it pauses and spends no attempt, and nothing is dead-lettered.
//
// A store Start cannot reach (Check takes at most [Tuning.StoreTimeout]) is logged, not
// refused: the publisher starts, and its rounds retry. So is a broker the sender cannot ask
// about the topics, and a MySQL table without the server-side defaults other programs'
// plain INSERTs need.
//
// When it is stopped, the publisher stops claiming, lets the claim in flight finish (within
// [Tuning.StoreTimeout]: a claim cut half way would leave its outcome unknown) and the send
// in flight finish (it is bounded by the send timeout) and records its outcome, returns to WAIT every event still
// SENDING under its InstanceID (claimed and not sent), and waits for the OnDeadLetter calls
// it queued. Store errors are logged and retried on the next round; they never end the run.
// An outcome the store failed to record is recorded before the next claim. After a stop,
// Start may be called again.
func (p *Publisher) Start(ctx context.Context) error {
	_, err := p.start(ctx)
	return err
}

// Run is [Publisher.Start] and then a wait for the run to end: it returns Start's refusal,
// or nil once the publisher has stopped (ctx cancelled, [Publisher.Stop] or
// [Publisher.Close]) and its shutdown has finished. It is the blocking form, for an
// errgroup:
//
//	g.Go(func() error { return publisher.Run(ctx) })
func (p *Publisher) Run(ctx context.Context) error {
	r, err := p.start(ctx)
	if err != nil {
		return err
	}
	<-r.done
	return nil
}

func (p *Publisher) start(ctx context.Context) (*runState, error) {
	l := &p.life
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return nil, errClosed
	}
	if l.run != nil {
		l.mu.Unlock()
		return nil, fmt.Errorf("%w: this publisher was started and has not stopped (Stop waits for its shutdown)", ErrAlreadyRunning)
	}
	ctx, cancel := context.WithCancel(ctx)
	r := &runState{cancel: cancel, done: make(chan struct{})}
	l.run = r // from here a Stop or Close stops this run, even before Check has answered
	l.mu.Unlock()

	err := p.check(ctx)
	if err == nil && p.isClosed() {
		err = errClosed
	}
	if err != nil {
		cancel()
		p.ended(r)
		return nil, err
	}
	p.running.Store(true)
	p.log.InfoContext(ctx, "outbox publisher started",
		slog.Int("batch_size", p.cfg.Tuning.BatchSize),
		slog.Duration("poll_interval", p.cfg.PollInterval),
		slog.Duration("lease", p.cfg.Tuning.Lease),
		slog.Bool("key_order", p.keyOrder.Load()))
	go p.run(ctx, r)
	return r, nil
}

// run is a started publisher's goroutine: its loops, then its shutdown.
func (p *Publisher) run(ctx context.Context, r *runState) {
	stopObserving := p.m.observe(p)
	wake, unsubscribe := p.store.Subscribe()
	reclaimed := make(chan struct{}, 1) // a reclaim put events back: a round at once sends them
	var wg sync.WaitGroup
	wg.Go(func() { p.scan(ctx, wake, reclaimed) })
	wg.Go(func() {
		every.Loop(ctx, func() time.Duration {
			if n, _ := p.reclaim(ctx); n > 0 {
				select {
				case reclaimed <- struct{}{}:
				default:
				}
			}
			return p.cfg.Tuning.ReclaimInterval
		})
	})
	if p.cfg.Retention > 0 {
		wg.Go(func() {
			every.Loop(ctx, func() time.Duration {
				p.retain(ctx)
				return p.cfg.Tuning.RetentionInterval
			})
		})
	}
	wg.Wait()
	p.stop(ctx)
	if unsubscribe != nil {
		unsubscribe()
	}
	// The callbacks of this run's dead letters, queued before its loops ended, run before
	// the run counts as stopped: Stop and Close wait for them.
	p.dead.wait(context.Background(), p.dead.mark())
	stopObserving()
	r.cancel()
	p.running.Store(false)
	p.log.Info("outbox publisher stopped")
	p.ended(r)
}

// ended makes r no longer the current run, and releases the sender if that was the last
// thing Close waited for.
func (p *Publisher) ended(r *runState) {
	p.life.mu.Lock()
	if p.life.run == r {
		p.life.run = nil
	}
	p.life.mu.Unlock()
	close(r.done)
	p.releaseIfIdle()
}

func (p *Publisher) isClosed() bool {
	p.life.mu.Lock()
	defer p.life.mu.Unlock()
	return p.life.closed
}

// Stop stops the run [Publisher.Start] began and waits for its shutdown (see Start): the
// send in flight finished and recorded, the events it claimed and did not send back to
// WAIT, the OnDeadLetter calls it queued returned. If ctx ends first, Stop returns an error
// wrapping ctx.Err() that says what is left (events SENDING, callbacks queued); the
// shutdown goes on in the background, and a later Stop waits for it again. Stop is safe to
// call more than once, concurrently, and when the publisher is not running (it then returns
// nil). After Stop has returned nil, Start may be called again.
//
// Called from inside [Config.OnDeadLetter], Stop begins the stop and returns nil at once:
// the shutdown waits for the callbacks, the one Stop is called from among them, so Stop
// cannot wait for it.
func (p *Publisher) Stop(ctx context.Context) error {
	p.life.mu.Lock()
	r := p.life.run
	p.life.mu.Unlock()
	if r == nil {
		return nil
	}
	r.cancel()
	if p.dead.onDispatcher() {
		return nil
	}
	select {
	case <-r.done:
		return nil
	case <-ctx.Done():
		return p.stillStopping(ctx.Err())
	}
}

// stillStopping is Stop's error when its context ended first: what the shutdown has left.
func (p *Publisher) stillStopping(cause error) error {
	var left []string
	if n := p.held.Load(); n > 0 {
		left = append(left, fmt.Sprintf("%d events it claimed stay SENDING until the send in flight ends and they are recorded, or else until their lease (%s) expires", n, p.cfg.Tuning.Lease))
	}
	if n := p.dead.backlog(); n > 0 {
		left = append(left, fmt.Sprintf("%d OnDeadLetter calls have not returned", n))
	}
	if len(left) == 0 {
		left = append(left, "its last outcomes are being recorded")
	}
	return fmt.Errorf("outbox: the publisher is still stopping (%w): %s; it goes on stopping in the background, and Stop again waits for it",
		cause, strings.Join(left, "; "))
}

// Close stops the publisher for good: it stops the run as [Publisher.Stop] does, bounded by
// [Config.StopTimeout], makes the PublishPending and Reclaim calls in progress stop
// claiming and waits for them (within the same bound), and then closes the sender if the
// sender has a Close method and the publisher owns it (no [Config.SharedSender]), and
// returns that error; or, when the bound passed first, an error wrapping
// context.DeadlineExceeded that says what was left, the sender then being closed once
// the last of it has ended, never under a send. Once Close is called no round begins:
// Start, Run, PublishPending and Reclaim return [ErrClosed]. Close is safe to call more than
// once, concurrently, and without Start; every call waits as the first does.
//
// Called from inside [Config.OnDeadLetter], Close closes the publisher and begins its stop,
// and returns nil at once, without waiting for the callback it is called from: the shutdown
// (and the sender's Close) ends after the callback has returned.
func (p *Publisher) Close() error {
	l := &p.life
	l.mu.Lock()
	l.closed = true
	l.mu.Unlock()
	l.cancelClosing()
	if p.dead.onDispatcher() {
		_ = p.Stop(context.Background()) // begins the stop; returns at once on the dispatcher
		p.releaseIfIdle()
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), p.cfg.stopTimeout())
	defer cancel()
	if err := p.Stop(ctx); err != nil {
		return fmt.Errorf("outbox: close within StopTimeout (%s): %w; the sender is closed once the publisher has stopped", p.cfg.stopTimeout(), err)
	}
	p.releaseIfIdle()
	select {
	case <-l.released:
	case <-ctx.Done():
		l.mu.Lock()
		calls := l.calls
		l.mu.Unlock()
		return fmt.Errorf("outbox: close within StopTimeout (%s): %w: %d PublishPending or Reclaim calls are still in progress; the sender is closed once they have returned",
			p.cfg.stopTimeout(), ctx.Err(), calls)
	}
	if err := p.dead.wait(ctx, p.dead.mark()); err != nil {
		return fmt.Errorf("outbox: close within StopTimeout (%s): %w: %d OnDeadLetter calls have not returned",
			p.cfg.stopTimeout(), err, p.dead.backlog())
	}
	return l.closeErr
}

// releaseIfIdle closes the sender the publisher owns, once: when Close has been called and
// neither a run nor a call is left that could send.
func (p *Publisher) releaseIfIdle() {
	l := &p.life
	l.mu.Lock()
	idle := l.closed && l.run == nil && l.calls == 0 && !l.releasing
	if idle {
		l.releasing = true
	}
	l.mu.Unlock()
	if !idle {
		return
	}
	if c, ok := p.sender.(io.Closer); ok && !p.cfg.SharedSender {
		l.closeErr = c.Close()
	}
	close(l.released)
}

// enter begins a PublishPending or Reclaim call: refused after Close, and otherwise counted
// until exit, with a context that Close cancels as well as ctx.
func (p *Publisher) enter(ctx context.Context) (context.Context, func(), error) {
	l := &p.life
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return nil, nil, errClosed
	}
	l.calls++
	l.mu.Unlock()
	ctx, cancel := context.WithCancel(ctx)
	stop := context.AfterFunc(l.closing, cancel)
	return ctx, func() {
		stop()
		cancel()
		l.mu.Lock()
		l.calls--
		l.mu.Unlock()
		p.releaseIfIdle()
	}, nil
}
