package main

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// lead records that relay inst began a term at d.
func (f *fake) lead(d time.Duration, inst string, epoch, handovers int64) *fake {
	f.in.Relay = true
	f.in.Records = append(f.in.Records, record{At: at(d), Instance: inst, Kind: kindLead, Detail: formatTerm(epoch, handovers)})
	return f
}

// relaySent gives row id a send by relay inst at d (the relay claims nothing: it marks the
// row SUCCESS after the send), stored at store; the row ends SUCCESS under inst.
func (f *fake) relaySent(id int64, inst, kind string, d time.Duration, store string) *fake {
	f.log(d, inst, kind, id)
	if store != "" {
		f.deliver(id, store, d)
	}
	f.in.Rows[id-1].Owner = inst
	return f
}

func TestTermRecordsRoundTrip(t *testing.T) {
	e, h, ok := parseTerm(formatTerm(12, 3))
	require.True(t, ok)
	assert.Equal(t, int64(12), e)
	assert.Equal(t, int64(3), h)
	for _, bad := range []string{"", "epoch=1", "epoch=x handovers=0", "handovers=0 epoch=1"} {
		_, _, ok := parseTerm(bad)
		assert.False(t, ok, bad)
	}
	assert.True(t, isRelayInstance(relayInstance("p03")))
	assert.False(t, isRelayInstance("p03"))
	assert.Equal(t, "p03", processOf(relayInstance("p03")))
}

func TestRelayRunCountsRowsAndTerms(t *testing.T) {
	f := newFake(4)
	f.lead(0, "p01-relay", 1, 0)
	f.relaySent(1, "p01-relay", kindSent, time.Second, "q/1")
	f.relaySent(2, "p01-relay", kindSent, 2*time.Second, "q/2")
	// A handover (binlog purged) in the same epoch, then p02's relay leads.
	f.lead(3*time.Second, "p01-relay", 1, 1)
	f.relaySent(3, "p01-relay", kindSent, 4*time.Second, "q/3")
	f.lead(10*time.Second, "p02-relay", 3, 0)
	// A publisher sent row 4 while the publishers had the table.
	f.sentOnce(4, "p03", 8*time.Second)
	f.in.Rows[3].Owner = "p03"
	f.in.Checkpoint = checkpointRow{Found: true, Epoch: 3, Mode: "relay", Leader: "p02-relay", Fresh: true}
	r := analyze(f.in)
	assert.Empty(t, r.failed())
	assert.Equal(t, map[string]int{"p01-relay": 3}, r.SentByRelay)
	assert.Equal(t, map[string]int{"p03": 1}, r.SentByPollers)
	assert.Equal(t, map[string]int{"p01-relay": 2, "p02-relay": 1}, r.RelayTerms)
	assert.Equal(t, int64(1), r.RelayHandovers)
	var out bytes.Buffer
	r.print(&out)
	assert.Contains(t, out.String(), "rows sent by the relay")
	assert.Contains(t, out.String(), "p01-relay 3")
	assert.Contains(t, out.String(), "relay leader terms")
	assert.Contains(t, out.String(), "handovers (binlog not followable: the table swept) 1")
	assert.Contains(t, out.String(), "epoch 3, mode relay, leader p02-relay")
}

func TestRelayResendAfterAFailoverIsExplained(t *testing.T) {
	f := newFake(1)
	// p01's relay sent row 1 and died before marking it; p02's relay, leading next, resent
	// it from the checkpoint: two copies, the same eventId.
	f.lead(0, "p01-relay", 4, 0).relaySent(1, "p01-relay", kindSent, time.Second, "q/1")
	f.in.Killed["p01"] = at(1100 * time.Millisecond)
	f.lead(2*time.Second, "p02-relay", 5, 0).relaySent(1, "p02-relay", kindSent, 2500*time.Millisecond, "q/2")
	r := analyze(f.in)
	assert.Equal(t, 1, r.DuplicateCopies)
	assert.Empty(t, r.Unexplained)
	assert.Empty(t, r.failed())
	assert.Equal(t, map[string]int{causeRelayResend: 1}, r.Causes)
	assert.Equal(t, 1, r.RelayResent)
	assert.Equal(t, 1, r.RelayResentEv)
	var out bytes.Buffer
	r.print(&out)
	assert.Contains(t, out.String(), "duplicates resent by the relay")
}

