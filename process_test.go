package outbox_test

import (
	"bufio"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/go-outbox/outbox"
	"github.com/go-outbox/outbox/internal/testsvc"
)

// The test binary re-runs itself as a publisher process when childEnv is set, so that a
// publisher can be killed for real (SIGKILL: no deferred code, no clean shutdown).
const childEnv = "OUTBOX_TEST_CHILD"

// runChild is a publisher process. Mode "hang": claim, announce "SENDING id", then block in the
// send forever. Mode "drain": run until no row of the table is WAIT or SENDING, announcing
// "SENT id" for each send. Mode "poison": drain, but the send of an event whose biz no is
// poisonBizNo kills the process. Mode "rocketmq": publish to the real broker (topic
// OUTBOX_CHILD_TOPIC, name server OUTBOX_CHILD_NAMESRV) until killed.
const poisonBizNo = "POISON"

func runChild() int {
	mode := os.Getenv(childEnv)
	db, err := sql.Open("mysql", os.Getenv("OUTBOX_CHILD_DSN"))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	defer db.Close()
	ordering := outbox.Unordered
	if os.Getenv("OUTBOX_CHILD_ORDERING") == "key" {
		ordering = outbox.KeyOrder
	}
	store, err := outbox.NewMySQLStore(db, outbox.MySQLConfig{Table: os.Getenv("OUTBOX_CHILD_TABLE"), Ordering: ordering,
		Routes: outbox.Routes{Topic: os.Getenv("OUTBOX_CHILD_TOPIC")}})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	out := bufio.NewWriter(os.Stdout)
	announce := func(word string, id int64) {
		fmt.Fprintf(out, "%s %d\n", word, id)
		_ = out.Flush()
	}
	cfg := outbox.Config{
		InstanceID:   os.Getenv("OUTBOX_CHILD_ID"),
		PollInterval: 20 * time.Millisecond,
		Tuning: outbox.Tuning{
			ClaimPerRow:     testPerRow,
			ReclaimInterval: 100 * time.Millisecond,
			Lease:           2 * time.Second,
			SendTimeout:     100 * time.Millisecond,
		},
	}
	ctx := context.Background()
	switch mode {
	case "hold":
		// A publisher with the default lease and reclaim interval whose sends never return:
		// it holds its claims, renewing their leases, until it is killed.
		sender := outbox.SenderFunc(func(context.Context, outbox.Event) error { time.Sleep(time.Hour); return nil })
		hooked := &hookStore{Store: store, afterClaim: func(_ context.Context, ev outbox.Event, won bool) {
			if won {
				announce("SENDING", ev.ID)
			}
		}}
		p, err := outbox.NewPublisher(hooked, sender, outbox.Config{InstanceID: os.Getenv("OUTBOX_CHILD_ID"),
			Logger: slog.New(slog.DiscardHandler), Tuning: outbox.Tuning{ClaimPerRow: testPerRow, BatchSize: 10}})
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 2
		}
		_ = p.Run(ctx)
		return 3 // unreachable: the send never returns
	case "hang":
		// A send that ignores its context and never returns in practice. (A sleep rather
		// than an empty select, which the runtime could report as a deadlock.)
		sender := outbox.SenderFunc(func(context.Context, outbox.Event) error { time.Sleep(time.Hour); return nil })
		hooked := &hookStore{Store: store, afterClaim: func(_ context.Context, ev outbox.Event, won bool) {
			if won {
				announce("SENDING", ev.ID)
			}
		}}
		p, err := outbox.NewPublisher(hooked, sender, cfg)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 2
		}
		_, _ = p.PublishPending(ctx)
		return 3 // unreachable: the send never returns
	case "drain", "poison":
		sender := outbox.SenderFunc(func(_ context.Context, ev outbox.Event) error {
			if mode == "poison" && ev.BizNo == poisonBizNo {
				// The send of a poison event kills its process: no outcome is ever recorded.
				_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
				time.Sleep(time.Hour)
			}
			announce("SENT", ev.ID)
			return nil
		})
		p, err := outbox.NewPublisher(store, sender, cfg)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 2
		}
		ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
		defer cancel()
		done := make(chan error, 1)
		go func() { done <- p.Run(ctx) }()
		for ctx.Err() == nil {
			var left int
			if err := db.QueryRow("SELECT COUNT(*) FROM `" + outbox.TableForTest(store) + "` WHERE status IN ('WAIT', 'SENDING')").Scan(&left); err == nil && left == 0 {
				break
			}
			time.Sleep(50 * time.Millisecond)
		}
		cancel()
		<-done
		return 0
	case "rocketmq":
		// A publisher on the real broker that runs until it is killed, announcing "READY 0"
		// as it starts.
		cfg.Tuning.SendTimeout, cfg.Tuning.Lease = 2*time.Second, 20*time.Second
		outbox.RouteRocketMQClientLogs(nil)
		sender, err := outbox.NewRocketMQSender(outbox.RocketMQConfig{
			NameServers: []string{os.Getenv("OUTBOX_CHILD_NAMESRV")},
			GroupName:   os.Getenv("OUTBOX_CHILD_ID"),
			SendTimeout: cfg.Tuning.SendTimeout,
		})
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 2
		}
		p, err := outbox.NewPublisher(store, sender, cfg)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 2
		}
		announce("READY", 0)
		_ = p.Run(ctx)
		return 3 // unreachable: nothing ends ctx
	}
	fmt.Fprintln(os.Stderr, "unknown child mode", mode)
	return 2
}

