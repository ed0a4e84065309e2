package outbox_test

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/binary"
	"log/slog"
	"math"
	"reflect"
	"strings"
	"testing"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/apache/rocketmq-client-go/v2/primitive"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/go-outbox/outbox"
	"github.com/go-outbox/outbox/internal/testsvc"
)

// Fuzz tests for every input a user controls: the event fields, Config, MySQLConfig (the
// table name) and RocketMQConfig (the topic). `go test` runs their seeds; `go test -run '^$'
// -fuzz FuzzX -fuzztime 60s .` explores. Each checks the documented rule both ways: what
// the documentation allows is accepted and works, and everything else is refused with the
// package's error, having written nothing.

// documentedKey is the documented rule for BizNo and EventType: required, at most 64
// characters, printable UTF-8 (no control characters) without spaces.
func documentedKey(s string) bool {
	return s != "" && utf8.ValidString(s) && utf8.RuneCountInString(s) <= 64 &&
		!strings.ContainsFunc(s, unicode.IsControl) && !strings.ContainsFunc(s, unicode.IsSpace)
}

// documentedType is the documented rule for EventType, a RocketMQ tag: a documentedKey
// without "||" (the subscription's separator) and other than "*" (every tag).
func documentedType(s string) bool {
	return documentedKey(s) && !strings.Contains(s, "||") && s != "*"
}

// An event the documentation allows (a biz no and an event type as documented, a payload of
// 1 byte to MaxPayloadBytes) is written and read back exactly, and the RocketMQ message made
// from it carries its fields through the client's property encoding, in key order too; any
// other is refused with ErrInvalidEvent, naming the field, and writes nothing.
func FuzzInsertEvent(f *testing.F) {
	const maxPayload = 1 << 10
	db := testsvc.NewDatabase(f)
	store := testsvc.NewStore(f, db, outbox.MySQLConfig{MaxPayloadBytes: maxPayload})
	table := "`" + outbox.TableForTest(store) + "`"
	sender, err := outbox.NewRocketMQSenderWithProducerForTest(outbox.RocketMQConfig{}, &fakeProducer{})
	require.NoError(f, err)

	for _, s := range []struct {
		biz, typ string
		payload  []byte
	}{
		{"ORD-1", "ORDER_CREATED", []byte(`{"order":1}`)},
		{"", "E", nil},
		{"B", "", nil},
		{strings.Repeat("x", 64), strings.Repeat("é", 64), []byte("{}")},
		{strings.Repeat("x", 65), "E", nil},
		{"B", strings.Repeat("😀", 65), nil},
		{strings.Repeat("😀", 64), "E", []byte{}}, // no payload
		{"B", "E", nil},
		{"订单-42", "支付成功", []byte{0, 1, 2, 0xff}},
		{"trailing space ", " leading", nil},
		{"a\x00b", "E", nil},
		{"a\tb", "E", nil},
		{"B", "E\n", nil},
		{"\x7f", "E", nil},
		{"\u0085", "E", nil},
		{"\xff\xfe", "E", nil},
		{"\xed\xa0\x80", "E", nil}, // a surrogate, encoded
		{"a\u2028b", "E\u200b", nil},
		{"\ufeffBOM", "E", []byte("{}")},
		{"B", "E", make([]byte, maxPayload)},
		{"B", "E", make([]byte, maxPayload+1)},
		{"x'OR'1'='1", "E');DROP_TABLE_t;--", []byte("\\'\"")},
		{"ORD 1", "E", nil},
		{"ORD\u00a01", "E", nil},
		{"B", "ORDER||PAID", nil},
		{"B", "*", nil},
		{"B", "A|B", []byte("{}")},
	} {
		f.Add(s.biz, s.typ, s.payload)
	}
	f.Fuzz(func(t *testing.T, biz, typ string, payload []byte) {
		ctx := context.Background()
		tx, err := store.BeginTx(ctx, nil)
		require.NoError(t, err)
		id, insertErr := outbox.InsertForTest(ctx, tx, outbox.EventInput{BizNo: biz, EventType: typ, Payload: payload})
		require.NoError(t, tx.Commit())

		if !documentedKey(biz) || !documentedType(typ) || len(payload) == 0 || len(payload) > maxPayload {
			require.ErrorIs(t, insertErr, outbox.ErrInvalidEvent)
			var named []string
			if !documentedKey(biz) {
				named = append(named, "BizNo")
			}
			if !documentedType(typ) {
				named = append(named, "EventType")
			}
			if len(payload) == 0 || len(payload) > maxPayload {
				named = append(named, "payload")
			}
			assert.True(t, containsAny(insertErr.Error(), named), "the error %q names the bad field (%v)", insertErr, named)
			var n int
			require.NoError(t, db.QueryRow("SELECT COUNT(*) FROM "+table).Scan(&n))
			assert.Zero(t, n, "a refused event writes nothing")
			return
		}
		require.NoError(t, insertErr, "a documented-valid event is accepted")
		got, err := outbox.NewAdmin(store).Get(ctx, id)
		require.NoError(t, err)
		_, err = db.Exec("DELETE FROM "+table+" WHERE id = ?", id)
		require.NoError(t, err)
		assert.Equal(t, biz, got.BizNo)
		assert.Equal(t, typ, got.EventType)
		assert.True(t, bytes.Equal(payload, got.Payload), "payload %x read back as %x", payload, got.Payload)
		assert.Equal(t, outbox.StatusWait, got.Status)
		assert.Zero(t, got.RetryCount)

		// The client encodes properties as name\x01value\x02: the fields must survive it.
		for _, keyOrder := range []bool{false, true} {
			msg := outbox.MessageForTest(sender, got, keyOrder)
			decoded := &primitive.Message{}
			decoded.UnmarshalProperties([]byte(msg.MarshallProperties()))
			assert.Equal(t, biz, decoded.GetProperty(outbox.PropertyBizNo))
			assert.Equal(t, typ, decoded.GetProperty(outbox.PropertyEventType))
			assert.Equal(t, typ, decoded.GetTags())
			assert.Equal(t, biz, decoded.GetKeys())
			assert.Equal(t, msg.GetProperty(outbox.PropertyEventID), decoded.GetProperty(outbox.PropertyEventID))
			assert.True(t, bytes.Equal(payload, msg.Body), "the body is the payload")
			if keyOrder {
				assert.Equal(t, biz, decoded.GetShardingKey(), "in key order the biz no is the sharding key")
			}
		}
	})
}

