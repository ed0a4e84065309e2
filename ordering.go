package outbox

import (
	"context"
	"errors"
	"fmt"
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

// KeyOrderer is implemented by a store that can claim the events of one biz no in order (see
// [KeyOrder]). [MySQLStore] is one.
type KeyOrderer interface {
	// CheckOrdering reports whether the table can serve ordered claims; its error names the
	// fix (the ALTER TABLE to run).
	CheckOrdering(ctx context.Context) error
	// OrderedCandidates is [Store.Candidates] for the per-row mode under o: only events
	// whose biz no lets them go (every earlier event done), oldest first.
	OrderedCandidates(ctx context.Context, limit int, o Ordering) ([]Event, error)
	// ClaimInOrder is [Store.Claim] that also requires, in the same statement, that no
	// earlier event of ev's biz no is still open under o.
	ClaimInOrder(ctx context.Context, ev Event, owner string, o Ordering) (bool, error)
}

// ErrNotSent is a sender's answer for an event of a batch it did not try: the batch's send
// timeout passed before its turn, or, in key order, an earlier event of the same biz no
// failed. The publisher returns such an event to WAIT with no attempt counted.
var ErrNotSent = errors.New("outbox: not sent")

// errNotSent is ErrNotSent for an event whose turn never came before the batch's deadline.
var errNotSent = fmt.Errorf("%w: the batch's send timeout passed before its turn", ErrNotSent)

// checkOrdering checks that store and sender can keep the events of one biz no in order, if
// o asks for it, and returns the store's KeyOrderer (nil when o is Unordered).
func checkOrdering(o Ordering, store Store, sender Sender) (KeyOrderer, error) {
	if o == Unordered {
		return nil, nil
	}
	orderer, ok := store.(KeyOrderer)
	if !ok {
		return nil, fmt.Errorf("%w: Ordering %s needs a store that claims in key order, and %T is no KeyOrderer", ErrInvalidConfig, o, store)
	}
	if _, ok := sender.(BatchSender); ok {
		ko, ok := sender.(interface{ KeyOrdered() bool })
		if !ok || !ko.KeyOrdered() {
			return nil, fmt.Errorf("%w: Ordering %s needs a sender that keeps one biz no's events in order, and %T does not say it does (a RocketMQSender does with RocketMQConfig.KeyOrder)",
				ErrInvalidConfig, o, sender)
		}
	}
	return orderer, nil
}

// checkOrdering runs the store's CheckOrdering at Run's start: a table that cannot serve
// ordered claims is refused; a store that does not answer is logged, and the claims will say
// more.
func (p *Publisher) checkOrdering(ctx context.Context) error {
	cctx, cancel := context.WithTimeout(ctx, p.cfg.StoreTimeout)
	defer cancel()
	err := p.orderer.CheckOrdering(cctx)
	switch {
	case err == nil:
		return nil
	case errors.Is(err, ErrInvalidConfig):
		return err
	}
	p.log.WarnContext(ctx, "outbox: could not check that the table serves ordered claims", slog.Any("error", err))
	return nil
}
