package gossip

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
)

// logRecord is one record a logRecorder received, its attributes (the logger's, then the
// record's) as key=value.
type logRecord struct {
	level slog.Level
	msg   string
	attrs []string
}

// logRecorder keeps every record logged through it.
type logRecorder struct {
	mu      *sync.Mutex
	records *[]logRecord
	attrs   []string
}

func newLogRecorder() logRecorder { return logRecorder{mu: &sync.Mutex{}, records: &[]logRecord{}} }

func (r logRecorder) Enabled(context.Context, slog.Level) bool { return true }
func (r logRecorder) Handle(_ context.Context, rec slog.Record) error {
	attrs := slices.Clone(r.attrs)
	rec.Attrs(func(a slog.Attr) bool {
		attrs = append(attrs, fmt.Sprintf("%s=%v", a.Key, a.Value))
		return true
	})
	r.mu.Lock()
	defer r.mu.Unlock()
	*r.records = append(*r.records, logRecord{rec.Level, rec.Message, attrs})
	return nil
}
func (r logRecorder) WithAttrs(as []slog.Attr) slog.Handler {
	attrs := slices.Clone(r.attrs)
	for _, a := range as {
		attrs = append(attrs, fmt.Sprintf("%s=%v", a.Key, a.Value))
	}
	return logRecorder{mu: r.mu, records: r.records, attrs: attrs}
}
func (r logRecorder) WithGroup(string) slog.Handler { return r }

func (r logRecorder) all() []logRecord {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(*r.records)
}

// TestMemberlistLinesBecomeRecords: each of memberlist's lines is one record at its own level,
// its text without the logger's timestamp, the level tag and the "memberlist: " prefix; the
// refutes that answer a peer's suspicion are INFO, and errors about memberlist's own sockets
// closing under it at shutdown DEBUG.
func TestMemberlistLinesBecomeRecords(t *testing.T) {
	for _, tc := range []struct {
		line  string
		level slog.Level
		msg   string
	}{
		{"2026/12/04 16:11:36 [DEBUG] memberlist: Stream connection from=127.0.0.1:4",
			slog.LevelDebug, "Stream connection from=127.0.0.1:4"},
		{"2026/12/04 16:11:36 [INFO] memberlist: Suspect n2 has failed, no acks received",
			slog.LevelInfo, "Suspect n2 has failed, no acks received"},
		{"2026/12/04 16:11:36 [WARN] memberlist: Was able to connect to n2 over TCP but UDP probes failed",
			slog.LevelWarn, "Was able to connect to n2 over TCP but UDP probes failed"},
		{"2026/12/04 16:11:36 [ERR] memberlist: Failed to send gossip to 127.0.0.1:1: write udp: i/o timeout",
			slog.LevelError, "Failed to send gossip to 127.0.0.1:1: write udp: i/o timeout"},
		{"2026/12/04 16:11:36 [ERROR] memberlist: Failed to push local state",
			slog.LevelError, "Failed to push local state"},
		{"2026/12/04 16:11:36 [WARN] memberlist: Refuting a dead message (from: n2)",
			slog.LevelInfo, "Refuting a dead message (from: n2)"},
		{"2026/12/04 16:11:36 [WARN] memberlist: Refuting a suspect message (from: n3)",
			slog.LevelInfo, "Refuting a suspect message (from: n3)"},
		{"2026/12/04 16:11:36 [ERR] memberlist: Failed to send indirect UDP ping: write udp 127.0.0.1:2->127.0.0.1:3: use of closed network connection",
			slog.LevelDebug, "Failed to send indirect UDP ping: write udp 127.0.0.1:2->127.0.0.1:3: use of closed network connection"},
		{"memberlist: a line without a tag [::1]:7946",
			slog.LevelInfo, "a line without a tag [::1]:7946"},
	} {
		t.Run(tc.msg, func(t *testing.T) {
			rec := newLogRecorder()
			w := newLogWriter(slog.New(rec))
			if n, err := w.Write([]byte(tc.line + "\n")); n != len(tc.line)+1 || err != nil {
				t.Fatalf("Write = %d, %v", n, err)
			}
			got := rec.all()
			if len(got) != 1 || got[0].level != tc.level || got[0].msg != tc.msg {
				t.Fatalf("records %+v; want one at %v: %q", got, tc.level, tc.msg)
			}
			if want := []string{"component=memberlist"}; !slices.Equal(got[0].attrs, want) {
				t.Errorf("attributes %q, want %q", got[0].attrs, want)
			}
		})
	}
}

// TestMemberlistLogHasOneComponent: memberlist's records through a member's logger carry
// component=memberlist once, beside the attributes of the logger the member was given.
func TestMemberlistLogHasOneComponent(t *testing.T) {
	rec := newLogRecorder()
	c := testConfig("self")
	c.Logger = slog.New(rec).With("node", "self")
	g, err := New(c)
	if err != nil {
		t.Fatal(err)
	}
	mlc, err := g.memberlistConfig()
	if err != nil {
		t.Fatal(err)
	}
	_, _ = mlc.LogOutput.Write([]byte("2026/12/04 16:11:36 [INFO] memberlist: hello\n"))
	got := rec.all()
	if want := []string{"node=self", "component=memberlist"}; len(got) != 1 || !slices.Equal(got[0].attrs, want) {
		t.Errorf("records %+v; want one with attributes %q", got, want)
	}
}

// TestJoinLogsOneLine: a member that joins its seed logs one INFO line saying so, with the
// seeds it contacted.
func TestJoinLogsOneLine(t *testing.T) {
	seed := startNode(t, testConfig("seed"))
	rec := newLogRecorder()
	c := testConfig("joiner")
	c.Join = []string{seed.LocalAddr()}
	c.Logger = slog.New(rec)
	startNode(t, c)
	var joined []logRecord
	for _, r := range rec.all() {
		if r.level >= slog.LevelInfo && strings.Contains(r.msg, "join") {
			joined = append(joined, r)
		}
	}
	if len(joined) != 1 || joined[0].level != slog.LevelInfo || !slices.Contains(joined[0].attrs, "contacted=1") {
		t.Errorf("join records %+v; want one INFO line with contacted=1", joined)
	}
}