func containsAny(s string, subs []string) bool {
	for _, sub := range subs {
		if strings.Contains(s, sub) {
			return true
		}
	}
	return false
}

// fuzzInput reads typed values from a fuzzer's bytes, so that one []byte fills a struct
// whose fields grow over time: an input saved for a shorter field list still decodes (the
// new fields read as zero, their defaults). Numbers take one selector byte: an interesting
// value from a table, or past the table, the next eight bytes as they are.
type fuzzInput struct{ b []byte }

// rawNumber is the selector byte for "the next eight bytes".
const rawNumber = 0xff

var (
	interestingInts = []int64{0, 1, -1, 2, 3, 20, 64, 1000, 1001, math.MaxInt32, math.MinInt32,
		math.MaxInt64, math.MinInt64, 1 << 20, 4 << 20, 1<<24 - 1, 1 << 24}
	interestingDurations = []time.Duration{0, 1, -1, time.Millisecond, 5 * time.Millisecond, 100 * time.Millisecond,
		999 * time.Millisecond, time.Second, 3 * time.Second, 5 * time.Second, 10 * time.Second, time.Minute,
		time.Minute + 1, 100 * time.Second, 10 * time.Minute, time.Hour, math.MaxInt64, math.MinInt64}
)

func (in *fuzzInput) byte() byte {
	if len(in.b) == 0 {
		return 0
	}
	c := in.b[0]
	in.b = in.b[1:]
	return c
}

func (in *fuzzInput) number(table []int64) int64 {
	sel := int(in.byte())
	if sel < len(table) {
		return table[sel]
	}
	var raw [8]byte
	n := copy(raw[:], in.b)
	in.b = in.b[n:]
	return int64(binary.LittleEndian.Uint64(raw[:]))
}

func (in *fuzzInput) string() string {
	n := min(int(in.byte()), len(in.b))
	s := string(in.b[:n])
	in.b = in.b[n:]
	return s
}

// fieldKind says how a fuzzed field is read from the input.
type fieldKind int

const (
	kindInt      fieldKind = iota // any integer field
	kindDuration                  // a time.Duration
	kindString
	kindBool
	kindChoice // one of the field's choices
)

