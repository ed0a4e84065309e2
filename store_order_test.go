package outbox_test

import (
	"context"
	"fmt"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/go-outbox/outbox"
	"github.com/go-outbox/outbox/internal/testsvc"
)

// orderedSetup is setup with a store in KeyOrder, on a table made for ordered claims.
func orderedSetup(t *testing.T) *bundle { return orderedSetupWith(t, outbox.KeyOrder) }

// orderedSetupWith is setup with a store in o, on a table made for it.
func orderedSetupWith(t *testing.T, o outbox.Ordering) *bundle {
	t.Helper()
	db := testsvc.OpenDB(t)
	return &bundle{db: db, store: testsvc.NewStore(t, db, outbox.MySQLConfig{Ordering: o})}
}

// insertKeys commits per events for each key, one transaction per round, the keys
// interleaved within a round (so that one key's ids are not adjacent), and returns each
// key's ids in order.
func (b *bundle) insertKeys(t testing.TB, keys []string, per int) map[string][]int64 {
	t.Helper()
	ctx := context.Background()
	out := map[string][]int64{}
	for round := range per {
		tx, err := b.store.BeginTx(ctx, nil)
		require.NoError(t, err)
		for _, k := range keys {
			id, err := outbox.InsertForTest(ctx, tx, outbox.EventInput{BizNo: k, EventType: fmt.Sprintf("E%d", round),
				Payload: fmt.Appendf(nil, `{"key":%q,"n":%d}`, k, round)})
			require.NoError(t, err)
			out[k] = append(out[k], id)
		}
		require.NoError(t, tx.Commit())
	}
	return out
}

// orderedClaim is one ordered batch claim.
func orderedClaim(t testing.TB, s outbox.Store, owner string, o outbox.Ordering, limit int, succeeded ...int64) outbox.ClaimResult {
	t.Helper()
	res, err := outbox.WithOrderingForTest(s, o).ClaimDue(context.Background(), outbox.ClaimRequest{Owner: owner, Limit: limit, MaxBytes: 1 << 20,
		Succeeded: succeeded})
	require.NoError(t, err)
	requireGrouped(t, res.Events)
	return res
}

// requireGrouped checks the claim's promise: one key's events are contiguous, in id order.
func requireGrouped(t testing.TB, evs []outbox.Event) {
	t.Helper()
	seen := map[string]bool{}
	for i, ev := range evs {
		if i > 0 && evs[i-1].BizNo == ev.BizNo {
			require.Less(t, evs[i-1].ID, ev.ID, "a key's events in id order")
			continue
		}
		require.False(t, seen[ev.BizNo], "key %s's events are not contiguous in %v", ev.BizNo, idsOf(evs))
		seen[ev.BizNo] = true
	}
}

func idsOf(evs []outbox.Event) []int64 {
	ids := make([]int64, len(evs))
	for i, ev := range evs {
		ids[i] = ev.ID
	}
	return ids
}

func byKey(evs []outbox.Event) map[string][]int64 {
	m := map[string][]int64{}
	for _, ev := range evs {
		m[ev.BizNo] = append(m[ev.BizNo], ev.ID)
	}
	return m
}

// indexColumns reads a table's indexes: name -> columns in order.
func indexColumns(t testing.TB, b *bundle) map[string]string {
	t.Helper()
	rows, err := b.db.Query(`SELECT INDEX_NAME, GROUP_CONCAT(COLUMN_NAME ORDER BY SEQ_IN_INDEX SEPARATOR ',')
	FROM information_schema.STATISTICS WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = ? GROUP BY INDEX_NAME`, outbox.TableForTest(b.store))
	require.NoError(t, err)
	defer rows.Close()
	m := map[string]string{}
	for rows.Next() {
		var name, cols string
		require.NoError(t, rows.Scan(&name, &cols))
		m[name] = cols
	}
	require.NoError(t, rows.Err())
	return m
}

