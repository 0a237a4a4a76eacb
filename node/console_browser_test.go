package node_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	cdplog "github.com/chromedp/cdproto/log"
	"github.com/chromedp/cdproto/runtime"
	"github.com/chromedp/chromedp"
	"github.com/chromedp/chromedp/kb"

	"github.com/kvmesh/kvmesh/node"
)

// browser is the Chromium the browser test drives: $KVMESH_BROWSER, else the first of the
// usual names on PATH; "" when none is found.
func browser() string {
	if p := os.Getenv("KVMESH_BROWSER"); p != "" {
		return p
	}
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome", "google-chrome-stable"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	return ""
}

// pageErrors collects what the page reports as errors: console.error calls, uncaught
// exceptions and the browser's own error entries (a failed load, a refused script).
type pageErrors struct {
	mu   sync.Mutex
	errs []string
}

func (p *pageErrors) listen(t *testing.T, ctx context.Context) {
	err := chromedp.Listen(ctx, func(ev any) {
		var msg string
		switch e := ev.(type) {
		case *runtime.EventConsoleAPICalled:
			if e.Type == runtime.ConsoleAPICalledTypeError || e.Type == runtime.ConsoleAPICalledTypeAssert {
				for _, a := range e.Args {
					msg += string(a.Value) + " " + a.Description
				}
			}
		case *runtime.EventExceptionThrown:
			msg = e.ExceptionDetails.Text
			if e.ExceptionDetails.Exception != nil {
				msg += " " + e.ExceptionDetails.Exception.Description
			}
		case *cdplog.EventEntryAdded:
			if e.Entry.Level == cdplog.EntryLevelError {
				msg = string(e.Entry.Source) + ": " + e.Entry.Text + " " + e.Entry.URL
			}
		}
		if msg != "" {
			p.mu.Lock()
			p.errs = append(p.errs, msg)
			p.mu.Unlock()
		}
	})
	if err != nil {
		t.Fatalf("listen to the page: %v", err)
	}
}

func (p *pageErrors) get() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.errs...)
}

