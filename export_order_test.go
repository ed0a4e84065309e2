package outbox

import "fmt"

// OrderedLockDueForTest returns the ordered batch claim's SELECT as the store runs it under
// o, with inline and limit filled in, so that the tests EXPLAIN the real text.
func OrderedLockDueForTest(s *MySQLStore, o Ordering, inline, limit int) string {
	return fmt.Sprintf(s.oq.lockDue[orderIndexOf(o)], inline, limit)
}

// OrderedClaimForTest returns the per-row ordered claim statement under o.
func OrderedClaimForTest(s *MySQLStore, o Ordering) string { return s.oq.claim[orderIndexOf(o)] }
