package outbox_test

import (
	"context"
	"database/sql"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/google/uuid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/go-outbox/outbox"
	"github.com/go-outbox/outbox/internal/testsvc"
)

// storeHarness is what the conformance suite needs from a Store implementation: a fresh
// store, a way to write events through its transaction, to read a row back, and to move a
// row's times into the past (tests do not wait out leases and backoffs).
type storeHarness struct {
	new func(t *testing.T) (outbox.Store, *bundle)
}

// TestMySQLStoreConformance runs the Store contract against MySQLStore on a real server.
func TestMySQLStoreConformance(t *testing.T) {
	t.Parallel()
	storeConformance(t, storeHarness{new: func(t *testing.T) (outbox.Store, *bundle) {
		b := setup(t)
		return b.store, b
	}})
}

// storeConformance is the contract any Store must keep. Each boundary of the claim protocol
// has a case: a write under someone else's lease, or from the wrong state, changes nothing.
func storeConformance(t *testing.T, h storeHarness) {
	faultConformance(t, h)
	ctx := context.Background()
	const owner, other = "owner-a", "owner-b"

	claimed := func(t *testing.T, s outbox.Store, b *bundle) outbox.Event {
		t.Helper()
		b.insert(t, 1)
		evs, err := s.Candidates(ctx, 10)
		require.NoError(t, err)
		require.Len(t, evs, 1)
		won, err := s.Claim(ctx, evs[0], owner)
		require.NoError(t, err)
		require.True(t, won)
		return evs[0]
	}

	t.Run("CandidatesDueWaitOldestFirstLimited", func(t *testing.T) {
		t.Parallel()
		s, b := h.new(t)
		ids := b.insert(t, 6)
		// Give each a distinct age so the order is by next_retry_time, not by id.
		for i, id := range ids {
			b.exec(t, "UPDATE {t} SET next_retry_time = DATE_SUB(UTC_TIMESTAMP(3), INTERVAL ? SECOND) WHERE id = ?", 100-i*10, id)
		}
		b.exec(t, "UPDATE {t} SET status = 'SUCCESS' WHERE id = ?", ids[0])
		b.exec(t, "UPDATE {t} SET status = 'FAIL' WHERE id = ?", ids[1])
		b.exec(t, "UPDATE {t} SET status = 'SENDING', claim_owner = 'x', claimed_at = UTC_TIMESTAMP(3) WHERE id = ?", ids[2])
		b.exec(t, "UPDATE {t} SET next_retry_time = DATE_ADD(UTC_TIMESTAMP(3), INTERVAL 1 MINUTE) WHERE id = ?", ids[5])

		evs, err := s.Candidates(ctx, 10)
		require.NoError(t, err)
		got := make([]int64, len(evs))
		for i, ev := range evs {
			got[i] = ev.ID
			assert.Equal(t, outbox.StatusWait, ev.Status)
			assert.Equal(t, "ORDER_CREATED", ev.EventType)
			assert.NotEmpty(t, ev.Payload)
		}
		assert.Equal(t, []int64{ids[3], ids[4]}, got, "due WAIT rows only, oldest next_retry_time first")

		evs, err = s.Candidates(ctx, 1)
		require.NoError(t, err)
		require.Len(t, evs, 1)
		assert.Equal(t, ids[3], evs[0].ID)
	})

	// Every event a store hands out carries the event id it got at insert, unchanged by
	// claims, retries and reclaims: a resend carries the id of the first send, so that
	// consumers can recognise it.
	t.Run("EventIDKeptThroughClaimRetryAndReclaim", func(t *testing.T) {
		t.Parallel()
		s, b := h.new(t)
		id := b.insert(t, 1)[0]
		want := b.get(t, id).EventID
		require.NotEmpty(t, want)

		evs, err := s.Candidates(ctx, 1)
		require.NoError(t, err)
		require.Len(t, evs, 1)
		assert.Equal(t, want, evs[0].EventID, "candidate")
		evs, _, err = claimDue(ctx, s, owner, 1, 1<<20)
		require.NoError(t, err)
		require.Len(t, evs, 1)
		assert.Equal(t, want, evs[0].EventID, "batch claim")

		ok, err := s.ReleaseForRetry(ctx, id, owner, 1, 0, "boom")
		require.NoError(t, err)
		require.True(t, ok)
		b.makeDue(t, id)
		evs, _, err = claimDue(ctx, s, other, 1, 1<<20)
		require.NoError(t, err)
		require.Len(t, evs, 1)
		assert.Equal(t, want, evs[0].EventID, "claimed again after a retry")

		b.ageClaim(t, id, time.Hour)
		n, _, err := s.ReclaimExpired(ctx, time.Minute, 3)
		require.NoError(t, err)
		require.Equal(t, int64(1), n)
		evs, err = s.Candidates(ctx, 1)
		require.NoError(t, err)
		require.Len(t, evs, 1)
		assert.Equal(t, want, evs[0].EventID, "candidate after a reclaim")
		won, err := s.Claim(ctx, evs[0], owner)
		require.NoError(t, err)
		require.True(t, won)
		ok, err = markOne(ctx, s, id, owner)
		require.NoError(t, err)
		require.True(t, ok)
		assert.Equal(t, want, b.get(t, id).EventID, "after success")
	})

	t.Run("ClaimIsWonByExactlyOne", func(t *testing.T) {
		t.Parallel()
		s, b := h.new(t)
		b.insert(t, 1)
		evs, err := s.Candidates(ctx, 1)
		require.NoError(t, err)
		require.Len(t, evs, 1)
		var wins atomic.Int32
		var wg sync.WaitGroup
		for i := range 8 {
			wg.Go(func() {
				won, err := s.Claim(ctx, evs[0], fmt.Sprintf("owner-%d", i))
				assert.NoError(t, err)
				if won {
					wins.Add(1)
				}
			})
		}
		wg.Wait()
		assert.Equal(t, int32(1), wins.Load())
		assert.Equal(t, outbox.StatusSending, b.get(t, evs[0].ID).Status)
	})

	t.Run("ClaimRecordsOwnerAndDatabaseTime", func(t *testing.T) {
		t.Parallel()
		s, b := h.new(t)
		ev := claimed(t, s, b)
		got := b.get(t, ev.ID)
		assert.Equal(t, owner, got.ClaimOwner)
		assert.InDelta(t, 0, b.secondsFromNow(t, ev.ID, "claimed_at"), 1, "claimed_at is the database's now")
	})

	t.Run("ClaimWithStaleRetryCountLoses", func(t *testing.T) {
		t.Parallel()
		s, b := h.new(t)
		ids := b.insert(t, 1)
		evs, err := s.Candidates(ctx, 1)
		require.NoError(t, err)
		// Meanwhile another instance claims, fails and releases it, due again at once.
		won, err := s.Claim(ctx, evs[0], other)
		require.NoError(t, err)
		require.True(t, won)
		ok, err := s.ReleaseForRetry(ctx, ids[0], other, 1, 0, "boom")
		require.NoError(t, err)
		require.True(t, ok)
		b.makeDue(t, ids[0])

		won, err = s.Claim(ctx, evs[0], owner)
		require.NoError(t, err)
		assert.False(t, won, "a candidate read at retry_count 0 must not claim the row at retry_count 1")
	})

	t.Run("ClaimOfRowNotYetDueLoses", func(t *testing.T) {
		t.Parallel()
		s, b := h.new(t)
		ids := b.insert(t, 1)
		evs, err := s.Candidates(ctx, 1)
		require.NoError(t, err)
		b.exec(t, "UPDATE {t} SET next_retry_time = DATE_ADD(UTC_TIMESTAMP(3), INTERVAL 1 MINUTE) WHERE id = ?", ids[0])
		won, err := s.Claim(ctx, evs[0], owner)
		require.NoError(t, err)
		assert.False(t, won)
		assert.Equal(t, outbox.StatusWait, b.get(t, ids[0]).Status)
	})

	t.Run("MarkSuccessByOwner", func(t *testing.T) {
		t.Parallel()
		s, b := h.new(t)
		ev := claimed(t, s, b)
		ok, err := markOne(ctx, s, ev.ID, owner)
		require.NoError(t, err)
		assert.True(t, ok)
		got := b.get(t, ev.ID)
		assert.Equal(t, outbox.StatusSuccess, got.Status)
		assert.Equal(t, owner, got.ClaimOwner, "claim_owner keeps who sent it")
	})

	t.Run("MarkSuccessUnderAnotherOwnerChangesNothing", func(t *testing.T) {
		t.Parallel()
		s, b := h.new(t)
		ev := claimed(t, s, b)
		ok, err := markOne(ctx, s, ev.ID, other)
		require.NoError(t, err)
		assert.False(t, ok)
		got := b.get(t, ev.ID)
		assert.Equal(t, outbox.StatusSending, got.Status)
		assert.Equal(t, owner, got.ClaimOwner)
	})

	// Owners are compared exactly: an owner that differs only in case is someone else.
	t.Run("OwnersDifferingInCaseAreDifferent", func(t *testing.T) {
		t.Parallel()
		s, b := h.new(t)
		ev := claimed(t, s, b)
		ok, err := markOne(ctx, s, ev.ID, strings.ToUpper(owner))
		require.NoError(t, err)
		assert.False(t, ok)
		n, err := s.MarkSuccess(ctx, []int64{ev.ID}, strings.ToUpper(owner))
		require.NoError(t, err)
		assert.Zero(t, n)
		ok, err = s.ReleaseForRetry(ctx, ev.ID, strings.ToUpper(owner), 1, 0, "boom")
		require.NoError(t, err)
		assert.False(t, ok)
		assert.Equal(t, outbox.StatusSending, b.get(t, ev.ID).Status)
	})

	t.Run("MarkSuccessOfWaitRowChangesNothing", func(t *testing.T) {
		t.Parallel()
		s, b := h.new(t)
		ids := b.insert(t, 1)
		ok, err := markOne(ctx, s, ids[0], owner)
		require.NoError(t, err)
		assert.False(t, ok)
		assert.Equal(t, outbox.StatusWait, b.get(t, ids[0]).Status)
	})

	t.Run("ReleaseForRetryByOwner", func(t *testing.T) {
		t.Parallel()
		s, b := h.new(t)
		ev := claimed(t, s, b)
		ok, err := s.ReleaseForRetry(ctx, ev.ID, owner, 2, 20*time.Second, "broker busy")
		require.NoError(t, err)
		assert.True(t, ok)
		got := b.get(t, ev.ID)
		assert.Equal(t, outbox.StatusWait, got.Status)
		assert.Equal(t, 2, got.RetryCount)
		assert.Empty(t, got.ClaimOwner)
		assert.True(t, got.ClaimedAt.IsZero())
		assert.Equal(t, "broker busy", got.LastError)
		assert.InDelta(t, 20, b.secondsFromNow(t, ev.ID, "next_retry_time"), 1)
	})

	t.Run("ReleaseForRetryUnderAnotherOwnerChangesNothing", func(t *testing.T) {
		t.Parallel()
		s, b := h.new(t)
		ev := claimed(t, s, b)
		ok, err := s.ReleaseForRetry(ctx, ev.ID, other, 1, 0, "boom")
		require.NoError(t, err)
		assert.False(t, ok)
		got := b.get(t, ev.ID)
		assert.Equal(t, outbox.StatusSending, got.Status)
		assert.Equal(t, owner, got.ClaimOwner)
		assert.Equal(t, 0, got.RetryCount)
		assert.Empty(t, got.LastError)
	})

	t.Run("MarkFailByOwner", func(t *testing.T) {
		t.Parallel()
		s, b := h.new(t)
		ev := claimed(t, s, b)
		ok, err := s.MarkFail(ctx, ev.ID, owner, 4, "too many retries")
		require.NoError(t, err)
		assert.True(t, ok)
		got := b.get(t, ev.ID)
		assert.Equal(t, outbox.StatusFail, got.Status)
		assert.Equal(t, 4, got.RetryCount)
		assert.Equal(t, "too many retries", got.LastError)
	})

	t.Run("MarkFailUnderAnotherOwnerChangesNothing", func(t *testing.T) {
		t.Parallel()
		s, b := h.new(t)
		ev := claimed(t, s, b)
		ok, err := s.MarkFail(ctx, ev.ID, other, 4, "boom")
		require.NoError(t, err)
		assert.False(t, ok)
		got := b.get(t, ev.ID)
		assert.Equal(t, outbox.StatusSending, got.Status)
		assert.Equal(t, 0, got.RetryCount)
	})

	t.Run("ClaimDueTakesDueWaitRowsOldestFirst", func(t *testing.T) {
		t.Parallel()
		s, b := h.new(t)
		ids := b.insert(t, 5)
		for i, id := range ids {
			b.exec(t, "UPDATE {t} SET next_retry_time = DATE_SUB(UTC_TIMESTAMP(3), INTERVAL ? SECOND) WHERE id = ?", 100-i*10, id)
		}
		b.exec(t, "UPDATE {t} SET next_retry_time = DATE_ADD(UTC_TIMESTAMP(3), INTERVAL 1 MINUTE) WHERE id = ?", ids[4])
		b.exec(t, "UPDATE {t} SET status = 'FAIL' WHERE id = ?", ids[0])

		evs, _, err := claimDue(ctx, s, owner, 2, 1<<20)
		require.NoError(t, err)
		require.Len(t, evs, 2)
		assert.Equal(t, []int64{ids[1], ids[2]}, []int64{evs[0].ID, evs[1].ID})
		for _, ev := range evs {
			assert.Equal(t, outbox.StatusSending, ev.Status)
			assert.NotEmpty(t, ev.Payload)
			got := b.get(t, ev.ID)
			assert.Equal(t, outbox.StatusSending, got.Status)
			assert.Equal(t, owner, got.ClaimOwner)
			assert.InDelta(t, 0, b.secondsFromNow(t, ev.ID, "claimed_at"), 1)
		}
		evs, _, err = claimDue(ctx, s, other, 10, 1<<20)
		require.NoError(t, err)
		require.Len(t, evs, 1, "the FAIL row and the row not yet due are not claimed")
		assert.Equal(t, ids[3], evs[0].ID)
	})

	t.Run("ClaimDueRecordsSuccessesUnderOwnLease", func(t *testing.T) {
		t.Parallel()
		s, b := h.new(t)
		ids := b.insert(t, 4)
		mine, _, err := claimDue(ctx, s, owner, 3, 1<<20)
		require.NoError(t, err)
		require.Len(t, mine, 3)
		// The third was reclaimed and claimed by another instance meanwhile.
		b.exec(t, "UPDATE {t} SET claim_owner = ? WHERE id = ?", other, mine[2].ID)

		res, err := s.ClaimDue(ctx, outbox.ClaimRequest{Owner: owner, Limit: 10, MaxBytes: 1 << 20,
			Succeeded: []int64{mine[0].ID, mine[1].ID, mine[2].ID}})
		require.NoError(t, err)
		assert.Equal(t, int64(2), res.Succeeded, "only the rows still ours")
		require.Len(t, res.Events, 1, "and the claim took the row left")
		assert.Equal(t, ids[3], res.Events[0].ID)
		assert.Equal(t, outbox.StatusSuccess, b.get(t, mine[0].ID).Status)
		assert.Equal(t, outbox.StatusSuccess, b.get(t, mine[1].ID).Status)
		assert.Equal(t, outbox.StatusSending, b.get(t, mine[2].ID).Status, "another's lease is left alone")
		assert.Equal(t, other, b.get(t, mine[2].ID).ClaimOwner)

		// With nothing due, the successes are recorded all the same; recording one again
		// (after a claim whose outcome was unknown) counts it, as marked already.
		res, err = s.ClaimDue(ctx, outbox.ClaimRequest{Owner: owner, Limit: 10, MaxBytes: 1 << 20,
			Succeeded: []int64{mine[0].ID, res.Events[0].ID}})
		require.NoError(t, err)
		assert.Empty(t, res.Events)
		assert.Equal(t, int64(2), res.Succeeded)
		assert.Equal(t, outbox.StatusSuccess, b.get(t, ids[3]).Status)
	})

	t.Run("ConcurrentClaimDueNeverOverlaps", func(t *testing.T) {
		t.Parallel()
		s, b := h.new(t)
		ids := b.insert(t, 400)
		var mu sync.Mutex
		claimedBy := map[int64]string{}
		var wg sync.WaitGroup
		for i := range 4 {
			wg.Go(func() {
				me := fmt.Sprintf("owner-%d", i)
				for {
					evs, _, err := claimDue(ctx, s, me, 7, 1<<20)
					if !assert.NoError(t, err) || len(evs) == 0 {
						return
					}
					mu.Lock()
					for _, ev := range evs {
						if prev, dup := claimedBy[ev.ID]; dup {
							t.Errorf("event %d claimed by %s and %s", ev.ID, prev, me)
						}
						claimedBy[ev.ID] = me
					}
					mu.Unlock()
				}
			})
		}
		wg.Wait()
		assert.Len(t, claimedBy, len(ids), "every row claimed exactly once")
		for id, me := range claimedBy {
			if got := b.get(t, id); got.ClaimOwner != me {
				t.Fatalf("event %d: claim_owner %q, claimed by %q", id, got.ClaimOwner, me)
			}
		}
	})

	t.Run("MarkSuccessBatchOnlyUnderOwnLease", func(t *testing.T) {
		t.Parallel()
		s, b := h.new(t)
		b.insert(t, 3)
		mine, _, err := claimDue(ctx, s, owner, 2, 1<<20)
		require.NoError(t, err)
		theirs, _, err := claimDue(ctx, s, other, 1, 1<<20)
		require.NoError(t, err)
		n, err := s.MarkSuccess(ctx, []int64{mine[0].ID, mine[1].ID, theirs[0].ID}, owner)
		require.NoError(t, err)
		assert.Equal(t, int64(2), n)
		assert.Equal(t, outbox.StatusSuccess, b.get(t, mine[0].ID).Status)
		assert.Equal(t, outbox.StatusSuccess, b.get(t, mine[1].ID).Status)
		assert.Equal(t, outbox.StatusSending, b.get(t, theirs[0].ID).Status, "another owner's lease is left alone")
		n, err = s.MarkSuccess(ctx, nil, owner)
		require.NoError(t, err)
		assert.Zero(t, n)
	})

	t.Run("ReclaimJudgedByClaimedAtOnly", func(t *testing.T) {
		t.Parallel()
		s, b := h.new(t)
		ids := b.insert(t, 4)
		for _, id := range ids[:3] {
			evs, err := s.Candidates(ctx, 10)
			require.NoError(t, err)
			for _, ev := range evs {
				if ev.ID == id {
					won, err := s.Claim(ctx, ev, owner)
					require.NoError(t, err)
					require.True(t, won)
				}
			}
		}
		// ids[0]: fresh claim, but next_retry_time an hour old: in flight, must stay.
		b.exec(t, "UPDATE {t} SET next_retry_time = DATE_SUB(UTC_TIMESTAMP(3), INTERVAL 1 HOUR) WHERE id = ?", ids[0])
		// ids[1]: claimed 11 minutes ago: the holder is presumed dead.
		b.ageClaim(t, ids[1], 11*time.Minute)
		// ids[2]: claimed 9 minutes ago: still within its lease.
		b.ageClaim(t, ids[2], 9*time.Minute)
		// ids[3]: WAIT with an old next_retry_time: not SENDING, not a reclaim's business.
		b.exec(t, "UPDATE {t} SET next_retry_time = DATE_SUB(UTC_TIMESTAMP(3), INTERVAL 1 HOUR) WHERE id = ?", ids[3])

		n, dead, err := s.ReclaimExpired(ctx, 10*time.Minute, 3)
		require.NoError(t, err)
		assert.Equal(t, int64(1), n)
		assert.Empty(t, dead)
		assert.Equal(t, outbox.StatusSending, b.get(t, ids[0]).Status)
		got := b.get(t, ids[1])
		assert.Equal(t, outbox.StatusWait, got.Status)
		assert.Empty(t, got.ClaimOwner)
		assert.True(t, got.ClaimedAt.IsZero())
		assert.Equal(t, 0, got.RetryCount, "a reclaim is not a failed attempt")
		assert.Equal(t, 1, got.ReclaimCount, "but it is counted as a reclaim")
		assert.Equal(t, outbox.StatusSending, b.get(t, ids[2]).Status)
		assert.Equal(t, outbox.StatusWait, b.get(t, ids[3]).Status)

		// The reclaimed row is a candidate again, and the old owner can no longer ack it.
		ok, err := markOne(ctx, s, ids[1], owner)
		require.NoError(t, err)
		assert.False(t, ok)
	})
}

