package loadgen

import (
	"bufio"
	"bytes"
	"cmp"
	"encoding/csv"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"
)

// TraceRecord is one request of a trace.
type TraceRecord struct {
	// At is the arrival time relative to the trace's first request.
	At time.Duration
	// InputTokens and OutputTokens are at most 1<<24 each. A record of 0 is replayed as 1 (a
	// 1-token prompt, max_tokens 1), so the trace's arrivals stay as they were.
	InputTokens  int
	OutputTokens int
	// HashIDs are the Mooncake prefix block ids, one per 512-token block (nil for CSV traces).
	HashIDs []int64
}

// maxTraceTokens bounds a record's lengths: no model's context comes near it, and a longer
// prompt would be more than 64 MB of text to build and send.
const maxTraceTokens = 1 << 24

// maxTraceLine bounds one trace line; a Mooncake line of a 128k-token prompt is ~2 KB.
const maxTraceLine = 1 << 20

// utf8BOM starts files saved by some Windows tools; it is not part of the first line.
const utf8BOM = "\ufeff"

// ReadTraceFile reads a trace file: Mooncake JSONL when its first non-blank byte is '{', else a
// CSV that ReadCSV reads. A file without a request is an error.
func ReadTraceFile(path string) ([]TraceRecord, error) {
	recs, _, err := readTraceFile(path, 0)
	return recs, err
}

// readTraceFile is ReadTraceFile keeping only the records within window of the first (0: all);
// cut tells whether it left any out.
func readTraceFile(path string, window time.Duration) (recs []TraceRecord, cut bool, err error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, false, fmt.Errorf("loadgen: trace: %w", err)
	}
	defer f.Close()
	br := bufio.NewReaderSize(f, 64<<10)
	if b, _ := br.Peek(len(utf8BOM)); string(b) == utf8BOM {
		_, _ = br.Discard(len(utf8BOM))
	}
	// Peek, not read, past leading blank lines, so errors name lines as the file numbers them.
	head, _ := br.Peek(br.Size())
	b := bytes.TrimLeft(head, " \t\r\n")
	read := readCSV
	if len(b) > 0 && b[0] == '{' {
		read = readMooncake
	}
	s := traceSink{window: window}
	if len(b) > 0 || len(head) == br.Size() {
		if err := read(br, &s); err != nil {
			return nil, false, err
		}
	}
	recs = s.sorted()
	if len(recs) == 0 {
		return nil, false, fmt.Errorf("%w: %s has no requests", ErrTrace, path)
	}
	return recs, s.cut, nil
}

// traceSink collects a trace's records. With a window it holds only those within it of the
// earliest so far (one past it stays past as the earliest moves back), so that a minute's replay
// of a week-long trace of millions of requests costs a minute of them.
type traceSink struct {
	window time.Duration // 0: no window
	min    time.Duration // the earliest arrival, once recs is not empty
	recs   []TraceRecord
	cut    bool // a record past the window was left out
}

func (s *traceSink) add(r TraceRecord) {
	if len(s.recs) == 0 || r.At < s.min {
		s.min = r.At
	}
	if s.window > 0 && r.At-s.min > s.window {
		s.cut = true
		return
	}
	s.recs = append(s.recs, r)
}

// sorted returns the records by arrival, relative to the earliest, within the window.
func (s *traceSink) sorted() []TraceRecord {
	recs := byArrival(s.recs)
	if s.window > 0 {
		if i := slices.IndexFunc(recs, func(r TraceRecord) bool { return r.At > s.window }); i >= 0 {
			recs, s.cut = recs[:i], true
		}
	}
	return recs
}

// readAll reads a whole trace with read.
func readAll(r io.Reader, read func(io.Reader, *traceSink) error) ([]TraceRecord, error) {
	var s traceSink
	if err := read(r, &s); err != nil {
		return nil, err
	}
	return s.sorted(), nil
}

// ReadMooncake parses a Mooncake JSONL trace: one object a line with timestamp (ms),
// input_length, output_length and hash_ids. Blank lines are allowed; any other malformed line
// is an error naming its line. Records are returned sorted by arrival, relative to the first.
func ReadMooncake(r io.Reader) ([]TraceRecord, error) { return readAll(r, readMooncake) }

