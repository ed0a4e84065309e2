package main

import (
	"bytes"
	"fmt"
	"go/ast"
	"go/parser"
	"go/printer"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// A pkg is one package of the library's API: its import path, the name of its file in api/,
// and its exported identifiers, one line each.
type pkg struct {
	path  string
	file  string // api/<file>.txt
	lines []string
}

// skipDirs are the directories that hold no API: modules of programs (tools, examples),
// test data, and what the go command ignores.
func skipDir(rel string, name string) bool {
	return rel == "tools" || rel == "examples" || name == "testdata" || name == "internal" ||
		strings.HasPrefix(name, ".") || strings.HasPrefix(name, "_")
}

// packages reads the API of every package under root: the modules there (the library's and
// the relay's), apart from main packages, internal ones and the programs' modules.
func packages(root string) ([]pkg, error) {
	var pkgs []pkg
	err := filepath.WalkDir(root, func(dir string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() {
			return nil
		}
		rel, err := filepath.Rel(root, dir)
		if err != nil {
			return err
		}
		rel = filepath.ToSlash(rel)
		if rel != "." && skipDir(rel, d.Name()) {
			return filepath.SkipDir
		}
		p, err := readPackage(root, rel)
		if err != nil {
			return err
		}
		if p != nil {
			pkgs = append(pkgs, *p)
		}
		return nil
	})
	return pkgs, err
}

// modulePath is the module path of the go.mod nearest above dir (rel to root) and dir's path
// inside that module.
func modulePath(root, rel string) (string, error) {
	for d := rel; ; d = filepath.ToSlash(filepath.Dir(d)) {
		data, err := os.ReadFile(filepath.Join(root, d, "go.mod"))
		if err == nil {
			for line := range strings.Lines(string(data)) {
				if f := strings.Fields(line); len(f) == 2 && f[0] == "module" {
					if d == "." {
						return f[1] + strings.TrimPrefix("/"+rel, "/."), nil
					}
					return f[1] + strings.TrimPrefix(rel, d), nil
				}
			}
			return "", fmt.Errorf("%s/go.mod names no module", d)
		}
		if d == "." {
			return "", fmt.Errorf("no go.mod above %s", rel)
		}
	}
}

func readPackage(root, rel string) (*pkg, error) {
	entries, err := os.ReadDir(filepath.Join(root, rel))
	if err != nil {
		return nil, err
	}
	fset := token.NewFileSet()
	var files []*ast.File
	for _, e := range entries {
		n := e.Name()
		if e.IsDir() || !strings.HasSuffix(n, ".go") || strings.HasSuffix(n, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, filepath.Join(root, rel, n), nil, parser.SkipObjectResolution)
		if err != nil {
			return nil, err
		}
		if f.Name.Name == "main" || ignoredByBuild(f) {
			continue
		}
		files = append(files, f)
	}
	if len(files) == 0 {
		return nil, nil
	}
	path, err := modulePath(root, rel)
	if err != nil {
		return nil, err
	}
	name := "outbox"
	if rel != "." {
		name = strings.ReplaceAll(rel, "/", "-")
	}
	return &pkg{path: path, file: name, lines: apiLines(path, files)}, nil
}

// ignoredByBuild: a file with a "//go:build ignore" constraint is no part of the package.
func ignoredByBuild(f *ast.File) bool {
	for _, cg := range f.Comments {
		if cg.Pos() > f.Package {
			break
		}
		for _, c := range cg.List {
			if strings.HasPrefix(c.Text, "//go:build") && strings.Contains(c.Text, "ignore") {
				return true
			}
		}
	}
	return false
}

// apiLines lists the exported identifiers of a package's files as Go's api/go1.*.txt do, one
// a line, sorted: "pkg P, func F(int) error", "pkg P, method (*T) M() error",
// "pkg P, type T struct", "pkg P, type T struct, Field int", "pkg P, type I interface, M()",
// "pkg P, const C T", "pkg P, var V error". Types are written as the source writes them
// (parameter names left out); the file is read, not type-checked.
func apiLines(path string, files []*ast.File) []string {
	set := map[string]bool{}
	add := func(format string, args ...any) { set["pkg "+path+", "+fmt.Sprintf(format, args...)] = true }
	for _, f := range files {
		for _, decl := range f.Decls {
			switch d := decl.(type) {
			case *ast.FuncDecl:
				if !d.Name.IsExported() {
					continue
				}
				if d.Recv == nil {
					add("func %s%s%s", d.Name.Name, typeParams(d.Type.TypeParams), signature(d.Type))
					continue
				}
				recv := d.Recv.List[0].Type
				if base := baseName(recv); base == "" || !ast.IsExported(base) {
					continue
				}
				add("method (%s) %s%s", expr(stripTypeArgs(recv)), d.Name.Name, signature(d.Type))
			case *ast.GenDecl:
				genDecl(d, add)
			}
		}
	}
	lines := make([]string, 0, len(set))
	for l := range set {
		lines = append(lines, l)
	}
	slices.Sort(lines)
	return lines
}

func genDecl(d *ast.GenDecl, add func(string, ...any)) {
	var lastType ast.Expr // a const spec without a type or value takes the one before it
	for _, spec := range d.Specs {
		switch s := spec.(type) {
		case *ast.ValueSpec:
			kind := d.Tok.String()
			typ := s.Type
			if d.Tok == token.CONST {
				if typ == nil && len(s.Values) == 0 {
					typ = lastType
				} else if len(s.Values) > 0 {
					lastType = typ
				}
			}
			for i, n := range s.Names {
				if !n.IsExported() {
					continue
				}
				switch {
				case typ != nil:
					add("%s %s %s", kind, n.Name, expr(typ))
				case i < len(s.Values) && isErrorCall(s.Values[i]):
					add("%s %s error", kind, n.Name)
				case i < len(s.Values) && d.Tok == token.CONST:
					add("%s %s = %s", kind, n.Name, expr(s.Values[i]))
				default:
					add("%s %s", kind, n.Name)
				}
			}
		case *ast.TypeSpec:
			if !s.Name.IsExported() {
				continue
			}
			name := s.Name.Name + typeParams(s.TypeParams)
			if s.Assign.IsValid() {
				add("type %s = %s", name, expr(s.Type))
				continue
			}
			switch t := s.Type.(type) {
			case *ast.StructType:
				add("type %s struct", name)
				for _, f := range t.Fields.List {
					if len(f.Names) == 0 {
						if ast.IsExported(baseName(f.Type)) {
							add("type %s struct, embedded %s", name, expr(f.Type))
						}
						continue
					}
					for _, fn := range f.Names {
						if fn.IsExported() {
							add("type %s struct, %s %s", name, fn.Name, expr(f.Type))
						}
					}
				}
			case *ast.InterfaceType:
				add("type %s interface", name)
				for _, m := range t.Methods.List {
					switch {
					case len(m.Names) == 0:
						add("type %s interface, %s", name, expr(m.Type))
					case m.Names[0].IsExported():
						add("type %s interface, %s%s", name, m.Names[0].Name, signature(m.Type.(*ast.FuncType)))
					default:
						add("type %s interface, unexported methods", name)
					}
				}
			default:
				add("type %s %s", name, expr(s.Type))
			}
		}
	}
}

// isErrorCall: errors.New(…) and fmt.Errorf(…), whose type is error.
func isErrorCall(e ast.Expr) bool {
	call, ok := e.(*ast.CallExpr)
	if !ok {
		return false
	}
	sel, ok := call.Fun.(*ast.SelectorExpr)
	if !ok {
		return false
	}
	x, ok := sel.X.(*ast.Ident)
	return ok && (x.Name == "errors" && sel.Sel.Name == "New" || x.Name == "fmt" && sel.Sel.Name == "Errorf")
}

// baseName is the type name of a receiver or an embedded field: T of T, *T, T[P], pkg.T.
func baseName(e ast.Expr) string {
	switch t := e.(type) {
	case *ast.Ident:
		return t.Name
	case *ast.StarExpr:
		return baseName(t.X)
	case *ast.IndexExpr:
		return baseName(t.X)
	case *ast.IndexListExpr:
		return baseName(t.X)
	case *ast.SelectorExpr:
		return t.Sel.Name
	}
	return ""
}

func stripTypeArgs(e ast.Expr) ast.Expr {
	switch t := e.(type) {
	case *ast.StarExpr:
		return &ast.StarExpr{X: stripTypeArgs(t.X)}
	case *ast.IndexExpr:
		return t.X
	case *ast.IndexListExpr:
		return t.X
	}
	return e
}

// signature writes a function type's parameters and results without their names.
func signature(ft *ast.FuncType) string {
	params := types(ft.Params)
	s := "(" + strings.Join(params, ", ") + ")"
	results := types(ft.Results)
	switch {
	case len(results) == 1:
		s += " " + results[0]
	case len(results) > 1:
		s += " (" + strings.Join(results, ", ") + ")"
	}
	return s
}

func types(fl *ast.FieldList) []string {
	if fl == nil {
		return nil
	}
	var out []string
	for _, f := range fl.List {
		n := max(len(f.Names), 1)
		for range n {
			out = append(out, expr(f.Type))
		}
	}
	return out
}

func typeParams(fl *ast.FieldList) string {
	if fl == nil || len(fl.List) == 0 {
		return ""
	}
	var parts []string
	for _, f := range fl.List {
		var names []string
		for _, n := range f.Names {
			names = append(names, n.Name)
		}
		parts = append(parts, strings.Join(names, ", ")+" "+expr(f.Type))
	}
	return "[" + strings.Join(parts, ", ") + "]"
}

// expr prints an expression on one line, the func types in it without parameter names.
func expr(e ast.Expr) string {
	ast.Inspect(e, func(n ast.Node) bool {
		if ft, ok := n.(*ast.FuncType); ok {
			unname(ft.Params)
			unname(ft.Results)
		}
		return true
	})
	var b bytes.Buffer
	if err := printer.Fprint(&b, token.NewFileSet(), e); err != nil {
		return fmt.Sprintf("<%v>", err)
	}
	return strings.Join(strings.Fields(b.String()), " ")
}

// unname drops the names of a field list, one unnamed field per name.
func unname(fl *ast.FieldList) {
	if fl == nil {
		return
	}
	var list []*ast.Field
	for _, f := range fl.List {
		for range max(len(f.Names), 1) {
			list = append(list, &ast.Field{Type: f.Type})
		}
	}
	fl.List = list
}
