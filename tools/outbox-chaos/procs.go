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

// procs are the publisher processes: this binary run as `outbox-chaos publish`.
type procs struct {
	exe  string
	dir  string
	base publishOptions
	logf func(format string, args ...any)

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

// start starts a new publisher process, p01, p02, … in order.
func (ps *procs) start() (*proc, error) {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	if ps.live == nil {
		ps.live, ps.killed = map[string]*proc{}, map[string]time.Time{}
	}
	ps.next++
	opts := ps.base
	opts.instance = fmt.Sprintf("p%02d", ps.next)
	out, err := os.OpenFile(filepath.Join(ps.dir, opts.instance+".out"), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	defer out.Close()
	cmd := exec.Command(ps.exe, opts.args()...)
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = childAttr()
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start publisher %s: %w", opts.instance, err)
	}
	p := &proc{name: opts.instance, cmd: cmd, done: make(chan struct{})}
	ps.live[p.name] = p
	go func() {
		err := cmd.Wait()
		ps.mu.Lock()
		delete(ps.live, p.name)
		if !p.expected {
			ps.unexpected++
			ps.logf("publisher %s exited on its own: %v (see %s.out)", p.name, err, p.name)
		}
		ps.mu.Unlock()
		close(p.done)
	}()
	return p, nil
}

// liveNames lists the running publishers, in order.
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

// kill SIGKILLs a publisher and waits until it is gone.
func (ps *procs) kill(name string) error {
	ps.mu.Lock()
	p := ps.live[name]
	if p == nil {
		ps.mu.Unlock()
		return fmt.Errorf("publisher %s is not running", name)
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

// stopAll stops every publisher cleanly (SIGTERM: Run records what is in flight), and
// SIGKILLs those still running after timeout.
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
			ps.logf("publisher %s did not stop within %s: SIGKILL", p.name, timeout)
			_ = p.cmd.Process.Signal(syscall.SIGKILL)
			<-p.done
		}
	}
}

// killedAt returns when each killed publisher was killed.
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
	f, err := os.Open(filepath.Join(ps.dir, name+".outcomes"))
	if err != nil {
		return false
	}
	defer f.Close()
	if _, err := f.Seek(0, io.SeekEnd); err != nil {
		return false
	}
	held := map[int64]bool{}
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
		for _, line := range strings.Split(string(data[:last+1]), "\n") {
			rec, ok := parseRecord(line)
			switch {
			case !ok:
			case rec.Kind == kindClaim:
				held[rec.ID] = true
			case rec.endsClaim() || rec.Kind == kindAckError || rec.Kind == kindAckPartial ||
				rec.Kind == kindReleaseError || rec.Kind == kindDeadError:
				delete(held, rec.ID)
			}
		}
		if len(held) > 0 {
			return true
		}
	}
	return false
}