// orderingALTERs are the SQL statements of docs/ordering.md's "Making an existing
// table ordered", in order.
func orderingALTERs(t testing.TB) []string {
	t.Helper()
	readme, err := os.ReadFile("docs/ordering.md")
	require.NoError(t, err)
	text := string(readme)
	start := strings.Index(text, "\n## Making an existing table ordered\n")
	require.GreaterOrEqual(t, start, 0, "docs/ordering.md has the section")
	m := regexp.MustCompile("(?s)```sql\n(.*?)```").FindStringSubmatch(text[start:])
	require.NotNil(t, m, "the section has an sql block")
	var stmts []string
	for _, s := range strings.Split(m[1], ";") {
		if s = strings.TrimSpace(s); s != "" {
			stmts = append(stmts, s)
		}
	}
	return stmts
}

// keyOrderCheck is what Check says of s's table for a store in KeyOrder.
func keyOrderCheck(ctx context.Context, s outbox.Store) error {
	info, err := outbox.WithOrderingForTest(s, outbox.KeyOrder).Check(ctx)
	if o := info.Ordering; o != outbox.KeyOrder {
		return fmt.Errorf("Check reported %s for a store in key order", o)
	}
	return err
}

// A table made for KeyOrder has idx_biz_no_status instead of idx_biz_no, and SKIPPED; a
// plain table is refused by Check with the ALTER to run, which is docs/ordering.md's; a
// table made before SKIPPED still serves unordered claims.
func TestOrderedSchema(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	ord := orderedSetup(t)
	require.NoError(t, keyOrderCheck(ctx, ord.store))
	idx := indexColumns(t, ord)
	assert.Equal(t, "biz_no,status,id", idx["idx_biz_no_status"])
	assert.NotContains(t, idx, "idx_biz_no", "the ordered index replaces idx_biz_no")

	b := setup(t)
	idx = indexColumns(t, b)
	assert.Equal(t, "biz_no", idx["idx_biz_no"], "schema.sql keeps idx_biz_no")
	assert.NotContains(t, idx, "idx_biz_no_status")
	tbl := "`" + outbox.TableForTest(b.store) + "`"
	err := keyOrderCheck(ctx, b.store)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "lacks an index idx_biz_no_status (biz_no, status, id)")
	assert.Contains(t, err.Error(), "ALTER TABLE "+tbl+" DROP INDEX idx_biz_no, ADD INDEX idx_biz_no_status (biz_no, status, id), ALGORITHM=INPLACE, LOCK=NONE;")
	assert.NotContains(t, err.Error(), "SKIPPED", "schema.sql has SKIPPED")

	// CreateSchema in KeyOrder on an existing plain table says what it lacks.
	again, err := outbox.NewMySQLStore(b.db, outbox.MySQLConfig{Table: outbox.TableForTest(b.store), Ordering: outbox.KeyOrder})
	require.NoError(t, err)
	err = again.CreateSchema(ctx)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "idx_biz_no_status")

	// The layout before SKIPPED.
	b.exec(t, "ALTER TABLE {t} MODIFY status ENUM('WAIT', 'SENDING', 'SUCCESS', 'FAIL') NOT NULL DEFAULT 'WAIT'")
	checkErr := keyOrderCheck(ctx, b.store)
	require.Error(t, checkErr)
	assert.Contains(t, checkErr.Error(), "ALTER TABLE "+tbl+" MODIFY status ENUM('WAIT', 'SENDING', 'SUCCESS', 'FAIL', 'SKIPPED') NOT NULL DEFAULT 'WAIT';")
	assert.Contains(t, checkErr.Error(), "DROP INDEX idx_biz_no, ADD INDEX idx_biz_no_status")
	// ... still serves unordered claims, and refuses a skip with the fix.
	id := b.insert(t, 1)[0]
	res, err := b.store.ClaimDue(ctx, outbox.ClaimRequest{Owner: "o", Limit: 10, MaxBytes: 1 << 20})
	require.NoError(t, err)
	require.Len(t, res.Events, 1)
	_, ok, err := b.store.MarkFail(ctx, id, "o", 1, "permanent", "boom")
	require.NoError(t, err)
	require.True(t, ok)
	err = b.admin().Skip(ctx, id)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "MODIFY status ENUM(")
	assert.Equal(t, outbox.StatusFail, b.get(t, id).Status, "nothing changed")

	// docs/ordering.md's statements make it an ordered table.
	stmts := orderingALTERs(t)
	require.Len(t, stmts, 2)
	for _, s := range stmts {
		assert.Contains(t, checkErr.Error(), strings.ReplaceAll(s, "t_event_record", tbl)+";", "Check names the documented statement")
		b.exec(t, strings.ReplaceAll(s, "t_event_record", "{t}"))
	}
	require.NoError(t, keyOrderCheck(ctx, b.store))
	idx = indexColumns(t, b)
	assert.Equal(t, "biz_no,status,id", idx["idx_biz_no_status"])
	assert.NotContains(t, idx, "idx_biz_no")
	require.NoError(t, b.admin().Skip(ctx, id))
	assert.Equal(t, outbox.StatusSkipped, b.get(t, id).Status)

	// An index of that name on other columns is named as such.
	b.exec(t, "ALTER TABLE {t} DROP INDEX idx_biz_no_status, ADD INDEX idx_biz_no_status (biz_no)")
	err = keyOrderCheck(ctx, b.store)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "an index idx_biz_no_status on (biz_no, status, id), not (biz_no)")
}

