package main

import (
	"context"
	"database/sql"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/apache/rocketmq-client-go/v2/consumer"
	"github.com/apache/rocketmq-client-go/v2/primitive"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/metric/noop"

	"github.com/go-outbox/outbox"
	"github.com/go-outbox/outbox/inbox"
)

// consumeOptions configures one inbox consumer process (the `consume` subcommand).
type consumeOptions struct {
	dsn, namesrv, topic, group string
	inboxTable, effects        string
	tag                        string
	instance, dir              string
	hold                       time.Duration
}

func (o *consumeOptions) flags(fs *flag.FlagSet) {
	fs.StringVar(&o.dsn, "dsn", "", "MySQL DSN")
	fs.StringVar(&o.namesrv, "namesrv", "", "RocketMQ name server(s), comma separated")
	fs.StringVar(&o.topic, "topic", "", "RocketMQ topic")
	fs.StringVar(&o.group, "group", "", "consumer group (the inbox's Config.Group)")
	fs.StringVar(&o.inboxTable, "inbox", "", "the inbox table (inbox.Config.Table; it exists already)")
	fs.StringVar(&o.effects, "effects", "", "the effects table, one row written per handled event")
	fs.StringVar(&o.tag, "tag", "", "the run's biz no prefix: messages of other biz nos are acknowledged with no effect")
	fs.StringVar(&o.instance, "instance", "", "the consumer's name")
	fs.StringVar(&o.dir, "dir", ".", "where the process writes INSTANCE.log (slog JSON) and INSTANCE.inbox (its records)")
	fs.DurationVar(&o.hold, "hold", 50*time.Millisecond, "how long the handler works after writing its effect, before its transaction commits")
}

// args renders o as the command line of a consumer process.
func (o consumeOptions) args() []string {
	return []string{"consume",
		"-dsn", o.dsn, "-namesrv", o.namesrv, "-topic", o.topic, "-group", o.group,
		"-inbox", o.inboxTable, "-effects", o.effects, "-tag", o.tag,
		"-instance", o.instance, "-dir", o.dir, "-hold", o.hold.String()}
}

// Kinds of an inbox consumer's records (its INSTANCE.inbox file, in the outcome-log format:
// BizNo is the event's biz no, Detail its eventId, ID is unused).
const (
	// kindHandle: the handler began, in the transaction in which the inbox has recorded the
	// event; the effect is not committed yet.
	kindHandle = "handle"
	// kindInboxPrefix + an inbox.Outcome's name ("inbox-handled", "inbox-duplicate",
	// "inbox-rejected", "inbox-failed"): what became of a delivery, as the inbox counted it
	// in its inbox.messages metric.
	kindInboxPrefix = "inbox-"
)

// effectsSchema is the effects table: one row per effect the handlers committed. It has no
// unique key on the event on purpose, so that an effect done twice is two rows.
func effectsSchema(table string) string {
	return "CREATE TABLE IF NOT EXISTS `" + table + "` (" +
		"id BIGINT NOT NULL AUTO_INCREMENT, " +
		"event_id CHAR(36) CHARACTER SET ascii COLLATE ascii_bin NOT NULL, " +
		"biz_no VARCHAR(64) NOT NULL, " +
		"consumer VARCHAR(32) NOT NULL, " +
		"msg_id VARCHAR(128) NOT NULL, " +
		"deliveries INT NOT NULL, " +
		"born_at DATETIME(3) NOT NULL, " +
		"effect_at DATETIME(6) NOT NULL, " +
		"PRIMARY KEY (id), KEY idx_event_id (event_id), KEY idx_effect_at (effect_at)" +
		") ENGINE = InnoDB"
}

// effect is one row of the effects table.
type effect struct {
	EventID  string
	BizNo    string
	Consumer string
	Born     time.Time // when the message was sent (its born timestamp)
	At       time.Time // when the handler wrote it (before its commit)
}

// runConsumer is an inbox consumer process: inbox.NewConsumer in the run's group on the real
// broker, whose handler writes one row per event into the effects table in the inbox's
// transaction, then works for -hold before returning (so that a SIGKILL often finds an
// effect written and not committed). It runs until SIGTERM or SIGINT (a clean stop) or
// SIGKILL (the fault the chaos run injects).
func runConsumer(args []string) int {
	var o consumeOptions
	fs := flag.NewFlagSet("consume", flag.ContinueOnError)
	o.flags(fs)
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if o.dsn == "" || o.namesrv == "" || o.topic == "" || o.group == "" || o.inboxTable == "" ||
		o.effects == "" || o.tag == "" || o.instance == "" {
		fmt.Fprintln(os.Stderr, "consume: -dsn, -namesrv, -topic, -group, -inbox, -effects, -tag and -instance are required")
		return 2
	}
	if err := consumeInbox(o); err != nil {
		fmt.Fprintf(os.Stderr, "consume %s: %v\n", o.instance, err)
		return 1
	}
	return 0
}