// configField is a Config field the fuzzer sets, named by its path ("Tuning.Lease"), and what
// the documentation says an accepted publisher's value of it (defaults filled in) must
// satisfy. Adding a Config field to the fuzzer is adding one entry; fields without an entry
// stay zero, so their defaults are still checked.
type configField struct {
	name    string
	kind    fieldKind
	choices []any // kindChoice: the values to pick from
	ok      func(c outbox.Config) bool
}

// configValue is the field of c at path, e.g. "Tuning.Lease".
func configValue(c reflect.Value, path string) reflect.Value {
	for name := range strings.SplitSeq(path, ".") {
		c = c.FieldByName(name)
	}
	return c
}

func positiveField(name string) func(outbox.Config) bool {
	return func(c outbox.Config) bool { return configValue(reflect.ValueOf(c), name).Int() > 0 }
}

var configFields = []configField{
	{name: "InstanceID", kind: kindString, ok: func(c outbox.Config) bool {
		id := c.InstanceID
		return id != "" && utf8.ValidString(id) && strings.TrimSpace(id) == id && utf8.RuneCountInString(id) <= 64
	}},
	{name: "Tuning.ClaimPerRow", kind: kindBool, ok: func(outbox.Config) bool { return true }},
	{name: "Tuning.BatchSize", kind: kindInt, ok: positiveField("Tuning.BatchSize")},
	{name: "PollInterval", kind: kindDuration, ok: positiveField("PollInterval")},
	{name: "Tuning.ReclaimInterval", kind: kindDuration, ok: positiveField("Tuning.ReclaimInterval")},
	{name: "Tuning.Lease", kind: kindDuration, ok: func(c outbox.Config) bool { return c.Tuning.Lease >= time.Second }},
	{name: "MaxAttempts", kind: kindInt, ok: positiveField("MaxAttempts")},
	{name: "Backoff", kind: kindChoice, choices: []any{nil, outbox.DefaultBackoff, func(int) time.Duration { return time.Second }},
		ok: func(c outbox.Config) bool { return c.Backoff != nil }},
	{name: "Tuning.SendTimeout", kind: kindDuration, ok: func(c outbox.Config) bool { return c.Tuning.SendTimeout >= 10*time.Millisecond }},
	{name: "Tuning.StoreTimeout", kind: kindDuration, ok: positiveField("Tuning.StoreTimeout")},
	{name: "Logger", kind: kindChoice, choices: []any{nil, slog.New(slog.DiscardHandler)},
		ok: func(c outbox.Config) bool { return c.Logger != nil }},
	{name: "OnDeadLetter", kind: kindChoice, choices: []any{nil, func(context.Context, outbox.Event, error) {}},
		ok: func(outbox.Config) bool { return true }},
	// Fields added later go last, so that saved inputs keep decoding as they did.
	{name: "Tuning.MaxBackoff", kind: kindDuration, ok: func(c outbox.Config) bool {
		return c.Tuning.MaxBackoff > 0 && c.Tuning.MaxBackoff <= 366*24*time.Hour
	}},
	{name: "Tuning.MaxReclaims", kind: kindInt, ok: positiveField("Tuning.MaxReclaims")},
	{name: "Tuning.MaxClaimBytes", kind: kindInt, ok: positiveField("Tuning.MaxClaimBytes")},
	{name: "Tuning.MaxProbeDelay", kind: kindDuration, ok: positiveField("Tuning.MaxProbeDelay")},
}

// configRules are the documented rules between fields, on an accepted publisher's config:
// none since the leases of a send are renewed while it runs (SendTimeout was once at most a
// tenth of Lease).
var configRules []struct {
	name  string
	holds func(c outbox.Config) bool
}

// randomDefaults are the fields whose default differs from one publisher to the next.
var randomDefaults = map[string]bool{"InstanceID": true}

// decodeConfig fills a Config from the fuzzer's bytes, field by field in configFields order.
func decodeConfig(data []byte) outbox.Config {
	in := &fuzzInput{b: data}
	var c outbox.Config
	v := reflect.ValueOf(&c).Elem()
	for _, f := range configFields {
		fv := configValue(v, f.name)
		switch f.kind {
		case kindInt:
			fv.SetInt(in.number(interestingInts))
		case kindDuration:
			fv.SetInt(in.number(durationsAsInts))
		case kindString:
			fv.SetString(in.string())
		case kindBool:
			fv.SetBool(in.byte()&1 == 1)
		case kindChoice:
			if x := f.choices[int(in.byte())%len(f.choices)]; x != nil {
				fv.Set(reflect.ValueOf(x))
			}
		}
	}
	return c
}

