package main

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-outbox/outbox"
)

// commit is an event whose Commit returned nil.
type commit struct {
	BizNo string
	At    time.Time
}

// writerResults is what the writers did. Every attempt has a biz no of its own, so a
// transaction that failed and was retried can never leave two rows with one biz no.
type writerResults struct {
	Committed []commit // Commit returned nil
	Unknown   []string // Commit returned an error: committed or not, the table says
	Aborted   []string // failed before Commit: rolled back, must not be in the table
	Errors    map[string]int
}

// writers commits events, each in its own transaction, at a steady pace that spreads
// `events` over `spread`, from `n` goroutines. A failed transaction is retried under a new
// biz no after a short pause. They stop once `events` were committed and done is closed
// (until then they go on at the same pace, so that every fault has events to recover with).
type writers struct {
	store   *outbox.MySQLStore
	tag     string // the run's biz no prefix
	n       int
	events  int
	spread  time.Duration
	payload int
	done    <-chan struct{}
	logf    func(format string, args ...any)

	committed atomic.Int64
	mu        sync.Mutex
	res       writerResults
}

func (w *writers) run(ctx context.Context) writerResults {
	w.res.Errors = map[string]int{}
	interval := w.spread / time.Duration(max(w.events, 1))
	start := time.Now()
	var ticket atomic.Int64
	var wg sync.WaitGroup
	for range w.n {
		wg.Go(func() {
			for {
				i := ticket.Add(1) - 1
				if i >= int64(w.events) {
					select {
					case <-w.done:
						return
					default:
					}
				}
				if !sleepUntil(ctx, start.Add(time.Duration(i)*interval)) {
					return
				}
				if !w.write(ctx, i) {
					return
				}
			}
		})
	}
	wg.Wait()
	return w.res
}

// write commits the event of ticket i, retrying under a new biz no until Commit returns nil;
// false if ctx ended first.
func (w *writers) write(ctx context.Context, i int64) bool {
	pause := 100 * time.Millisecond
	for attempt := 0; ; attempt++ {
		biz := fmt.Sprintf("%s-%07d-%d", w.tag, i, attempt)
		committing, err := w.tx(ctx, biz)
		if err == nil {
			w.mu.Lock()
			w.res.Committed = append(w.res.Committed, commit{BizNo: biz, At: time.Now()})
			w.mu.Unlock()
			w.committed.Add(1)
			return true
		}
		w.mu.Lock()
		if committing {
			w.res.Unknown = append(w.res.Unknown, biz)
		} else {
			w.res.Aborted = append(w.res.Aborted, biz)
		}
		key := errorKey(err)
		if w.res.Errors[key] == 0 {
			w.logf("writer: %s (retrying under a new biz no)", err)
		}
		w.res.Errors[key]++
		w.mu.Unlock()
		if !sleepFor(ctx, pause) {
			return false
		}
		pause = min(pause*2, 2*time.Second)
	}
}

// tx writes one event in one transaction. committing says the error came from Commit, whose
// outcome is then unknown.
func (w *writers) tx(ctx context.Context, biz string) (committing bool, err error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	tx, err := w.store.BeginTx(ctx, nil)
	if err != nil {
		return false, err
	}
	payload := fmt.Sprintf(`{"bizNo":"%s","pad":"`, biz)
	payload += strings.Repeat("x", max(w.payload-len(payload)-2, 0)) + `"}`
	if _, err := tx.InsertEvent(ctx, outbox.EventInput{BizNo: biz, EventType: "CHAOS_EVENT", Payload: []byte(payload)}); err != nil {
		_ = tx.Rollback()
		return false, err
	}
	if err := tx.Commit(); err != nil {
		return true, err
	}
	return false, nil
}

// errorKey groups errors for the summary: the message without numbers that change.
func errorKey(err error) string {
	s := err.Error()
	if len(s) > 120 {
		s = s[:120]
	}
	return s
}

func sleepUntil(ctx context.Context, t time.Time) bool { return sleepFor(ctx, time.Until(t)) }

func sleepFor(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-timer.C:
		return true
	}
}