func readMooncake(r io.Reader, s *traceSink) error {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), maxTraceLine)
	line := 0
	for sc.Scan() {
		line++
		b := sc.Bytes()
		if line == 1 {
			b = bytes.TrimPrefix(b, []byte(utf8BOM))
		}
		b = bytes.TrimSpace(b)
		if len(b) == 0 {
			continue
		}
		var v struct {
			Timestamp    *float64   `json:"timestamp"`
			InputLength  *traceInt  `json:"input_length"`
			OutputLength *traceInt  `json:"output_length"`
			HashIDs      []traceInt `json:"hash_ids"`
		}
		if err := json.Unmarshal(b, &v); err != nil {
			return fmt.Errorf("%w: line %d: %w", ErrTrace, line, err)
		}
		switch {
		case v.Timestamp == nil || v.InputLength == nil || v.OutputLength == nil:
			return fmt.Errorf("%w: line %d: missing timestamp, input_length or output_length", ErrTrace, line)
		case *v.Timestamp < 0 || math.IsNaN(*v.Timestamp) || *v.Timestamp > 1e12:
			return fmt.Errorf("%w: line %d: timestamp %v out of range", ErrTrace, line, *v.Timestamp)
		case *v.InputLength < 0 || *v.OutputLength < 0 || *v.InputLength > maxTraceTokens || *v.OutputLength > maxTraceTokens:
			return fmt.Errorf("%w: line %d: input_length %d and output_length %d must be in [0, %d]",
				ErrTrace, line, *v.InputLength, *v.OutputLength, maxTraceTokens)
		case len(v.HashIDs) > (int(*v.InputLength)+MooncakeBlockTokens-1)/MooncakeBlockTokens:
			return fmt.Errorf("%w: line %d: %d hash_ids for %d tokens, more than one a %d-token block",
				ErrTrace, line, len(v.HashIDs), *v.InputLength, MooncakeBlockTokens)
		}
		var ids []int64
		if v.HashIDs != nil {
			ids = make([]int64, len(v.HashIDs))
			for i, id := range v.HashIDs {
				ids[i] = int64(id)
			}
		}
		s.add(TraceRecord{
			At:           time.Duration(*v.Timestamp * float64(time.Millisecond)),
			InputTokens:  int(*v.InputLength),
			OutputTokens: int(*v.OutputLength),
			HashIDs:      ids,
		})
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("%w: line %d: %w", ErrTrace, line+1, err)
	}
	return nil
}

// traceInt is a JSON integer that may be written as an integral float ("6758.0"), as tools that
// pass a trace through floating point (pandas) write it.
type traceInt int64

func (n *traceInt) UnmarshalJSON(b []byte) error {
	i, err := parseTraceInt(string(b))
	*n = traceInt(i)
	return err
}

// parseTraceInt parses an integer, also written as an integral float.
func parseTraceInt(s string) (int64, error) {
	if i, err := strconv.ParseInt(s, 10, 64); err == nil {
		return i, nil
	}
	f, err := strconv.ParseFloat(s, 64)
	if err != nil || f != math.Trunc(f) || math.Abs(f) > 1<<53 {
		return 0, fmt.Errorf("%q is not an integer", s)
	}
	return int64(f), nil
}

// byArrival sorts recs by arrival, equal arrivals in file order, and makes arrivals relative to
// the earliest: a trace cut from a longer one starts with its first request, not after the
// time before it.
func byArrival(recs []TraceRecord) []TraceRecord {
	slices.SortStableFunc(recs, func(a, b TraceRecord) int { return cmp.Compare(a.At, b.At) })
	if len(recs) > 0 {
		t0 := recs[0].At
		for i := range recs {
			recs[i].At -= t0
		}
	}
	return recs
}

// csvFormat is a trace CSV layout, known by its header: the names of its timestamp, prompt and
// output columns (in any case and order; other columns are ignored).
type csvFormat struct {
	name, ts, in, out string
}

// csvFormats are the published trace CSVs. The first is also the column order of a file
// without a header.
var csvFormats = []csvFormat{
	{"Azure LLM inference", "TIMESTAMP", "ContextTokens", "GeneratedTokens"},
	{"BurstGPT", "Timestamp", "Request tokens", "Response tokens"},
}

// knownTraces names the formats for a file that is none of them.
const knownTraces = "want a Mooncake JSONL trace or a CSV with an Azure LLM inference header " +
	"(TIMESTAMP,ContextTokens,GeneratedTokens) or a BurstGPT one " +
	"(Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type)"

// azureLayouts are the TIMESTAMP formats of the public Azure LLM inference traces: 2023's
// "2023-11-16 18:15:46.6805900", 2024's "2024-05-12 00:00:00.001163+00:00" (and
// "2024-05-12 00:00:00+00:00" on a whole second), and ISO variants.
var azureLayouts = []string{
	"2006-01-02 15:04:05.999999999",
	"2006-01-02 15:04:05.999999999Z07:00",
	"2006-01-02 15:04:05.999999999 -07:00",
	"2006-01-02T15:04:05.999999999",
	time.RFC3339Nano,
}