var durationsAsInts = func() []int64 {
	out := make([]int64, len(interestingDurations))
	for i, d := range interestingDurations {
		out[i] = int64(d)
	}
	return out
}()

// encodeConfig is decodeConfig's inverse for seeds: the named fields' values (int, int64,
// time.Duration, string, bool, or a choice's index), the rest zero.
func encodeConfig(fields map[string]any) []byte {
	var b []byte
	for _, f := range configFields {
		x, set := fields[f.name]
		switch f.kind {
		case kindInt, kindDuration:
			if !set {
				b = append(b, 0) // the tables' first value is 0
				continue
			}
			b = append(b, rawNumber)
			b = binary.LittleEndian.AppendUint64(b, uint64(reflect.ValueOf(x).Int()))
		case kindString:
			s, _ := x.(string)
			b = append(b, byte(len(s)))
			b = append(b, s...)
		case kindBool:
			if on, _ := x.(bool); on {
				b = append(b, 1)
			} else {
				b = append(b, 0)
			}
		case kindChoice:
			i, _ := x.(int)
			b = append(b, byte(i))
		}
	}
	return b
}

// nopStore is a Store for NewPublisher alone: it is never called.
type nopStore struct{ outbox.Store }

// NewPublisher never panics; a config it accepts keeps every field that was set, fills
// every zero field with its default, and satisfies every documented rule; a config it
// refuses fails a rule, and the error wraps ErrInvalidConfig and names a field that was set.
func FuzzConfig(f *testing.F) {
	for _, seed := range []map[string]any{
		{},
		{"InstanceID": "order-7d9f-4811-a1b2c3", "Tuning.ClaimPerRow": true, "Tuning.BatchSize": 50},
		{"Tuning.Lease": time.Second, "Tuning.SendTimeout": 100 * time.Millisecond},
		{"Tuning.Lease": time.Second, "Tuning.SendTimeout": 100*time.Millisecond + 1},
		{"Tuning.Lease": 2 * time.Second}, // the default SendTimeout (3 s) is too long for it
		{"Tuning.Lease": time.Second - 1},
		{"Tuning.SendTimeout": time.Minute},
		{"Tuning.SendTimeout": time.Minute + 1},
		{"Tuning.BatchSize": -1},
		{"MaxAttempts": 1},
		{"MaxAttempts": -1},
		{"MaxAttempts": outbox.RetryForever},
		{"Tuning.MaxBackoff": 367 * 24 * time.Hour},
		{"Tuning.MaxReclaims": -1, "Tuning.MaxClaimBytes": 1, "Tuning.MaxProbeDelay": time.Millisecond},
		{"PollInterval": math.MinInt64},
		{"Tuning.ClaimPerRow": true}, // the per-row defaults
		{"InstanceID": " padded"},
		{"InstanceID": "x\xff"},
		{"InstanceID": strings.Repeat("é", 64)},
		{"InstanceID": strings.Repeat("é", 65)},
		{"Tuning.Lease": time.Duration(math.MaxInt64), "Tuning.SendTimeout": time.Duration(math.MaxInt64)},
		{"Backoff": 2, "Logger": 1, "OnDeadLetter": 1},
	} {
		f.Add(encodeConfig(seed))
	}
	sender := outbox.SenderFunc(func(context.Context, outbox.Event) error { return nil })
	f.Fuzz(func(t *testing.T, data []byte) {
		set := decodeConfig(data)
		p, err := outbox.NewPublisher(nopStore{}, sender, set)

		// What the documentation says the config becomes: set fields as they are, zero
		// fields with the defaults (read from a publisher of the same mode with nothing else set).
		dp, derr := outbox.NewPublisher(nopStore{}, sender, outbox.Config{Tuning: outbox.Tuning{ClaimPerRow: set.Tuning.ClaimPerRow}})
		require.NoError(t, derr, "the defaults are accepted")
		want := fillDefaults(set, outbox.ConfigForTest(dp))
		var broken []string
		for _, fl := range configFields {
			if !fl.ok(want) {
				broken = append(broken, fl.name)
			}
		}
		for _, r := range configRules {
			if !r.holds(want) {
				broken = append(broken, r.name)
			}
		}

		if err != nil {
			require.ErrorIs(t, err, outbox.ErrInvalidConfig)
			require.NotEmpty(t, broken, "a config that breaks no documented rule is accepted; refused with %v", err)
			var setNames []string // by their own names: the error may qualify them ("Tuning.Lease")
			for _, f := range configLeaves(reflect.ValueOf(set)) {
				if !f.v.IsZero() {
					setNames = append(setNames, f.name[strings.LastIndex(f.name, ".")+1:])
				}
			}
			assert.True(t, containsAny(err.Error(), setNames), "the error %q names a field that was set (%v)", err, setNames)
			return
		}
		require.Empty(t, broken, "an accepted config keeps the documented rules")
		got := outbox.ConfigForTest(p)
		gl, wl, sl := configLeaves(reflect.ValueOf(got)), configLeaves(reflect.ValueOf(want)), configLeaves(reflect.ValueOf(set))
		for i := range gl {
			name, g, w := gl[i].name, gl[i].v, wl[i].v
			switch {
			case sl[i].v.IsZero() && randomDefaults[name]:
				assert.False(t, g.IsZero(), "%s has its default", name)
			case g.Kind() == reflect.Func || (g.Kind() == reflect.Pointer && sl[i].v.IsZero()):
				assert.Equal(t, w.IsNil(), g.IsNil(), "%s", name)
			default:
				assert.Equal(t, w.Interface(), g.Interface(), "%s: set fields are kept, zero ones take their default", name)
			}
		}
		for _, fl := range configFields {
			assert.True(t, fl.ok(got), "%s keeps its rule", fl.name)
		}
		for _, r := range configRules {
			assert.True(t, r.holds(got), r.name)
		}
		assert.Equal(t, got.InstanceID, p.Health().InstanceID)
	})
}

