package deptest

import (
	"os"
	"strings"
	"testing"
)

const (
	module     = "github.com/kvmesh/kvmesh/"
	packageMap = "../../docs/design/packages.md"
)

// rank orders the layers of docs/design/packages.md: a package imports only packages of its
// own rank or lower. The tests layer has none: no package outside it may import it.
var rank = map[string]int{"pure": 0, "types": 1, "edge": 2, "parts": 3, "wiring": 4, "harness": 5, "entry": 6, "tests": -1}

// TestPackageMap fails for a package of the module that has no row in docs/design/packages.md,
// a row that names no package or an unknown layer, and a non-test import that goes up a layer
// or into the tests layer.
func TestPackageMap(t *testing.T) {
	layers := readPackageMap(t)
	imports := moduleImports(t)
	for pkg := range imports {
		if _, ok := layers[pkg]; !ok {
			t.Errorf("%s has no row: package %s is not in the map", packageMap, pkg)
		}
	}
	for pkg, layer := range layers {
		if _, ok := imports[pkg]; !ok {
			t.Errorf("%s has a row for %s, which is not a package of the module", packageMap, pkg)
		}
		if _, ok := rank[layer]; !ok {
			t.Errorf("%s puts %s in layer %q, which is not one of its layers", packageMap, pkg, layer)
		}
	}
	for pkg, deps := range imports {
		from, ok := layers[pkg]
		if !ok {
			continue
		}
		for _, dep := range deps {
			to := layers[dep]
			if to == "tests" && from != "tests" || rank[to] > rank[from] {
				t.Errorf("%s (%s) imports %s (%s): a package imports only its own layer or below", pkg, from, dep, to)
			}
		}
	}
}

// readPackageMap returns the layer of each package the map's table has a row for.
func readPackageMap(t *testing.T) map[string]string {
	t.Helper()
	doc, err := os.ReadFile(packageMap)
	if err != nil {
		t.Fatal(err)
	}
	layers := map[string]string{}
	for line := range strings.Lines(string(doc)) {
		if !strings.HasPrefix(line, "| `") {
			continue
		}
		cells := strings.Split(line, " | ")
		if len(cells) < 2 {
			t.Errorf("%s: row %q has no layer", packageMap, strings.TrimSpace(line))
			continue
		}
		pkg := strings.Trim(strings.TrimPrefix(cells[0], "| "), "`")
		if _, dup := layers[pkg]; dup {
			t.Errorf("%s has two rows for %s", packageMap, pkg)
		}
		layers[pkg] = cells[1]
	}
	if len(layers) == 0 {
		t.Fatalf("%s has no package rows", packageMap)
	}
	return layers
}

// moduleImports returns each package of the module (its path under the module) with the
// packages of the module its non-test files import.
func moduleImports(t *testing.T) map[string][]string {
	t.Helper()
	out := goList(t, "-f", `{{.ImportPath}}{{range .Imports}} {{.}}{{end}}`, "../../...")
	imports := map[string][]string{}
	for line := range strings.Lines(out) {
		fields := strings.Fields(line)
		pkg := strings.TrimPrefix(fields[0], module)
		imports[pkg] = nil
		for _, dep := range fields[1:] {
			if dep, ok := strings.CutPrefix(dep, module); ok {
				imports[pkg] = append(imports[pkg], dep)
			}
		}
	}
	if len(imports) < 2 {
		t.Fatalf("go list found only %v", imports)
	}
	return imports
}
