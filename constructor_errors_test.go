package outbox_test

import (
	"database/sql"
	"errors"
	"mime"
	"testing"

	rmqerrors "github.com/apache/rocketmq-client-go/v2/errors"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/metric/noop"

	"github.com/go-outbox/outbox"
)

// docs/configuration.md: every error of NewMySQLStore and NewRocketMQSender wraps
// ErrInvalidConfig, with the cause that made it wrapped beside it (errors.Is reaches the
// client's and the standard library's errors). The producer that cannot start is in
// TestRocketMQSenderWhoseProducerCannotStart, against the real name server.
func TestConstructorErrorsWrapErrInvalidConfigAndTheirCause(t *testing.T) {
	t.Parallel()
	base := outbox.RocketMQConfig{NameServers: []string{"127.0.0.1:9876"}}
	for _, c := range []struct {
		name  string
		edit  func(*outbox.RocketMQConfig)
		cause error
	}{
		{"name server not an address", func(c *outbox.RocketMQConfig) { c.NameServers = []string{"not-an-address"} }, rmqerrors.ErrIllegalIP},
		{"content type's parameter", func(c *outbox.RocketMQConfig) {
			c.CloudEventsSource, c.CloudEventsContentType = "/orders", "application/json; charset"
		}, mime.ErrInvalidMediaParameter},
	} {
		cfg := base
		c.edit(&cfg)
		_, err := outbox.NewRocketMQSender(cfg)
		require.ErrorIs(t, err, outbox.ErrInvalidConfig, c.name)
		assert.ErrorIs(t, err, c.cause, "%s: the cause is wrapped, not formatted as text", c.name)
	}
	_, err := outbox.NewMySQLStore(nil, outbox.MySQLConfig{})
	assert.ErrorIs(t, err, outbox.ErrInvalidConfig, "a nil db")
}

// docs/configuration.md: NewPublisher's errors about its arguments and Config wrap
// ErrInvalidConfig; an error of the MeterProvider making the publisher's instruments is the
// provider's, wrapped, and not ErrInvalidConfig (nothing in the Config is wrong).
func TestNewPublisherInstrumentErrorIsTheProviders(t *testing.T) {
	t.Parallel()
	db, err := sql.Open("mysql", "root@tcp(127.0.0.1:1)/none")
	require.NoError(t, err)
	t.Cleanup(func() { _ = db.Close() })
	store, err := outbox.NewMySQLStore(db, outbox.MySQLConfig{})
	require.NoError(t, err)

	_, err = outbox.NewPublisher(nil, newRecorder(), outbox.Config{})
	assert.ErrorIs(t, err, outbox.ErrInvalidConfig, "a nil store")
	_, err = outbox.NewPublisher(store, newRecorder(), outbox.Config{Tuning: outbox.Tuning{BatchSize: -1}})
	assert.ErrorIs(t, err, outbox.ErrInvalidConfig, "a negative setting")

	_, err = outbox.NewPublisher(store, newRecorder(), outbox.Config{MeterProvider: failingMeterProvider{}})
	require.ErrorIs(t, err, errInstrument, "the provider's error is wrapped")
	assert.NotErrorIs(t, err, outbox.ErrInvalidConfig, "docs/configuration.md says an instrument error is not ErrInvalidConfig")
}

var errInstrument = errors.New("the meter refuses the instrument")

type failingMeterProvider struct{ noop.MeterProvider }

func (failingMeterProvider) Meter(string, ...metric.MeterOption) metric.Meter { return failingMeter{} }

type failingMeter struct{ noop.Meter }

func (failingMeter) Int64Counter(string, ...metric.Int64CounterOption) (metric.Int64Counter, error) {
	return noop.Int64Counter{}, errInstrument
}