// configLeaf is one exported field of a Config, a Tuning field named "Tuning.X".
type configLeaf struct {
	name string
	v    reflect.Value
}

// configLeaves returns the exported fields of the Config c, with the fields of Tuning in
// place of Tuning, in declaration order.
func configLeaves(c reflect.Value) []configLeaf {
	var out []configLeaf
	var walk func(v reflect.Value, prefix string)
	walk = func(v reflect.Value, prefix string) {
		for i := range v.NumField() {
			f := v.Type().Field(i)
			if !f.IsExported() {
				continue
			}
			if f.Type.Kind() == reflect.Struct {
				walk(v.Field(i), prefix+f.Name+".")
				continue
			}
			out = append(out, configLeaf{name: prefix + f.Name, v: v.Field(i)})
		}
	}
	walk(c, "")
	return out
}

// fillDefaults returns set with each zero field (a Tuning field among them) taken from def.
func fillDefaults(set, def outbox.Config) outbox.Config {
	out := set
	ol, dl := configLeaves(reflect.ValueOf(&out).Elem()), configLeaves(reflect.ValueOf(def))
	for i, f := range ol {
		if f.v.IsZero() && f.v.CanSet() {
			f.v.Set(dl[i].v)
		}
	}
	return out
}

// documentedTable is the documented rule for a table name: 1 to 64 ASCII letters, digits
// and underscores (a leading digit, a reserved word, all digits: all names).
func documentedTable(s string) bool {
	if s == "" || len(s) > 64 {
		return false
	}
	for _, c := range []byte(s) {
		if !(c == '_' || c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z') {
			return false
		}
	}
	return true
}

