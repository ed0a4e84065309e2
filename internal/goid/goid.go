// Package goid tells which goroutine is running, for the one question the library's
// lifecycles must answer without a context: is Stop or Close being called from inside a
// callback (an OnDeadLetter, an inbox handler), on the goroutine that runs it? Waiting for
// that callback would then never end. Go gives goroutines no public id, but the first line
// of a goroutine's stack trace names it ("goroutine 18 [running]:"), and that is what ID
// reads. It costs a microsecond or so: call it per callback or per delivery, never per event
// of a batch.
package goid

import (
	"bytes"
	"runtime"
	"strconv"
)

// ID returns the calling goroutine's id; never 0 for a running goroutine.
func ID() uint64 {
	var buf [64]byte
	b := bytes.TrimPrefix(buf[:runtime.Stack(buf[:], false)], []byte("goroutine "))
	if i := bytes.IndexByte(b, ' '); i >= 0 {
		b = b[:i]
	}
	id, _ := strconv.ParseUint(string(b), 10, 64)
	return id
}
