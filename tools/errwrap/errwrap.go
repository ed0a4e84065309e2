// Package errwrap is the analyzer of the project's rule "every cause wrapped with %w, never
// %v or %s of an error": in the non-test files of a package, an argument of fmt.Errorf whose
// type is an error must be formatted with %w, so that errors.Is and errors.As reach it; and a
// log/slog call must not turn an error into text (fmt.Sprint*, err.Error()) for its message
// or an attribute, but pass the error itself as an attribute's value.
//
// The log package's Printf, Fatalf and Panicf are not checked: a program's last word about an
// error is text (they cannot wrap), and the library logs through log/slog only.
package errwrap

import (
	"go/ast"
	"go/constant"
	"go/types"
	"strings"

	"golang.org/x/tools/go/analysis"
)

// Analyzer reports an error formatted with a verb other than %w in fmt.Errorf, and an error
// turned into text in a log/slog call.
var Analyzer = &analysis.Analyzer{
	Name: "errwrap",
	Doc:  "report an error formatted with %v or %s in fmt.Errorf (use %w), or as text in a log/slog call (pass the error)",
	Run:  run,
}

var errorType = types.Universe.Lookup("error").Type().Underlying().(*types.Interface)

func isError(t types.Type) bool {
	return t != nil && types.Implements(t, errorType)
}

func run(pass *analysis.Pass) (any, error) {
	for _, file := range pass.Files {
		if strings.HasSuffix(pass.Fset.File(file.Pos()).Name(), "_test.go") {
			continue
		}
		ast.Inspect(file, func(n ast.Node) bool {
			call, ok := n.(*ast.CallExpr)
			if !ok {
				return true
			}
			fn := callee(pass, call)
			if fn == nil || fn.Pkg() == nil {
				return true
			}
			switch {
			case fn.Pkg().Path() == "fmt" && fn.Name() == "Errorf":
				checkErrorf(pass, call)
			case fn.Pkg().Path() == "log/slog" && isSlogCall(fn):
				for _, arg := range call.Args {
					checkSlogArg(pass, arg)
				}
			}
			return true
		})
	}
	return nil, nil
}

// callee is the function or method a call calls, nil for a conversion or a func value.
func callee(pass *analysis.Pass, call *ast.CallExpr) *types.Func {
	var id *ast.Ident
	switch f := ast.Unparen(call.Fun).(type) {
	case *ast.Ident:
		id = f
	case *ast.SelectorExpr:
		id = f.Sel
	default:
		return nil
	}
	fn, _ := pass.TypesInfo.Uses[id].(*types.Func)
	return fn
}

// isSlogCall: the package's and a Logger's Debug, Info, Warn, Error (and their Context
// forms), Log, and slog.Any, slog.String and the other attribute constructors' value.
func isSlogCall(fn *types.Func) bool {
	switch strings.TrimSuffix(fn.Name(), "Context") {
	case "Debug", "Info", "Warn", "Error", "Log", "Any", "String", "Group", "With":
		return true
	}
	return false
}

func checkErrorf(pass *analysis.Pass, call *ast.CallExpr) {
	if len(call.Args) == 0 {
		return
	}
	tv, ok := pass.TypesInfo.Types[call.Args[0]]
	if !ok || tv.Value == nil || tv.Value.Kind() != constant.String {
		return // not a constant format: nothing to match
	}
	verbs := formatVerbs(constant.StringVal(tv.Value))
	args := call.Args[1:]
	for i, v := range verbs {
		if v.arg >= len(args) || v.verb == 'w' || v.verb == 'T' || v.verb == 'p' {
			continue
		}
		arg := args[v.arg]
		if x, ok := errorText(pass, arg); ok {
			pass.Reportf(arg.Pos(), "fmt.Errorf formats %s, the error's text (verb %d): wrap %s with %%w so that errors.Is and errors.As reach it",
				types.ExprString(arg), i+1, types.ExprString(x))
			continue
		}
		if isError(pass.TypesInfo.TypeOf(arg)) {
			pass.Reportf(arg.Pos(), "fmt.Errorf formats the error %s with %%%c (verb %d): wrap it with %%w so that errors.Is and errors.As reach it",
				types.ExprString(arg), v.verb, i+1)
		}
	}
}

// errorText: e is x.Error() of an error x.
func errorText(pass *analysis.Pass, e ast.Expr) (ast.Expr, bool) {
	call, ok := ast.Unparen(e).(*ast.CallExpr)
	if !ok || len(call.Args) != 0 {
		return nil, false
	}
	sel, ok := ast.Unparen(call.Fun).(*ast.SelectorExpr)
	if !ok || sel.Sel.Name != "Error" || !isError(pass.TypesInfo.TypeOf(sel.X)) {
		return nil, false
	}
	return sel.X, true
}

// checkSlogArg reports fmt.Sprint*(…, err, …) and err.Error() given to a log/slog call.
func checkSlogArg(pass *analysis.Pass, arg ast.Expr) {
	call, ok := ast.Unparen(arg).(*ast.CallExpr)
	if !ok {
		return
	}
	if _, ok := errorText(pass, arg); ok {
		pass.Reportf(arg.Pos(), "log/slog is given %s as text: pass the error itself as the attribute's value", types.ExprString(arg))
		return
	}
	fn := callee(pass, call)
	if fn == nil || fn.Pkg() == nil || fn.Pkg().Path() != "fmt" || !strings.HasPrefix(fn.Name(), "Sprint") {
		return
	}
	for _, a := range call.Args {
		if isError(pass.TypesInfo.TypeOf(a)) {
			pass.Reportf(a.Pos(), "log/slog is given the error %s formatted as text by fmt.%s: pass the error itself as an attribute's value",
				types.ExprString(a), fn.Name())
		}
	}
}

type verb struct {
	verb rune
	arg  int // the index of its argument, after the format
}

// formatVerbs parses a fmt format into its verbs and the argument each takes, as fmt does
// for the common forms: flags, width and precision (a '*' takes an argument), explicit
// argument indexes ([n]), and %% (no argument).
func formatVerbs(format string) []verb {
	var verbs []verb
	arg := 0
	for i := 0; i < len(format); i++ {
		if format[i] != '%' {
			continue
		}
		i++
	flags:
		for ; i < len(format); i++ {
			switch format[i] {
			case '+', '-', '#', ' ', '0':
			default:
				break flags
			}
		}
		num := func() {
			for i < len(format) && format[i] >= '0' && format[i] <= '9' {
				i++
			}
		}
		index := func() {
			if i < len(format) && format[i] == '[' {
				j := strings.IndexByte(format[i:], ']')
				if j < 0 {
					return
				}
				n := 0
				for _, c := range format[i+1 : i+j] {
					n = n*10 + int(c-'0')
				}
				arg = n - 1
				i += j + 1
			}
		}
		index()
		if i < len(format) && format[i] == '*' {
			arg++
			i++
		} else {
			num()
		}
		if i < len(format) && format[i] == '.' {
			i++
			index()
			if i < len(format) && format[i] == '*' {
				arg++
				i++
			} else {
				num()
			}
		}
		index()
		if i >= len(format) {
			break
		}
		if format[i] == '%' {
			continue
		}
		verbs = append(verbs, verb{verb: rune(format[i]), arg: arg})
		arg++
	}
	return verbs
}
