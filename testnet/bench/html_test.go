package bench

import (
	"bytes"
	"encoding/xml"
	"io"
	"strings"
	"testing"
)

// TestWriteHTML pins the page's content and shape: well-formed, self-contained, every policy,
// every class's attainment and latencies, every refusal reason, the per-class TTFT panels,
// accessible tables and figures, and every string escaped.
func TestWriteHTML(t *testing.T) {
	res := handResult()
	res.Rows[0].Policy = "kvmesh <b>&</b>" // a name that must come out escaped
	var page bytes.Buffer
	if err := res.WriteHTML(&page); err != nil {
		t.Fatal(err)
	}
	html := page.String()
	text := xmlText(t, page.Bytes())
	for _, want := range []string{
		"kvmesh <b>&</b>", "cache-aware", // each policy
		"SLO attainment per priority class", "interactive", "batch", "97.7%", "55.0%", // each class's attainment
		"p99 TTFT of interactive (s)", "p99 TTFT of batch (s)", "SLO attainment of batch (%)", // per-class panels
		"queue_full", "slo<unmeetable>&", // each refusal reason
		"cache hit", "oracle hit", "bound", "Goodput per policy and load", "1.5× capacity",
		"kvmesh / best other", // the terminal table, in full
	} {
		if !strings.Contains(text, want) {
			t.Errorf("page lacks %q", want)
		}
	}
	if strings.Contains(html, "<b>") || strings.Contains(html, "slo<unmeetable>") {
		t.Error("a string reached the page unescaped")
	}
	for _, banned := range []string{"<script", "http://", "https://", "<link", "@import", "url("} {
		if banned == "http://" {
			// The SVG namespace is the one URL allowed: it is a name, never fetched.
			if strings.Count(html, banned) != strings.Count(html, "http://www.w3.org/2000/svg") {
				t.Error("the page refers to an outside resource")
			}
			continue
		}
		if strings.Contains(html, banned) {
			t.Errorf("the page is not self-contained: %q", banned)
		}
	}
	for _, want := range []string{`<html lang="en">`, `<caption class="sr">`, `<th scope="col">`, `<th scope="row">`, "<figcaption>", `role="img"`} {
		if !strings.Contains(html, want) {
			t.Errorf("page lacks %s", want)
		}
	}
	if n := strings.Count(html, "<table>"); n != 5 {
		t.Errorf("%d tables, want 5", n)
	}
}

// xmlText parses b as XML, failing the test on an unbalanced tag or a bad entity, and returns
// its character data joined.
func xmlText(t *testing.T, b []byte) string {
	t.Helper()
	d := xml.NewDecoder(bytes.NewReader(b))
	var sb strings.Builder
	for {
		tok, err := d.Token()
		if err == io.EOF {
			return sb.String()
		}
		if err != nil {
			t.Fatalf("page is not well-formed: %v", err)
		}
		if cd, ok := tok.(xml.CharData); ok {
			sb.Write(cd)
			sb.WriteByte('\n')
		}
	}
}