// TestConsoleInABrowser opens the console of a three-node mesh in headless Chromium: it shows
// the three nodes, its admission counters and forward matrix move with traffic, a request's
// explanation and a node's detail open with the keyboard, and the page logs no error. With
// KVMESH_SCREENSHOT set, it saves a screenshot of the page there (docs/console.png).
func TestConsoleInABrowser(t *testing.T) {
	exe := browser()
	if exe == "" && os.Getenv("KVMESH_REQUIRE_BROWSER") != "" {
		t.Fatal("KVMESH_REQUIRE_BROWSER is set and no Chromium was found (chromium, chromium-browser, google-chrome, or $KVMESH_BROWSER)")
	}
	if exe == "" {
		t.Skip("no Chromium found (chromium, chromium-browser, google-chrome, or $KVMESH_BROWSER): install Debian's chromium package, as .ci/run does, to run the console's browser test")
	}
	tn := startNet(t, 3, func(i int, cfg *node.Config) {
		if i == 0 {
			// An ingress for the default model that routes it itself (no delegate), so its
			// own admission decides and every request is a forward.
			cfg.Models = []string{"another-model"}
			off := false
			cfg.Route.Delegate = &off
		}
	})
	url := tn.URLs()[0]
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(exe), chromedp.WindowSize(1280, 1400))
	if os.Geteuid() == 0 {
		opts = append(opts, chromedp.NoSandbox) // Chromium's sandbox refuses to run as root
	}
	actx, cancelAlloc := chromedp.NewExecAllocator(ctx, opts...)
	defer cancelAlloc()
	bctx, cancelBrowser := chromedp.NewContext(actx, chromedp.WithLogf(t.Logf))
	defer cancelBrowser()
	var pe pageErrors
	pe.listen(t, bctx)
	run := func(what string, actions ...chromedp.Action[chromedp.Void]) {
		t.Helper()
		if err := chromedp.Do(bctx, actions...); err != nil {
			t.Fatalf("%s: %v (page errors: %q)", what, err, pe.get())
		}
	}
	eval := func(js string) string {
		t.Helper()
		v, err := chromedp.Run(bctx, chromedp.Evaluate[string](js))
		if err != nil {
			t.Fatalf("%s: %v (page errors: %q)", js, err, pe.get())
		}
		return v
	}
	// until polls the page's js (a string expression) until it is true of its value.
	until := func(js, what string, ok func(string) bool) string {
		t.Helper()
		deadline := time.Now().Add(20 * time.Second)
		for {
			v := eval(js)
			if ok(v) {
				return v
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: %s is %q", what, js, v)
			}
			run("wait", chromedp.Sleep(100*time.Millisecond))
		}
	}
	run("open the console", chromedp.Navigate(url+"/console"))
	until(`(document.querySelector("#nodes-count")||{}).textContent||""`, "three nodes", func(v string) bool { return v == "(3 nodes)" })

	const total = `(document.querySelector("#adm-accept span[data-total]")||{dataset:{}}).dataset.total||"-1"`
	before, _ := strconv.Atoi(until(total, "the accepted counter", func(v string) bool { return v != "-1" }))
	flowsBefore := eval(`document.querySelector("#flows tbody").textContent`)
	for i := range 6 {
		resp := post(t, url, "/v1/chat/completions", chatBody(fmt.Sprintf("console traffic %d", i), 4, false), nil)
		if b := readAll(t, resp); resp.StatusCode != 200 {
			t.Fatalf("chat: %d %s", resp.StatusCode, b)
		}
	}
	until(total, "the accepted counter after 6 requests", func(v string) bool { n, _ := strconv.Atoi(v); return n >= before+6 })
	flows := until(`document.querySelector("#flows tbody").textContent`, "the forward matrix", func(v string) bool {
		return v != flowsBefore && (strings.Contains(v, tn.Nodes[1].Name()) || strings.Contains(v, tn.Nodes[2].Name()))
	})
	t.Logf("forward matrix: %s", flows)

	// The keyboard reaches everything: Tab from the id field passes the Explain button to the
	// first recent request, Enter explains it.
	const active = `(document.activeElement.id || document.activeElement.tagName) + " " + (document.activeElement.closest("#recent") ? "recent" : document.activeElement.className)`
	run("focus the request id field", chromedp.Focus(chromedp.CSS(`#explain-id`)), chromedp.KeyEvent(kb.Tab+kb.Tab))
	if v := eval(active); !strings.HasSuffix(v, " recent") {
		t.Fatalf("two Tabs from the request id field focus %q, not a recent request", v)
	}
	run("open an explanation", chromedp.KeyEvent(kb.Enter), chromedp.WaitVisible(chromedp.CSS(`#explain-table`)))
	expl := eval(`document.querySelector("#explain-result").textContent`)
	if !strings.Contains(expl, "accept") || !strings.Contains(expl, "(chosen)") {
		t.Fatalf("explanation %q lacks the verdict or the chosen candidate", expl)
	}
	t.Logf("explained: %.200s", expl)
	// The simulated engines predict fractions of a millisecond; none may read as zero.
	lat := eval(`[...document.querySelectorAll("#explain-table tbody tr")].map((r) => r.cells[9].textContent + " / " + r.cells[10].textContent).join("; ")`)
	if strings.Contains(lat, "0.00 ms") || strings.Contains(lat, " 0 ms") || strings.HasPrefix(lat, "0 ms") {
		t.Fatalf("predicted TTFT / TPOT of the candidates read as zero: %s", lat)
	}
	t.Logf("predicted TTFT / TPOT: %s", lat)
	// Tab from the sort control lands on the first node's row; Enter opens its detail and
	// moves focus to the detail's heading.
	run("focus the sort control", chromedp.Focus(chromedp.CSS(`#sort`)), chromedp.KeyEvent(kb.Tab))
	if v := eval(active); v != "TR peer" {
		t.Fatalf("Tab from the sort control focuses %q, not a node's row", v)
	}
	run("open a node's detail", chromedp.KeyEvent(kb.Enter))
	until(`document.querySelector("#detail").hidden ? "hidden" : document.querySelector("#detail-h").textContent`, "the node's detail", func(v string) bool { return strings.HasPrefix(v, "Node ") })
	if v := eval(active); v != "detail-h " {
		t.Fatalf("the open detail leaves focus on %q, not its heading", v)
	}
	if path := os.Getenv("KVMESH_SCREENSHOT"); path != "" {
		png, err := chromedp.Run(bctx, chromedp.FullScreenshot(100))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, png, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	run("close the detail", chromedp.KeyEvent(kb.Escape))
	until(`document.querySelector("#detail").hidden ? "hidden " + document.activeElement.tagName : "shown"`, "Escape closes the detail", func(v string) bool { return v == "hidden TR" })
	if errs := pe.get(); len(errs) > 0 {
		t.Fatalf("the page logged errors: %q", errs)
	}
}
