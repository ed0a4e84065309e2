package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-outbox/outbox"
	"github.com/go-outbox/outbox/relay"
)

// Relay mode (-relay): each publisher process also runs a binlog relay (package relay)
// beside its publisher, with the same sender; the publisher's store names the relay's
// checkpoint table as its RelayTable, so that it stands by while a relay leads. The relay
// of process p01 is p01-relay: that is its InstanceID, the leader column of the checkpoint
// row while it leads, and the claim_owner of the rows it marks SUCCESS.
const relaySuffix = "-relay"

// relayInstance is the relay's InstanceID in the process called name.
func relayInstance(name string) string { return name + relaySuffix }

// isRelayInstance reports whether an instance id is a relay's.
func isRelayInstance(inst string) bool { return strings.HasSuffix(inst, relaySuffix) }

// processOf is the process a relay instance runs in.
func processOf(relayID string) string { return strings.TrimSuffix(relayID, relaySuffix) }

// relayServerID is the binlog client server id of the relay in process n (1, 2, …): each
// its own, none the server's (the chaos run's MariaDB runs with --server-id=1).
func relayServerID(n int) uint { return uint(100 + n) }

// mariadbBinlogArgs start the chaos run's own MariaDB with the binlog as the relay needs it.
const mariadbBinlogArgs = "--log-bin --binlog-format=ROW --binlog-row-metadata=FULL --sync-binlog=1 --server-id=1"

// runRelay runs the publisher and a relay side by side until ctx ends. The relay's sends
// go to the outcome log INSTANCE.relay.outcomes, under the relay's instance id, each term
// of its leadership announced there first (a kindLead record, see termLog). A relay that
// refuses the server (Run returns an error) stops the process, which then exits non-zero.
func runRelay(ctx context.Context, o publishOptions, p *outbox.Publisher, sender *outbox.RocketMQSender,
	logger *slog.Logger, clientRetries *atomic.Int64) error {
	id := relayInstance(o.instance)
	rlog, err := openOutcomeLog(filepath.Join(o.dir, o.instance+".relay.outcomes"), id)
	if err != nil {
		return err
	}
	defer rlog.close()
	terms := &termLog{log: rlog}
	rs := &relaySender{recordingSender: recordingSender{inner: sender, log: rlog, clientRetries: clientRetries}, terms: terms}
	r, err := relay.New(o.dsn, rs, relay.Config{Table: o.table, CheckpointTable: o.relayTable, InstanceID: id, Routes: outbox.Routes{Topic: o.topic},
		ServerID: uint32(o.serverID), FallbackAfter: o.fallback, Logger: logger.With(slog.String("component", "relay"))})
	if err != nil {
		return err
	}
	terms.relay = r
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	var perr, rerr error
	wg.Go(func() { perr = p.Run(ctx) })
	wg.Go(func() {
		if rerr = r.Run(ctx); rerr != nil {
			cancel()
		}
	})
	wg.Go(func() {
		t := time.NewTicker(100 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				terms.note()
			}
		}
	})
	wg.Wait()
	cerr := r.Close()
	st := r.Stats()
	logger.Info("relay stopped", slog.Int64("sent", st.Sent), slog.Int64("resent", st.Resent), slog.Int64("swept", st.Swept),
		slog.Int64("retried", st.Retried), slog.Int64("dead_lettered", st.DeadLettered), slog.Int64("terms", st.Terms),
		slog.Int64("handovers", st.Handovers))
	if rerr != nil {
		rerr = fmt.Errorf("relay: %w", rerr)
	}
	return errors.Join(perr, rerr, cerr)
}

// termLog writes a kindLead record each time its relay is seen leading a new term: a new
// epoch, or the same epoch after a handover (the binlog could not be followed, the table
// is swept). It is consulted before every send and every 100 ms, so that each term's
// record comes before the records of its sends.
type termLog struct {
	relay *relay.Relay
	log   *outcomeLog
	mu    sync.Mutex
	last  string
}

func (l *termLog) note() {
	if l.relay == nil {
		return
	}
	h := l.relay.Health()
	if !h.Leader {
		return
	}
	detail := formatTerm(h.Epoch, l.relay.Stats().Handovers)
	l.mu.Lock()
	defer l.mu.Unlock()
	if detail != l.last {
		l.last = detail
		l.log.write([]record{{Kind: kindLead, Detail: detail}})
	}
}

// relaySender is the recording sender of a relay: each send is recorded under the relay's
// term, announced first.
type relaySender struct {
	recordingSender
	terms *termLog
}

func (s *relaySender) Send(ctx context.Context, evs []outbox.Event, keyOrder bool) []error {
	s.terms.note()
	return s.recordingSender.Send(ctx, evs, keyOrder)
}

