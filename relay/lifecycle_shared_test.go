package relay_test

import (
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/go-outbox/outbox"
	"github.com/go-outbox/outbox/internal/lifecycletest"
	"github.com/go-outbox/outbox/relay"
)

// The relay has the lifecycle the publisher and the inbox's consumer have
// (outbox.TestPublisherSharesTheLifecycle, inbox.TestConsumerSharesTheLifecycle).
func TestRelaySharesTheLifecycle(t *testing.T) {
	t.Parallel()
	e := newEnv(t, newServer(t), outbox.Unordered)
	var sent atomic.Int64
	r, err := relay.New(e.dsn, okSender(&sent), e.config("relay-shared"))
	require.NoError(t, err)
	lifecycletest.Test(t, r)
}
