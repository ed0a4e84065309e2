package mysqldialect

import (
	"strings"
	"testing"
	"time"
	"unicode/utf8"
)

// ParseFailures reads the library's lines, skips empty ones, keeps what it cannot read as
// text, and returns at most the latest MaxFailures.
func TestParseFailures(t *testing.T) {
	v := "\n" + `{"at": "2026-12-01 10:00:00.123", "instance": "a", "class": "retryable", "message": "x\ny"}` + "\n\n" +
		`{"class":"permanent","message":"m","at":"2026-12-01 10:00:01.000","instance":"b"}` + "\nnot json\n"
	got := ParseFailures(v)
	want := []Failure{
		{At: time.Date(2026, 12, 1, 10, 0, 0, 123e6, time.UTC), Instance: "a", Class: "retryable", Message: "x\ny"},
		{At: time.Date(2026, 12, 1, 10, 0, 1, 0, time.UTC), Instance: "b", Class: "permanent", Message: "m"},
		{Message: "not json"},
	}
	if len(got) != len(want) {
		t.Fatalf("got %d entries %+v, want %d", len(got), got, len(want))
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("entry %d: got %+v, want %+v", i, got[i], want[i])
		}
	}
	if ParseFailures("") != nil {
		t.Error("an empty value has no entries")
	}
	many := strings.Repeat("line\n", 25)
	if n := len(ParseFailures(many)); n != MaxFailures {
		t.Errorf("25 lines read as %d entries, want %d", n, MaxFailures)
	}
	long := ParseFailures(strings.Repeat("é", 2000) + "\xff")
	if len(long) != 1 || utf8.RuneCountInString(long[0].Message) != MaxFailureMessage || !utf8.ValidString(long[0].Message) {
		t.Errorf("a long unreadable line: %d characters, valid %v", utf8.RuneCountInString(long[0].Message), utf8.ValidString(long[0].Message))
	}
}

// FuzzParseFailures: any value reads without a panic, into at most MaxFailures entries of
// valid UTF-8 when the value is.
func FuzzParseFailures(f *testing.F) {
	f.Add(`{"at": "2026-12-01 10:00:00.123", "instance": "a", "class": "retryable", "message": "x"}`)
	f.Add("{\"at\": 5}\n{\n}\n\x00")
	f.Fuzz(func(t *testing.T, v string) {
		got := ParseFailures(v)
		if len(got) > MaxFailures {
			t.Fatalf("%d entries", len(got))
		}
		for _, e := range got {
			if !utf8.ValidString(e.Message) && utf8.ValidString(v) {
				t.Fatalf("invalid UTF-8 message %q from a valid value", e.Message)
			}
		}
	})
}