func TestAdminGetNotFound(t *testing.T) {
	t.Parallel()
	b := setup(t)
	_, err := b.admin().Get(context.Background(), 424242)
	require.ErrorIs(t, err, outbox.ErrNotFound)
}

// Each event gets a UUIDv7 at insert, in canonical form, different from every other, in the
// order of the inserts (so that uk_event_id grows at its end), and Get shows it.
func TestMySQLStoreEventIDIsAUUIDv7(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ids := append(b.insert(t, 50), b.insert(t, 50)...)
	seen := map[string]int64{}
	eventIDs := make([]string, len(ids))
	for i, id := range ids {
		ev := b.get(t, id)
		u, err := uuid.Parse(ev.EventID)
		require.NoError(t, err, "event %d: %q", id, ev.EventID)
		assert.Equal(t, uuid.Version(7), u.Version(), "event %d: %s", id, ev.EventID)
		assert.Equal(t, uuid.RFC4122, u.Variant(), "event %d: %s", id, ev.EventID)
		assert.Equal(t, u.String(), ev.EventID, "canonical: lowercase, with hyphens")
		if prev, dup := seen[ev.EventID]; dup {
			t.Errorf("events %d and %d share event id %s", prev, id, ev.EventID)
		}
		seen[ev.EventID] = id
		eventIDs[i] = ev.EventID
	}
	assert.True(t, slices.IsSorted(eventIDs), "event ids ascend with the inserts")
	assert.Equal(t, b.eventIDs(t)[ids[0]], eventIDs[0], "Get shows the stored id")
}