// A table name NewMySQLStore accepts is documented-valid and works for real: the table
// created has exactly that name and is the only one in the database (nothing in the name
// reached the SQL as anything but a name), and an event goes in, is claimed, acknowledged
// and read back. Any other name, or a payload limit out of range, is refused with
// ErrInvalidConfig. It runs in a database of its own, where any name is free to use.
func FuzzMySQLConfig(f *testing.F) {
	db := testsvc.NewDatabase(f)
	for _, s := range []struct {
		table      string
		maxPayload int
	}{
		{"", 0},
		{"t_event_record", 1},
		{"_", 1 << 10},
		{"Orders_2026", 1<<24 - 1},
		{"orders_2026", 1 << 24},
		{"select", -1},
		{strings.Repeat("a", 64), 0},
		{strings.Repeat("a", 65), 0},
		{"1events", 0},
		{"order", 0},
		{"2026", 0},
		{"ev`; DROP DATABASE x; --", 0},
		{"ev-1", 0},
		{"ev 1", 0},
		{"ev.t", 0},
		{"évents", 0},
		{"ev\x00", 0},
		{"ev\n", 0},
	} {
		f.Add(s.table, s.maxPayload)
	}
	f.Fuzz(func(t *testing.T, table string, maxPayload int) {
		store, err := outbox.NewMySQLStore(db, outbox.MySQLConfig{Table: table, MaxPayloadBytes: maxPayload})
		name := table
		if name == "" {
			name = "t_event_record" // the documented default
		}
		valid := documentedTable(name) && maxPayload >= 0 && maxPayload <= 1<<24-1
		if !valid {
			require.Error(t, err, "table %q, MaxPayloadBytes %d", table, maxPayload)
			require.ErrorIs(t, err, outbox.ErrInvalidConfig)
			return
		}
		require.NoError(t, err, "a documented-valid config is accepted")
		require.Equal(t, name, outbox.TableForTest(store))

		ctx := context.Background()
		require.NoError(t, store.CreateSchema(ctx))
		defer func() {
			_, err := db.Exec("DROP TABLE IF EXISTS `" + name + "`")
			require.NoError(t, err)
		}()
		var tables []string
		rows, err := db.Query("SELECT TABLE_NAME FROM information_schema.TABLES WHERE TABLE_SCHEMA = DATABASE()")
		require.NoError(t, err)
		for rows.Next() {
			var n string
			require.NoError(t, rows.Scan(&n))
			tables = append(tables, n)
		}
		require.NoError(t, rows.Err())
		require.NoError(t, rows.Close())
		require.Equal(t, []string{name}, tables, "the table has exactly the name given, and nothing else was created")

		limit := maxPayload
		if limit == 0 {
			limit = 4 << 20 // the documented default, RocketMQ's message size limit
		}
		payload := bytes.Repeat([]byte{'p'}, min(limit, 4<<10))
		tx, err := store.BeginTx(ctx, nil)
		require.NoError(t, err)
		_, err = tx.InsertEvent(ctx, outbox.EventInput{BizNo: "B", EventType: "E", Payload: make([]byte, limit+1)})
		require.ErrorIs(t, err, outbox.ErrPayloadTooLarge, "a payload over the limit is refused")
		id, err := outbox.InsertForTest(ctx, tx, outbox.EventInput{BizNo: "B", EventType: "E", Payload: payload})
		require.NoError(t, err)
		require.NoError(t, tx.Commit())
		evs, _, err := claimDue(ctx, store, "fuzz", 10, 1<<20)
		require.NoError(t, err)
		require.Len(t, evs, 1)
		n, err := store.MarkSuccess(ctx, []int64{id}, "fuzz")
		require.NoError(t, err)
		require.EqualValues(t, 1, n)
		got, err := outbox.NewAdmin(store).Get(ctx, id)
		require.NoError(t, err)
		assert.Equal(t, outbox.StatusSuccess, got.Status)
		assert.Equal(t, payload, got.Payload)
	})
}

// documentedTopic is the broker's rule for a topic name, which the documentation cites:
// 1 to 127 of letters, digits, '_', '-', '%' and '|'.
func documentedTopic(s string) bool {
	if s == "" || len(s) > 127 {
		return false
	}
	switch s {
	case "TBW102", "SCHEDULE_TOPIC_XXXX", "BenchmarkTest", "RMQ_SYS_TRANS_HALF_TOPIC", "RMQ_SYS_TRACE_TOPIC",
		"RMQ_SYS_TRANS_OP_HALF_TOPIC", "TRANS_CHECK_MAX_TIME_TOPIC", "SELF_TEST_TOPIC", "OFFSET_MOVED_EVENT":
		return false // the broker's own topics
	}
	for _, prefix := range []string{"rmq_sys_", "%RETRY%", "%DLQ%"} {
		if strings.HasPrefix(s, prefix) {
			return false
		}
	}
	for _, c := range []byte(s) {
		if !(c == '_' || c == '-' || c == '%' || c == '|' || c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z') {
			return false
		}
	}
	return true
}

