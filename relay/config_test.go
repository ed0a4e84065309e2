package relay_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/go-outbox/outbox"
	"github.com/go-outbox/outbox/relay"
)

// New refuses bad input with an error wrapping ErrInvalidConfig that says what is wrong,
// before it opens any connection.
func TestNewRefusesBadConfiguration(t *testing.T) {
	t.Parallel()
	ok := "root@tcp(127.0.0.1:3306)/outbox_test"
	nop := outbox.SenderFunc(nil)
	for _, tc := range []struct {
		name   string
		dsn    string
		sender outbox.Sender
		cfg    relay.Config
		says   string
	}{
		{"nil sender", ok, nil, relay.Config{}, "sender is nil"},
		{"bad DSN", "not a dsn", nop, relay.Config{}, "the DSN"},
		{"no database", "root@tcp(127.0.0.1:3306)/", nop, relay.Config{}, "names no database"},
		{"unix socket", "root@unix(/tmp/m.sock)/db", nop, relay.Config{}, "needs tcp"},
		{"table name", ok, nop, relay.Config{Table: "t-1"}, "Table"},
		{"checkpoint is the outbox", ok, nop, relay.Config{Table: "t", CheckpointTable: "t"}, "must not be the outbox table"},
		{"long instance id", ok, nop, relay.Config{InstanceID: string(make([]byte, 65))}, "at most 64"},
		{"ordering", ok, nop, relay.Config{Ordering: 9}, "unknown Ordering"},
		{"negative attempts", ok, nop, relay.Config{MaxAttempts: -1}, "MaxAttempts"},
		{"negative batch", ok, nop, relay.Config{BatchSize: -1}, "BatchSize"},
		{"short checkpoint", ok, nop, relay.Config{CheckpointInterval: 10}, "under 100ms"},
		{"short fallback", ok, nop, relay.Config{FallbackAfter: 1}, "three CheckpointIntervals"},
		{"negative stop timeout", ok, nop, relay.Config{StopTimeout: -1}, "StopTimeout"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := relay.New(tc.dsn, tc.sender, tc.cfg)
			require.ErrorIs(t, err, outbox.ErrInvalidConfig)
			assert.Contains(t, err.Error(), tc.says)
		})
	}
	r, err := relay.New(ok, nop, relay.Config{})
	require.NoError(t, err, "the defaults are valid")
	require.NoError(t, r.Close())
}