// A batch claim in key order takes whole runs, each key's events together in id order, and
// never an event while an earlier one of its key is in flight or backing off.
func TestOrderedClaimRuns(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := orderedSetup(t)
	// Scan order (next_retry_time, then id): A0 B0 C0 A1 B1 C1 A2 B2 C2.
	ids := b.insertKeys(t, []string{"A", "B", "C"}, 3)

	res := orderedClaim(t, b.store, "one", outbox.KeyOrder, 4)
	assert.Equal(t, map[string][]int64{"A": ids["A"][:2], "B": ids["B"][:1], "C": ids["C"][:1]}, byKey(res.Events),
		"heads, and A's run as far as LIMIT reached")
	assert.True(t, res.More)
	res = orderedClaim(t, b.store, "two", outbox.KeyOrder, 100)
	assert.Empty(t, res.Events, "every key is in flight")
	evs, err := outbox.WithOrderingForTest(b.store, outbox.KeyOrder).Candidates(ctx, 100)
	require.NoError(t, err)
	assert.Empty(t, evs)

	// "one" sent A0, B0 and C0, and A1 failed: it backs off, and A2 waits behind it.
	ok, err := b.store.ReleaseForRetry(ctx, ids["A"][1], "one", 1, time.Hour, "retryable", "boom")
	require.NoError(t, err)
	require.True(t, ok)
	res = orderedClaim(t, b.store, "one", outbox.KeyOrder, 100, ids["A"][0], ids["B"][0], ids["C"][0])
	assert.Equal(t, int64(3), res.Succeeded)
	assert.Equal(t, map[string][]int64{"B": ids["B"][1:], "C": ids["C"][1:]}, byKey(res.Events), "A2 waits for A1")
	evs, err = outbox.WithOrderingForTest(b.store, outbox.KeyOrder).Candidates(ctx, 100)
	require.NoError(t, err)
	assert.Empty(t, evs)
	won, err := outbox.WithOrderingForTest(b.store, outbox.KeyOrder).Claim(ctx, b.get(t, ids["A"][2]), "x")
	require.NoError(t, err)
	assert.False(t, won, "the per-row claim re-checks the key")

	// Due again, before A2 in the scan (a minute ago: A2 was written since).
	b.exec(t, "UPDATE {t} SET next_retry_time = DATE_SUB(UTC_TIMESTAMP(3), INTERVAL 1 MINUTE) WHERE id = ?", ids["A"][1])
	evs, err = outbox.WithOrderingForTest(b.store, outbox.KeyOrderSkipDeadLetters).Candidates(ctx, 100)
	require.NoError(t, err)
	require.Equal(t, ids["A"][1:], idsOf(evs))
	won, err = outbox.WithOrderingForTest(b.store, outbox.KeyOrder).Claim(ctx, evs[1], "x")
	require.NoError(t, err)
	assert.False(t, won, "A2 not before A1")
	res = orderedClaim(t, b.store, "one", outbox.KeyOrder, 100)
	assert.Equal(t, map[string][]int64{"A": ids["A"][1:]}, byKey(res.Events))
	assert.Equal(t, 1, res.Events[0].RetryCount)
	assert.NotEmpty(t, res.Events[1].Payload)
}

