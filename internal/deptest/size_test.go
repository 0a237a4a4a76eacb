package deptest

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// The size limits: a function of the request path reads in one screenful or two, and a file
// holds one concern a reviewer can keep in mind.
const (
	maxFuncLines = 80  // from the func keyword to the closing brace, doc comment excluded
	maxFileLines = 500 // every line of a non-test file
)

// requestPath reports whether the functions of pkg (its path under the module) are held to
// maxFuncLines: the packages a client's request runs through, from the HTTP ingress through
// admission and routing to a peer's engine and back. That is node and its subpackages, the
// admission and routing libraries under admit, and kvindex, which every routing decision
// reads. node/engine/sim is left out: it stands in for a GPU engine, which in production is
// another program and none of kvmesh's request path. gossip, carbon, the harnesses and the
// commands run beside or outside a request and are held to the file limit only.
func requestPath(pkg string) bool {
	if pkg == "node/engine/sim" || strings.HasPrefix(pkg, "node/engine/sim/") {
		return false
	}
	for _, root := range []string{"node", "admit", "kvindex"} {
		if pkg == root || strings.HasPrefix(pkg, root+"/") {
			return true
		}
	}
	return false
}

// longFuncs are the request path's functions over maxFuncLines today, by package, receiver
// and name, with their length. The list only shrinks: a function that grows, or a new one
// over the limit, fails TestSizes; so does an entry whose function got shorter (lower its
// number, or drop it once it is within the limit), so a shortening is never given back.
// TestSizes prints the list as it should read when it fails.
var longFuncs = map[string]int{
	"node/metrics.New": 146,
}

// longFiles are the non-test files over maxFileLines today, with their length; the same
// ratchet as longFuncs. Generated files (a "Code generated ... DO NOT EDIT." line) are not
// counted; a file of table data, named here with a comment saying so, may stay long.
var longFiles = map[string]int{}

// generated is Go's marker of a generated file.
var generated = regexp.MustCompile(`(?m)^// Code generated .* DO NOT EDIT\.$`)

// TestSizes fails for a non-test file of the module over maxFileLines and a function of the
// request path over maxFuncLines that their lists do not allow, and for an entry of either
// list that no longer matches what it names.
func TestSizes(t *testing.T) {
	funcs, files := map[string]int{}, map[string]int{}
	for _, f := range moduleFiles(t) {
		src, err := os.ReadFile(filepath.Join("../..", f.path))
		if err != nil {
			t.Fatal(err)
		}
		if generated.Match(src) {
			continue
		}
		if n := strings.Count(string(src), "\n"); n > maxFileLines {
			files[f.path] = n
		}
		if requestPath(f.pkg) {
			for name, n := range longFuncsOf(t, f, src) {
				funcs[name] = n
			}
		}
	}
	ok := ratchet(t, "function", maxFuncLines, longFuncs, funcs)
	ok = ratchet(t, "file", maxFileLines, longFiles, files) && ok
	if !ok {
		t.Logf("the lists as they are today (size_test.go):\n\nvar longFuncs = map[string]int{\n%s}\n\nvar longFiles = map[string]int{\n%s}",
			listing(funcs), listing(files))
	}
}

// ratchet compares what is over limit today with what allowed lets be, and reports whether
// they agree.
func ratchet(t *testing.T, what string, limit int, allowed, today map[string]int) bool {
	t.Helper()
	ok := true
	for name, n := range today {
		switch max, listed := allowed[name]; {
		case !listed:
			t.Errorf("%s %s has %d lines, over the limit of %d: split it", what, name, n, limit)
			ok = false
		case n > max:
			t.Errorf("%s %s grew to %d lines (%d allowed, the limit is %d): shorten it", what, name, n, max, limit)
			ok = false
		case n < max:
			t.Errorf("%s %s is down to %d lines: lower its entry from %d", what, name, n, max)
			ok = false
		}
	}
	for name := range allowed {
		if _, long := today[name]; !long {
			t.Errorf("%s %s is listed but is gone or within %d lines: drop its entry", what, name, limit)
			ok = false
		}
	}
	return ok
}

// listing formats m as the lines of a map literal, sorted and aligned as gofmt aligns them.
func listing(m map[string]int) string {
	keys := slices.Sorted(maps.Keys(m))
	width := 0
	for _, k := range keys {
		width = max(width, len(fmt.Sprintf("%q:", k)))
	}
	var b strings.Builder
	for _, k := range keys {
		fmt.Fprintf(&b, "\t%-*s %d,\n", width, fmt.Sprintf("%q:", k), m[k])
	}
	return b.String()
}

type goFile struct{ pkg, path string } // path under the module

// moduleFiles returns the module's non-test Go files, those every build constraint excludes
// too.
func moduleFiles(t *testing.T) []goFile {
	t.Helper()
	out := goList(t, "-f", `{{.ImportPath}} {{.Dir}}{{range .GoFiles}} {{.}}{{end}}{{range .CgoFiles}} {{.}}{{end}}{{range .IgnoredGoFiles}} {{.}}{{end}}`, "../../...")
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	var files []goFile
	for line := range strings.Lines(out) {
		fields := strings.Fields(line)
		pkg := strings.TrimPrefix(fields[0], module)
		dir, err := filepath.Rel(root, fields[1])
		if err != nil {
			t.Fatal(err)
		}
		for _, name := range fields[2:] {
			if !strings.HasSuffix(name, "_test.go") {
				files = append(files, goFile{pkg, filepath.ToSlash(filepath.Join(dir, name))})
			}
		}
	}
	if len(files) < 10 {
		t.Fatalf("go list found only %v", files)
	}
	return files
}

// longFuncsOf returns the functions of f over maxFuncLines, named as longFuncs names them.
func longFuncsOf(t *testing.T, f goFile, src []byte) map[string]int {
	t.Helper()
	fset := token.NewFileSet()
	file, err := parser.ParseFile(fset, f.path, src, parser.SkipObjectResolution)
	if err != nil {
		t.Fatal(err)
	}
	long := map[string]int{}
	for _, d := range file.Decls {
		fn, ok := d.(*ast.FuncDecl)
		if !ok || fn.Body == nil {
			continue
		}
		if n := fset.Position(fn.End()).Line - fset.Position(fn.Pos()).Line + 1; n > maxFuncLines {
			long[f.pkg+"."+funcName(fn)] = n
		}
	}
	return long
}

// funcName is fn's name with its receiver's type: "New", "(*Node).migrate", "Kind.String".
func funcName(fn *ast.FuncDecl) string {
	if fn.Recv == nil || len(fn.Recv.List) == 0 {
		return fn.Name.Name
	}
	typ := fn.Recv.List[0].Type
	star := ""
	if s, ok := typ.(*ast.StarExpr); ok {
		typ, star = s.X, "*"
	}
	switch x := typ.(type) { // a generic receiver: T[K] or T[K, V]
	case *ast.IndexExpr:
		typ = x.X
	case *ast.IndexListExpr:
		typ = x.X
	}
	id, _ := typ.(*ast.Ident)
	if id == nil {
		return fn.Name.Name
	}
	if star != "" {
		return "(*" + id.Name + ")." + fn.Name.Name
	}
	return id.Name + "." + fn.Name.Name
}
