package main

import (
	"context"
	"database/sql"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	_ "github.com/go-sql-driver/mysql"

	"github.com/go-outbox/outbox"
)

// publishOptions configures one publisher process (the `publish` subcommand).
type publishOptions struct {
	dsn, table, namesrv, topic string
	instance, dir              string
	claimMode                  string
	lease, reclaim, poll       time.Duration

	// relayTable, when set, makes the process run a binlog relay beside its publisher
	// (relay mode): the relay's checkpoint table, which the publisher's store names as its
	// RelayTable; serverID is the relay's binlog client id, fallback its FallbackAfter.
	relayTable string
	serverID   uint
	fallback   time.Duration
}

func (o *publishOptions) flags(fs *flag.FlagSet) {
	fs.StringVar(&o.dsn, "dsn", "", "MySQL DSN")
	fs.StringVar(&o.table, "table", "", "outbox table")
	fs.StringVar(&o.namesrv, "namesrv", "", "RocketMQ name server(s), comma separated")
	fs.StringVar(&o.topic, "topic", "", "RocketMQ topic")
	fs.StringVar(&o.instance, "instance", "", "the publisher's InstanceID")
	fs.StringVar(&o.dir, "dir", ".", "where the process writes INSTANCE.log (slog JSON) and INSTANCE.outcomes")
	fs.StringVar(&o.claimMode, "claim-mode", claimBatch, "batch, or per-row (Tuning.ClaimPerRow)")
	fs.DurationVar(&o.lease, "lease", 30*time.Second, "Tuning.Lease")
	fs.DurationVar(&o.reclaim, "reclaim", 5*time.Second, "Tuning.ReclaimInterval")
	fs.DurationVar(&o.poll, "poll", 0, "Config.PollInterval (0: the library's default)")
	fs.StringVar(&o.relayTable, "relay-table", "", "run a binlog relay too, with this checkpoint table (the store's RelayTable)")
	fs.UintVar(&o.serverID, "server-id", 0, "the relay's binlog client server id (relay.Config.ServerID)")
	fs.DurationVar(&o.fallback, "relay-fallback", 0, "the relay's FallbackAfter (0: the relay's default)")
}

// args renders o as the command line of a publisher process.
func (o publishOptions) args() []string {
	return []string{"publish",
		"-dsn", o.dsn, "-table", o.table, "-namesrv", o.namesrv, "-topic", o.topic,
		"-instance", o.instance, "-dir", o.dir, "-claim-mode", o.claimMode,
		"-lease", o.lease.String(), "-reclaim", o.reclaim.String(), "-poll", o.poll.String(),
		"-relay-table", o.relayTable, "-server-id", fmt.Sprint(o.serverID), "-relay-fallback", o.fallback.String()}
}

// runPublisher is a publisher process: outbox.NewPublisher with outbox.NewRocketMQSender on
// the real broker, a short lease so that a killed process's rows come back quickly, the
// library's defaults otherwise. It runs until SIGTERM or SIGINT (a clean stop: Run records
// what is in flight, then Close closes the sender) or SIGKILL (the fault the chaos run
// injects). With -relay-table it runs a binlog relay beside the publisher (see runRelay).
func runPublisher(args []string) int {
	var o publishOptions
	fs := flag.NewFlagSet("publish", flag.ContinueOnError)
	o.flags(fs)
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if o.dsn == "" || o.table == "" || o.namesrv == "" || o.topic == "" || o.instance == "" {
		fmt.Fprintln(os.Stderr, "publish: -dsn, -table, -namesrv, -topic and -instance are required")
		return 2
	}
	if _, err := claimMode(o.claimMode); err != nil {
		fmt.Fprintln(os.Stderr, "publish:", err)
		return 2
	}
	if err := publish(o); err != nil {
		fmt.Fprintf(os.Stderr, "publish %s: %v\n", o.instance, err)
		return 1
	}
	return 0
}