func childCmd(t *testing.T, mode, id, table string) *exec.Cmd {
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childEnv+"="+mode, "OUTBOX_CHILD_ID="+id,
		"OUTBOX_CHILD_DSN="+testsvc.MySQLDSN(t), "OUTBOX_CHILD_TABLE="+table)
	cmd.Stderr = os.Stderr
	return cmd
}

// readIDs reads "WORD id" lines until EOF.
func readIDs(t *testing.T, r io.Reader, word string) []int64 {
	var ids []int64
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		w, v, ok := strings.Cut(sc.Text(), " ")
		require.True(t, ok && w == word, "unexpected line %q", sc.Text())
		id, err := strconv.ParseInt(v, 10, 64)
		require.NoError(t, err)
		ids = append(ids, id)
	}
	return ids
}

// A publisher process is SIGKILLed after its claim and before its send returned. The row is
// left SENDING under the dead owner; another process reclaims it once the lease (2 s) has
// expired and sends it. Nothing is lost, and nothing is sent twice by the survivor.
func TestProcessKilledMidSendIsReclaimedByAnother(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ids := b.insert(t, 5)

	hang := childCmd(t, "hang", "proc-a", outbox.TableForTest(b.store))
	stdout, err := hang.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, hang.Start())
	line, err := bufio.NewReader(stdout).ReadString('\n')
	require.NoError(t, err, "process A never claimed")
	var stuck int64
	_, err = fmt.Sscanf(line, "SENDING %d", &stuck)
	require.NoError(t, err)
	require.NoError(t, hang.Process.Signal(syscall.SIGKILL))
	werr := hang.Wait()
	var exitErr *exec.ExitError
	require.ErrorAs(t, werr, &exitErr)
	require.Equal(t, syscall.SIGKILL, exitErr.Sys().(syscall.WaitStatus).Signal())

	got := b.get(t, stuck)
	require.Equal(t, outbox.StatusSending, got.Status, "the killed process leaves its claim behind")
	require.Equal(t, "proc-a", got.ClaimOwner)

	drain := childCmd(t, "drain", "proc-b", outbox.TableForTest(b.store))
	out, err := drain.StdoutPipe()
	require.NoError(t, err)
	start := time.Now()
	require.NoError(t, drain.Start())
	sent := readIDs(t, out, "SENT")
	require.NoError(t, drain.Wait())
	t.Logf("process B drained %d events in %s (lease 2 s)", len(sent), time.Since(start).Round(time.Millisecond))

	assert.ElementsMatch(t, ids, sent, "every event sent once by the survivor, the stuck one included")
	for _, id := range ids {
		got := b.get(t, id)
		assert.Equal(t, outbox.StatusSuccess, got.Status)
		assert.Equal(t, "proc-b", got.ClaimOwner)
	}
}

