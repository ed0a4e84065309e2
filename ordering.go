package outbox

import (
	"context"
	"errors"
	"log/slog"
	"strconv"
)

// Ordering says whether, and how, the events of one biz no are published in order.
type Ordering int

const (
	// Unordered publishes events as they come due, in parallel: one biz no's events may
	// overtake each other. The default.
	Unordered Ordering = iota
	// KeyOrder publishes the events of one biz no in id order: an event is claimed only when
	// every earlier event of its biz no is SUCCESS or SKIPPED, so no two events of one key
	// are ever in flight at once, across instances. A dead letter (FAIL) blocks its key until
	// a person requeues or skips it.
	KeyOrder
	// KeyOrderSkipDeadLetters is KeyOrder in which a dead letter no longer blocks its key:
	// the key's later events go on without it.
	KeyOrderSkipDeadLetters
)

func (o Ordering) String() string {
	switch o {
	case Unordered:
		return "unordered"
	case KeyOrder:
		return "key"
	case KeyOrderSkipDeadLetters:
		return "key-skip-dead-letters"
	}
	return "Ordering(" + strconv.Itoa(int(o)) + ")"
}

// StatusSkipped marks a dead letter a person chose not to send: final, and for ordering as
// good as SUCCESS (its key's later events go on).
const StatusSkipped Status = "SKIPPED"

// check asks the store how it claims at Run's start: a table that cannot serve its
// ordering is refused; a store that does not answer is logged, and the claims will say
// more.
func (p *Publisher) check(ctx context.Context) error {
	cctx, cancel := context.WithTimeout(ctx, p.cfg.Tuning.StoreTimeout)
	defer cancel()
	o, err := p.store.Check(cctx)
	p.keyOrder.Store(o != Unordered)
	switch {
	case err == nil:
		return nil
	case errors.Is(err, ErrInvalidConfig):
		return err
	}
	p.log.WarnContext(ctx, "outbox: could not check the table", slog.Any("error", err))
	return nil
}
