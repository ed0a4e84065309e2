package console_test

import (
	"fmt"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/go-outbox/outbox"
	"github.com/go-outbox/outbox/console"
	"github.com/go-outbox/outbox/internal/testsvc"
)

// checkpointDDL is the part of a binlog relay's checkpoint table the store reads (module
// relay's CreateSchema makes the whole table).
const checkpointDDL = `CREATE TABLE %s (
    outbox_table VARCHAR(64) NOT NULL PRIMARY KEY, epoch BIGINT NOT NULL,
    mode ENUM('relay', 'polling') NOT NULL, leader VARCHAR(64) NOT NULL, gtid VARCHAR(4096) NOT NULL DEFAULT '',
    fallback_after_ms BIGINT NOT NULL, heartbeat_at DATETIME(3) NOT NULL, updated_at DATETIME(3) NOT NULL)`

// The store's page: counts, the events sent this minute in the chart, a claim past half
// the lease, the relay that leads the table, and the dead letters by type.
func TestStorePageShowsRelaySendsAndStaleClaims(t *testing.T) {
	t.Parallel()
	db := testsvc.OpenDB(t)
	cp := testsvc.UniqueTable("t_console_cp")
	_, err := db.Exec(fmt.Sprintf(checkpointDDL, cp))
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = db.Exec("DROP TABLE IF EXISTS " + cp) })
	f := newFixture(t, outbox.MySQLConfig{RelayTable: cp})
	var sent []int64
	for i := range 3 {
		sent = append(sent, f.insert(t, "SENT", fmt.Sprintf("S-%d", i), []byte(`{}`)))
	}
	stale := f.insert(t, "SLOW", "C-1", []byte(`{}`))
	f.dead(t, "PAY", "P-1")
	f.dead(t, "PAY", "P-2")
	f.dead(t, "SHIP", "H-1")
	// The scene as publishers and a relay leave it.
	_, err = f.db.Exec("UPDATE `"+f.table+"` SET status = 'SUCCESS', claim_owner = 'pub-1', claimed_at = UTC_TIMESTAMP(3) WHERE id IN (?, ?, ?)", sent[0], sent[1], sent[2])
	require.NoError(t, err)
	_, err = f.db.Exec("UPDATE `"+f.table+"` SET status = 'SENDING', claim_owner = 'pub-2', claimed_at = UTC_TIMESTAMP(3) - INTERVAL 10 MINUTE WHERE id = ?", stale)
	require.NoError(t, err)
	_, err = f.db.Exec("INSERT INTO "+cp+" VALUES (?, 7, 'relay', 'relay-<1>', '0-1-42', 60000, UTC_TIMESTAMP(3) - INTERVAL 5 SECOND, UTC_TIMESTAMP(3))", f.table)
	require.NoError(t, err)

	b, _ := newConsole(t, console.Config{Stores: []console.Store{{Name: "s", Store: f.store, Lease: 10 * time.Minute}}})
	p := b.get("/stores/s")
	require.Equal(t, http.StatusOK, p.status, p.body)
	assert.Contains(t, p.body, `id="count-sending">1<`)
	assert.Contains(t, p.body, `id="count-fail"><a href="/stores/s/dead-letters">3</a>`)
	assert.Contains(t, p.body, "3 sent in the last 60 minutes, at most 3 a minute")
	assert.Contains(t, p.body, `<rect x="590" y="0" width="8" height="100"><title>`, "the last minute's bar, full height")
	assert.Contains(t, p.body, "1 SENDING claim(s) older than half the lease (10m0s)")
	assert.Contains(t, p.body, "<tr><th>Mode</th><td>relay</td></tr>")
	assert.Contains(t, p.body, "<tr><th>Leader</th><td>relay-&lt;1&gt;</td></tr>")
	assert.Contains(t, p.body, "<tr><th>Epoch</th><td>7</td></tr>")
	assert.Contains(t, p.body, "<code>0-1-42</code>")
	assert.Contains(t, p.body, `<td id="relay-live">yes</td>`)
	assert.Contains(t, p.body, `id="relay-lag"`)
	assert.Contains(t, p.body, `<tr><td><a href="/stores/s/dead-letters?type=PAY">PAY</a></td><td class="n">2</td></tr>`+
		`<tr><td><a href="/stores/s/dead-letters?type=SHIP">SHIP</a></td><td class="n">1</td></tr>`, "most first")

	home := b.get("/")
	assert.Contains(t, home.body, "relay (live)")
}

// The blocked keys of a key-order store, a page at a time by the dead letter's id, oldest
// first; an unordered store says it is not held back.
func TestBlockedKeysPageByID(t *testing.T) {
	t.Parallel()
	f := newFixture(t, outbox.MySQLConfig{Ordering: outbox.KeyOrder})
	var want []string
	for i := range 5 {
		key := fmt.Sprintf("K-%d", i)
		want = append(want, strconv.FormatInt(f.dead(t, "T", key), 10))
		for range i + 1 {
			f.insert(t, "T", key, []byte(`{}`))
		}
	}
	f.dead(t, "T", "ALONE") // nothing waits behind it
	b, _ := newConsole(t, console.Config{Stores: []console.Store{{Name: "s", Store: f.store}}, PageSize: 2})
	var got []string
	path, pages := "/stores/s/blocked", 0
	for path != "" && pages < 5 {
		p := b.get(path)
		require.Equal(t, http.StatusOK, p.status, p.body)
		got = append(got, p.rowIDs("blocked")...)
		path = p.next()
		pages++
	}
	assert.Equal(t, want, got, "every blocked key once, oldest first")
	assert.Equal(t, 3, pages)
	first := b.get("/stores/s/blocked")
	assert.Contains(t, first.body, `<td class="n">2</td>`, "two events wait behind K-1's dead letter")

	u := newFixture(t, outbox.MySQLConfig{})
	ub, _ := newConsole(t, console.Config{Stores: []console.Store{{Name: "u", Store: u.store}}})
	assert.Contains(t, ub.get("/stores/u/blocked").body, `id="unordered"`)
}
