package main

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/urfave/cli/v2"
)

const operatingDoc = "../../docs/operating.md"

// TestOperatingDocListsEveryNodeFlag fails, naming each one, for every flag of `kvmesh node`
// that docs/operating.md does not list as `--name` with its environment variable.
func TestOperatingDocListsEveryNodeFlag(t *testing.T) {
	doc := readOperatingDoc(t)
	flags := nodeCommand().Flags
	if len(flags) == 0 {
		t.Fatal("kvmesh node has no flags")
	}
	for _, f := range flags {
		checkFlagDocumented(t, doc, "kvmesh node", f)
	}
}

// TestOperatingDocListsEveryGlobalFlag does the same for the flags main gives the app itself,
// read from main.go's cli.App literal (main builds the app inline).
func TestOperatingDocListsEveryGlobalFlag(t *testing.T) {
	doc := readOperatingDoc(t)
	names := globalFlagNames(t)
	if len(names) == 0 {
		t.Fatal("found no global flags in main.go's cli.App")
	}
	for _, name := range names {
		if !strings.Contains(doc, "`--"+name+"`") {
			t.Errorf("%s does not document global flag `--%s`", operatingDoc, name)
		}
		if e := env(name)[0]; !strings.Contains(doc, "`"+e+"`") {
			t.Errorf("%s does not give global flag --%s's variable `%s`", operatingDoc, name, e)
		}
	}
}

// TestOperatingDocFlagTableHasNoStrayFlag fails for a row of the node flag table that names a
// flag neither `kvmesh node` nor the app has, such as one removed from the code.
func TestOperatingDocFlagTableHasNoStrayFlag(t *testing.T) {
	doc := readOperatingDoc(t)
	known := map[string]bool{}
	for _, f := range nodeCommand().Flags {
		for _, n := range f.Names() {
			known[n] = true
		}
	}
	for _, n := range globalFlagNames(t) {
		known[n] = true
	}
	row := regexp.MustCompile("(?m)^\\| `--([a-z0-9-]+)`")
	section := flagSection(t, doc)
	rows := row.FindAllStringSubmatch(section, -1)
	if len(rows) == 0 {
		t.Fatalf("%s: no flag rows in the flags section", operatingDoc)
	}
	for _, m := range rows {
		if !known[m[1]] {
			t.Errorf("%s lists `--%s`, which kvmesh node does not have", operatingDoc, m[1])
		}
	}
}

func checkFlagDocumented(t *testing.T, doc, cmd string, f cli.Flag) {
	t.Helper()
	for _, name := range f.Names() {
		if !strings.Contains(doc, "`--"+name+"`") {
			t.Errorf("%s does not document %s flag `--%s`", operatingDoc, cmd, name)
		}
	}
	if ev, ok := f.(interface{ GetEnvVars() []string }); ok {
		for _, e := range ev.GetEnvVars() {
			if !strings.Contains(doc, "`"+e+"`") {
				t.Errorf("%s does not give %s flag --%s's variable `%s`", operatingDoc, cmd, f.Names()[0], e)
			}
		}
	}
}

func readOperatingDoc(t *testing.T) string {
	t.Helper()
	data, err := os.ReadFile(operatingDoc)
	if err != nil {
		t.Fatal(err)
	}
	return string(data)
}

// flagSection is the part of the doc from the "## Flags" heading to the next "## " heading.
func flagSection(t *testing.T, doc string) string {
	t.Helper()
	i := strings.Index(doc, "\n## Flags")
	if i < 0 {
		t.Fatalf("%s has no \"## Flags\" section", operatingDoc)
	}
	rest := doc[i+1:]
	if j := strings.Index(rest[3:], "\n## "); j >= 0 {
		rest = rest[:j+3]
	}
	return rest
}

// globalFlagNames reads the Name of every flag in the Flags field of the cli.App composite
// literal in main.go.
func globalFlagNames(t *testing.T) []string {
	t.Helper()
	fset := token.NewFileSet()
	file, err := parser.ParseFile(fset, "main.go", nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	apps := 0
	ast.Inspect(file, func(n ast.Node) bool {
		lit, ok := n.(*ast.CompositeLit)
		if !ok || !isSelector(lit.Type, "cli", "App") {
			return true
		}
		apps++
		for _, el := range lit.Elts {
			kv, ok := el.(*ast.KeyValueExpr)
			if !ok || !isIdent(kv.Key, "Flags") {
				continue
			}
			flags, ok := kv.Value.(*ast.CompositeLit)
			if !ok {
				t.Fatalf("main.go: cli.App's Flags is not a literal list")
			}
			for _, fe := range flags.Elts {
				name, ok := flagLiteralName(fe)
				if !ok {
					t.Fatalf("main.go: cannot read a global flag's Name at %s", fset.Position(fe.Pos()))
				}
				names = append(names, name)
			}
		}
		return false
	})
	if apps != 1 {
		t.Fatalf("main.go: want one cli.App literal, found %d", apps)
	}
	return names
}

// flagLiteralName reads Name from &cli.XFlag{Name: "..."}.
func flagLiteralName(e ast.Expr) (string, bool) {
	if u, ok := e.(*ast.UnaryExpr); ok && u.Op == token.AND {
		e = u.X
	}
	lit, ok := e.(*ast.CompositeLit)
	if !ok {
		return "", false
	}
	for _, el := range lit.Elts {
		kv, ok := el.(*ast.KeyValueExpr)
		if !ok || !isIdent(kv.Key, "Name") {
			continue
		}
		bl, ok := kv.Value.(*ast.BasicLit)
		if !ok || bl.Kind != token.STRING {
			return "", false
		}
		s, err := strconv.Unquote(bl.Value)
		return s, err == nil
	}
	return "", false
}

func isIdent(e ast.Expr, name string) bool {
	id, ok := e.(*ast.Ident)
	return ok && id.Name == name
}

func isSelector(e ast.Expr, pkg, name string) bool {
	sel, ok := e.(*ast.SelectorExpr)
	return ok && isIdent(sel.X, pkg) && sel.Sel.Name == name
}

// TestOperatingDocListsEveryTestnetFlag fails for a flag of `kvmesh testnet`, and for the
// bench's testnet flags (--engines, --baseline-scheduling, the disaggregated mode's, --models), that
// docs/operating.md does not list with its environment variable.
func TestOperatingDocListsEveryTestnetFlag(t *testing.T) {
	doc := readOperatingDoc(t)
	for _, f := range testnetCommand().Flags {
		checkFlagDocumented(t, doc, "kvmesh testnet", f)
	}
	for _, f := range benchCommand().Flags {
		if slices.ContainsFunc(f.Names(), func(n string) bool {
			return slices.Contains([]string{"engines", "baseline-scheduling", "disaggregated", "disagg-link-gbps", "pool-plot", "models"}, n)
		}) {
			checkFlagDocumented(t, doc, "kvmesh bench", f)
		}
	}
}
