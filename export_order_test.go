package outbox

import (
	"fmt"
	"strings"
)

// OrderedHeadsForTest returns the ordered batch claim's heads statement as the store runs
// it under o, with inline, window and heads filled in, so that the tests EXPLAIN the real
// text.
func OrderedHeadsForTest(s *MySQLStore, o Ordering, inline, window, heads int) string {
	return fmt.Sprintf(s.oq.heads[orderIndexOf(o)], inline, window, heads)
}

// OrderedRunsForTest returns the ordered batch claim's read of the runs of keys, at most
// limit ids, as the store runs it.
func OrderedRunsForTest(s *MySQLStore, o Ordering, keys []string, limit int) string {
	lits := make([]string, len(keys))
	for i, k := range keys {
		lits[i] = sqlText(k)
	}
	return fmt.Sprintf(s.oq.runs[orderIndexOf(o)], strings.Join(lits, ", "), limit)
}