// Row ids repeat between tables and when a table is recreated; event ids never do. This is
// the case a consumer deduplicating on the row id gets wrong: the second table's events, or
// the recreated table's, look like the first one's and are dropped.
func TestMySQLStoreEventIDsNeverRepeatAcrossTablesOrRecreation(t *testing.T) {
	t.Parallel()
	a, other := setup(t), setup(t)
	ctx := context.Background()
	rowIDs := a.insert(t, 10)
	require.Equal(t, rowIDs, other.insert(t, 10), "two tables: the same row ids")
	first, second := a.eventIDs(t), other.eventIDs(t)
	for id, eid := range first {
		assert.NotContains(t, slices.Collect(maps.Values(second)), eid, "event %d", id)
	}

	// Recreated: DROP and CreateSchema, as a reset or a restore from an empty backup would.
	a.exec(t, "DROP TABLE {t}")
	require.NoError(t, a.store.CreateSchema(ctx))
	require.Equal(t, rowIDs, a.insert(t, 10), "the recreated table: the same row ids again")
	recreated := a.eventIDs(t)
	for id, eid := range recreated {
		assert.NotEqual(t, first[id], eid, "row %d got its predecessor's event id", id)
		assert.NotContains(t, slices.Collect(maps.Values(first)), eid, "row %d", id)
	}

	// uk_event_id: a row that repeats an event id, a copy say, is refused.
	_, err := a.db.Exec("INSERT INTO `"+outbox.TableForTest(a.store)+"` (event_id, biz_no, event_type, payload, next_retry_time, create_time, update_time) "+
		"SELECT event_id, biz_no, event_type, payload, next_retry_time, create_time, update_time FROM `"+outbox.TableForTest(a.store)+"` WHERE id = ?", rowIDs[0])
	var me *mysql.MySQLError
	require.ErrorAs(t, err, &me)
	assert.Equal(t, uint16(1062), me.Number, "duplicate key")
}

