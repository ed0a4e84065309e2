package outbox_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log"
	"log/slog"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/apache/rocketmq-client-go/v2/rlog"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/go-outbox/outbox"
	"github.com/go-outbox/outbox/internal/testsvc"
)

// importProbeEnv makes the test binary, which imports the package, log one line through the
// RocketMQ client's logger before anything else runs, and exit.
const importProbeEnv = "OUTBOX_TEST_IMPORT_PROBE"

// importProbeLine is what the probe logs through the client's logger.
const importProbeLine = "rocketmq-client-logger-probe"

func runImportProbe() int {
	rlog.Warning(importProbeLine, nil)
	return 0
}

// Importing the package changes no process-wide state: the RocketMQ client's logger is the
// client's own default, which writes to stderr, until the service routes it. The test binary
// imports the package; re-run as a probe, it logs through the client's logger before any
// sender exists or TestMain routes the logs.
func TestImportLeavesTheRocketMQClientLoggerAlone(t *testing.T) {
	t.Parallel()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), importProbeEnv+"=1", "ROCKETMQ_GO_LOG_LEVEL=")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	require.NoError(t, cmd.Run())
	assert.Contains(t, stderr.String(), importProbeLine,
		"a warning logged through the client's logger reaches stderr, as the client's default logger writes it")
}

// closeProbeEnv makes the test binary build a RocketMQ sender on the name server it names,
// send nothing, close it and exit; with closeProbeRouteEnv set, after routing the client's
// logs to a slog logger on stdout, at debug, as a service's main does.
const (
	closeProbeEnv      = "OUTBOX_TEST_CLOSE_PROBE"
	closeProbeRouteEnv = "OUTBOX_TEST_CLOSE_PROBE_ROUTE"
)

func runCloseProbe() int {
	if os.Getenv(closeProbeRouteEnv) != "" {
		outbox.RouteRocketMQClientLogs(slog.New(slog.NewTextHandler(os.Stdout, &slog.HandlerOptions{Level: slog.LevelDebug})))
	}
	s, err := outbox.NewRocketMQSender(outbox.RocketMQConfig{NameServers: []string{os.Getenv(closeProbeEnv)}})
	if err != nil {
		fmt.Fprintln(os.Stderr, "probe:", err)
		return 2
	}
	time.Sleep(100 * time.Millisecond) // the client's background loops run
	if err := s.Close(); err != nil {
		fmt.Fprintln(os.Stderr, "probe:", err)
		return 2
	}
	return 0
}

// A sender's Close prints the RocketMQ client's own shutdown lines on stderr through the
// client's default logger, until the service routes the client's logs: with the one call
// in main, RouteRocketMQClientLogs, they go to the service's slog (at debug: routine), and
// nothing reaches stderr.
func TestSenderCloseLogsOnlyWhereTheServiceRoutesTheClient(t *testing.T) {
	t.Parallel()
	ns := testsvc.RocketMQNameServer(t)
	run := func(route bool) (stdout, stderr string) {
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), closeProbeEnv+"="+ns, "ROCKETMQ_GO_LOG_LEVEL=")
		if route {
			cmd.Env = append(cmd.Env, closeProbeRouteEnv+"=1")
		}
		var out, errOut bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &errOut
		require.NoError(t, cmd.Run(), "stderr: %s", errOut.String())
		return out.String(), errOut.String()
	}
	_, stderr := run(false)
	assert.Contains(t, stderr, "clientMap", "unrouted, the client's shutdown lines reach stderr")
	stdout, stderr := run(true)
	assert.Empty(t, stderr, "routed, nothing reaches stderr")
	assert.Contains(t, stdout, "component=rocketmq-client", "the client's lines are in the service's slog")
	assert.Contains(t, stdout, "clientMap", "its shutdown lines among them")
	assert.NotContains(t, stdout, "level=INFO", "at debug: they are routine")
}

// RouteRocketMQClientLogs, the opt-in, sends the client's logs to the logger given: warnings
// at warn, routine lines at debug.
func TestRouteRocketMQClientLogs(t *testing.T) {
	logs := &logSink{}
	outbox.RouteRocketMQClientLogs(slog.New(logs))
	t.Cleanup(func() { outbox.RouteRocketMQClientLogs(slog.New(slog.DiscardHandler)) })
	rlog.Warning("a client warning", map[string]any{"broker": "b"})
	rlog.Info("a client routine line", nil)
	assert.Equal(t, 1, logs.count(slog.LevelWarn, "a client warning"))
	assert.Equal(t, 1, logs.count(slog.LevelDebug, "a client routine line"))
}

