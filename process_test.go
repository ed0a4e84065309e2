package outbox_test

import (
	"bufio"
	"context"
	"database/sql"
	"fmt"
	"io"
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
// send forever. Mode "drain": run until every row of the table is SUCCESS, announcing
// "SENT id" for each send.
func runChild() int {
	mode := os.Getenv(childEnv)
	db, err := sql.Open("mysql", os.Getenv("OUTBOX_CHILD_DSN"))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	defer db.Close()
	store, err := outbox.NewMySQLStore(db, outbox.MySQLConfig{Table: os.Getenv("OUTBOX_CHILD_TABLE")})
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
		ClaimMode:       testClaimMode,
		InstanceID:      os.Getenv("OUTBOX_CHILD_ID"),
		PollInterval:    20 * time.Millisecond,
		ReclaimInterval: 100 * time.Millisecond,
		Lease:           2 * time.Second,
		SendTimeout:     100 * time.Millisecond,
	}
	ctx := context.Background()
	switch mode {
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
	case "drain":
		sender := outbox.SenderFunc(func(_ context.Context, ev outbox.Event) error {
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
			if err := db.QueryRow("SELECT COUNT(*) FROM `" + store.Table() + "` WHERE status <> 'SUCCESS'").Scan(&left); err == nil && left == 0 {
				break
			}
			time.Sleep(50 * time.Millisecond)
		}
		cancel()
		<-done
		return 0
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

	hang := childCmd(t, "hang", "proc-a", b.store.Table())
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

	drain := childCmd(t, "drain", "proc-b", b.store.Table())
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
