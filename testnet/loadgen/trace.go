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
	// HashIDs are the Mooncake prefix block ids, one per 512-token block (nil for Azure).
	HashIDs []int64
}

// maxTraceTokens bounds a record's lengths: no model's context comes near it, and a longer
// prompt would be more than 64 MB of text to build and send.
const maxTraceTokens = 1 << 24

// maxTraceLine bounds one trace line; a Mooncake line of a 128k-token prompt is ~2 KB.
const maxTraceLine = 1 << 20

// utf8BOM starts files saved by some Windows tools; it is not part of the first line.
const utf8BOM = "\ufeff"

// ReadTraceFile reads a Mooncake JSONL or Azure CSV trace, telling them apart by the first
// non-blank byte ('{' is Mooncake).
func ReadTraceFile(path string) ([]TraceRecord, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("loadgen: trace: %w", err)
	}
	defer f.Close()
	br := bufio.NewReader(f)
	if b, _ := br.Peek(len(utf8BOM)); string(b) == utf8BOM {
		_, _ = br.Discard(len(utf8BOM))
	}
	for {
		b, err := br.Peek(1)
		if err != nil {
			return nil, fmt.Errorf("%w: %s: empty file", ErrTrace, path)
		}
		if c := b[0]; c == ' ' || c == '\t' || c == '\r' || c == '\n' {
			_, _ = br.ReadByte()
			continue
		}
		if b[0] == '{' {
			return ReadMooncake(br)
		}
		return ReadAzure(br)
	}
}

// ReadMooncake parses a Mooncake JSONL trace: one object a line with timestamp (ms),
// input_length, output_length and hash_ids. Blank lines are allowed; any other malformed line
// is an error naming its line. Records are returned sorted by arrival, relative to the first.
func ReadMooncake(r io.Reader) ([]TraceRecord, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), maxTraceLine)
	var recs []TraceRecord
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
			return nil, fmt.Errorf("%w: line %d: %w", ErrTrace, line, err)
		}
		switch {
		case v.Timestamp == nil || v.InputLength == nil || v.OutputLength == nil:
			return nil, fmt.Errorf("%w: line %d: missing timestamp, input_length or output_length", ErrTrace, line)
		case *v.Timestamp < 0 || math.IsNaN(*v.Timestamp) || *v.Timestamp > 1e12:
			return nil, fmt.Errorf("%w: line %d: timestamp %v out of range", ErrTrace, line, *v.Timestamp)
		case *v.InputLength < 0 || *v.OutputLength < 0 || *v.InputLength > maxTraceTokens || *v.OutputLength > maxTraceTokens:
			return nil, fmt.Errorf("%w: line %d: input_length %d and output_length %d must be in [0, %d]",
				ErrTrace, line, *v.InputLength, *v.OutputLength, maxTraceTokens)
		case len(v.HashIDs) > (int(*v.InputLength)+MooncakeBlockTokens-1)/MooncakeBlockTokens:
			return nil, fmt.Errorf("%w: line %d: %d hash_ids for %d tokens", ErrTrace, line, len(v.HashIDs), *v.InputLength)
		}
		var ids []int64
		if v.HashIDs != nil {
			ids = make([]int64, len(v.HashIDs))
			for i, id := range v.HashIDs {
				ids[i] = int64(id)
			}
		}
		recs = append(recs, TraceRecord{
			At:           time.Duration(*v.Timestamp * float64(time.Millisecond)),
			InputTokens:  int(*v.InputLength),
			OutputTokens: int(*v.OutputLength),
			HashIDs:      ids,
		})
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("%w: line %d: %w", ErrTrace, line+1, err)
	}
	return byArrival(recs), nil
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

// azureLayouts are the TIMESTAMP formats of the public Azure LLM inference traces
// ("2023-11-16 18:15:46.6805900") and their ISO variants.
var azureLayouts = []string{
	"2006-01-02 15:04:05.999999999",
	"2006-01-02 15:04:05.999999999Z07:00",
	"2006-01-02 15:04:05.999999999 -07:00",
	"2006-01-02T15:04:05.999999999",
	time.RFC3339Nano,
}

// parseAzureTime returns a timestamp as an offset from an arbitrary origin: plain seconds
// (fractions allowed) are taken as-is, datetimes as time since the Unix epoch.
func parseAzureTime(s string) (time.Duration, error) {
	if f, err := strconv.ParseFloat(s, 64); err == nil {
		if f < 0 || math.IsNaN(f) || f > 1e10 {
			return 0, fmt.Errorf("timestamp %q out of range", s)
		}
		return time.Duration(f * float64(time.Second)), nil
	}
	for _, l := range azureLayouts {
		if t, err := time.Parse(l, s); err == nil {
			return time.Duration(t.UnixNano()), nil
		}
	}
	return 0, fmt.Errorf("timestamp %q is neither seconds nor a datetime", s)
}

// ReadAzure parses an Azure LLM inference trace CSV: TIMESTAMP,ContextTokens,GeneratedTokens.
// A header line (names in any order and case) is optional; without one the columns are in that
// order. Timestamps are datetimes or plain seconds; arrivals are relative to the earliest.
// Malformed lines are errors naming their line. Records are returned sorted by arrival.
func ReadAzure(r io.Reader) ([]TraceRecord, error) {
	cr := csv.NewReader(r)
	cr.FieldsPerRecord = -1
	cr.TrimLeadingSpace = true
	cr.ReuseRecord = true
	col := [3]int{0, 1, 2} // timestamp, context, generated
	var recs []TraceRecord
	first := true
	for {
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
			return nil, fmt.Errorf("%w: line %d: %w", ErrTrace, line, err)
		}
		line, _ := cr.FieldPos(0) // FieldPos is valid only after a successful Read
		if first {
			first = false
			row[0] = strings.TrimPrefix(row[0], utf8BOM)
			if isAzureHeader(row, &col) {
				continue
			}
		}
		if len(row) <= slices.Max(col[:]) {
			return nil, fmt.Errorf("%w: line %d: %d fields, want TIMESTAMP,ContextTokens,GeneratedTokens", ErrTrace, line, len(row))
		}
		at, err := parseAzureTime(strings.TrimSpace(row[col[0]]))
		if err != nil {
			return nil, fmt.Errorf("%w: line %d: %w", ErrTrace, line, err)
		}
		in, err1 := parseTraceInt(strings.TrimSpace(row[col[1]]))
		out, err2 := parseTraceInt(strings.TrimSpace(row[col[2]]))
		if err1 != nil || err2 != nil || in < 0 || out < 0 || in > maxTraceTokens || out > maxTraceTokens {
			return nil, fmt.Errorf("%w: line %d: ContextTokens and GeneratedTokens must be integers in [0, %d], got %q, %q",
				ErrTrace, line, maxTraceTokens, row[col[1]], row[col[2]])
		}
		recs = append(recs, TraceRecord{At: at, InputTokens: int(in), OutputTokens: int(out)})
	}
	return byArrival(recs), nil
}

// isAzureHeader reports whether row is a header and, if so, maps the column positions.
func isAzureHeader(row []string, col *[3]int) bool {
	idx := map[string]int{}
	for i, f := range row {
		idx[strings.ToLower(strings.TrimSpace(f))] = i
	}
	ts, ok1 := idx["timestamp"]
	in, ok2 := idx["contexttokens"]
	out, ok3 := idx["generatedtokens"]
	if !ok1 || !ok2 || !ok3 {
		return false
	}
	*col = [3]int{ts, in, out}
	return true
}