// After a SIGKILL, the survivors send the dead instance's claims within seconds, with the
// default settings (Tuning.Lease 15 s, ReclaimInterval 5 s): unordered and in key order,
// where the keys of the events it held wait for them and then go on in order. While the
// instance is alive, its send hangs longer than a lease, and its leases are renewed: the
// survivor, running beside it, sends none of them. docs/operations.md gives the figures.
func TestKilledInstancesClaimsAreSentWithinSeconds(t *testing.T) {
	t.Parallel()
	for _, o := range []outbox.Ordering{outbox.Unordered, outbox.KeyOrder} {
		t.Run(o.String(), func(t *testing.T) {
			t.Parallel()
			db := testsvc.OpenDB(t)
			b := &bundle{db: db, store: testsvc.NewStore(t, db, outbox.MySQLConfig{Ordering: o})}
			var ids []int64
			for i := range 40 {
				ids = append(ids, b.insertInput(t, outbox.EventInput{BizNo: fmt.Sprintf("ORD-%d", i%8), EventType: "ORDER_STEP", Payload: []byte("{}")}))
			}
			hold := childCmd(t, "hold", "proc-hold-"+o.String(), outbox.TableForTest(b.store))
			if o != outbox.Unordered {
				hold.Env = append(hold.Env, "OUTBOX_CHILD_ORDERING=key")
			}
			stdout, err := hold.StdoutPipe()
			require.NoError(t, err)
			require.NoError(t, hold.Start())
			t.Cleanup(func() { _ = hold.Process.Kill(); _ = hold.Wait() })
			held := map[int64]bool{}
			sc := bufio.NewScanner(stdout)
			require.True(t, sc.Scan(), "the instance never claimed")
			var first int64
			_, err = fmt.Sscanf(sc.Text(), "SENDING %d", &first)
			require.NoError(t, err)
			held[first] = true
			go func() {
				for sc.Scan() { // the rest of its claim: read, to keep its pipe flowing
				}
			}()

			// The survivor, with the defaults, beside the live instance.
			rec := newRecorder()
			survivor := newPublisher(t, b.store, rec, outbox.Config{InstanceID: "survivor-" + o.String(), Logger: slog.New(&logSink{}),
				Tuning: outbox.Tuning{ClaimPerRow: testPerRow}})
			require.NoError(t, survivor.Start(context.Background()))
			t.Cleanup(func() { assert.NoError(t, survivor.Close()) })

			// Past a whole lease, the live instance's claims are still its own.
			time.Sleep(18 * time.Second)
			var mine []int64
			rows, err := db.Query("SELECT id FROM `"+outbox.TableForTest(b.store)+"` WHERE status = 'SENDING' AND claim_owner = ?", "proc-hold-"+o.String())
			require.NoError(t, err)
			for rows.Next() {
				var id int64
				require.NoError(t, rows.Scan(&id))
				mine = append(mine, id)
			}
			require.NoError(t, rows.Err())
			require.NoError(t, rows.Close())
			require.Contains(t, mine, first, "a live send keeps its claims past the lease")
			for _, id := range mine {
				assert.Zero(t, rec.count(id), "event %d, held by a live instance, is not sent by another", id)
			}

			require.NoError(t, hold.Process.Signal(syscall.SIGKILL))
			killed := time.Now()
			require.Eventually(t, func() bool {
				for _, id := range ids {
					if rec.count(id) == 0 {
						return false
					}
				}
				return true
			}, time.Minute, 50*time.Millisecond, "every event sent by the survivor")
			took := time.Since(killed)
			t.Logf("%s: the killed instance's %d claims sent by the survivor %s after the kill (lease 15 s, reclaim every 5 s)",
				o, len(mine), took.Round(100*time.Millisecond))
			if o != outbox.Unordered {
				last := map[string]int64{}
				for _, ev := range rec.events() {
					assert.Greater(t, ev.ID, last[ev.BizNo], "biz no %s in order", ev.BizNo)
					last[ev.BizNo] = ev.ID
				}
			}
		})
	}
}

// An event whose send kills the process every time ends: each publisher that claims it dies,
// the next reclaims it after the lease (counting the reclaim) and claims it alone; the
// third reclaim dead-letters it with a reason that says so. Every other event, including
// those that were claimed with it in the first batch and orphaned by the first death, is
// sent.
func TestPoisonEventIsDeadLetteredAfterMaxReclaims(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ids := b.insert(t, 5)
	poison := b.insertPayload(t, poisonBizNo, []byte("kills its sender"))
	ids = append(ids, b.insert(t, 5)...)

	kills := 0
	var sent []int64
	for run := 1; ; run++ {
		require.LessOrEqual(t, run, 8, "the poison event never ended")
		cmd := childCmd(t, "poison", fmt.Sprintf("proc-%d", run), outbox.TableForTest(b.store))
		out, err := cmd.StdoutPipe()
		require.NoError(t, err)
		require.NoError(t, cmd.Start())
		sent = append(sent, readIDs(t, out, "SENT")...)
		err = cmd.Wait()
		var exitErr *exec.ExitError
		if errors.As(err, &exitErr) && exitErr.Sys().(syscall.WaitStatus).Signal() == syscall.SIGKILL {
			kills++
			continue
		}
		require.NoError(t, err)
		break
	}
	assert.Equal(t, 3, kills, "claimed once, then reclaimed twice and claimed alone; the third reclaim ends it")
	got := b.get(t, poison)
	assert.Equal(t, outbox.StatusFail, got.Status)
	assert.Equal(t, 3, got.ReclaimCount)
	assert.Equal(t, 0, got.RetryCount)
	assert.Contains(t, got.LastError, "reclaimed 3 times")
	assert.NotContains(t, sent, poison)
	for _, id := range ids {
		assert.Equal(t, outbox.StatusSuccess, b.get(t, id).Status, "event %d", id)
		assert.Contains(t, sent, id)
	}
}
