package inbox_test

import (
	"testing"

	"github.com/go-outbox/outbox/inbox"
	"github.com/go-outbox/outbox/internal/lifecycletest"
)

// The consumer has the lifecycle the publisher and the relay have
// (outbox.TestPublisherSharesTheLifecycle, relay.TestRelaySharesTheLifecycle).
func TestConsumerSharesTheLifecycle(t *testing.T) {
	t.Parallel()
	r := newConsRig(t, consRigOptions{})
	lifecycletest.Test(t, r.newConsumer(t, r.effectHandler("shared", nil), inbox.ConsumerConfig{}))
}