// A table made before event ids: CreateSchema says so at startup, and so does every
// statement that needs the column, naming the fix. docs/upgrading.md's upgrade then makes it
// usable, with an id for every row it already had.
func TestMySQLStoreTableWithoutEventIDNamesTheUpgrade(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	b.insert(t, 3)
	b.exec(t, "ALTER TABLE {t} DROP INDEX uk_event_id, DROP COLUMN event_id, DROP COLUMN reclaim_count") // the old layout

	err := b.store.CreateSchema(ctx)
	require.Error(t, err)
	t.Logf("CreateSchema: %v", err)
	assert.Contains(t, err.Error(), "no event_id or reclaim_count column")
	assert.Contains(t, err.Error(), "docs/upgrading.md")
	tx, err := b.store.BeginTx(ctx, nil)
	require.NoError(t, err)
	_, err = tx.InsertEvent(ctx, outbox.EventInput{BizNo: "ORD-1", EventType: "ORDER_CREATED", Payload: []byte("{}")})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "no event_id column")
	require.NoError(t, tx.Rollback())
	_, err = b.store.Candidates(ctx, 10)
	require.Error(t, err)
	t.Logf("Candidates: %v", err)
	assert.Contains(t, err.Error(), "docs/upgrading.md")

	// docs/upgrading.md's statements.
	b.exec(t, "ALTER TABLE {t} ADD COLUMN event_id CHAR(36) CHARACTER SET ascii COLLATE ascii_bin NULL AFTER id")
	b.exec(t, "UPDATE {t} SET event_id = UUID() WHERE event_id IS NULL")
	b.exec(t, "ALTER TABLE {t} MODIFY event_id CHAR(36) CHARACTER SET ascii COLLATE ascii_bin NOT NULL, "+
		"ADD UNIQUE KEY uk_event_id (event_id), ADD COLUMN reclaim_count INT NOT NULL DEFAULT 0 AFTER retry_count")

	require.NoError(t, b.store.CreateSchema(ctx))
	ids := append(slices.Sorted(maps.Keys(b.eventIDs(t))), b.insert(t, 1)...)
	seen := map[string]bool{}
	for _, id := range ids {
		ev := b.get(t, id)
		_, err := uuid.Parse(ev.EventID)
		require.NoError(t, err, "event %d: %q", id, ev.EventID)
		assert.False(t, seen[ev.EventID], "event %d repeats %s", id, ev.EventID)
		seen[ev.EventID] = true
	}
	assert.Len(t, seen, 4)
}

