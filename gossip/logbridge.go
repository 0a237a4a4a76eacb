package gossip

import (
	"context"
	"log/slog"
	"strings"
	"sync/atomic"
	"time"

	"golang.org/x/time/rate"
)

// logWriter routes memberlist's log lines into slog, one record a line, under the attribute
// component=memberlist. memberlist writes "2026/12/04 16:11:36 [WARN] memberlist: text" through
// a standard library logger; the record is "text" at the line's level (memberlistLine), with
// the time slog gives every record.
//
// Warnings and errors pass at most logBurst at once, then one a second: anyone who can reach
// the gossip port makes one with each packet the key does not open, and must not flood the
// node's log. The next line let through counts the ones held back.
type logWriter struct {
	l       *slog.Logger
	limit   *rate.Limiter
	now     func() time.Time
	dropped atomic.Int64
}

const logBurst = 10

// newLogWriter writes to l with component=memberlist; l should carry no component of its own.
func newLogWriter(l *slog.Logger) *logWriter {
	return &logWriter{l: l.With("component", "memberlist"), limit: rate.NewLimiter(1, logBurst), now: time.Now}
}

func (w *logWriter) Write(p []byte) (int, error) {
	for _, line := range strings.Split(strings.TrimRight(string(p), "\n"), "\n") {
		if line = strings.TrimSpace(line); line != "" {
			w.log(memberlistLine(line))
		}
	}
	return len(p), nil
}

func (w *logWriter) log(level slog.Level, msg string) {
	if level >= slog.LevelWarn {
		if !w.limit.AllowN(w.now(), 1) {
			w.dropped.Add(1)
			return
		}
		if n := w.dropped.Swap(0); n > 0 {
			w.l.Log(context.Background(), level, msg, "held_back", n)
			return
		}
	}
	w.l.Log(context.Background(), level, msg)
}

// memberlistLevels maps memberlist's level tags to slog's.
var memberlistLevels = map[string]slog.Level{
	"DEBUG": slog.LevelDebug, "TRACE": slog.LevelDebug,
	"INFO": slog.LevelInfo,
	"WARN": slog.LevelWarn, "WARNING": slog.LevelWarn,
	"ERR": slog.LevelError, "ERROR": slog.LevelError,
}

// routineLines are memberlist warnings and errors that report the protocol at work, not a
// fault, with the level they are logged at instead. A refute answers a peer that suspected
// or declared this node dead (a slow probe, a restart under the same name): memberlist
// corrects it, and the peer's own suspicion is what an operator would look into. Errors on a
// closed connection are memberlist's probes racing its own shutdown.
var routineLines = []struct {
	contains string
	level    slog.Level
}{
	{"Refuting a suspect message", slog.LevelInfo},
	{"Refuting a dead message", slog.LevelInfo},
	{"use of closed network connection", slog.LevelDebug},
}

// memberlistLine parses one of memberlist's log lines into its level and its text, without
// the logger's timestamp, the level tag and the "memberlist: " prefix. A line without a
// known tag is kept whole at INFO.
func memberlistLine(line string) (slog.Level, string) {
	level, msg := slog.LevelInfo, line
	if open := strings.IndexByte(line, '['); open >= 0 {
		if end := strings.IndexByte(line[open:], ']'); end > 0 {
			if l, ok := memberlistLevels[line[open+1:open+end]]; ok {
				level, msg = l, strings.TrimSpace(line[open+end+1:])
			}
		}
	}
	msg = strings.TrimPrefix(msg, "memberlist: ")
	for _, r := range routineLines {
		if strings.Contains(msg, r.contains) {
			level = min(level, r.level)
		}
	}
	return level, msg
}
