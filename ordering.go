package outbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
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

// check asks the store how it claims and where its events go, and the sender whether it
// can send there, at Start and before the first PublishPending of a publisher not started.
// What cannot work (the store's table, and the sender's topics) is refused in one error,
// each problem named once; a store or a broker that does not answer is logged, and the
// claims will say more. The StoreInfo Check reports is the store's even when the table
// cannot be read, so it is known from then on, and every send is told it.
func (p *Publisher) check(ctx context.Context) error {
	cctx, cancel := context.WithTimeout(ctx, p.cfg.Tuning.StoreTimeout)
	defer cancel()
	info, err := p.store.Check(cctx)
	p.storeInfo.Store(&info)
	p.keyOrder.Store(info.Ordering != Unordered)
	p.topics.set(info.Topics)
	for _, w := range info.Warnings {
		p.log.WarnContext(ctx, "outbox: "+w)
	}
	var refusals []error
	stopped := func() bool { return ctx.Err() != nil || p.isClosed() }
	switch {
	case err == nil:
	case errors.Is(err, ErrInvalidConfig), errors.Is(err, ErrNoTable):
		refusals = append(refusals, err)
	case stopped():
		// Stopped or closed while starting: the check was cut short, nothing is wrong.
		p.log.DebugContext(ctx, "outbox: the table's check was cut short by a stop", slog.Any("error", err))
	default:
		p.log.WarnContext(ctx, "outbox: could not check the table", slog.Any("error", err))
	}
	if len(info.Topics) > 0 {
		sctx, cancel := context.WithTimeout(ctx, p.cfg.Tuning.SendTimeout)
		err := p.sender.Check(sctx, info.Topics)
		cancel()
		switch {
		case err == nil:
		case errors.Is(err, ErrInvalidConfig):
			refusals = append(refusals, err)
		case stopped():
		default:
			p.log.WarnContext(ctx, "outbox: could not check the sender's topics", slog.Any("error", err))
		}
	}
	if len(refusals) > 0 {
		return joinRefusals(refusals)
	}
	p.orderChecked.Store(true)
	return nil
}

// joinRefusals makes one error of what keeps a publisher from running: it wraps each (and
// so [ErrInvalidConfig]), and says each once, in one line.
func joinRefusals(errs []error) error {
	switch len(errs) {
	case 0:
		return nil
	case 1:
		return errs[0]
	}
	texts := make([]string, len(errs))
	args := make([]any, len(errs))
	for i, err := range errs {
		texts[i], args[i] = "%w", err
	}
	return fmt.Errorf(strings.Join(texts, "; "), args...)
}