func TestMySQLStoreMissingTableNamesTheFix(t *testing.T) {
	t.Parallel()
	db := testsvc.OpenDB(t)
	store, err := outbox.NewMySQLStore(db, outbox.MySQLConfig{Table: testsvc.UniqueTable("t_missing")})
	require.NoError(t, err)
	_, err = store.Candidates(context.Background(), 1)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "CreateSchema")
}

func TestMySQLStoreCreateSchemaIsIdempotentAndIndexed(t *testing.T) {
	t.Parallel()
	b := setup(t)
	require.NoError(t, b.store.CreateSchema(context.Background()), "a second CreateSchema is a no-op")

	rows, err := b.db.Query("SELECT index_name, column_name, seq_in_index FROM information_schema.statistics "+
		"WHERE table_schema = DATABASE() AND table_name = ? ORDER BY index_name, seq_in_index", outbox.TableForTest(b.store))
	require.NoError(t, err)
	defer rows.Close()
	got := map[string][]string{}
	for rows.Next() {
		var idx, col string
		var seq int
		require.NoError(t, rows.Scan(&idx, &col, &seq))
		got[idx] = append(got[idx], col)
	}
	require.NoError(t, rows.Err())
	assert.Equal(t, []string{"status", "next_retry_time"}, got["idx_status_next_retry"])
	assert.Equal(t, []string{"status", "claimed_at"}, got["idx_status_claimed_at"])
	assert.Equal(t, []string{"event_id"}, got["uk_event_id"])
	var nonUnique int
	require.NoError(t, b.db.QueryRow("SELECT MIN(non_unique) FROM information_schema.statistics "+
		"WHERE table_schema = DATABASE() AND table_name = ? AND index_name = 'uk_event_id'", outbox.TableForTest(b.store)).Scan(&nonUnique))
	assert.Zero(t, nonUnique, "uk_event_id is unique")
	var position int
	require.NoError(t, b.db.QueryRow("SELECT ordinal_position FROM information_schema.columns "+
		"WHERE table_schema = DATABASE() AND table_name = ? AND column_name = 'event_id'", outbox.TableForTest(b.store)).Scan(&position))
	assert.Equal(t, 2, position, "event_id comes right after id")

	var precision int
	require.NoError(t, b.db.QueryRow("SELECT datetime_precision FROM information_schema.columns "+
		"WHERE table_schema = DATABASE() AND table_name = ? AND column_name = 'claimed_at'", outbox.TableForTest(b.store)).Scan(&precision))
	assert.Equal(t, 3, precision, "millisecond time columns")

	// The columns a claim writes are fixed-width and never NULL, so a claim rewrites its row
	// in place (schema.sql says why).
	columns := map[string]string{}
	rows, err = b.db.Query("SELECT column_name, column_type, is_nullable, COALESCE(collation_name, '') FROM information_schema.columns "+
		"WHERE table_schema = DATABASE() AND table_name = ? AND column_name IN ('status', 'claim_owner', 'claimed_at', 'event_id')", outbox.TableForTest(b.store))
	require.NoError(t, err)
	defer rows.Close()
	for rows.Next() {
		var name, typ, nullable, collation string
		require.NoError(t, rows.Scan(&name, &typ, &nullable, &collation))
		columns[name] = strings.ReplaceAll(typ, " ", "") + " null=" + nullable
		if name == "claim_owner" || name == "event_id" {
			columns[name] += " " + collation // status's collation is the server's default
		}
	}
	require.NoError(t, rows.Err())
	assert.Equal(t, map[string]string{
		"status":      "enum('WAIT','SENDING','SUCCESS','FAIL','SKIPPED') null=NO",
		"claim_owner": "char(64) null=NO utf8mb4_bin",
		"claimed_at":  "datetime(3) null=NO",
		// written once; ASCII, exactly 36 bytes, compared byte for byte
		"event_id": "char(36) null=NO ascii_bin",
	}, columns)
}

