package nodeconfig

import (
	"os"
	"reflect"
	"strings"
	"testing"

	"github.com/kvmesh/kvmesh/admit"
	"github.com/kvmesh/kvmesh/internal/jsonconf"
)

// operatingDoc is the operator's guide, which names every key outside advanced.
const operatingDoc = "../../docs/operating.md"

// maxOperatorKeys bounds the config file's keys outside the advanced objects (as fileKeys
// counts them): the settings an operator tunes, each documented in docs/operating.md.
const maxOperatorKeys = 90

// TestOperatorKeysAreFewAndDocumented counts the config file's keys outside the advanced
// objects (at most maxOperatorKeys) and fails for each that docs/operating.md does not name
// (an admission key as its table does, without "admission."; a map by its entries' keys,
// `models.M.context_tokens`).
func TestOperatorKeysAreFewAndDocumented(t *testing.T) {
	keys := fileKeys(reflect.TypeFor[fileLayout[admit.Config]](), "")
	var operator []string
	for _, k := range keys {
		if !strings.Contains(k, "."+jsonconf.AdvancedKey+".") {
			operator = append(operator, k)
		}
	}
	t.Logf("%d keys, %d outside advanced", len(keys), len(operator))
	if len(operator) > maxOperatorKeys {
		t.Errorf("%d keys outside advanced, want at most %d: move internals under advanced", len(operator), maxOperatorKeys)
	}
	if len(operator) == len(keys) {
		t.Fatal("no advanced key found: the walk does not see the tag")
	}
	data, err := os.ReadFile(operatingDoc)
	if err != nil {
		t.Fatal(err)
	}
	doc := string(data)
	for _, k := range operator {
		k = strings.TrimPrefix(k, "admission.")
		if !strings.Contains(doc, "`"+k+"`") && !strings.Contains(doc, "`"+k+".") {
			t.Errorf("%s does not name config key `%s`", operatingDoc, k)
		}
	}
}
