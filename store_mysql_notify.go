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

// Notify wakes the subscribed publishers. [Tx.Commit] does this by itself; call it after
// committing directly a transaction wrapped with WrapTx. It never blocks. The next claim
// reads the due rows from the start rather than from where the last one left nothing behind
// (see [MySQLConfig.NoSteadyScan]), since Notify cannot tell how long ago the transaction
// wrote its events; Tx.Commit can, so prefer it.
func (s *MySQLStore) Notify() {
	s.floor.reset()
	s.notify()
}

// notify wakes the subscribed publishers.
func (s *MySQLStore) notify() {
	s.subsMu.Lock()
	defer s.subsMu.Unlock()
	for ch := range s.subs {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
}