// claimResult is what a ClaimDue running in the background returned.
type claimResult struct {
	evs []outbox.Event
	err error
}

func claimInBackground(ctx context.Context, s outbox.Store, owner string) <-chan claimResult {
	done := make(chan claimResult, 1)
	go func() {
		evs, _, err := claimDue(ctx, s, owner, 10, 1<<20)
		done <- claimResult{evs, err}
	}()
	return done
}

// holdClaimTurn takes store's claim lock on a connection of its own, as another instance's
// claim would, and returns the function that releases it.
func holdClaimTurn(t *testing.T, b *bundle) (release func()) {
	t.Helper()
	ctx := context.Background()
	conn, err := b.db.Conn(ctx)
	require.NoError(t, err)
	var got int
	require.NoError(t, conn.QueryRowContext(ctx, "SELECT GET_LOCK("+outbox.ClaimLockNameForTest(b.store)+", 0)").Scan(&got))
	require.Equal(t, 1, got, "the claim lock is free before the test takes it")
	var once sync.Once
	release = func() {
		once.Do(func() {
			_, err := conn.ExecContext(ctx, "DO RELEASE_LOCK("+outbox.ClaimLockNameForTest(b.store)+")")
			assert.NoError(t, err)
			assert.NoError(t, conn.Close())
		})
	}
	t.Cleanup(release)
	return release
}

