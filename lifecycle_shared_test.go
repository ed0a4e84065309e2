package outbox_test

import (
	"context"
	"testing"

	"github.com/go-outbox/outbox"
	"github.com/go-outbox/outbox/internal/lifecycletest"
)

// The publisher has the lifecycle the relay and the inbox's consumer have
// (relay.TestRelaySharesTheLifecycle, inbox.TestConsumerSharesTheLifecycle).
func TestPublisherSharesTheLifecycle(t *testing.T) {
	t.Parallel()
	b := setup(t)
	sender := outbox.SenderFunc(func(context.Context, outbox.Event) error { return nil })
	lifecycletest.Test(t, newPublisher(t, b.store, sender, fastConfig("shared-lifecycle", &logSink{})))
}