func publish(o publishOptions) error {
	logFile, err := os.OpenFile(filepath.Join(o.dir, o.instance+".log"), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer logFile.Close()
	var clientRetries atomic.Int64
	logger := slog.New(retryCounter{Handler: slog.NewJSONHandler(logFile, nil), n: &clientRetries})
	outcomes, err := openOutcomeLog(filepath.Join(o.dir, o.instance+".outcomes"), o.instance)
	if err != nil {
		return err
	}
	defer outcomes.close()

	db, err := sql.Open("mysql", o.dsn)
	if err != nil {
		return err
	}
	defer db.Close()
	store, err := outbox.NewMySQLStore(db, outbox.MySQLConfig{Table: o.table, RelayTable: o.relayTable, Routes: outbox.Routes{Topic: o.topic}})
	if err != nil {
		return err
	}
	outbox.RouteRocketMQClientLogs(logger) // before the process's first RocketMQ client
	sender, err := outbox.NewRocketMQSender(outbox.RocketMQConfig{
		NameServers:  strings.Split(o.namesrv, ","),
		InstanceName: o.instance + "-" + fmt.Sprint(os.Getpid()),
	})
	if err != nil {
		return err
	}
	perRow, err := claimMode(o.claimMode)
	if err != nil {
		_ = sender.Close()
		return err
	}
	p, err := outbox.NewPublisher(recordingStore{MySQLStore: store, log: outcomes},
		&recordingSender{inner: sender, log: outcomes, clientRetries: &clientRetries},
		outbox.Config{
			InstanceID:   o.instance,
			PollInterval: o.poll,
			Logger:       logger,
			Tuning: outbox.Tuning{
				ClaimPerRow:     perRow,
				Lease:           o.lease,
				ReclaimInterval: o.reclaim,
			},
		})
	if err != nil {
		_ = sender.Close()
		return err
	}
	defer p.Close() // once Run has returned: closes the sender
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if o.relayTable != "" {
		return runRelay(ctx, o, p, sender, logger, &clientRetries)
	}
	return p.Run(ctx)
}

// The claim modes' names: the publishers' batch claims (the default), or Tuning.ClaimPerRow.
const (
	claimBatch  = "batch"
	claimPerRow = "per-row"
)

// claimMode reports whether the named claim mode is per-row (Tuning.ClaimPerRow).
func claimMode(s string) (perRow bool, err error) {
	switch s {
	case claimBatch:
		return false, nil
	case claimPerRow:
		return true, nil
	}
	return false, fmt.Errorf("claim mode %q is neither %s nor %s", s, claimBatch, claimPerRow)
}

// recordingStore is the MySQL store with every claim and every outcome written under a claim
// appended to the outcome log. Everything else (Subscribe too) is the store's own.
type recordingStore struct {
	*outbox.MySQLStore
	log *outcomeLog
}

func (s recordingStore) ClaimDue(ctx context.Context, req outbox.ClaimRequest) (outbox.ClaimResult, error) {
	res, err := s.MySQLStore.ClaimDue(ctx, req)
	if len(req.Succeeded) > 0 {
		s.log.write(ackRecords(req.Succeeded, res.Succeeded, err))
	}
	recs := make([]record, len(res.Events))
	for i, ev := range res.Events {
		recs[i] = record{Kind: kindClaim, ID: ev.ID, BizNo: ev.BizNo}
	}
	s.log.write(recs)
	return res, err
}

func (s recordingStore) Claim(ctx context.Context, ev outbox.Event, owner string) (bool, error) {
	won, err := s.MySQLStore.Claim(ctx, ev, owner)
	if won && err == nil {
		s.log.write([]record{{Kind: kindClaim, ID: ev.ID, BizNo: ev.BizNo}})
	}
	return won, err
}

func (s recordingStore) MarkSuccess(ctx context.Context, ids []int64, owner string) (int64, error) {
	n, err := s.MySQLStore.MarkSuccess(ctx, ids, owner)
	s.log.write(ackRecords(ids, n, err))
	return n, err
}

// ackRecords are the records of an acknowledgement of ids that marked n rows, or failed. One
// id marked or not is known exactly; of several, fewer marked than named leaves which ones
// unknown.
func ackRecords(ids []int64, n int64, err error) []record {
	kind, detail := kindAck, ""
	switch {
	case err != nil:
		kind, detail = kindAckError, err.Error()
	case n == 0:
		kind = kindAckLost
	case n < int64(len(ids)):
		kind, detail = kindAckPartial, fmt.Sprintf("%d of %d rows", n, len(ids))
	}
	recs := make([]record, len(ids))
	for i, id := range ids {
		recs[i] = record{Kind: kind, ID: id, Detail: detail}
	}
	return recs
}

func (s recordingStore) ReleaseForRetry(ctx context.Context, id int64, owner string, retryCount int, delay time.Duration, class, reason string) (bool, error) {
	ok, err := s.MySQLStore.ReleaseForRetry(ctx, id, owner, retryCount, delay, class, reason)
	s.log.write([]record{writeRecord(id, kindRelease, kindReleaseLost, kindReleaseError, ok, err)})
	return ok, err
}

func (s recordingStore) MarkFail(ctx context.Context, id int64, owner string, retryCount int, class, reason string) ([]outbox.Failure, bool, error) {
	history, ok, err := s.MySQLStore.MarkFail(ctx, id, owner, retryCount, class, reason)
	rec := writeRecord(id, kindDead, kindDeadLost, kindDeadError, ok, err)
	if ok {
		rec.Detail = reason
	}
	s.log.write([]record{rec})
	return history, ok, err
}

func writeRecord(id int64, done, lost, failed string, ok bool, err error) record {
	switch {
	case err != nil:
		return record{Kind: failed, ID: id, Detail: err.Error()}
	case !ok:
		return record{Kind: lost, ID: id}
	}
	return record{Kind: done, ID: id}
}

// recordingSender is the RocketMQ sender with every send outcome appended to the outcome log.
// It passes Info on, and Close, which the publisher's Close calls.
type recordingSender struct {
	inner *outbox.RocketMQSender
	log   *outcomeLog
	// clientRetries counts the client's "start retrying to send" warnings: a send during
	// which it moved was tried more than once inside the client, and an earlier try's outcome
	// is unknown.
	clientRetries *atomic.Int64
}

func (s *recordingSender) Send(ctx context.Context, evs []outbox.Event, keyOrder bool) []error {
	before := s.clientRetries.Load()
	errs := s.inner.Send(ctx, evs, keyOrder)
	retried := s.clientRetries.Load() != before
	recs := make([]record, len(evs))
	for i, ev := range evs {
		var err error
		if i < len(errs) {
			err = errs[i]
		}
		recs[i] = sendRecord(ev, sendOutcome(err, retried), err, retried)
	}
	s.log.write(recs)
	return errs
}

func (s *recordingSender) Info() outbox.SenderInfo { return s.inner.Info() }

func (s *recordingSender) Check(ctx context.Context, topics []string) error {
	return s.inner.Check(ctx, topics)
}

func (s *recordingSender) Close() error { return s.inner.Close() }

func sendRecord(ev outbox.Event, kind string, err error, clientRetried bool) record {
	r := record{Kind: kind, ID: ev.ID, BizNo: ev.BizNo}
	switch {
	case err != nil && clientRetried:
		r.Detail = "client retried; last try: " + err.Error()
	case err != nil:
		r.Detail = err.Error()
	case clientRetried:
		r.Detail = "client retried"
	}
	return r
}

// sendOutcome says what a send's result proves about the broker's store. Only a result that
// proves the message was not stored is "failed"; anything that leaves it open is "unknown",
// so that a duplicate it caused is explained. From rocketmq-client-go's SendSync: a client
// that retried returns only its last try's error, so after a retry nothing is proven; a
// connection refused, a missing route, the producer not running, the publisher's "not sent"
// (a batch whose deadline passed before its turn), a closed sender and a broker's answer with
// an error code ("CODE: n", the request was refused) mean the message was not stored; a
// status other than SEND_OK means it was stored but not confirmed; a timeout or a connection
// lost mid-request may go either way.
func sendOutcome(err error, clientRetried bool) string {
	if err == nil {
		if clientRetried {
			return kindSentRetried
		}
		return kindSent
	}
	if clientRetried {
		return kindUnknown
	}
	if errors.Is(err, outbox.ErrClosed) {
		return kindFailed
	}
	msg := err.Error()
	for _, s := range []string{"connection refused", "route info not found", "topic route not found",
		"producer not started", "not sent:", "CODE: "} {
		if strings.Contains(msg, s) {
			return kindFailed
		}
	}
	return kindUnknown
}

// retryCounter is a slog handler that counts the RocketMQ client's internal send retries
// as they are logged, and passes every record on.
type retryCounter struct {
	slog.Handler
	n *atomic.Int64
}

func (h retryCounter) Handle(ctx context.Context, r slog.Record) error {
	if strings.HasPrefix(r.Message, "start retrying to send") {
		h.n.Add(1)
	}
	return h.Handler.Handle(ctx, r)
}

func (h retryCounter) WithAttrs(attrs []slog.Attr) slog.Handler {
	return retryCounter{Handler: h.Handler.WithAttrs(attrs), n: h.n}
}

func (h retryCounter) WithGroup(name string) slog.Handler {
	return retryCounter{Handler: h.Handler.WithGroup(name), n: h.n}
}