// The claim records the request's successes before its SELECT: a hot key moves on in the
// same claim.
func TestOrderedClaimRecordsSuccessFirst(t *testing.T) {
	t.Parallel()
	b := orderedSetup(t)
	ids := b.insertKeys(t, []string{"HOT"}, 3)["HOT"]
	res := orderedClaim(t, b.store, "one", outbox.KeyOrder, 1)
	require.Equal(t, ids[:1], idsOf(res.Events))
	res = orderedClaim(t, b.store, "one", outbox.KeyOrder, 1, ids[0])
	assert.Equal(t, int64(1), res.Succeeded)
	assert.Equal(t, ids[1:2], idsOf(res.Events), "the next event, in the claim that recorded its predecessor")
	// A success that is not ours any more is not recorded, and the key stays held.
	res = orderedClaim(t, b.store, "two", outbox.KeyOrder, 10, ids[1])
	assert.Equal(t, int64(0), res.Succeeded)
	assert.Empty(t, res.Events)
	assert.Equal(t, outbox.StatusSending, b.get(t, ids[1]).Status)
}

// A reclaimed head is claimed (alone) before its followers, in both claim modes.
func TestOrderedReclaimedHeadFirst(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := orderedSetup(t)
	ids := b.insertKeys(t, []string{"K", "L"}, 3)
	res := orderedClaim(t, b.store, "dead", outbox.KeyOrder, 1)
	require.Equal(t, ids["K"][:1], idsOf(res.Events))
	// "dead" dies holding K1. Its followers wait however long the lease.
	res = orderedClaim(t, b.store, "live", outbox.KeyOrder, 100)
	assert.Equal(t, map[string][]int64{"L": ids["L"]}, byKey(res.Events))
	b.ageClaim(t, ids["K"][0], time.Hour)
	n, _, err := b.store.ReclaimExpired(ctx, time.Minute, 3)
	require.NoError(t, err)
	require.Equal(t, int64(1), n)

	evs, err := outbox.WithOrderingForTest(b.store, outbox.KeyOrder).Candidates(ctx, 100)
	require.NoError(t, err)
	require.NotEmpty(t, evs)
	assert.Equal(t, ids["K"][0], evs[0].ID, "the reclaimed head first")
	won, err := outbox.WithOrderingForTest(b.store, outbox.KeyOrder).Claim(ctx, evs[len(evs)-1], "x")
	require.NoError(t, err)
	assert.Equal(t, len(evs) == 1, won, "a follower is refused while its head waits")

	res = orderedClaim(t, b.store, "live", outbox.KeyOrder, 100, ids["L"]...)
	assert.Equal(t, ids["K"][:1], idsOf(res.Events), "the reclaimed head, alone")
	assert.Equal(t, 1, res.Events[0].ReclaimCount)
	res = orderedClaim(t, b.store, "live", outbox.KeyOrder, 100, ids["K"][0])
	assert.Equal(t, ids["K"][1:], idsOf(res.Events))
}