// lineSink is a slog.Handler that keeps every line with its attributes, those given to the
// logger (With) included.
type lineSink struct {
	mu    *sync.Mutex
	lines *[]line
	with  []slog.Attr
}

type line struct {
	level slog.Level
	msg   string
	attrs map[string]string
}

func newLineSink() *lineSink { return &lineSink{mu: &sync.Mutex{}, lines: &[]line{}} }

func (s *lineSink) Enabled(context.Context, slog.Level) bool { return true }
func (s *lineSink) WithGroup(string) slog.Handler            { return s }
func (s *lineSink) WithAttrs(attrs []slog.Attr) slog.Handler {
	c := *s
	c.with = append(slices.Clone(s.with), attrs...)
	return &c
}

func (s *lineSink) Handle(_ context.Context, r slog.Record) error {
	l := line{level: r.Level, msg: r.Message, attrs: map[string]string{}}
	for _, a := range s.with {
		l.attrs[a.Key] = a.Value.String()
	}
	r.Attrs(func(a slog.Attr) bool {
		l.attrs[a.Key] = a.Value.String()
		return true
	})
	s.mu.Lock()
	defer s.mu.Unlock()
	*s.lines = append(*s.lines, l)
	return nil
}

func (s *lineSink) all() []line {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(*s.lines)
}

// captureDefault makes slog.Default() write into a sink for the rest of the test, and puts
// back the default logger and the log package's output and flags afterwards (slog.SetDefault
// redirects the log package, and setting the original default back does not undo that).
func captureDefault(t *testing.T) *lineSink {
	t.Helper()
	sink := newLineSink()
	old, oldOut, oldFlags := slog.Default(), log.Writer(), log.Flags()
	slog.SetDefault(slog.New(sink))
	t.Cleanup(func() {
		slog.SetDefault(old)
		log.SetOutput(oldOut)
		log.SetFlags(oldFlags)
	})
	return sink
}

// A dead letter is never silent: with no Config.Logger, the publisher logs to slog.Default()
// at warn and above (as slog.Default() is when the line is logged, so a default set after
// NewPublisher counts), and routine lines stay out. Not parallel: it sets slog.Default().
func TestNilLoggerLogsDeadLettersToSlogDefault(t *testing.T) {
	ctx := context.Background()
	b := setup(t)
	okID := b.insertPayload(t, "ORD-OK", []byte(`{}`))
	deadID := b.insertPayload(t, "ORD-DEAD", []byte(`{}`))
	var dead atomic.Int64
	dead.Store(deadID)
	sender := outbox.SenderFunc(func(_ context.Context, ev outbox.Event) error {
		if ev.ID == dead.Load() {
			return outbox.Permanent(errors.New("refused for good"))
		}
		return nil
	})
	p, err := outbox.NewPublisher(b.store, sender, outbox.Config{InstanceID: "nil-logger", Tuning: outbox.Tuning{ClaimPerRow: testPerRow}})
	require.NoError(t, err)

	sink := captureDefault(t) // after NewPublisher: the default is read when a line is logged
	_, err = p.PublishPending(ctx)
	require.NoError(t, err)
	assert.Equal(t, outbox.StatusSuccess, b.get(t, okID).Status)
	assert.Equal(t, outbox.StatusFail, b.get(t, deadID).Status)

	lines := sink.all()
	require.Len(t, lines, 1, "one line, the dead letter, reaches slog.Default(): %v", lines)
	assert.Equal(t, slog.LevelError, lines[0].level)
	assert.Contains(t, lines[0].msg, "dead-lettered")
	assert.Equal(t, "nil-logger", lines[0].attrs["instance"], "with the publisher's attributes")
	assert.Equal(t, fmt.Sprint(deadID), lines[0].attrs["id"], "id is the row id")
	assert.Equal(t, b.get(t, deadID).EventID, lines[0].attrs["event_id"], "event_id is the UUID consumers see")
	assert.Contains(t, lines[0].attrs["error"], "refused for good")

	// A discard logger silences it.
	quiet, err := outbox.NewPublisher(b.store, sender, outbox.Config{Logger: slog.New(slog.DiscardHandler), Tuning: outbox.Tuning{ClaimPerRow: testPerRow}})
	require.NoError(t, err)
	dead.Store(b.insertPayload(t, "ORD-DEAD2", []byte(`{}`)))
	_, err = quiet.PublishPending(ctx)
	require.NoError(t, err)
	assert.Equal(t, outbox.StatusFail, b.get(t, dead.Load()).Status)
	assert.Len(t, sink.all(), 1, "a discard logger keeps the dead letter out of slog.Default()")
}