// A default topic the store's Routes accept is one the broker allows, and a RocketMQConfig
// NewRocketMQSender accepts (with a producer of the caller's, here a fake) sends every
// message, alone or in a batch, to its event's topic; any other setting is refused with
// ErrInvalidConfig.
func FuzzRocketMQConfig(f *testing.F) {
	for _, s := range []struct {
		topic              string
		timeout            int64
		attempts, maxBatch int
	}{
		{"", 0, 0, 0},
		{"ORDER_EVENT_TOPIC", int64(time.Second), 1, 1},
		{"%RETRY%group|a-b_c", 0, 0, 4 << 20},
		{strings.Repeat("t", 127), 0, 0, 0},
		{strings.Repeat("t", 128), 0, 0, 0},
		{"a b", 0, 0, 0},
		{"a/b", 0, 0, 0},
		{"SCHEDULE_TOPIC_XXXX", 0, 0, 0},
		{"rmq_sys_x", 0, 0, 0},
		{"tópico", 0, 0, 0},
		{"T", -1, 0, 0},
		{"T", 0, -1, 0},
		{"T", 0, 0, 4<<20 + 1},
		{"T", math.MaxInt64, math.MaxInt, 1},
	} {
		f.Add(s.topic, s.timeout, s.attempts, s.maxBatch)
	}
	db, err := sql.Open("mysql", "root@tcp(127.0.0.1:1)/none") // never connects
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { _ = db.Close() })
	f.Fuzz(func(t *testing.T, topic string, timeout int64, attempts, maxBatch int) {
		want := topic
		if want == "" {
			want = "ORDER_EVENT_TOPIC" // the documented default
		}
		_, routeErr := outbox.NewMySQLStore(db, outbox.MySQLConfig{Routes: outbox.Routes{Topic: topic}})
		if !documentedTopic(want) {
			require.ErrorIs(t, routeErr, outbox.ErrInvalidConfig, "topic %q", topic)
		} else {
			require.NoError(t, routeErr, "a documented-valid topic is accepted")
		}
		fp := &fakeProducer{res: &primitive.SendResult{Status: primitive.SendOK}}
		s, err := outbox.NewRocketMQSenderWithProducerForTest(outbox.RocketMQConfig{SendTimeout: time.Duration(timeout), SendAttempts: attempts, MaxBatchBytes: maxBatch}, fp)
		valid := (timeout == 0 || timeout >= int64(10*time.Millisecond)) && attempts >= 0 && maxBatch >= 0 && maxBatch <= 4<<20
		if !valid {
			require.Error(t, err)
			require.ErrorIs(t, err, outbox.ErrInvalidConfig)
			return
		}
		require.NoError(t, err, "a documented-valid config is accepted")
		defer func() { require.NoError(t, s.Close()) }()
		if routeErr != nil {
			return
		}
		evs := []outbox.Event{{ID: 1, BizNo: "A", EventType: "E", Payload: []byte("a"), Topic: want}, {ID: 2, BizNo: "B", EventType: "E", Payload: []byte("b"), Topic: want}}
		sendErr := sendAlone(context.Background(), s, evs[0])
		batchErrs := s.Send(context.Background(), evs, false)
		if timeout == 0 || timeout >= int64(time.Second) {
			// Time enough for a producer that answers at once. (A shorter timeout may pass
			// before the batch's turn: its events are then not sent, and say so.)
			require.NoError(t, sendErr)
			for _, err := range batchErrs {
				require.NoError(t, err)
			}
			require.Len(t, fp.msgs, 3)
		}
		for _, m := range fp.msgs {
			assert.Equal(t, want, m.Topic, "every message goes to its event's topic")
		}
	})
}

// The fuzzers' seeds must be meaningful: each decodes to the config it was written as.
func TestFuzzConfigSeedsDecode(t *testing.T) {
	t.Parallel()
	c := decodeConfig(encodeConfig(map[string]any{"InstanceID": "pub", "Tuning.Lease": 2 * time.Second, "Tuning.ClaimPerRow": true, "Backoff": 2}))
	assert.Equal(t, "pub", c.InstanceID)
	assert.Equal(t, 2*time.Second, c.Tuning.Lease)
	assert.True(t, c.Tuning.ClaimPerRow)
	assert.NotNil(t, c.Backoff)
	assert.Zero(t, c.Tuning.SendTimeout)
	assert.Equal(t, outbox.Config{}, decodeConfig(nil), "an empty input is the zero config: every default")
}
