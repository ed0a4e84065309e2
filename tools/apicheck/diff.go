package main

import (
	"fmt"
	"regexp"
	"slices"
	"strings"
)

// A change is one line of the API that is in api/ and not today (removed or changed) or
// today and not in api/ (added or changed).
type change struct {
	path  string // the package's import path
	line  string // without "pkg <path>, "
	added bool
}

// key is the identifier a line is about, as the CHANGELOG writes it: New, Publisher.Run,
// Config.MaxBackoff, ErrClosed.
func (c change) key() string {
	kind, rest, _ := strings.Cut(c.line, " ")
	name := func(s string) string {
		if i := strings.IndexAny(s, " ([="); i >= 0 {
			return s[:i]
		}
		return s
	}
	switch kind {
	case "method": // method (*T) M(...)
		recv, m, _ := strings.Cut(rest, ") ")
		return strings.Trim(recv, "(*") + "." + name(m)
	case "type":
		head, member, ok := strings.Cut(rest, ", ")
		t := name(head)
		if !ok || member == "unexported methods" {
			return t
		}
		member = strings.TrimPrefix(member, "embedded ")
		m := name(strings.TrimLeft(member, "*"))
		if i := strings.LastIndexByte(m, '.'); i >= 0 {
			m = m[i+1:]
		}
		return t + "." + m
	}
	return name(rest)
}

// typeLine: the line declares a type itself ("type T struct"), not one of its members.
func (c change) typeLine() bool {
	return strings.HasPrefix(c.line, "type ") && !strings.Contains(c.line, ", ")
}

func (c change) String() string {
	verb := "removed or changed since 0.1.0"
	if c.added {
		verb = "added or changed since 0.1.0"
	}
	return fmt.Sprintf("%s (%s): %s: %s", c.key(), c.path, verb, c.line)
}

// diff compares the recorded API with today's, package by package.
func diff(recorded, today map[string][]string) []change {
	var out []change
	paths := map[string]bool{}
	for p := range recorded {
		paths[p] = true
	}
	for p := range today {
		paths[p] = true
	}
	for _, p := range slices.Sorted(func(yield func(string) bool) {
		for p := range paths {
			if !yield(p) {
				return
			}
		}
	}) {
		prefix := "pkg " + p + ", "
		was, is := set(recorded[p]), set(today[p])
		for l := range was {
			if !is[l] {
				out = append(out, change{path: p, line: strings.TrimPrefix(l, prefix)})
			}
		}
		for l := range is {
			if !was[l] {
				out = append(out, change{path: p, line: strings.TrimPrefix(l, prefix), added: true})
			}
		}
	}
	slices.SortFunc(out, func(a, b change) int {
		return strings.Compare(a.path+" "+a.key()+" "+a.line, b.path+" "+b.key()+" "+b.line)
	})
	return out
}

func set(lines []string) map[string]bool {
	m := make(map[string]bool, len(lines))
	for _, l := range lines {
		m[l] = true
	}
	return m
}

// unreleasedSection is the text of CHANGELOG.md's "## [Unreleased]" section.
func unreleasedSection(changelog string) (string, error) {
	start := strings.Index(changelog, "\n## [Unreleased]")
	if start < 0 {
		return "", fmt.Errorf("CHANGELOG.md has no \"## [Unreleased]\" section")
	}
	rest := changelog[start+1:]
	if end := strings.Index(rest[3:], "\n## "); end >= 0 {
		rest = rest[:end+3]
	}
	return rest, nil
}

var (
	codeSpan  = regexp.MustCompile("`([^`]+)`")
	leadIdent = regexp.MustCompile(`^\*?&?([A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*)`)
)

// bullets splits a section into its bullets ("- " at a line's start, with the lines
// indented under it), each as the identifiers of its code spans.
func bullets(section string) [][]string {
	var out [][]string
	var cur strings.Builder
	flush := func() {
		var ids []string
		for _, m := range codeSpan.FindAllStringSubmatch(cur.String(), -1) {
			if id := leadIdent.FindStringSubmatch(strings.TrimSpace(m[1])); id != nil {
				ids = append(ids, id[1])
			}
		}
		if len(ids) > 0 {
			out = append(out, ids)
		}
		cur.Reset()
	}
	for line := range strings.Lines(section) {
		if strings.HasPrefix(line, "- ") || strings.HasPrefix(line, "#") {
			flush()
		}
		cur.WriteString(line)
	}
	flush()
	return out
}

// named: a bullet names key of package pkgName: a code span is the key (Publisher.Run), the
// key behind the package's name (relay.Config.Checkpoint) or a type's path ending in it
// (Config.Tuning.MaxBackoff); or, for a member T.M, the bullet has a span M and one T.
func named(bs [][]string, pkgName, key string) bool {
	t, m, member := strings.Cut(key, ".")
	for _, ids := range bs {
		hasT, hasM := false, false
		for _, id := range ids {
			id = strings.TrimPrefix(id, pkgName+".")
			if id == key || strings.HasSuffix(id, "."+key) {
				return true
			}
			hasT = hasT || id == t || strings.HasPrefix(id, t+".")
			hasM = hasM || id == m
		}
		if member && hasT && hasM {
			return true
		}
	}
	return false
}

// newPackage: a bullet names the package as new: "package `inbox`", "module `<path>`", or
// its import path in a code span.
func newPackage(section, path string) bool {
	name := path[strings.LastIndexByte(path, '/')+1:]
	s := strings.ToLower(section)
	return strings.Contains(s, "package `"+name+"`") || strings.Contains(section, "`"+path+"`")
}

// uncovered is the changes [Unreleased] does not name, as lines to print. recorded is the
// set of packages api/ has: the others are new.
func uncovered(changes []change, section string, recorded map[string]bool) []string {
	bs := bullets(section)
	var out []string
	// A type added or removed whole covers its members that changed the same way.
	whole := map[string]bool{}
	for _, c := range changes {
		if c.typeLine() {
			whole[fmt.Sprint(c.path, c.added, c.key())] = true
		}
	}
	pkgNew := map[string]bool{}
	for _, c := range changes {
		name := c.path[strings.LastIndexByte(c.path, '/')+1:]
		if _, ok := pkgNew[c.path]; !ok {
			pkgNew[c.path] = !recorded[c.path] && newPackage(section, c.path)
		}
		if c.added && pkgNew[c.path] {
			continue
		}
		key := c.key()
		if t, _, ok := strings.Cut(key, "."); ok && whole[fmt.Sprint(c.path, c.added, t)] {
			key = t
		}
		if !named(bs, name, key) {
			out = append(out, c.String())
		}
	}
	return out
}
