package main

import (
	"go/ast"
	"go/parser"
	"go/token"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const src = `package p

import "context"

const (
	A Mode = iota
	B
	c
)

const Limit = 10

var ErrX = errors.New("x")

type Mode int

func (Mode) String() string { return "" }

type Config struct {
	Name    string
	Timeout, Pause time.Duration
	OnDone  func(ctx context.Context, id int64)
	hidden  int
	Embedded
}

type Sender interface {
	Send(ctx context.Context, evs []Event, keyOrder bool) []error
	info() int
}

type hiddenT struct{}

func (hiddenT) Exported() {}

func New(ctx context.Context, a, b int, opts ...Option) (*Config, error) { return nil, nil }

func Map[K comparable, V any](m map[K]V) []K { return nil }

func (c *Config) Run(ctx context.Context) error { return nil }
`

// The API of a package: one line per exported identifier, types as written, parameter
// names left out, unexported ones (and methods of unexported types) left out.
func TestAPILines(t *testing.T) {
	f, err := parser.ParseFile(token.NewFileSet(), "p.go", src, 0)
	require.NoError(t, err)
	got := apiLines("example.com/p", []*ast.File{f})
	want := []string{
		"const A Mode", "const B Mode", "const Limit = 10",
		"func Map[K comparable, V any](map[K]V) []K",
		"func New(context.Context, int, int, ...Option) (*Config, error)",
		"method (*Config) Run(context.Context) error",
		"method (Mode) String() string",
		"type Config struct", "type Config struct, Name string", "type Config struct, OnDone func(context.Context, int64)",
		"type Config struct, Pause time.Duration", "type Config struct, Timeout time.Duration",
		"type Config struct, embedded Embedded",
		"type Mode int",
		"type Sender interface", "type Sender interface, Send(context.Context, []Event, bool) []error",
		"type Sender interface, unexported methods",
		"var ErrX error",
	}
	for i := range want {
		want[i] = "pkg example.com/p, " + want[i]
	}
	assert.ElementsMatch(t, want, got)
}

// A difference fails the check unless a bullet of [Unreleased] names it; a new package's
// identifiers count as named with the package, a type's members with the type added whole.
func TestUncovered(t *testing.T) {
	recorded := map[string][]string{"m": {
		"pkg m, type Config struct", "pkg m, type Config struct, MaxBackoff time.Duration",
		"pkg m, method (*Sender) Message(Event) *primitive.Message", "pkg m, func Old()",
		"pkg m, type Sender struct",
	}}
	today := map[string][]string{
		"m": {
			"pkg m, type Config struct", "pkg m, type Tuning struct", "pkg m, type Tuning struct, MaxBackoff time.Duration",
			"pkg m, type Config struct, Tuning Tuning", "pkg m, type Sender struct", "pkg m, func Old(int)",
			"pkg m, func Brand()",
		},
		"m/inbox": {"pkg m/inbox, func New() *Inbox"},
		"m/relay": {"pkg m/relay, func New() *Relay"},
	}
	section := "## [Unreleased]\n\n### Changed\n\n- Every expert setting of `Config` -> a field of `Config.Tuning` (type `Tuning`):\n  `MaxBackoff`.\n" +
		"- Package `inbox`, the consumer's half.\n- `Old` takes the count.\n"
	got := uncovered(diff(recorded, today), section, map[string]bool{"m": true})
	assert.Equal(t, []string{
		"Brand (m): added or changed since 0.1.0: func Brand()",
		"Sender.Message (m): removed or changed since 0.1.0: method (*Sender) Message(Event) *primitive.Message",
		"New (m/relay): added or changed since 0.1.0: func New() *Relay",
	}, got)
}
