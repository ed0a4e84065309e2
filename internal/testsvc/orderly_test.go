package testsvc

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

// An inversion is an event arriving for the first time after a later event of its biz no; an
// event arriving again (a repeat) is none, wherever it comes.
func TestOrderlyInversions(t *testing.T) {
	t.Parallel()
	rank := func(id string) int64 { return int64(id[1] - '0') }
	arrive := func(ids ...string) []Arrival {
		out := make([]Arrival, len(ids))
		for i, id := range ids {
			out[i] = Arrival{EventID: id, Seq: i + 1}
		}
		return out
	}
	assert.Empty(t, inversions("K", arrive("e1", "e2", "e3"), rank))
	assert.Empty(t, inversions("K", arrive("e1", "e2", "e1", "e2", "e3", "e1"), rank), "repeats")
	assert.Empty(t, inversions("K", arrive("e1", "e3"), rank), "a gap is a loss, not an inversion")
	assert.Equal(t, []Inversion{{BizNo: "K", EventID: "e2", After: "e3", Seq: 3}},
		inversions("K", arrive("e1", "e3", "e2", "e3"), rank))
	assert.Equal(t, []Inversion{{BizNo: "K", EventID: "e1", After: "e2", Seq: 2}, {BizNo: "K", EventID: "e3", After: "e4", Seq: 4}},
		inversions("K", arrive("e2", "e1", "e4", "e3"), rank))
}
