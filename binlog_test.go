package outbox_test

import (
	"context"
	"log/slog"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/go-outbox/outbox"
	"github.com/go-outbox/outbox/internal/testsvc"
)

// The batch claim runs in READ COMMITTED, which InnoDB binlogs only as rows: on a server
// that logs statements (binlog_format = STATEMENT), its locking SELECT fails with error 1665.
// The error names the fixes; the per-row claim works there, and so does the batch claim once
// the format is MIXED.
func TestBatchClaimUnderStatementBinlogNamesTheFix(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	srv := testsvc.PrivateMySQL(t, "--log-bin", "--binlog-format=STATEMENT", "--server-id=1")
	db := srv.OpenDB(t)
	var format string
	require.NoError(t, db.QueryRow("SELECT @@GLOBAL.binlog_format").Scan(&format))
	require.Equal(t, "STATEMENT", format)
	b := &bundle{db: db, store: testsvc.NewStore(t, db, outbox.MySQLConfig{})}
	first := b.insertPayload(t, "ORD-1", []byte(`{}`))

	cfg := outbox.Config{InstanceID: "binlog", ClaimMode: outbox.ClaimBatch, Logger: slog.New(slog.DiscardHandler)}
	batch := newPublisher(t, b.store, newRecorder(), cfg)
	_, err := batch.PublishPending(ctx)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "Error 1665")
	assert.Contains(t, err.Error(), "set binlog_format to ROW (MySQL's default) or MIXED (MariaDB's), or use ClaimPerRow")
	assert.Equal(t, outbox.StatusWait, b.get(t, first).Status)

	cfg.ClaimMode = outbox.ClaimPerRow
	perRow := newPublisher(t, b.store, newRecorder(), cfg)
	stats, err := perRow.PublishPending(ctx)
	require.NoError(t, err, "the per-row claim needs no READ COMMITTED")
	assert.Equal(t, 1, stats.Sent)

	_, err = db.Exec("SET GLOBAL binlog_format = 'MIXED'")
	require.NoError(t, err)
	fresh := srv.OpenDB(t) // sessions take the global format when they connect
	b = &bundle{db: fresh, store: testsvc.NewStoreOn(t, fresh, outbox.TableForTest(b.store))}
	second := b.insertPayload(t, "ORD-2", []byte(`{}`))
	cfg.ClaimMode = outbox.ClaimBatch
	stats, err = newPublisher(t, b.store, newRecorder(), cfg).PublishPending(ctx)
	require.NoError(t, err, "with binlog_format = MIXED the batch claim works")
	assert.Equal(t, 1, stats.Sent)
	assert.Equal(t, outbox.StatusSuccess, b.get(t, second).Status)
}