// claimTurnFree reports whether nobody holds store's claim lock.
func claimTurnFree(t *testing.T, db *sql.DB, store *outbox.MySQLStore) bool {
	t.Helper()
	var free int
	require.NoError(t, db.QueryRow("SELECT IS_FREE_LOCK("+outbox.ClaimLockNameForTest(store)+")").Scan(&free))
	return free == 1
}

// waitingForTurn reports whether a session is waiting in GET_LOCK for this table's claim lock.
func waitingForTurn(t *testing.T, b *bundle) bool {
	t.Helper()
	var n int
	require.NoError(t, b.db.QueryRow("SELECT COUNT(*) FROM information_schema.PROCESSLIST "+
		"WHERE INFO LIKE 'SELECT GET_LOCK(%' AND INFO LIKE CONCAT('%', ?, '%')", outbox.TableForTest(b.store)).Scan(&n))
	return n > 0
}

// Batch claims take turns: while another instance holds the turn, a claim waits (here for up
// to a minute), and it claims as soon as the turn is released. It leaves the lock free.
func TestMySQLStoreBatchClaimsTakeTurns(t *testing.T) {
	t.Parallel()
	b := setup(t)
	outbox.SetClaimTurnWaitForTest(b.store, time.Minute)
	b.insert(t, 3)
	release := holdClaimTurn(t, b)

	done := claimInBackground(context.Background(), b.store, "owner-a")
	require.Eventually(t, func() bool { return waitingForTurn(t, b) }, 10*time.Second, 10*time.Millisecond,
		"the claim waits for its turn")
	select {
	case r := <-done:
		t.Fatalf("claimed while another instance held the turn: %d events, %v", len(r.evs), r.err)
	default:
	}
	release()
	r := <-done
	require.NoError(t, r.err)
	assert.Len(t, r.evs, 3)
	assert.True(t, claimTurnFree(t, b.db, b.store), "the claim released its turn")
}