// formatTerm and parseTerm are the Detail of a kindLead record.
func formatTerm(epoch, handovers int64) string {
	return fmt.Sprintf("epoch=%d handovers=%d", epoch, handovers)
}

func parseTerm(detail string) (epoch, handovers int64, ok bool) {
	e, h, found := strings.Cut(detail, " ")
	es, ok1 := strings.CutPrefix(e, "epoch=")
	hs, ok2 := strings.CutPrefix(h, "handovers=")
	if !found || !ok1 || !ok2 {
		return 0, 0, false
	}
	var err1, err2 error
	epoch, err1 = strconv.ParseInt(es, 10, 64)
	handovers, err2 = strconv.ParseInt(hs, 10, 64)
	return epoch, handovers, err1 == nil && err2 == nil
}

// checkpointRow is the relay's checkpoint row of the run's table.
type checkpointRow struct {
	Found  bool
	Epoch  int64
	Mode   string // relay or polling
	Leader string // a relay's instance id, or the publisher that took the table over
	// Fresh: the heartbeat is younger than the fallback (a relay that leads is alive).
	Fresh bool
}

func readCheckpoint(ctx context.Context, db *sql.DB, cpTable, table string) (checkpointRow, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	var cp checkpointRow
	err := db.QueryRowContext(ctx, "SELECT epoch, mode, leader, heartbeat_at >= UTC_TIMESTAMP(3) - INTERVAL fallback_after_ms * 1000 MICROSECOND FROM `"+
		cpTable+"` WHERE outbox_table = ?", table).Scan(&cp.Epoch, &cp.Mode, &cp.Leader, &cp.Fresh)
	if errors.Is(err, sql.ErrNoRows) {
		return cp, nil
	}
	cp.Found = err == nil
	return cp, err
}

// binlogFiles lists the server's binary logs, oldest first.
func binlogFiles(ctx context.Context, db *sql.DB) ([]string, error) {
	rows, err := db.QueryContext(ctx, "SHOW BINARY LOGS")
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	cols, err := rows.Columns()
	if err != nil {
		return nil, err
	}
	var names []string
	for rows.Next() {
		vals := make([]any, len(cols))
		var name string
		vals[0] = &name
		for i := 1; i < len(cols); i++ {
			vals[i] = new(sql.RawBytes)
		}
		if err := rows.Scan(vals...); err != nil {
			return nil, err
		}
		names = append(names, name)
	}
	return names, rows.Err()
}

// purgeBinlogs starts a new binary log (FLUSH BINARY LOGS) and purges every older one,
// trying again every 500 ms until they are gone or timeout passes: MariaDB keeps a file
// until InnoDB has checkpointed its transactions, and one a binlog reader still reads. It
// returns how many files it purged.
func purgeBinlogs(ctx context.Context, db *sql.DB, timeout time.Duration) (int, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if _, err := db.ExecContext(ctx, "FLUSH BINARY LOGS"); err != nil {
		return 0, fmt.Errorf("FLUSH BINARY LOGS: %w", err)
	}
	files, err := binlogFiles(ctx, db)
	if err != nil {
		return 0, fmt.Errorf("SHOW BINARY LOGS: %w", err)
	}
	if len(files) == 0 {
		return 0, errors.New("the server lists no binary log: is --log-bin on?")
	}
	newest, before := files[len(files)-1], len(files)
	for {
		if _, err := db.ExecContext(ctx, "PURGE BINARY LOGS TO '"+newest+"'"); err != nil && ctx.Err() == nil {
			return 0, fmt.Errorf("PURGE BINARY LOGS: %w", err)
		}
		files, err := binlogFiles(ctx, db)
		if err == nil && len(files) > 0 && files[0] == newest {
			return before - len(files), nil
		}
		if !sleepFor(ctx, 500*time.Millisecond) {
			left := len(files)
			return before - left, fmt.Errorf("the binary logs before %s still there after %s (%d files)", newest, timeout, left)
		}
	}
}

// findLeader waits up to wait for a relay to lead the run's table (the checkpoint row in
// relay mode, its heartbeat fresh, its leader a running process) and returns that
// process's name ("" if none did) and the row.
func (c *chaos) findLeader(ctx context.Context, wait time.Duration) (string, checkpointRow) {
	deadline := time.Now().Add(wait)
	for {
		cp, err := readCheckpoint(ctx, c.db, c.relayCP, c.table)
		if err == nil && cp.Found && cp.Mode == "relay" && cp.Fresh && isRelayInstance(cp.Leader) &&
			slices.Contains(c.pubs.liveNames(), processOf(cp.Leader)) {
			return processOf(cp.Leader), cp
		}
		if time.Now().After(deadline) || !sleepFor(ctx, 200*time.Millisecond) {
			return "", cp
		}
	}
}

