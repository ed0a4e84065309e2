package outbox_test

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/go-outbox/outbox"
)

// faultConformance is the part of the Store contract that keeps the guarantee under faults:
// bounded claims, reclaimed events claimed alone and dead-lettered past MaxReclaims, and an
// owner releasing only its own rows.
func faultConformance(t *testing.T, h storeHarness) {
	ctx := context.Background()
	const owner, other = "owner-a", "owner-b"

	t.Run("ClaimDueBoundsPayloadBytes", func(t *testing.T) {
		t.Parallel()
		s, b := h.new(t)
		const size = 300 << 10
		var ids []int64
		for i := range 6 {
			ids = append(ids, b.insertPayload(t, "ORD-B", bytes.Repeat([]byte{byte('a' + i)}, size)))
		}
		evs, more, err := claimDue(ctx, s, owner, 100, 1<<20)
		require.NoError(t, err)
		require.Len(t, evs, 3, "three 300 KiB payloads fit in 1 MiB, a fourth does not")
		assert.True(t, more, "due events were left behind")
		for i, ev := range evs {
			assert.Equal(t, ids[i], ev.ID)
			assert.Equal(t, bytes.Repeat([]byte{byte('a' + i)}, size), ev.Payload, "a payload read after the claim is whole")
		}
		// A payload larger than the bound still goes, alone.
		evs, _, err = claimDue(ctx, s, owner, 100, 100<<10)
		require.NoError(t, err)
		require.Len(t, evs, 1)
		assert.Equal(t, ids[3], evs[0].ID)
		assert.Len(t, evs[0].Payload, size)
		assert.Equal(t, outbox.StatusWait, b.get(t, ids[4]).Status, "rows locked but not taken stay WAIT")
	})

	t.Run("ClaimDueTakesAReclaimedEventAlone", func(t *testing.T) {
		t.Parallel()
		s, b := h.new(t)
		ids := b.insert(t, 6)
		for i, id := range ids {
			b.exec(t, "UPDATE {t} SET next_retry_time = DATE_SUB(UTC_TIMESTAMP(3), INTERVAL ? SECOND) WHERE id = ?", 100-i, id)
		}
		b.exec(t, "UPDATE {t} SET reclaim_count = 1 WHERE id IN (?, ?)", ids[2], ids[3])

		var (
			got   [][]int64
			mores []bool
		)
		for {
			evs, more, err := claimDue(ctx, s, owner, 100, 1<<20)
			require.NoError(t, err)
			if len(evs) == 0 {
				assert.False(t, more)
				break
			}
			mores = append(mores, more)
			var round []int64
			for _, ev := range evs {
				round = append(round, ev.ID)
			}
			got = append(got, round)
		}
		assert.Equal(t, [][]int64{{ids[0], ids[1]}, {ids[2]}, {ids[3]}, {ids[4], ids[5]}}, got,
			"a batch stops before a reclaimed event, which is then claimed alone")
		assert.Equal(t, []bool{true, true, true, false}, mores, "each claim cut short says more may be due; the last does not")
	})

	t.Run("ReclaimDeadLettersPastMaxReclaims", func(t *testing.T) {
		t.Parallel()
		s, b := h.new(t)
		ids := b.insert(t, 3)
		evs, _, err := claimDue(ctx, s, owner, 10, 1<<20)
		require.NoError(t, err)
		require.Len(t, evs, 3)
		b.exec(t, "UPDATE {t} SET reclaim_count = 2 WHERE id = ?", ids[0])
		b.exec(t, "UPDATE {t} SET reclaim_count = 1 WHERE id = ?", ids[1])
		for _, id := range ids {
			b.ageClaim(t, id, 11*time.Minute)
		}
		n, dead, err := s.ReclaimExpired(ctx, 10*time.Minute, 3)
		require.NoError(t, err)
		assert.Equal(t, int64(2), n)
		require.Len(t, dead, 1)
		assert.Equal(t, ids[0], dead[0].ID)
		assert.Equal(t, outbox.StatusFail, dead[0].Status)
		assert.Equal(t, 3, dead[0].ReclaimCount)
		assert.Contains(t, dead[0].LastError, "reclaimed 3 times")
		assert.Equal(t, 0, dead[0].RetryCount, "a reclaim is no failed send")

		got := b.get(t, ids[1])
		assert.Equal(t, outbox.StatusWait, got.Status)
		assert.Equal(t, 2, got.ReclaimCount)
		assert.Equal(t, 1, b.get(t, ids[2]).ReclaimCount)

		// RetryForever never dead-letters for reclaims.
		evs, _, err = claimDue(ctx, s, owner, 10, 1<<20)
		require.NoError(t, err)
		require.NotEmpty(t, evs)
		for _, ev := range evs {
			b.exec(t, "UPDATE {t} SET reclaim_count = 1000 WHERE id = ?", ev.ID)
			b.ageClaim(t, ev.ID, 11*time.Minute)
		}
		_, dead, err = s.ReclaimExpired(ctx, 10*time.Minute, outbox.RetryForever)
		require.NoError(t, err)
		assert.Empty(t, dead)

		// A person's requeue is a fresh start for reclaims too.
		require.NoError(t, b.admin().Requeue(ctx, ids[0]))
		assert.Equal(t, 0, b.get(t, ids[0]).ReclaimCount)
	})

	t.Run("ReleaseOwnedTouchesOnlyTheOwnersRows", func(t *testing.T) {
		t.Parallel()
		s, b := h.new(t)
		ids := b.insert(t, 4)
		mine, _, err := claimDue(ctx, s, owner, 2, 1<<20)
		require.NoError(t, err)
		require.Len(t, mine, 2)
		theirs, _, err := claimDue(ctx, s, other, 1, 1<<20)
		require.NoError(t, err)
		require.Len(t, theirs, 1)
		b.exec(t, "UPDATE {t} SET retry_count = 2 WHERE id = ?", mine[0].ID)
		b.exec(t, "UPDATE {t} SET claim_owner = ? WHERE id = ?", strings.ToUpper(owner), ids[3]) // WAIT, and not ours

		n, err := s.ReleaseOwned(ctx, owner, "stopping")
		require.NoError(t, err)
		assert.Equal(t, int64(2), n)
		for _, ev := range mine {
			got := b.get(t, ev.ID)
			assert.Equal(t, outbox.StatusWait, got.Status)
			assert.Empty(t, got.ClaimOwner)
			assert.Equal(t, 0, got.ReclaimCount, "a release is no reclaim")
			assert.Equal(t, "stopping", got.LastError)
			assert.InDelta(t, 0, b.secondsFromNow(t, ev.ID, "next_retry_time"), 1, "due now")
		}
		assert.Equal(t, 2, b.get(t, mine[0].ID).RetryCount, "no retry counted, none forgotten")
		got := b.get(t, theirs[0].ID)
		assert.Equal(t, outbox.StatusSending, got.Status, "another owner's lease is never touched")
		assert.Equal(t, other, got.ClaimOwner)

		n, err = s.ReleaseOwned(ctx, owner, "again")
		require.NoError(t, err)
		assert.Zero(t, n)
	})
}