func TestRelayResendInTheSameProcessAfterANewTermIsExplained(t *testing.T) {
	for _, tc := range []struct {
		name                  string
		epoch, handovers      int64
		explained             bool
		secondKind, firstKind string
	}{
		{"new epoch (database restarted)", 8, 0, true, kindSent, kindSent},
		{"handover (position purged)", 7, 1, true, kindSent, kindSent},
		{"same term", 7, 0, false, kindSent, kindSent},
		{"same term after an unknown outcome", 7, 0, true, kindSent, kindUnknown},
		{"same term after a client retry", 7, 0, true, kindSent, kindSentRetried},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFake(1)
			f.lead(0, "p01-relay", 7, 0).relaySent(1, "p01-relay", tc.firstKind, time.Second, "q/1")
			f.lead(5*time.Second, "p01-relay", tc.epoch, tc.handovers) // the same term: no new record in reality
			f.relaySent(1, "p01-relay", tc.secondKind, 6*time.Second, "q/2")
			r := analyze(f.in)
			assert.Equal(t, 1, r.DuplicateCopies)
			if tc.explained {
				assert.Empty(t, r.Unexplained)
			} else {
				assert.Len(t, r.Unexplained, 1, "within a term a relay sends an event once")
			}
		})
	}
}

func TestRelayCopyThenAPublishersCopyIsExplained(t *testing.T) {
	f := newFake(1)
	// The relay sent row 1, its heartbeat went old before it marked it, the publishers took
	// the table over and p02 sent it again.
	f.lead(0, "p01-relay", 2, 0).relaySent(1, "p01-relay", kindSent, time.Second, "q/1")
	f.sentOnce(1, "p02", 40*time.Second)
	f.in.Deliveries[1].Store = "q/2"
	r := analyze(f.in)
	assert.Empty(t, r.Unexplained)
	assert.Equal(t, 1, r.RelayResent)
}

func TestThreeRelayCopiesNeedTwoCauses(t *testing.T) {
	f := newFake(1)
	f.lead(0, "p01-relay", 1, 0).relaySent(1, "p01-relay", kindSent, time.Second, "q/1")
	f.relaySent(1, "p01-relay", kindSent, 2*time.Second, "q/2") // same term: no cause
	f.lead(3*time.Second, "p02-relay", 2, 0).relaySent(1, "p02-relay", kindSent, 4*time.Second, "q/3")
	r := analyze(f.in)
	require.Len(t, r.Unexplained, 1)
	assert.Equal(t, 3, r.Unexplained[0].Copies)
	assert.Equal(t, []string{causeRelayResend}, r.Unexplained[0].Causes)
}