// Under KeyOrder a dead letter holds its key until it is skipped or requeued; under
// KeyOrderSkipDeadLetters it does not. Blocked lists it with the count behind it.
func TestOrderedDeadLetter(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, o := range []outbox.Ordering{outbox.KeyOrder, outbox.KeyOrderSkipDeadLetters} {
		t.Run(o.String(), func(t *testing.T) {
			t.Parallel()
			b := orderedSetup(t)
			ids := b.insertKeys(t, []string{"K", "L"}, 3)
			res := orderedClaim(t, b.store, "one", o, 1)
			require.Equal(t, ids["K"][:1], idsOf(res.Events))
			_, ok, err := b.store.MarkFail(ctx, ids["K"][0], "one", 5, "permanent", "poison")
			require.NoError(t, err)
			require.True(t, ok)

			blocked, err := b.admin().Blocked(ctx, 0, 0)
			require.NoError(t, err)
			require.Len(t, blocked, 1)
			assert.Equal(t, ids["K"][0], blocked[0].ID)
			assert.Equal(t, "K", blocked[0].BizNo)
			assert.Equal(t, outbox.StatusFail, blocked[0].Status)
			assert.Equal(t, "poison", blocked[0].LastError)
			assert.Equal(t, int64(2), blocked[0].Waiting)

			res = orderedClaim(t, b.store, "one", o, 100)
			if o == outbox.KeyOrderSkipDeadLetters {
				assert.Equal(t, map[string][]int64{"K": ids["K"][1:], "L": ids["L"]}, byKey(res.Events))
				return
			}
			assert.Equal(t, map[string][]int64{"L": ids["L"]}, byKey(res.Events), "K stands still")
			won, err := outbox.WithOrderingForTest(b.store, o).Claim(ctx, b.get(t, ids["K"][1]), "x")
			require.NoError(t, err)
			assert.False(t, won)

			require.ErrorIs(t, b.admin().Skip(ctx, ids["L"][0]), outbox.ErrNotDeadLetter)
			require.ErrorIs(t, b.admin().Skip(ctx, 1<<40), outbox.ErrNotFound)
			require.ErrorIs(t, b.admin().Skip(ctx, 0), outbox.ErrInvalidInput)
			require.NoError(t, b.admin().Skip(ctx, ids["K"][0]))
			require.ErrorIs(t, b.admin().Skip(ctx, ids["K"][0]), outbox.ErrNotDeadLetter, "only once")
			assert.Equal(t, outbox.StatusSkipped, b.get(t, ids["K"][0]).Status)
			blocked, err = b.admin().Blocked(ctx, 0, 0)
			require.NoError(t, err)
			assert.Empty(t, blocked)
			res = orderedClaim(t, b.store, "one", o, 100, ids["L"]...)
			assert.Equal(t, map[string][]int64{"K": ids["K"][1:]}, byKey(res.Events), "SKIPPED is done")
		})
	}
}

// Blocked pages by the dead letter's id: each page starts after the last id of the one
// before, and the pages together list each blocked key once.
func TestBlockedPages(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := orderedSetup(t)
	keys := []string{"K1", "K2", "K3", "K4", "K5"}
	ids := b.insertKeys(t, keys, 2)
	var heads []int64
	for _, k := range keys {
		b.setState(t, ids[k][0], outbox.StatusFail, time.Hour)
		heads = append(heads, ids[k][0])
	}
	var got []int64
	after := int64(0)
	for page := 0; ; page++ {
		require.Less(t, page, 5, "the pages end")
		keys, err := b.admin().Blocked(ctx, after, 2)
		require.NoError(t, err)
		if len(keys) == 0 {
			break
		}
		assert.LessOrEqual(t, len(keys), 2)
		for _, k := range keys {
			assert.Greater(t, k.ID, after)
			assert.Equal(t, int64(1), k.Waiting)
			got = append(got, k.ID)
		}
		after = keys[len(keys)-1].ID
	}
	assert.Equal(t, heads, got)
	_, err := b.admin().Blocked(ctx, -1, 0)
	require.ErrorIs(t, err, outbox.ErrInvalidInput)
}

