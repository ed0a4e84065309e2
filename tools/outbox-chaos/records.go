package main

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Kinds of outcome-log records. Each publisher process writes one record per claimed
// event, per send outcome and per acknowledgement, so that the report can say why an event
// was delivered more than once, and whether two instances ever held live claims on one row.
const (
	kindClaim = "claim" // the instance's claim changed the row: it holds the lease

	kindSent        = "sent"         // the broker answered SEND_OK
	kindSentRetried = "sent-retried" // SEND_OK, but the client retried internally first: an earlier attempt's outcome is unknown
	kindFailed      = "failed"       // the message was not stored (refused, never reached the broker)
	kindUnknown     = "unknown"      // the message may or may not have been stored (timeout, connection lost, status other than SEND_OK)

	kindAck        = "ack"         // SUCCESS recorded under the instance's lease
	kindAckLost    = "ack-lost"    // the row was no longer the instance's (reclaimed, or already SUCCESS)
	kindAckPartial = "ack-partial" // a batch acknowledgement changed fewer rows than it named: which ones is unknown
	kindAckError   = "ack-error"   // the acknowledgement failed: the row may still be SENDING

	kindRelease      = "release" // back to WAIT (a retry, or unsent)
	kindReleaseLost  = "release-lost"
	kindReleaseError = "release-error"
	kindDead         = "dead" // FAIL
	kindDeadLost     = "dead-lost"
	kindDeadError    = "dead-error"

	// kindLead opens a term of a relay's leadership (relay mode): every send the relay
	// records after it, until the next, was made in that term. Detail: formatTerm.
	kindLead = "lead"
)

// record is one line of a publisher's outcome log.
type record struct {
	At       time.Time
	Instance string
	Kind     string
	ID       int64  // the row id
	BizNo    string // empty where the publisher only knows the id (acknowledgements)
	Detail   string // the error, for failures
}

// isSend reports whether the record is a send outcome.
func (r record) isSend() bool {
	switch r.Kind {
	case kindSent, kindSentRetried, kindFailed, kindUnknown:
		return true
	}
	return false
}

// isSuccessfulSend reports whether the broker confirmed the send.
func (r record) isSuccessfulSend() bool { return r.Kind == kindSent || r.Kind == kindSentRetried }

// endsClaim reports whether the record ends the instance's lease on the row: an outcome
// written under it. A failed write (…-error) may or may not have happened, so it ends
// nothing; a write that found the lease gone (…-lost) ends it, since it was gone already.
func (r record) endsClaim() bool {
	switch r.Kind {
	case kindAck, kindAckLost, kindRelease, kindReleaseLost, kindDead, kindDeadLost:
		return true
	}
	return false
}

// outcomeLog appends records to a file with one unbuffered write per call, opened with
// O_APPEND: whatever a write call returned from survives a SIGKILL of the process.
type outcomeLog struct {
	mu       sync.Mutex
	f        *os.File
	instance string
}

func openOutcomeLog(path, instance string) (*outcomeLog, error) {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	return &outcomeLog{f: f, instance: instance}, nil
}

// write appends recs in one write(2). The time is taken now, after the operation they
// describe returned.
func (l *outcomeLog) write(recs []record) {
	if len(recs) == 0 {
		return
	}
	at := time.Now()
	var b strings.Builder
	for _, r := range recs {
		r.At, r.Instance = at, l.instance
		b.WriteString(formatRecord(r))
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, err := l.f.WriteString(b.String()); err != nil {
		fmt.Fprintf(os.Stderr, "outcome log: %v\n", err)
	}
}

func (l *outcomeLog) close() error { return l.f.Close() }

// formatRecord renders r as one tab-separated line.
func formatRecord(r record) string {
	return fmt.Sprintf("%d\t%s\t%s\t%d\t%s\t%s\n", r.At.UnixNano(), field(r.Instance), r.Kind, r.ID, field(r.BizNo), field(r.Detail))
}

// field keeps a value on one line and within one column.
func field(s string) string {
	s = strings.Map(func(r rune) rune {
		if r == '\t' || r == '\n' || r == '\r' {
			return ' '
		}
		return r
	}, s)
	if len(s) > 300 {
		s = s[:300]
	}
	return s
}

// parseRecords reads an outcome log. A line that does not parse (which a SIGKILL cannot
// produce, but a full disk could) is counted, not fatal.
func parseRecords(r io.Reader) (recs []record, bad int, err error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64*1024), 1<<20)
	for sc.Scan() {
		rec, ok := parseRecord(sc.Text())
		if !ok {
			bad++
			continue
		}
		recs = append(recs, rec)
	}
	return recs, bad, sc.Err()
}

func parseRecord(line string) (record, bool) {
	f := strings.SplitN(line, "\t", 6)
	if len(f) != 6 || f[1] == "" || f[2] == "" {
		return record{}, false
	}
	ns, err1 := strconv.ParseInt(f[0], 10, 64)
	id, err2 := strconv.ParseInt(f[3], 10, 64)
	if err1 != nil || err2 != nil {
		return record{}, false
	}
	return record{At: time.Unix(0, ns), Instance: f[1], Kind: f[2], ID: id, BizNo: f[4], Detail: f[5]}, true
}