func TestRelayFaultNotes(t *testing.T) {
	f := newFake(3)
	f.lead(0, "p01-relay", 1, 0).relaySent(1, "p01-relay", kindSent, time.Second, "q/1")
	// p01 (the leader) killed at 10 s, p05 started at 10.1 s; p02's relay leads at 11.2 s.
	f.lead(11200*time.Millisecond, "p02-relay", 2, 0).relaySent(2, "p02-relay", kindSent, 12*time.Second, "q/2")
	// The purge at 30 s: p02 killed, the others resumed at 40 s; p03's relay leads at
	// 40.5 s, its checkpoint's position purged: a handover at 41 s.
	f.lead(40500*time.Millisecond, "p03-relay", 3, 0).lead(41*time.Second, "p03-relay", 3, 1)
	f.relaySent(3, "p03-relay", kindSent, 42*time.Second, "q/3")
	f.in.Faults = []fault{
		{Kind: faultKillLeader, Target: "p01", Start: at(10 * time.Second), End: at(10100 * time.Millisecond), Replacement: "p05",
			Note: "it led as p01-relay, epoch 1"},
		{Kind: faultPurge, Target: "p02", Start: at(30 * time.Second), End: at(40 * time.Second), Replacement: "p06",
			Note: "p02 led as p02-relay, epoch 2; 3 binary logs purged in 1.20s"},
	}
	f.in.FaultKinds = relayFaults
	r := analyze(f.in)
	require.Len(t, r.Faults, 2)
	kill, purge := r.Faults[0], r.Faults[1]
	assert.Equal(t, "p02-relay", kill.NewLeader)
	assert.Equal(t, int64(2), kill.NewEpoch)
	assert.Equal(t, 1200*time.Millisecond, kill.NewLeaderAfter, "from the kill")
	assert.Zero(t, kill.Handovers)
	assert.Equal(t, "p03-relay", purge.NewLeader)
	assert.Equal(t, 500*time.Millisecond, purge.NewLeaderAfter, "from the fault's end, when the relays resumed")
	assert.Equal(t, int64(1), purge.Handovers)
	assert.Equal(t, 2*time.Second, purge.FirstSend)
	var out bytes.Buffer
	r.print(&out)
	s := out.String()
	assert.Contains(t, s, "kill leader p01")
	assert.Contains(t, s, "new p05; it led as p01-relay, epoch 1; p02-relay led (epoch 2) 1.20s after the kill")
	assert.Contains(t, s, "purge binlog, kill p02")
	assert.Contains(t, s, "3 binary logs purged in 1.20s; p03-relay led (epoch 3) 0.50s after the publishers resumed; handovers (table swept) 1")
	assert.Contains(t, s, "crash database     not injected", "the run's kinds are listed")
	assert.NotContains(t, s, "kill publisher", "a kind the run was not to inject is not listed")
}

func TestTheTermAfterAFault(t *testing.T) {
	f := newFake(1)
	f.lead(0, "p01-relay", 1, 0).relaySent(1, "p01-relay", kindSent, 30*time.Second, "q/1")
	// The term after the database restart at 40 s belongs to it, not to the broker's fault.
	f.lead(51*time.Second, "p01-relay", 2, 0)
	// The relay leads again at 65 s, before the crashed database's start command returned.
	f.lead(65*time.Second, "p01-relay", 3, 0)
	f.in.Faults = []fault{
		{Kind: faultBroker, Target: "broker-a", Start: at(10 * time.Second), End: at(20 * time.Second)},
		{Kind: faultDB, Target: "database", Start: at(40 * time.Second), End: at(50 * time.Second)},
		{Kind: faultDBCrash, Target: "database", Start: at(60 * time.Second), End: at(70 * time.Second)},
	}
	r := analyze(f.in)
	require.Len(t, r.Faults, 3)
	assert.Empty(t, r.Faults[0].NewLeader)
	assert.Equal(t, "p01-relay", r.Faults[1].NewLeader)
	assert.Equal(t, 11*time.Second, r.Faults[1].NewLeaderAfter, "from the stop")
	assert.Equal(t, "p01-relay", r.Faults[2].NewLeader)
	assert.Equal(t, 5*time.Second, r.Faults[2].NewLeaderAfter, "from the crash")
	var out bytes.Buffer
	r.print(&out)
	s := out.String()
	assert.Contains(t, s, "p01-relay led (epoch 2) 11.0s after the database stopped")
	assert.Contains(t, s, "p01-relay led (epoch 3) 5.00s after the crash")
	assert.NotContains(t, s, "no relay led after it", "a broker restart need not end the leader's term:\n%s", s)

	// A restart after which no relay led.
	f.in.Faults = []fault{{Kind: faultDB, Target: "database", Start: at(66 * time.Second), End: at(70 * time.Second)}}
	out.Reset()
	analyze(f.in).print(&out)
	assert.Equal(t, 1, strings.Count(out.String(), "no relay led after it"), "the restart's:\n%s", out.String())
}
