package outbox_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/go-outbox/outbox"
	"github.com/go-outbox/outbox/internal/testsvc"
)

// RocketMQSender.Check asks the name servers. Where the cluster creates topics on demand
// (its brokers route TBW102, as the test brokers do) every topic can be sent to, one that
// exists on no broker yet too. A name server that does not answer is no refusal: the error
// does not wrap ErrInvalidConfig, so the publisher logs it and starts.
func TestRocketMQSenderCheck(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := plainSender(t)
	topic := testsvc.NewTopic(t, "OUTBOX_CHECK")
	assert.NoError(t, s.Check(ctx, []string{topic, testsvc.UniqueTable("OUTBOX_CHECK_NONE")}))
	assert.NoError(t, s.Check(ctx, nil), "nothing to ask")

	silent, err := outbox.NewRocketMQSender(outbox.RocketMQConfig{
		NameServers: []string{"127.0.0.1:1"}, // nothing listens there
		GroupName:   testsvc.UniqueTable("pg"),
		SendTimeout: 300 * time.Millisecond,
	})
	require.NoError(t, err)
	t.Cleanup(func() { _ = silent.Close() })
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	err = silent.Check(cctx, []string{topic})
	t.Logf("no name server: %v", err)
	require.Error(t, err)
	assert.NotErrorIs(t, err, outbox.ErrInvalidConfig, "a name server that does not answer refuses nothing")
}