// A requeued dead letter goes first, before the events that waited behind it: the claim
// takes it and the run behind it, in id order, though the run was due before it.
func TestOrderedRequeuedDeadLetterFirst(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := orderedSetup(t)
	ids := b.insertKeys(t, []string{"K"}, 3)["K"]
	res := orderedClaim(t, b.store, "one", outbox.KeyOrder, 1)
	require.Equal(t, ids[:1], idsOf(res.Events))
	_, ok, err := b.store.MarkFail(ctx, ids[0], "one", 5, "permanent", "poison")
	require.NoError(t, err)
	require.True(t, ok)
	require.NoError(t, b.admin().Requeue(ctx, ids[0]))
	evs, err := outbox.WithOrderingForTest(b.store, outbox.KeyOrder).Candidates(ctx, 100)
	require.NoError(t, err)
	assert.Equal(t, ids[:1], idsOf(evs), "per row: the requeued event alone, its followers were due before it")
	res = orderedClaim(t, b.store, "one", outbox.KeyOrder, 100)
	assert.Equal(t, ids, idsOf(res.Events), "the requeued event first, then the events behind it")
	res = orderedClaim(t, b.store, "one", outbox.KeyOrder, 100, ids...)
	assert.Equal(t, int64(3), res.Succeeded)
	assert.Empty(t, res.Events)
}

// Purge deletes old SKIPPED rows as it does old SUCCESS rows; Stats counts them with the
// history; List filters by SKIPPED.
func TestSkippedIsHistory(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := orderedSetup(t)
	ids := b.insert(t, 4)
	b.exec(t, "UPDATE {t} SET status = 'FAIL' WHERE id IN (?, ?, ?)", ids[0], ids[1], ids[2])
	require.NoError(t, b.admin().Skip(ctx, ids[0]))
	require.NoError(t, b.admin().Skip(ctx, ids[1]))
	b.exec(t, "UPDATE {t} SET status = 'SUCCESS' WHERE id = ?", ids[3])
	b.exec(t, "UPDATE {t} SET claimed_at = DATE_SUB(UTC_TIMESTAMP(3), INTERVAL 2 DAY), update_time = DATE_SUB(UTC_TIMESTAMP(3), INTERVAL 2 DAY) WHERE id IN (?, ?, ?)",
		ids[0], ids[2], ids[3])

	st, err := b.store.Stats(ctx, outbox.StatsOptions{CountSucceeded: true})
	require.NoError(t, err)
	assert.Equal(t, int64(2), st.Skipped)
	assert.Equal(t, int64(1), st.Success)
	assert.Equal(t, int64(1), st.Fail)
	listed, err := b.admin().List(ctx, outbox.Filter{Status: outbox.StatusSkipped})
	require.NoError(t, err)
	assert.Len(t, listed, 2)

	n, err := b.store.Purge(ctx, 24*time.Hour, outbox.PurgeOptions{DryRun: true})
	require.NoError(t, err)
	assert.Equal(t, int64(2), n)
	assert.Equal(t, outbox.StatusSkipped, b.get(t, ids[0]).Status, "a dry run deletes nothing")
	n, err = b.store.Purge(ctx, 24*time.Hour, outbox.PurgeOptions{})
	require.NoError(t, err)
	assert.Equal(t, int64(2), n, "the old SUCCESS and the old SKIPPED row")
	for _, id := range []int64{ids[0], ids[3]} {
		_, err := b.admin().Get(ctx, id)
		require.ErrorIs(t, err, outbox.ErrNotFound)
	}
	assert.Equal(t, outbox.StatusSkipped, b.get(t, ids[1]).Status, "a recent SKIPPED row stays")
	assert.Equal(t, outbox.StatusFail, b.get(t, ids[2]).Status, "FAIL is never purged")
}