func consumeInbox(o consumeOptions) error {
	logFile, err := os.OpenFile(filepath.Join(o.dir, o.instance+".log"), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer logFile.Close()
	// Info: the inbox logs each duplicate it suppresses at info.
	logger := slog.New(slog.NewJSONHandler(logFile, &slog.HandlerOptions{Level: slog.LevelInfo}))
	outbox.RouteRocketMQClientLogs(logger)
	recs, err := openOutcomeLog(filepath.Join(o.dir, o.instance+".inbox"), o.instance)
	if err != nil {
		return err
	}
	defer recs.close()

	db, err := sql.Open("mysql", o.dsn)
	if err != nil {
		return err
	}
	defer db.Close()
	db.SetMaxOpenConns(32)
	in, err := inbox.New(db, inbox.Config{Group: o.group, Table: o.inboxTable, Logger: logger,
		MeterProvider: outcomeMeter{log: recs}})
	if err != nil {
		return err
	}
	c, err := inbox.NewConsumer(in, effectHandler(o, recs), inbox.ConsumerConfig{
		NameServers:  strings.Split(o.namesrv, ","),
		Topic:        o.topic,
		InstanceName: fmt.Sprintf("%s-%d", o.instance, os.Getpid()),
		// One message per call, so that the outcome counter's context names the message.
		ConsumerOptions: []consumer.Option{consumer.WithConsumeMessageBatchMaxSize(1)},
	})
	if err != nil {
		return err
	}
	defer c.Close()
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	return c.Run(ctx)
}

// effectHandler is the consumers' handler: for an event of the run, a record that it began,
// then its effect row, written in tx, then -hold of work before the inbox commits.
func effectHandler(o consumeOptions, recs *outcomeLog) inbox.Handler {
	insert := "INSERT INTO `" + o.effects + "` (event_id, biz_no, consumer, msg_id, deliveries, born_at, effect_at) VALUES (?, ?, ?, ?, ?, ?, ?)"
	return func(ctx context.Context, tx *sql.Tx, msg *inbox.Message) error {
		if !strings.HasPrefix(msg.BizNo, o.tag+"-") {
			return nil // another run's message: no effect
		}
		recs.write([]record{{Kind: kindHandle, BizNo: msg.BizNo, Detail: msg.EventID}})
		if _, err := tx.ExecContext(ctx, insert, msg.EventID, msg.BizNo, o.instance, msg.MsgID, msg.Deliveries, msg.BornAt, time.Now()); err != nil {
			return err
		}
		time.Sleep(o.hold)
		return nil
	}
}

// outcomeMeter is a MeterProvider whose inbox.messages counter appends a record per delivery
// to the consumer's records (one unbuffered write each, which a SIGKILL cannot undo), with
// the message's biz no and eventId from the push consumer's context. Every other instrument
// records nothing.
type outcomeMeter struct {
	noop.MeterProvider
	log *outcomeLog
}

func (p outcomeMeter) Meter(string, ...metric.MeterOption) metric.Meter {
	return outcomeMeterMeter{log: p.log}
}

type outcomeMeterMeter struct {
	noop.Meter
	log *outcomeLog
}

func (m outcomeMeterMeter) Int64Counter(name string, opts ...metric.Int64CounterOption) (metric.Int64Counter, error) {
	if name == "inbox.messages" {
		return outcomeCounter{log: m.log}, nil
	}
	return m.Meter.Int64Counter(name, opts...)
}

type outcomeCounter struct {
	noop.Int64Counter
	log *outcomeLog
}

func (c outcomeCounter) Add(ctx context.Context, n int64, opts ...metric.AddOption) {
	rec := record{Kind: kindInboxPrefix + "unknown"}
	attrs := metric.NewAddConfig(opts).Attributes()
	if v, ok := attrs.Value("outcome"); ok {
		rec.Kind = kindInboxPrefix + v.AsString()
	}
	if mc, ok := primitive.GetConsumerCtx(ctx); ok && len(mc.Msgs) == 1 {
		rec.BizNo = mc.Msgs[0].GetProperty(outbox.PropertyBizNo)
		rec.Detail = mc.Msgs[0].GetProperty(outbox.PropertyEventID)
	}
	recs := make([]record, n)
	for i := range recs {
		recs[i] = rec
	}
	c.log.write(recs)
}
