package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"
)

// procs are processes of one kind this binary runs: the publishers (`outbox-chaos
// publish`, p01, p02, …) or the inbox consumers (`outbox-chaos consume`, c01, c02, …).
type procs struct {
	exe    string
	dir    string
	kind   string                     // "publisher" or "consumer", for the logs
	prefix string                     // of the names: "p" or "c"
	args   func(name string) []string // the command line of the process called name
	logf   func(format string, args ...any)

	mu         sync.Mutex
	next       int
	live       map[string]*proc
	killed     map[string]time.Time
	unexpected int
}

type proc struct {
	name     string
	cmd      *exec.Cmd
	done     chan struct{}
	expected bool // killed or stopped by the run
}

// start starts a new process, named with the prefix and the next number (p01, p02, …).
func (ps *procs) start() (*proc, error) {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	if ps.live == nil {
		ps.live, ps.killed = map[string]*proc{}, map[string]time.Time{}
	}
	ps.next++
	name := fmt.Sprintf("%s%02d", ps.prefix, ps.next)
	out, err := os.OpenFile(filepath.Join(ps.dir, name+".out"), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	defer out.Close()
	cmd := exec.Command(ps.exe, ps.args(name)...)
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = childAttr()
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s %s: %w", ps.kind, name, err)
	}
	p := &proc{name: name, cmd: cmd, done: make(chan struct{})}
	ps.live[p.name] = p
	go func() {
		err := cmd.Wait()
		ps.mu.Lock()
		delete(ps.live, p.name)
		if !p.expected {
			ps.unexpected++
			ps.logf("%s %s exited on its own: %v (see %s.out)", ps.kind, p.name, err, p.name)
		}
		ps.mu.Unlock()
		close(p.done)
	}()
	return p, nil
}

// liveNames lists the running processes, in order.
func (ps *procs) liveNames() []string {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	names := make([]string, 0, len(ps.live))
	for n := range ps.live {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

// kill SIGKILLs a process and waits until it is gone.
func (ps *procs) kill(name string) error {
	ps.mu.Lock()
	p := ps.live[name]
	if p == nil {
		ps.mu.Unlock()
		return fmt.Errorf("%s %s is not running", ps.kind, name)
	}
	p.expected = true
	ps.killed[name] = time.Now()
	err := p.cmd.Process.Signal(syscall.SIGKILL)
	ps.mu.Unlock()
	if err != nil {
		return err
	}
	<-p.done
	return nil
}

// stopAll stops every process cleanly (SIGTERM: a publisher's Run records what is in
// flight, a consumer shuts its push consumer down), and SIGKILLs those still running after
// timeout.
func (ps *procs) stopAll(timeout time.Duration) {
	ps.mu.Lock()
	var all []*proc
	for _, p := range ps.live {
		p.expected = true
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
		all = append(all, p)
	}
	ps.mu.Unlock()
	deadline := time.After(timeout)
	for _, p := range all {
		select {
		case <-p.done:
		case <-deadline:
			ps.logf("%s %s did not stop within %s: SIGKILL", ps.kind, p.name, timeout)
			_ = p.cmd.Process.Signal(syscall.SIGKILL)
			<-p.done
		}
	}
}

// signalAll sends sig to every running process.
func (ps *procs) signalAll(sig os.Signal) {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	for _, p := range ps.live {
		_ = p.cmd.Process.Signal(sig)
	}
}

// killedAt returns when each killed process was killed.
func (ps *procs) killedAt() map[string]time.Time {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	out := make(map[string]time.Time, len(ps.killed))
	for k, v := range ps.killed {
		out[k] = v
	}
	return out
}

func (ps *procs) unexpectedExits() int {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	return ps.unexpected
}

// waitHolding watches a publisher's outcome log until it holds claimed rows (a claim with no
// outcome written under it yet), and reports whether it did within timeout. The log is read
// from its current end, so only claims taken from now on count.
func (ps *procs) waitHolding(ctx context.Context, name string, timeout time.Duration) bool {
	held := map[int64]bool{}
	return watchLog(ctx, filepath.Join(ps.dir, name+".outcomes"), timeout, func(rec record) bool {
		switch {
		case rec.Kind == kindClaim:
			held[rec.ID] = true
		case rec.endsClaim() || rec.Kind == kindAckError || rec.Kind == kindAckPartial ||
			rec.Kind == kindReleaseError || rec.Kind == kindDeadError:
			delete(held, rec.ID)
		}
		return len(held) > 0
	})
}

// waitRelaySend watches the outcome log of a publisher process's relay until the relay
// records a send, and reports whether it did within timeout.
func (ps *procs) waitRelaySend(ctx context.Context, name string, timeout time.Duration) bool {
	return watchLog(ctx, filepath.Join(ps.dir, name+".relay.outcomes"), timeout, func(rec record) bool { return rec.isSend() })
}

// waitHandling watches a consumer's records until one of its handlers begins (the inbox has
// recorded the event in the handler's transaction, the effect is being written), and
// reports whether one did within timeout. The handler then works for -consumer-hold before
// its transaction commits.
func (ps *procs) waitHandling(ctx context.Context, name string, timeout time.Duration) bool {
	open := map[string]bool{} // event ids
	return watchLog(ctx, filepath.Join(ps.dir, name+".inbox"), timeout, func(rec record) bool {
		switch {
		case rec.Kind == kindHandle:
			open[rec.Detail] = true
		case strings.HasPrefix(rec.Kind, kindInboxPrefix):
			delete(open, rec.Detail)
		}
		return len(open) > 0
	})
}

// watchLog reads the records appended to the log at path from its current end, handing each
// to seen, until seen returns true for the last record of what one read returned (watchLog
// returns true) or timeout passes (false).
func watchLog(ctx context.Context, path string, timeout time.Duration, seen func(record) bool) bool {
	f, err := os.Open(path)
	if err != nil {
		return false
	}
	defer f.Close()
	if _, err := f.Seek(0, io.SeekEnd); err != nil {
		return false
	}
	var partial []byte
	buf := make([]byte, 256<<10)
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) && ctx.Err() == nil {
		n, _ := f.Read(buf)
		if n == 0 {
			time.Sleep(2 * time.Millisecond)
			continue
		}
		data := append(partial, buf[:n]...)
		last := bytes.LastIndexByte(data, '\n')
		partial = append([]byte(nil), data[last+1:]...)
		done := false
		for _, line := range strings.Split(string(data[:last+1]), "\n") {
			if rec, ok := parseRecord(line); ok {
				done = seen(rec)
			}
		}
		if done {
			return true
		}
	}
	return false
}