// Log lines name the row id "id" and the UUID consumers see "event_id", never the other way
// round: a retry, a send and a dead letter each carry both.
func TestLogLinesNameIDAndEventID(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	retried := b.insertPayload(t, "ORD-RETRY", []byte(`{}`))
	dead := b.insertPayload(t, "ORD-DEAD", []byte(`{}`))
	var failedOnce atomic.Bool
	sender := outbox.SenderFunc(func(_ context.Context, ev outbox.Event) error {
		switch {
		case ev.ID == dead:
			return outbox.Permanent(errors.New("refused for good"))
		case ev.ID == retried && failedOnce.CompareAndSwap(false, true):
			return errors.New("broker busy")
		}
		return nil
	})
	sink := newLineSink()
	p, err := outbox.NewPublisher(b.store, sender, outbox.Config{Tuning: outbox.Tuning{ClaimPerRow: true}, InstanceID: "ids",
		Logger: slog.New(sink), Backoff: func(int) time.Duration { return time.Millisecond }})
	require.NoError(t, err)
	_, err = p.PublishPending(ctx)
	require.NoError(t, err)
	b.makeDue(t, retried)
	_, err = p.PublishPending(ctx)
	require.NoError(t, err)
	require.Equal(t, outbox.StatusSuccess, b.get(t, retried).Status)

	eventIDs := b.eventIDs(t)
	seen := map[string]bool{}
	for _, l := range sink.all() {
		for key, v := range l.attrs {
			switch key {
			case "event_id":
				assert.Len(t, v, 36, "%q: event_id %q is a UUID", l.msg, v)
			case "id", "first_id", "last_id":
				_, err := strconv.ParseInt(v, 10, 64)
				assert.NoError(t, err, "%q: %s %q is a row id", l.msg, key, v)
			}
		}
		id, err := strconv.ParseInt(l.attrs["id"], 10, 64)
		if err != nil {
			continue
		}
		assert.Equal(t, eventIDs[id], l.attrs["event_id"], "%q: the event_id of row %d", l.msg, id)
		switch {
		case strings.Contains(l.msg, "will retry") && id == retried,
			strings.Contains(l.msg, "event sent") && id == retried,
			strings.Contains(l.msg, "dead-lettered") && id == dead:
			seen[l.msg] = true
		}
	}
	assert.Len(t, seen, 3, "the retry, the send and the dead letter each logged with both ids: %v", seen)
}

// The publisher takes its send timeout from a sender that has one (SenderInfo.SendTimeout),
// so it is typed once; a different value set on both is refused.
func TestSendTimeoutComesFromTheSender(t *testing.T) {
	t.Parallel()
	store := testsvc.NewStore(t, testsvc.NewDatabase(t), outbox.MySQLConfig{})
	sender, err := outbox.NewRocketMQSenderWithProducerForTest(outbox.RocketMQConfig{SendTimeout: 7 * time.Second}, &fakeProducer{})
	require.NoError(t, err)
	require.Equal(t, 7*time.Second, sender.Info().SendTimeout)

	p, err := outbox.NewPublisher(store, sender, outbox.Config{})
	require.NoError(t, err)
	assert.Equal(t, 7*time.Second, outbox.ConfigForTest(p).Tuning.SendTimeout, "a zero SendTimeout is the sender's")

	p, err = outbox.NewPublisher(store, sender, outbox.Config{Tuning: outbox.Tuning{SendTimeout: 7 * time.Second}})
	require.NoError(t, err, "the same value on both is accepted")
	assert.Equal(t, 7*time.Second, outbox.ConfigForTest(p).Tuning.SendTimeout)

	for _, d := range []time.Duration{time.Second, 20 * time.Second} {
		_, err = outbox.NewPublisher(store, sender, outbox.Config{Tuning: outbox.Tuning{SendTimeout: d}})
		require.ErrorIs(t, err, outbox.ErrInvalidConfig, "SendTimeout %s against the sender's 7s", d)
		assert.Contains(t, err.Error(), fmt.Sprintf("Tuning.SendTimeout (%s) differs from the sender's own (7s)", d))
		assert.Contains(t, err.Error(), "leave it zero")
	}

	// A send longer than a third of the lease is fine: its leases are renewed while it runs.
	_, err = outbox.NewPublisher(store, sender, outbox.Config{Tuning: outbox.Tuning{Lease: 2 * time.Second}})
	require.NoError(t, err)

	// A sender whose Info gives no send timeout leaves the default, 3 s.
	p, err = outbox.NewPublisher(store, outbox.SenderFunc(func(context.Context, outbox.Event) error { return nil }), outbox.Config{})
	require.NoError(t, err)
	assert.Equal(t, 3*time.Second, outbox.ConfigForTest(p).Tuning.SendTimeout)
}
