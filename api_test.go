package outbox_test

import (
	"go/ast"
	"go/doc"
	"go/parser"
	"go/token"
	"os"
	"reflect"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/go-outbox/outbox"
)

// The package stays small enough to learn in an afternoon: at most 117 exported identifiers
// (constants, variables, functions, types and their methods, as godoc lists them), and the
// store a service meets at most 17 methods. A change that needs more makes something else
// smaller, or moves what only one audience uses apart (as Admin did the operators' calls).
func TestAPISurface(t *testing.T) {
	t.Parallel()
	fset := token.NewFileSet()
	entries, err := os.ReadDir(".")
	require.NoError(t, err)
	var files []*ast.File
	for _, e := range entries {
		if name := e.Name(); strings.HasSuffix(name, ".go") && !strings.HasSuffix(name, "_test.go") {
			f, err := parser.ParseFile(fset, name, nil, parser.ParseComments)
			require.NoError(t, err)
			files = append(files, f)
		}
	}
	p, err := doc.NewFromFiles(fset, files, "github.com/go-outbox/outbox")
	require.NoError(t, err)

	var names []string
	values := func(vs []*doc.Value, kind string) {
		for _, v := range vs {
			for _, n := range v.Names {
				if ast.IsExported(n) {
					names = append(names, kind+" "+n)
				}
			}
		}
	}
	values(p.Consts, "const")
	values(p.Vars, "var")
	for _, f := range p.Funcs {
		names = append(names, "func "+f.Name)
	}
	methods := map[string]int{}
	for _, typ := range p.Types {
		names = append(names, "type "+typ.Name)
		values(typ.Consts, "const")
		values(typ.Vars, "var")
		for _, f := range typ.Funcs {
			names = append(names, "func "+f.Name)
		}
		for _, m := range typ.Methods {
			names = append(names, "method "+typ.Name+"."+m.Name)
			methods[typ.Name]++
		}
	}
	// 102: the lifecycle's Start and Stop, the verbs the relay and the inbox's consumer share,
	// and Admin.GetByEventID, the lookup by the id consumers log; ConstantBackoff, a one-line
	// closure, went to make room. 105: the operator console's two calls, Admin.SkipFailed
	// (RequeueFailed's twin) and RocketMQMessage (what a dead letter will be sent as). 117:
	// key order across topics and routing on the store: Dispatch (the one rule, which the
	// relay calls too), StoreInfo, Routes and Routes.TopicOf, Sender's Check (on
	// RocketMQSender and SenderFunc), Admin.RequeueTo, RetryPolicy and its Next (the one
	// retry rule), ErrNoTable, ErrUnconfirmed, and Store's RenewLease (so 17 methods of
	// MySQLStore). EventRead (a store dates its reads for the publisher's figures) took the
	// place of the Backoff type. The budget comes down again as the core is simplified.
	assert.LessOrEqual(t, len(names), 117, "exported identifiers:\n%s", strings.Join(names, "\n"))
	assert.LessOrEqual(t, methods["MySQLStore"], 17, "MySQLStore's methods")
	assert.NotZero(t, methods["MySQLStore"], "the count found the store's methods")
}

// docs/configuration.md is the reference of every setting: each field of Config, Tuning,
// MySQLConfig and RocketMQConfig has its row.
func TestConfigurationReferenceIsComplete(t *testing.T) {
	t.Parallel()
	page, err := os.ReadFile("docs/configuration.md")
	require.NoError(t, err)
	for _, v := range []any{outbox.Config{}, outbox.Tuning{}, outbox.MySQLConfig{}, outbox.RocketMQConfig{}} {
		typ := reflect.TypeOf(v)
		for i := range typ.NumField() {
			f := typ.Field(i)
			if f.IsExported() {
				assert.Contains(t, string(page), "| `"+f.Name+"` |", "%s.%s has no row in docs/configuration.md", typ.Name(), f.Name)
			}
		}
	}
}
