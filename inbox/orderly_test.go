package inbox_test

import (
	"fmt"
	"os"
	"sort"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/go-outbox/outbox"
)

// createRunsTable creates the table the handlers of consumer processes record their runs
// in (childConfig.Runs), dropped when t ends.
func (r *consRig) createRunsTable(t *testing.T) string {
	t.Helper()
	runs := r.effects + "_runs"
	_, err := r.inDB.Exec("CREATE TABLE `" + runs + "` (seq BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY, " +
		"biz_no VARCHAR(64) NOT NULL, handled_by VARCHAR(64) NOT NULL, started BIGINT NOT NULL, ended BIGINT NOT NULL) ENGINE = InnoDB")
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = r.inDB.Exec("DROP TABLE IF EXISTS `" + runs + "`") })
	return runs
}

// run is one committed run of a handler: which consumer ran it, on which biz no, when
// (Unix microseconds).
type run struct {
	by, bizNo  string
	start, end int64
}

func (r *consRig) runs(t *testing.T, table string) []run {
	t.Helper()
	rows, err := r.inDB.Query("SELECT handled_by, biz_no, started, ended FROM `" + table + "` ORDER BY seq")
	require.NoError(t, err)
	defer rows.Close()
	var out []run
	for rows.Next() {
		var x run
		require.NoError(t, rows.Scan(&x.by, &x.bizNo, &x.start, &x.end))
		out = append(out, x)
	}
	require.NoError(t, rows.Err())
	return out
}

// overlaps counts the pairs of runs of two consumers on one biz no (so one queue) at once.
func overlaps(runs []run) int {
	byBizNo := map[string][]run{}
	for _, x := range runs {
		byBizNo[x.bizNo] = append(byBizNo[x.bizNo], x)
	}
	n := 0
	for _, xs := range byBizNo {
		sort.Slice(xs, func(i, j int) bool { return xs[i].start < xs[j].start })
		for i := range xs {
			for j := i + 1; j < len(xs) && xs[j].start < xs[i].end; j++ {
				if xs[j].by != xs[i].by {
					n++
				}
			}
		}
	}
	return n
}

// A rolling restart of orderly consumers (processes of their own) under a steady load: A
// runs alone, B joins, A leaves (Close) and C joins. Each time, the queues a rebalance
// moves are handed over at once: the consumer that gets a queue handles its events within
// a liveness bound far below the broker's lock life (60 s), which is how long it waits when
// the consumer that had the queue does not unlock it at the broker. No two consumers ever
// handle one queue (one biz no) at once, every event is handled once, and each biz no's
// events in commit order.
func TestOrderlyConsumersHandQueuesOverInARollingRestart(t *testing.T) {
	t.Parallel()
	bin := plainBinary(t)
	r := newConsRig(t, consRigOptions{ordering: outbox.KeyOrder})
	runsTable := r.createRunsTable(t)
	r.publish(t)
	cfg := func(name string) childConfig {
		return childConfig{Name: name, Orderly: true, RetryPause: 100 * time.Millisecond, Runs: runsTable,
			Pause: 5 * time.Millisecond, ClientStrategy: os.Getenv("INBOX_TEST_CLIENT_STRATEGY") != ""}
	}
	a := r.startConsumer(t, bin, cfg("A"))

	const bizNos = 12
	var stop atomic.Bool
	produced := make(chan int, 1)
	go func() {
		n := 0
		for i := 0; !stop.Load(); i++ {
			for k := range bizNos {
				r.insertOne(t, fmt.Sprintf("ORD-%02d", k), fmt.Sprintf(`{"n":%d}`, i))
				n++
			}
			time.Sleep(150 * time.Millisecond)
		}
		produced <- n
	}()
	t.Cleanup(func() {
		if !stop.Swap(true) {
			<-produced
		}
	})
	r.waitEffects(t, 3*bizNos, 60*time.Second)

	// handled reports whether by (any consumer, for "") has handled an event of each of
	// bizNos biz nos (of any, for 1) since since.
	handled := func(by string, bizNos int, since time.Time) bool {
		seen := map[string]bool{}
		for _, x := range r.runs(t, runsTable) {
			if (by == "" || x.by == by) && x.start > since.UnixMicro() {
				seen[x.bizNo] = true
			}
		}
		return len(seen) >= bizNos
	}
	const liveness = 30 * time.Second // well above a handover, well below the broker's lock life

	joined := time.Now()
	r.startConsumer(t, bin, cfg("B"))
	require.Eventually(t, func() bool { return handled("B", 1, joined) }, liveness, 200*time.Millisecond,
		"B handles the queues A gave it")
	mark := time.Now()
	require.Eventually(t, func() bool { return handled("", bizNos, mark) }, liveness, 200*time.Millisecond,
		"every biz no is handled after B joined")

	a.stop(t)
	left := time.Now()
	require.Eventually(t, func() bool { return handled("", bizNos, left) }, liveness, 200*time.Millisecond,
		"B handles A's queues after A closed")

	joined = time.Now()
	r.startConsumer(t, bin, cfg("C"))
	require.Eventually(t, func() bool { return handled("C", 1, joined) }, liveness, 200*time.Millisecond,
		"C handles the queues B gave it")
	mark = time.Now()
	require.Eventually(t, func() bool { return handled("", bizNos, mark) }, liveness, 200*time.Millisecond,
		"every biz no is handled after C joined")

	stop.Store(true)
	total := <-produced
	r.waitEffects(t, total, 60*time.Second)
	assert.Len(t, r.checkLedger(t), total)
	runs := r.runs(t, runsTable)
	assert.Zero(t, overlaps(runs), "runs of two consumers on one biz no at once")

	rank := map[string]int64{} // each event's outbox id: its biz no's commit order
	for _, ev := range r.committed(t) {
		rank[ev.EventID] = ev.ID
	}
	last := map[string]int64{}
	outOfOrder := 0
	for _, e := range r.effectRows(t) {
		if rank[e.EventID] < last[e.BizNo] {
			outOfOrder++
		}
		last[e.BizNo] = rank[e.EventID]
	}
	assert.Zero(t, outOfOrder, "effects out of their biz no's order")
	by := map[string]int{}
	for _, x := range runs {
		by[x.by]++
	}
	t.Logf("%d events, handled by %v", total, by)
}
