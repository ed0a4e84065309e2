package outbox

// Subscribe returns a channel that receives a signal (coalesced: at most one waits) whenever
// events committed through this store may be due, and a function that ends the subscription.
// [Publisher.Run] subscribes when its store offers this.
func (s *MySQLStore) Subscribe() (<-chan struct{}, func()) {
	ch := make(chan struct{}, 1)
	s.subsMu.Lock()
	if s.subs == nil {
		s.subs = map[chan struct{}]struct{}{}
	}
	s.subs[ch] = struct{}{}
	s.subsMu.Unlock()
	return ch, func() {
		s.subsMu.Lock()
		delete(s.subs, ch)
		s.subsMu.Unlock()
	}
}

// Notify wakes the subscribed publishers. [Tx.Commit] calls it; call it yourself after
// committing a transaction wrapped with WrapTx that you committed directly. It never blocks.
func (s *MySQLStore) Notify() {
	s.subsMu.Lock()
	defer s.subsMu.Unlock()
	for ch := range s.subs {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
}