// killLeader SIGKILLs the process whose relay leads (with -kill-when in-flight, as soon as
// its relay has sent: the batch is then likely not marked yet) and starts a new process.
// A standby relay of another process takes over and resends from the checkpoint what the
// killed one sent and did not mark.
func (c *chaos) killLeader(ctx context.Context, f *fault) {
	name, cp := c.findLeader(ctx, 20*time.Second)
	if name == "" {
		f.Start, f.End, f.Err = time.Now(), time.Now(), "no relay leads the table (checkpoint row: "+describeCheckpoint(cp)+")"
		return
	}
	f.Target = name
	f.Note = fmt.Sprintf("it led as %s, epoch %d", cp.Leader, cp.Epoch)
	how := ""
	if c.o.killWhen == "in-flight" {
		how = " (its relay sent nothing: killed anyway after 10 s)"
		if c.pubs.waitRelaySend(ctx, name, 10*time.Second) {
			how = " as its relay has just sent"
		}
	}
	f.Start = time.Now()
	if err := c.pubs.kill(name); err != nil {
		f.Err = err.Error()
	}
	c.logf("fault: SIGKILL publisher %s, whose relay leads (epoch %d)%s", name, cp.Epoch, how)
	p, err := c.pubs.start()
	f.End = time.Now()
	if err != nil {
		f.Err = err.Error()
		return
	}
	f.Replacement = p.name
	c.logf("started publisher %s in its place", p.name)
	if next, ncp := c.findLeader(ctx, 20*time.Second); next != "" {
		c.logf("%s leads now (epoch %d), %s after the kill", ncp.Leader, ncp.Epoch, time.Since(f.Start).Round(100*time.Millisecond))
	}
}

// purgeWhileLeaderDown purges the binary logs the relay leader would resume from: it
// pauses every publisher process (SIGSTOP: no standby can take over meanwhile), SIGKILLs
// the leader's, lets the writers commit past its checkpoint, flushes the binary log and
// purges the older files (retried until they are gone), then starts a new process and
// resumes the others. The next leader finds its checkpoint's position purged (error 1236):
// it sweeps the table and reads on from the current position.
func (c *chaos) purgeWhileLeaderDown(ctx context.Context, f *fault) {
	name, cp := c.findLeader(ctx, 20*time.Second)
	pause, resume := pauseSignals()
	f.Start = time.Now()
	if pause != nil {
		c.pubs.signalAll(pause)
	}
	if name != "" {
		f.Target = name
		if err := c.pubs.kill(name); err != nil {
			f.Err = err.Error()
		}
		c.logf("fault: binlog purge: publishers paused, SIGKILL publisher %s, whose relay leads (epoch %d)", name, cp.Epoch)
	} else {
		c.logf("fault: binlog purge: publishers paused; no relay leads (checkpoint row: %s)", describeCheckpoint(cp))
	}
	sleepFor(ctx, 2*time.Second) // the writers commit past the checkpoint
	begin := time.Now()
	n, err := purgeBinlogs(ctx, c.db, time.Minute)
	took := time.Since(begin)
	if err != nil {
		f.Err = err.Error()
	}
	c.logf("purged %d binary logs in %s", n, took.Round(100*time.Millisecond))
	f.Note = fmt.Sprintf("%d binary logs purged in %s", n, dur(took))
	if name != "" {
		f.Note = fmt.Sprintf("%s led as %s, epoch %d; ", name, cp.Leader, cp.Epoch) + f.Note
		p, err := c.pubs.start()
		if err != nil {
			f.Err = err.Error()
		} else {
			f.Replacement = p.name
			c.logf("started publisher %s in its place", p.name)
		}
	}
	if resume != nil {
		c.pubs.signalAll(resume)
	}
	f.End = time.Now()
	if next, ncp := c.findLeader(ctx, 20*time.Second); next != "" {
		c.logf("%s leads now (epoch %d), %s after the publishers resumed", ncp.Leader, ncp.Epoch, time.Since(f.End).Round(100*time.Millisecond))
	}
}

func describeCheckpoint(cp checkpointRow) string {
	if !cp.Found {
		return "none"
	}
	fresh := "heartbeat fresh"
	if !cp.Fresh {
		fresh = "heartbeat old"
	}
	return fmt.Sprintf("epoch %d, mode %s, leader %s, %s", cp.Epoch, cp.Mode, cp.Leader, fresh)
}