// The ordered batch claim's statements use idx_biz_no_status for every check, each reading an
// entry or two: the heads' window scans idx_status_next_retry in order and locks each head
// by primary key; the runs' read is a range on idx_biz_no_status, from the index alone,
// in index order (no sort, stopped by its LIMIT).
func TestOrderedClaimExplain(t *testing.T) {
	t.Parallel()
	b := orderedSetup(t)
	fillHistory(t, b, 1000, 20) // not tiny: on a few thousand rows a full scan is the better plan
	for _, o := range []outbox.Ordering{outbox.KeyOrder, outbox.KeyOrderSkipDeadLetters} {
		plans := explainRows(t, b, outbox.OrderedHeadsForTest(b.store, o, 4096, 200, 100))
		// The outer join (the window, then each head by primary key), the window's two
		// derived tables (the candidates, and their count and places), one subquery per
		// check, and each head's dive for its next event.
		want := map[outbox.Ordering]int{outbox.KeyOrder: 8, outbox.KeyOrderSkipDeadLetters: 7}[o]
		require.Len(t, plans, want)
		for _, p := range plans {
			t.Logf("%s: %v", o, p)
			switch {
			case p["select_type"] == "PRIMARY" && p["table"] == "t":
				assert.Equal(t, "PRIMARY", p["key"], "each head locked by primary key")
				assert.Equal(t, "eq_ref", p["type"])
			case p["select_type"] == "PRIMARY" || p["select_type"] == "DERIVED" && strings.HasPrefix(p["table"], "<derived"):
			case p["select_type"] == "DERIVED":
				assert.Equal(t, "h", p["table"])
				assert.Equal(t, "idx_status_next_retry", p["key"], "the window scans the due rows in order")
				assert.NotContains(t, p["Extra"], "filesort")
			default:
				assert.Equal(t, "DEPENDENT SUBQUERY", p["select_type"])
				assert.Equal(t, "idx_biz_no_status", p["key"], "subquery %v", p)
				assert.Equal(t, "ref", p["type"])
				assert.Equal(t, "259", p["key_len"], "(biz_no, status): biz_no VARCHAR(64) utf8mb4 is 258 bytes, status 1")
				assert.LessOrEqual(t, atoi(p["rows"]), 10, "a dive, not the key's history")
			}
		}
	}
	var keys []string
	for k := range 50 {
		keys = append(keys, fmt.Sprintf("K%d", k))
	}
	for _, o := range []outbox.Ordering{outbox.KeyOrder, outbox.KeyOrderSkipDeadLetters} {
		plans := explainRows(t, b, outbox.OrderedRunsForTest(b.store, o, keys, 500))
		n := 0
		for _, p := range plans {
			t.Logf("%s runs: %v", o, p)
			if p["select_type"] == "UNION RESULT" {
				continue
			}
			n++
			assert.Equal(t, "range", p["type"])
			assert.Equal(t, "idx_biz_no_status", p["key"])
			assert.Contains(t, p["Extra"], "Using index", "read from the index alone")
			assert.NotContains(t, p["Extra"], "filesort", "in index order, stopped by the LIMIT")
		}
		assert.Equal(t, 2, n, "the WAIT ids, and the ids where runs stop")
	}
}

func atoi(s string) int {
	var n int
	_, _ = fmt.Sscan(s, &n)
	return n
}

// explainRows runs EXPLAIN on q against b's table: one map per plan row.
func explainRows(t testing.TB, b *bundle, q string, args ...any) []map[string]string {
	t.Helper()
	rows, err := b.db.Query("EXPLAIN "+q, args...)
	require.NoError(t, err)
	defer rows.Close()
	cols, err := rows.Columns()
	require.NoError(t, err)
	var out []map[string]string
	for rows.Next() {
		vals := make([]any, len(cols))
		ptrs := make([]any, len(cols))
		for i := range vals {
			ptrs[i] = &vals[i]
		}
		require.NoError(t, rows.Scan(ptrs...))
		m := map[string]string{}
		for i, c := range cols {
			if v, ok := vals[i].([]byte); ok {
				m[c] = string(v)
			} else if vals[i] != nil {
				m[c] = fmt.Sprint(vals[i])
			}
		}
		out = append(out, m)
	}
	require.NoError(t, rows.Err())
	return out
}

