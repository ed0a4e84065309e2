package outbox_test

import (
	"context"
	"crypto/rand"
	"fmt"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/go-outbox/outbox"
	"github.com/go-outbox/outbox/internal/testsvc"
	"github.com/go-outbox/outbox/outboxtest"
)

// The scenarios below run the same events, routing, faults and settings through two wires:
// the test kit's (a FaultySender over a MemorySender) and the real one (the same
// FaultySender over a RocketMQSender on the real brokers). What to send when, what a
// failure leads to and when a key stops are the library's decisions in both; only the
// wire differs. Each scenario asserts the outcome it expects and that both wires reach it:
// every event's final status, and each biz no's send order in each topic.

// scenarioOutcome is what a run decided: each event's final status, by biz no and event
// type ("ORD-1/ORDER_PAID"), and the event types each biz no's events were stored in, by
// topic and biz no ("PAY/ORD-1"), in the order the broker stored them (each once).
type scenarioOutcome struct {
	status map[string]outbox.Status
	order  map[string][]string
}

// scenarioWire is a wire to run scenarios through: a sender, and a way to read back what
// reached each topic.
type scenarioWire struct {
	name  string
	start func(t *testing.T, topics []string) (outbox.Sender, func(t *testing.T, sent map[string]int) map[string][]string)
}

// kitWire is the test kit's wire: a MemorySender that knows the scenario's topics.
var kitWire = scenarioWire{name: "kit", start: func(t *testing.T, topics []string) (outbox.Sender, func(*testing.T, map[string]int) map[string][]string) {
	mem := outboxtest.NewMemorySender(topics...)
	return mem, func(t *testing.T, _ map[string]int) map[string][]string {
		seen := map[string]bool{}
		order := map[string][]string{}
		for _, ev := range mem.Events() {
			if !seen[ev.EventID] {
				seen[ev.EventID] = true
				k := ev.Topic + "/" + ev.BizNo
				order[k] = append(order[k], ev.EventType)
			}
		}
		return order
	}
}}

// realWire is the real one: a RocketMQSender, and an orderly consumer on each topic (the
// topics on every broker), whose arrivals in queue order are what the broker stored.
var realWire = scenarioWire{name: "rocketmq", start: func(t *testing.T, topics []string) (outbox.Sender, func(*testing.T, map[string]int) map[string][]string) {
	consumers := map[string]*testsvc.OrderlyConsumer{}
	for _, topic := range topics {
		consumers[topic] = testsvc.ConsumeOrderly(t, topic)
	}
	s, err := outbox.NewRocketMQSender(outbox.RocketMQConfig{NameServers: []string{testsvc.RocketMQNameServer(t)},
		GroupName: testsvc.UniqueTable("pg"), SendTimeout: 20 * time.Second})
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, s.Close()) })
	return s, func(t *testing.T, sent map[string]int) map[string][]string {
		order := map[string][]string{}
		for topic, c := range consumers {
			c.WaitDistinct(t, sent[topic], 2*time.Minute)
			for biz, arrivals := range c.Arrivals() {
				sort.SliceStable(arrivals, func(i, j int) bool { return arrivals[i].QueueOffset < arrivals[j].QueueOffset })
				seen := map[string]bool{}
				for _, a := range arrivals {
					if !a.Refused && !seen[a.EventID] {
						seen[a.EventID] = true
						order[topic+"/"+biz] = append(order[topic+"/"+biz], a.EventID)
					}
				}
			}
		}
		return order
	}
}}