// timeParser parses CSV timestamps: plain seconds (BurstGPT's, fractions allowed) as an
// offset, datetimes as time since the Unix epoch. Both are bounded so that any two differ by
// less than time.Duration's 292 years.
type timeParser struct {
	layout int // the layout that parsed the last datetime, tried first: a file keeps one
}

func (p *timeParser) parse(s string) (time.Duration, error) {
	if f, err := strconv.ParseFloat(s, 64); err == nil {
		if !(f >= 0 && f <= 4e9) {
			return 0, fmt.Errorf("timestamp %q out of range", s)
		}
		return time.Duration(f * float64(time.Second)), nil
	}
	for i := range azureLayouts {
		l := (p.layout + i) % len(azureLayouts)
		t, err := time.Parse(azureLayouts[l], s)
		if err != nil {
			continue
		}
		if y := t.Year(); y < 1970 || y >= 2200 {
			return 0, fmt.Errorf("timestamp %q out of range", s)
		}
		p.layout = l
		return time.Duration(t.UnixNano()), nil
	}
	return 0, fmt.Errorf("timestamp %q is neither seconds nor a datetime", s)
}

// ReadCSV parses a trace CSV: an Azure LLM inference trace (2023 or 2024,
// TIMESTAMP,ContextTokens,GeneratedTokens; without a header the columns are in that order) or
// BurstGPT (Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type, timestamps in
// seconds), told apart by the header. A malformed line is an error naming its line, and the
// first line names the formats when it is none of them. Records are returned sorted by arrival,
// relative to the first.
func ReadCSV(r io.Reader) ([]TraceRecord, error) { return readAll(r, readCSV) }

func readCSV(r io.Reader, s *traceSink) error {
	cr := csv.NewReader(r)
	cr.FieldsPerRecord = -1
	cr.TrimLeadingSpace = true
	cr.ReuseRecord = true
	format, col := csvFormats[0], [3]int{0, 1, 2} // timestamp, prompt, output
	var times timeParser
	for first := true; ; first = false {
		row, err := cr.Read()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			line := 0
			var pe *csv.ParseError
			if errors.As(err, &pe) {
				line = pe.StartLine
			}
			if first {
				return fmt.Errorf("%w: line %d: %w; %s", ErrTrace, line, err, knownTraces)
			}
			return fmt.Errorf("%w: line %d: %w", ErrTrace, line, err)
		}
		line, _ := cr.FieldPos(0) // FieldPos is valid only after a successful Read
		if first {
			row[0] = strings.TrimPrefix(row[0], utf8BOM)
			if f, c, ok := csvHeader(row); ok {
				format, col = f, c
				continue
			}
			if _, err := times.parse(strings.TrimSpace(row[0])); err != nil {
				return fmt.Errorf("%w: line %d: neither a known header nor a record; %s", ErrTrace, line, knownTraces)
			}
		}
		if len(row) <= slices.Max(col[:]) {
			return fmt.Errorf("%w: line %d: %d fields, want %s's %s, %s and %s",
				ErrTrace, line, len(row), format.name, format.ts, format.in, format.out)
		}
		at, err := times.parse(strings.TrimSpace(row[col[0]]))
		if err != nil {
			return fmt.Errorf("%w: line %d: %w", ErrTrace, line, err)
		}
		in, err1 := parseTraceInt(strings.TrimSpace(row[col[1]]))
		out, err2 := parseTraceInt(strings.TrimSpace(row[col[2]]))
		if err1 != nil || err2 != nil || in < 0 || out < 0 || in > maxTraceTokens || out > maxTraceTokens {
			return fmt.Errorf("%w: line %d: %s and %s must be integers in [0, %d], got %q, %q",
				ErrTrace, line, format.in, format.out, maxTraceTokens, row[col[1]], row[col[2]])
		}
		s.add(TraceRecord{At: at, InputTokens: int(in), OutputTokens: int(out)})
	}
	return nil
}

// csvHeader reports whether row is the header of a known format and, if so, where its columns
// are.
func csvHeader(row []string) (csvFormat, [3]int, bool) {
	for _, f := range csvFormats {
		col := [3]int{-1, -1, -1}
		for i, name := range row {
			for j, want := range []string{f.ts, f.in, f.out} {
				if strings.EqualFold(strings.TrimSpace(name), want) {
					col[j] = i
				}
			}
		}
		if !slices.Contains(col[:], -1) {
			return f, col, true
		}
	}
	return csvFormat{}, [3]int{}, false
}