// fillHistory gives b's table keys K0..K(keys-1), each with success SUCCESS events and then
// two due WAIT events, written with INSERT ... SELECT from a digits table (portable: no
// sequence engine, no recursive CTE), and analyzes the table.
func fillHistory(t testing.TB, b *bundle, keys, success int) {
	t.Helper()
	require.LessOrEqual(t, keys, 1000)
	require.LessOrEqual(t, success, 1000)
	// nums: 0..999, from a cross join of digits.
	digits, nums := testsvc.UniqueTable("digits"), testsvc.UniqueTable("nums")
	for _, tb := range []string{digits, nums} {
		b.exec(t, "CREATE TABLE `"+tb+"` (n INT NOT NULL PRIMARY KEY)")
		t.Cleanup(func() { _, _ = b.db.Exec("DROP TABLE IF EXISTS `" + tb + "`") })
	}
	b.exec(t, "INSERT INTO `"+digits+"` VALUES (0), (1), (2), (3), (4), (5), (6), (7), (8), (9)")
	b.exec(t, "INSERT INTO `"+nums+"` SELECT a.n + 10 * b.n + 100 * c.n FROM `"+digits+"` a, `"+digits+"` b, `"+digits+"` c")
	nums = "`" + nums + "`"
	insert := func(status string, perKey int, first int) {
		// One statement per page of keys, so that no statement is large.
		const page = 100
		for k0 := 0; k0 < keys; k0 += page {
			b.exec(t, `INSERT INTO {t} (event_id, biz_no, event_type, payload, status, retry_count, next_retry_time,
	claim_owner, claimed_at, create_time, update_time)
	SELECT UUID(), CONCAT('K', k.n), 'E', '', ?, 0, DATE_SUB(UTC_TIMESTAMP(3), INTERVAL 1 MINUTE),
	       IF(? = 'SUCCESS', 'old', ''), IF(? = 'SUCCESS', DATE_SUB(UTC_TIMESTAMP(3), INTERVAL 1 DAY), '1970-01-01'),
	       UTC_TIMESTAMP(3), UTC_TIMESTAMP(3)
	FROM `+nums+` k, `+nums+` e
	WHERE k.n >= ? AND k.n < ? AND e.n >= ? AND e.n < ?
	ORDER BY k.n, e.n`, status, status, status, k0, min(k0+page, keys), first, first+perKey)
		}
	}
	insert("SUCCESS", success, 0)
	insert("WAIT", 2, 0)
	b.exec(t, "ANALYZE TABLE {t}")
}

// A run whose scan order (next_retry_time) differs from its id order: whatever cuts it (the
// limit, MaxBytes), the claim takes a prefix of the key's events in id order, never an event
// with an unclaimed earlier one.
func TestOrderedClaimCutsRunsToPrefixes(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := orderedSetup(t)
	ids := b.insertKeys(t, []string{"K"}, 3)["K"]
	h, f1, f2 := ids[0], ids[1], ids[2]
	// Scan order: h, f2, f1.
	for id, ago := range map[int64]int{h: 300, f1: 100, f2: 200} {
		b.exec(t, "UPDATE {t} SET next_retry_time = DATE_SUB(UTC_TIMESTAMP(3), INTERVAL ? SECOND), payload = REPEAT('x', 5000) WHERE id = ?", ago, id)
	}
	reset := func() { b.exec(t, "UPDATE {t} SET status = 'WAIT', claim_owner = '' WHERE status = 'SENDING'") }

	res := orderedClaim(t, b.store, "one", outbox.KeyOrder, 2)
	assert.Equal(t, []int64{h, f1}, idsOf(res.Events), "the limit: the head and the next in id order, not f2")
	assert.True(t, res.More)
	reset()

	res, err := outbox.WithOrderingForTest(b.store, outbox.KeyOrder).ClaimDue(ctx, outbox.ClaimRequest{Owner: "one", Limit: 10, MaxBytes: 10000})
	require.NoError(t, err)
	assert.Equal(t, []int64{h, f1}, idsOf(res.Events), "MaxBytes: h and f1, in id order; f2 would pass it")
	assert.True(t, res.More)
	reset()

	// Limit 1000 of 1 MiB: payloads over 4 KiB are read after the SELECT.
	res = orderedClaim(t, b.store, "one", outbox.KeyOrder, 1000)
	assert.Equal(t, []int64{h, f1, f2}, idsOf(res.Events), "the whole run, in id order")
	for _, ev := range res.Events {
		assert.Len(t, ev.Payload, 5000)
	}
}
