package outbox_test

import (
	"context"
	"encoding/json"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/go-outbox/outbox"
)

// Health follows the publisher: not running, running with rounds that reach the store, a
// store that fails and recovers, a broker that is down and back, and stopped.
func TestHealth(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()

	var storeDown, brokerDown atomic.Bool
	store := &hookStore{Store: b.store, beforeClaim: func(context.Context, outbox.Event) error {
		if storeDown.Load() {
			return errors.New("database unreachable (simulated)")
		}
		return nil
	}}
	rec := newRecorder()
	rec.fail = func(outbox.Event) error {
		if brokerDown.Load() {
			return outbox.Unavailable(errors.New("connection refused (simulated)"))
		}
		return nil
	}
	cfg := fastConfig("order-1", &logSink{})
	cfg.Tuning.MaxProbeDelay = 20 * time.Millisecond
	p := newPublisher(t, failingCandidates{hookStore: store, down: &storeDown}, rec, cfg)

	h := p.Health()
	assert.Equal(t, outbox.Health{InstanceID: "order-1"}, h, "before Run: not running, no round yet")

	runCtx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() { assert.NoError(t, p.Run(runCtx)) })
	defer func() { cancel(); wg.Wait() }()
	require.Eventually(t, func() bool { return !p.Health().LastRoundOK.IsZero() }, time.Minute, 5*time.Millisecond)
	h = p.Health()
	assert.True(t, h.Running)
	assert.Empty(t, h.LastError)
	assert.False(t, h.BrokerUnavailable)

	// The store fails: the error is reported, and LastRoundOK stops moving.
	storeDown.Store(true)
	b.insert(t, 1) // something to claim, in the per-row mode
	require.Eventually(t, func() bool { return p.Health().LastError != "" }, time.Minute, 5*time.Millisecond)
	h = p.Health()
	assert.Contains(t, h.LastError, "database unreachable")
	encoded, err := json.Marshal(h)
	require.NoError(t, err)
	assert.Contains(t, string(encoded), `"LastError":"`, "the error encodes as its text, not {}")
	assert.Contains(t, string(encoded), "database unreachable")
	assert.True(t, h.LastErrorAt.After(h.LastRoundOK))
	assert.True(t, h.Running)
	okBefore := h.LastRoundOK

	// It recovers: the error is gone once a round reaches the store again.
	storeDown.Store(false)
	require.Eventually(t, func() bool { return p.Health().LastError == "" }, time.Minute, 5*time.Millisecond)
	h = p.Health()
	assert.True(t, h.LastRoundOK.After(okBefore))
	assert.True(t, h.LastErrorAt.IsZero())

	// The broker goes down: the publisher probes, and Health says so, with the time.
	brokerDown.Store(true)
	before := time.Now()
	b.insert(t, 1)
	require.Eventually(t, func() bool { return p.Health().BrokerUnavailable }, time.Minute, 5*time.Millisecond)
	h = p.Health()
	assert.False(t, h.BrokerUnavailableSince.Before(before))
	assert.Empty(t, h.LastError, "a broker outage is not a store error")
	assert.True(t, p.Health().BrokerUnavailable)

	brokerDown.Store(false)
	require.Eventually(t, func() bool { return !p.Health().BrokerUnavailable }, time.Minute, 5*time.Millisecond)
	assert.True(t, p.Health().BrokerUnavailableSince.IsZero())
	require.Eventually(t, func() bool { return b.countStatus(t, outbox.StatusSuccess) == 2 }, time.Minute, 10*time.Millisecond)

	cancel()
	wg.Wait()
	h = p.Health()
	assert.False(t, h.Running)
	assert.False(t, h.LastRoundOK.IsZero())
}

// failingCandidates makes the candidate query fail too while down, so that a store outage
// shows in either claim mode.
type failingCandidates struct {
	*hookStore
	down *atomic.Bool
}

func (f failingCandidates) Candidates(ctx context.Context, limit int) ([]outbox.Event, error) {
	if f.down.Load() {
		return nil, errors.New("database unreachable (simulated)")
	}
	return f.hookStore.Candidates(ctx, limit)
}
