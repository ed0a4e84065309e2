package outbox_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/go-outbox/outbox"
	"github.com/go-outbox/outbox/internal/testsvc"
)

// A dry run counts what the real purge then removes, also when rows have reached the
// catch-all partition: the real purge first splits them off into partitions ahead and
// drops those that qualify, and the dry run, which changes nothing, plans on the layout the
// split would make. With and without a limit, and with a partition ahead that holds an
// unsent row (its old sent rows are deleted in batches).
func TestPurgeDryRunCountsTheCatchAllsRows(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, c := range []struct {
		name   string
		limit  int64
		unsent int64 // an id left WAIT, or 0
		want   int64
	}{
		{name: "all", want: 4999},
		{name: "limit", limit: 3500, want: 3500},
		{name: "unsent in the catch-all", unsent: 4500, want: 4998},
	} {
		t.Run(c.name, func(t *testing.T) {
			b := newPartitioned(t, testsvc.OpenDB(t))
			b.history(t, 1, 5500, oldUpdate) // ids 3000 and up are in the catch-all partition
			if c.unsent > 0 {
				b.exec(t, "UPDATE {t} SET status = 'WAIT', next_retry_time = UTC_TIMESTAMP(3) + INTERVAL 1 DAY WHERE id = ?", c.unsent)
			}
			require.Equal(t, 2501, b.count(t, "id >= 3000"), "rows in the catch-all")
			dry, err := b.store.Purge(ctx, partAge, outbox.PurgeOptions{DryRun: true, Limit: c.limit})
			require.NoError(t, err)
			assert.Equal(t, []string{"p1000", "p2000", "p3000", "pmax"}, b.partitions(t), "the dry run changed nothing")
			assert.Equal(t, 5500, b.count(t, "TRUE"), "the dry run deleted nothing")
			n, err := b.store.Purge(ctx, partAge, outbox.PurgeOptions{Limit: c.limit})
			require.NoError(t, err)
			assert.Equal(t, c.want, n, "the real purge")
			assert.Equal(t, n, dry, "the dry run counted what the real purge removed")
			assert.Equal(t, 5500-int(n), b.count(t, "TRUE"))
		})
	}
}