// runScenario inserts the scenario's events into a table of its own (key order, CREATED
// to the default topic, PAID and SHIPPED by type to topics of their own), runs a publisher
// over fs (a FaultySender over the wire) until every event is final or blocked, and
// returns the outcome.
func runScenario(t *testing.T, w scenarioWire, setFaults func(outer, inner *outboxtest.FaultySender)) scenarioOutcome {
	t.Helper()
	def, pay, ship := "SC_DEF", "SC_PAY", "SC_SHIP"
	if w.name == realWire.name {
		def, _ = testsvc.NewTopicOnEveryBroker(t, "OUTBOX_SC_DEF")
		pay, _ = testsvc.NewTopicOnEveryBroker(t, "OUTBOX_SC_PAY")
		ship, _ = testsvc.NewTopicOnEveryBroker(t, "OUTBOX_SC_SHIP")
	}
	db := testsvc.OpenDB(t)
	b := &bundle{db: db, store: testsvc.NewStore(t, db, outbox.MySQLConfig{Ordering: outbox.KeyOrder, MaxPayloadBytes: 6 << 20,
		Routes: outbox.Routes{Topic: def, Topics: []string{pay, ship}, ByType: map[string]string{"ORDER_PAID": pay, "ORDER_SHIPPED": ship}}})}
	wire, stored := w.start(t, []string{def, pay, ship})
	inner := outboxtest.NewFaultySender(wire)
	fs := outboxtest.NewFaultySender(inner)
	setFaults(fs, inner)

	// A payload the broker refuses (over its 4 MiB message limit), incompressible.
	big := make([]byte, 5<<20)
	_, _ = rand.Read(big)
	const orders = 6
	ids := map[int64]string{} // row id -> "ORD-n/TYPE"
	for o := range orders {
		biz := fmt.Sprintf("ORD-%d", o)
		for _, typ := range []string{"ORDER_CREATED", "ORDER_PAID", "ORDER_SHIPPED"} {
			in := outbox.EventInput{BizNo: biz, EventType: typ, Payload: fmt.Appendf(nil, `{"order":%q,"type":%q}`, biz, typ)}
			switch {
			case o == 1 && typ == "ORDER_PAID":
				in.Payload = big
			case o == 4 && typ == "ORDER_CREATED":
				in.Delay = 2 * time.Second // the order's story starts later; its key waits with it
			}
			ids[b.insertInput(t, in)] = biz + "/" + typ
		}
	}
	cfg := fastConfig("scenario-"+w.name, &logSink{})
	cfg.PollInterval = 50 * time.Millisecond
	cfg.MaxAttempts = 3
	cfg.Backoff = func(int) time.Duration { return 200 * time.Millisecond }
	cfg.Tuning.SendTimeout = 0 // the sender's own, where it has one
	p := newPublisher(t, b.store, fs, cfg)
	require.NoError(t, p.Start(context.Background()))

	// Quiet: nothing SENDING, and no WAIT event due whose key is free, for a second.
	quiet := func() bool {
		var open int
		require.NoError(t, b.db.QueryRow("SELECT COUNT(*) FROM `"+outbox.TableForTest(b.store)+"` w WHERE w.status = 'SENDING' "+
			"OR (w.status = 'WAIT' AND NOT EXISTS (SELECT 1 FROM `"+outbox.TableForTest(b.store)+"` f WHERE f.biz_no = w.biz_no AND f.status = 'FAIL' AND f.id < w.id))").Scan(&open))
		return open == 0
	}
	require.Eventually(t, quiet, 3*time.Minute, 50*time.Millisecond, "the scenario settles")
	time.Sleep(time.Second)
	require.True(t, quiet(), "and stays settled")
	require.NoError(t, p.Close())

	out := scenarioOutcome{status: map[string]outbox.Status{}}
	sent := map[string]int{}
	byEventID := map[string]string{}
	for id, name := range ids {
		ev := b.get(t, id)
		out.status[name] = ev.Status
		byEventID[ev.EventID] = name
		if ev.Status == outbox.StatusSuccess {
			sent[ev.Topic]++
		}
	}
	out.order = map[string][]string{}
	for k, evs := range stored(t, sent) {
		cut := strings.LastIndex(k, "/")
		topic, biz := k[:cut], k[cut+1:]
		role := map[string]string{def: "DEF", pay: "PAY", ship: "SHIP"}[topic]
		for _, e := range evs {
			typ := e
			if name, ok := byEventID[e]; ok { // the real wire gives event ids
				typ = name[len(biz)+1:]
			}
			out.order[role+"/"+biz] = append(out.order[role+"/"+biz], typ)
		}
	}
	return out
}

// Routing × key order × permanent and retryable failures × a delay × a broker away: the
// kit and the real sender decide alike, event by event and key by key.
func TestKitAndRealSenderDecideAlike(t *testing.T) {
	t.Parallel()
	faults := func(outer, inner *outboxtest.FaultySender) {
		// Failures to retry: ORD-2's SHIPPED fails its first two tries and is sent on the
		// third (MaxAttempts 3); ORD-5's PAID fails every try and is dead-lettered at the
		// third.
		outer.FailFirst(2, func(ev outbox.Event) bool { return ev.BizNo == "ORD-2" && ev.EventType == "ORDER_SHIPPED" })
		inner.FailFirst(1000, func(ev outbox.Event) bool { return ev.BizNo == "ORD-5" && ev.EventType == "ORDER_PAID" })
		// The broker is away for the first second and a half: no attempt is spent on it.
		outer.SetUnavailable(true)
		time.AfterFunc(1500*time.Millisecond, func() { outer.SetUnavailable(false) })
	}
	want := scenarioOutcome{status: map[string]outbox.Status{}, order: map[string][]string{}}
	for o := range 6 {
		biz := fmt.Sprintf("ORD-%d", o)
		for _, typ := range []string{"ORDER_CREATED", "ORDER_PAID", "ORDER_SHIPPED"} {
			want.status[biz+"/"+typ] = outbox.StatusSuccess
		}
		want.order["DEF/"+biz] = []string{"ORDER_CREATED"}
		want.order["PAY/"+biz] = []string{"ORDER_PAID"}
		want.order["SHIP/"+biz] = []string{"ORDER_SHIPPED"}
	}
	// ORD-1's PAID is refused by the broker (too large): a dead letter at once, and its
	// SHIPPED, of another topic, waits behind it.
	want.status["ORD-1/ORDER_PAID"], want.status["ORD-1/ORDER_SHIPPED"] = outbox.StatusFail, outbox.StatusWait
	delete(want.order, "PAY/ORD-1")
	delete(want.order, "SHIP/ORD-1")
	// ORD-5's PAID fails every try: a dead letter after the third, and its SHIPPED waits.
	want.status["ORD-5/ORDER_PAID"], want.status["ORD-5/ORDER_SHIPPED"] = outbox.StatusFail, outbox.StatusWait
	delete(want.order, "PAY/ORD-5")
	delete(want.order, "SHIP/ORD-5")
	for _, w := range []scenarioWire{kitWire, realWire} {
		t.Run(w.name, func(t *testing.T) {
			t.Parallel()
			got := runScenario(t, w, faults)
			assert.Equal(t, want.status, got.status, "%s: each event's final status", w.name)
			assert.Equal(t, want.order, got.order, "%s: each biz no's send order per topic", w.name)
		})
	}
}