// A claim that does not get its turn in time goes ahead without it: the turn only orders
// claims, and SKIP LOCKED and the conditional UPDATE keep them correct. The store's next
// claims do not ask for the turn at all for a while, so a session that holds the lock and
// never lets go costs one wait, not one per claim.
func TestMySQLStoreBatchClaimGoesAheadAfterTheTurnWait(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ids := b.insert(t, 3)
	holdClaimTurn(t, b) // held for the whole test

	r := <-claimInBackground(context.Background(), b.store, "owner-a")
	require.NoError(t, r.err)
	require.Len(t, r.evs, 3)
	for _, id := range ids {
		got := b.get(t, id)
		assert.Equal(t, outbox.StatusSending, got.Status)
		assert.Equal(t, "owner-a", got.ClaimOwner)
	}

	// A claim that asked for the turn now would wait a minute and hit this deadline first.
	outbox.SetClaimTurnWaitForTest(b.store, time.Minute)
	b.insert(t, 2)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	r = <-claimInBackground(ctx, b.store, "owner-a")
	require.NoError(t, r.err)
	assert.Len(t, r.evs, 2)
}

// With ConcurrentClaims, a claim never asks for the turn.
func TestMySQLStoreConcurrentClaimsSkipTheTurn(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.insert(t, 3)
	store, err := outbox.NewMySQLStore(b.db, outbox.MySQLConfig{Table: outbox.TableForTest(b.store), ConcurrentClaims: true})
	require.NoError(t, err)
	outbox.SetClaimTurnWaitForTest(store, time.Minute)
	holdClaimTurn(t, b) // held for the whole test

	// A store that asked for the turn would wait a minute and hit this deadline first.
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	r := <-claimInBackground(ctx, store, "owner-a")
	require.NoError(t, r.err)
	assert.Len(t, r.evs, 3)
}

// The turn is released whatever happens after it was taken: here the SELECT fails because
// the table is missing, and the lock must not stay with the connection in the pool.
func TestMySQLStoreBatchClaimReleasesTheTurnOnError(t *testing.T) {
	t.Parallel()
	b := setup(t)
	missing, err := outbox.NewMySQLStore(b.db, outbox.MySQLConfig{Table: testsvc.UniqueTable("missing")})
	require.NoError(t, err)
	_, _, err = claimDue(context.Background(), missing, "owner-a", 10, 1<<20)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "does not exist")
	assert.True(t, claimTurnFree(t, b.db, missing), "the failed claim released its turn")
}

// A claim whose context ends while it waits for the turn returns the context's error and
// leaves nothing behind: once the holder releases it, the lock is free.
func TestMySQLStoreBatchClaimCancelledWhileWaiting(t *testing.T) {
	t.Parallel()
	b := setup(t)
	outbox.SetClaimTurnWaitForTest(b.store, time.Minute)
	ids := b.insert(t, 2)
	release := holdClaimTurn(t, b)

	ctx, cancel := context.WithCancel(context.Background())
	done := claimInBackground(ctx, b.store, "owner-a")
	require.Eventually(t, func() bool { return waitingForTurn(t, b) }, 10*time.Second, 10*time.Millisecond)
	cancel()
	r := <-done
	require.ErrorIs(t, r.err, context.Canceled)
	assert.Empty(t, r.evs)
	release()
	require.Eventually(t, func() bool { return claimTurnFree(t, b.db, b.store) }, 10*time.Second, 20*time.Millisecond,
		"no session kept the lock")
	for _, id := range ids {
		assert.Equal(t, outbox.StatusWait, b.get(t, id).Status, "the cancelled claim claimed nothing")
	}
}

// markOne marks one event SUCCESS and reports whether it changed the row.
func markOne(ctx context.Context, s outbox.Store, id int64, owner string) (bool, error) {
	n, err := s.MarkSuccess(ctx, []int64{id}, owner)
	return n == 1, err
}
