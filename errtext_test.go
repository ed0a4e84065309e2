package outbox_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// maxErrorText bounds the fixed text of an error the library makes (what fmt.Errorf's
// format or errors.New's argument says, the values and wrapped errors aside): one short
// sentence that says what went wrong and what to do; the docs hold the explanation.
const maxErrorText = 160

// Every error the library's modules make (outside tests, tools and examples) says what and
// what to do in at most maxErrorText characters of fixed text.
func TestErrorTextIsShort(t *testing.T) {
	t.Parallel()
	var long []string
	err := filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (path == "tools" || path == "examples" || strings.HasPrefix(d.Name(), ".")) && path != "." {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		fset := token.NewFileSet()
		f, err := parser.ParseFile(fset, path, nil, 0)
		if err != nil {
			return err
		}
		ast.Inspect(f, func(n ast.Node) bool {
			call, ok := n.(*ast.CallExpr)
			if !ok || len(call.Args) == 0 || !isErrorMaker(call.Fun) {
				return true
			}
			if text := literalText(call.Args[0]); len(text) > maxErrorText {
				long = append(long, fset.Position(call.Pos()).String()+": "+strconv.Itoa(len(text))+" characters")
			}
			return true
		})
		return nil
	})
	require.NoError(t, err)
	assert.Empty(t, long, "error texts over %d characters", maxErrorText)
}

// isErrorMaker reports whether fun is fmt.Errorf or errors.New.
func isErrorMaker(fun ast.Expr) bool {
	sel, ok := fun.(*ast.SelectorExpr)
	if !ok {
		return false
	}
	pkg, ok := sel.X.(*ast.Ident)
	return ok && (pkg.Name == "fmt" && sel.Sel.Name == "Errorf" || pkg.Name == "errors" && sel.Sel.Name == "New")
}

// literalText is the text of the string literals in e (a literal, or literals joined by +).
func literalText(e ast.Expr) string {
	var b strings.Builder
	ast.Inspect(e, func(n ast.Node) bool {
		if lit, ok := n.(*ast.BasicLit); ok && lit.Kind == token.STRING {
			s, err := strconv.Unquote(lit.Value)
			if err == nil {
				b.WriteString(s)
			}
		}
		return true
	})
	return b.String()
}
