package loadgen

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"runtime"
	"strings"
	"testing"
	"time"
)

const mooncakeTrace = "/work/shared/traces/mooncake_conversation_trace.jsonl"

func TestReadMooncake(t *testing.T) {
	in := `{"timestamp": 0, "input_length": 1100, "output_length": 20, "hash_ids": [0, 1, 2]}

{"timestamp": 1500, "input_length": 600, "output_length": 0, "hash_ids": [0, 3], "extra": true}
{"timestamp": 700, "input_length": 10, "output_length": 5, "hash_ids": []}
`
	recs, err := ReadMooncake(strings.NewReader(in))
	if err != nil {
		t.Fatal(err)
	}
	want := []TraceRecord{
		{At: 0, InputTokens: 1100, OutputTokens: 20, HashIDs: []int64{0, 1, 2}},
		{At: 700 * time.Millisecond, InputTokens: 10, OutputTokens: 5, HashIDs: []int64{}},
		{At: 1500 * time.Millisecond, InputTokens: 600, OutputTokens: 0, HashIDs: []int64{0, 3}},
	}
	if len(recs) != len(want) {
		t.Fatalf("got %d records, want %d", len(recs), len(want))
	}
	for i := range want {
		g, w := recs[i], want[i]
		if g.At != w.At || g.InputTokens != w.InputTokens || g.OutputTokens != w.OutputTokens || len(g.HashIDs) != len(w.HashIDs) {
			t.Errorf("record %d: got %+v, want %+v", i, g, w)
		}
	}
}

// TestReadMooncakeIntegralFloats pins that lengths and hash ids written as integral floats, as a
// trace passed through pandas has them, read as the integers they are.
func TestReadMooncakeIntegralFloats(t *testing.T) {
	in := `{"timestamp": 0.0, "input_length": 6758.0, "output_length": 5e2, "hash_ids": [0, 1.0, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13]}` + "\n"
	recs, err := ReadMooncake(strings.NewReader(in))
	if err != nil {
		t.Fatal(err)
	}
	if r := recs[0]; r.InputTokens != 6758 || r.OutputTokens != 500 || len(r.HashIDs) != 14 || r.HashIDs[1] != 1 {
		t.Fatalf("got %+v", r)
	}
	for _, bad := range []string{
		`{"timestamp": 0, "input_length": 6758.5, "output_length": 5}`,
		`{"timestamp": 0, "input_length": 10, "output_length": 5, "hash_ids": [0.5]}`,
		`{"timestamp": 0, "input_length": "10", "output_length": 5}`,
	} {
		if _, err := ReadMooncake(strings.NewReader(bad)); !errors.Is(err, ErrTrace) || !strings.Contains(err.Error(), "line 1:") {
			t.Errorf("%s: got %v, want ErrTrace naming line 1", bad, err)
		}
	}
}

// TestReadMooncakeStartsAtFirstRequest pins that arrivals are relative to the earliest request:
// a slice of a longer trace (the arxiv trace's copies start at 1,178,625 ms) starts at once
// instead of after the trace time before it, which a --duration window would not even reach.
func TestReadMooncakeStartsAtFirstRequest(t *testing.T) {
	in := `{"timestamp": 1181678, "input_length": 10, "output_length": 1}
{"timestamp": 1178625, "input_length": 20, "output_length": 1}
{"timestamp": 1178625.5, "input_length": 30, "output_length": 1}
`
	recs, err := ReadMooncake(strings.NewReader(in))
	if err != nil {
		t.Fatal(err)
	}
	want := []time.Duration{0, 500 * time.Microsecond, 3053 * time.Millisecond}
	for i, w := range want {
		if recs[i].At != w {
			t.Errorf("record %d at %v, want %v", i, recs[i].At, w)
		}
	}
}

func TestReadMooncakeMalformed(t *testing.T) {
	good := `{"timestamp": 0, "input_length": 10, "output_length": 5, "hash_ids": [1]}` + "\n"
	for _, c := range []struct {
		name, line string
	}{
		{"not json", `{"timestamp": 0, "input_length": 10,`},
		{"missing input", `{"timestamp": 0, "output_length": 5, "hash_ids": [1]}`},
		{"missing timestamp", `{"input_length": 10, "output_length": 5}`},
		{"negative timestamp", `{"timestamp": -1, "input_length": 10, "output_length": 5}`},
		{"huge input", `{"timestamp": 0, "input_length": 2000000000, "output_length": 5}`},
		{"huge output", `{"timestamp": 0, "input_length": 10, "output_length": 1e9}`},
		{"negative output", `{"timestamp": 0, "input_length": 10, "output_length": -5}`},
		{"wrong type", `{"timestamp": "x", "input_length": 10, "output_length": 5}`},
		{"too many hash ids", `{"timestamp": 0, "input_length": 10, "output_length": 5, "hash_ids": [1, 2]}`},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := ReadMooncake(strings.NewReader(good + good + "\n" + c.line + "\n" + good))
			if !errors.Is(err, ErrTrace) {
				t.Fatalf("got %v, want ErrTrace", err)
			}
			if !strings.Contains(err.Error(), "line 4:") {
				t.Fatalf("error %q does not name line 4", err)
			}
		})
	}
}

// TestTraceZeroLengths pins that a record of no prompt or no output tokens (BurstGPT's failed
// requests, empty prompts) is read and replayed as 1 token, keeping the trace's arrivals, and
// that a length past any model's context is an error rather than gigabytes of prompt.
func TestTraceZeroLengths(t *testing.T) {
	mc, err := ReadMooncake(strings.NewReader(`{"timestamp": 0, "input_length": 0, "output_length": 0, "hash_ids": []}` + "\n" +
		`{"timestamp": 5, "input_length": 16777216, "output_length": 0}`))
	if err != nil {
		t.Fatal(err)
	}
	az, err := ReadCSV(strings.NewReader("TIMESTAMP,ContextTokens,GeneratedTokens\n2024-05-12 00:00:00+00:00,0,0\n"))
	if err != nil {
		t.Fatal(err)
	}
	items := TraceItems(planCfg("", 1, 0, 1), []TraceRecord{mc[0], az[0]})
	for i, it := range items {
		if it.PromptTokens != 1 || it.MaxTokens != 1 || len(it.Messages()[0].Content) != bytesPerToken {
			t.Errorf("item %d: %d prompt tokens, max_tokens %d", i, it.PromptTokens, it.MaxTokens)
		}
	}
}

func TestMooncakeBlocksSharedExactlyWhereHashIDs(t *testing.T) {
	recs := []TraceRecord{
		{InputTokens: 3 * 512, OutputTokens: 1, HashIDs: []int64{7, 8, 9}},
		{InputTokens: 3*512 - 100, OutputTokens: 1, HashIDs: []int64{7, 8, 10}},
		{InputTokens: 2 * 512, OutputTokens: 1, HashIDs: []int64{11, 8}},
	}
	cfg := planCfg("", 1, 0, 1)
	items := TraceItems(cfg, recs)
	p := make([]string, len(items))
	for i, it := range items {
		m := it.Messages()
		if len(m) != 1 {
			t.Fatalf("trace prompt has %d messages", len(m))
		}
		p[i] = m[0].Content
		if len(p[i]) != recs[i].InputTokens*bytesPerToken {
			t.Fatalf("prompt %d: %d bytes for %d tokens", i, len(p[i]), recs[i].InputTokens)
		}
	}
	const block = 512 * bytesPerToken
	if p[0][:2*block] != p[1][:2*block] {
		t.Error("requests sharing hash ids 7, 8 do not share their first two blocks")
	}
	if p[0][2*block:3*block-400] == p[1][2*block:] {
		t.Error("hash ids 9 and 10 gave the same text")
	}
	// Same id at a different position is the same text, but the prefix differs from block 0.
	if p[2][block:] != p[0][block:2*block] {
		t.Error("hash id 8 did not give the same text in another request")
	}
	if p[2][:block] == p[0][:block] {
		t.Error("hash ids 11 and 7 gave the same text")
	}
}

func TestTraceItemsScaleSpeedup(t *testing.T) {
	recs := []TraceRecord{
		{At: 0, InputTokens: 1024, OutputTokens: 200, HashIDs: []int64{1, 2}},
		{At: 10 * time.Second, InputTokens: 1000, OutputTokens: 3, HashIDs: []int64{1, 3}},
		{At: 40 * time.Second, InputTokens: 100, OutputTokens: 0},
	}
	cfg := planCfg("", 1, 0, 1)
	cfg.Speedup, cfg.Rate, cfg.Scale = 5, 2, 0.25
	items := TraceItems(cfg, recs)
	if len(items) != 3 || items[1].At != time.Second || items[2].At != 4*time.Second {
		t.Fatalf("speedup 5 × rate 2: arrivals %v, %v", items[1].At, items[2].At)
	}
	if items[0].PromptTokens != 256 || items[0].MaxTokens != 50 || items[2].MaxTokens != 1 {
		t.Fatalf("scale 0.25: tokens %d, max %d, %d", items[0].PromptTokens, items[0].MaxTokens, items[2].MaxTokens)
	}
	a, b := items[0].Messages()[0].Content, items[1].Messages()[0].Content
	if a[:128*bytesPerToken] != b[:128*bytesPerToken] || a[128*bytesPerToken:] == b[128*bytesPerToken:250*bytesPerToken] {
		t.Fatal("scaled blocks are not shared exactly on hash id 1")
	}
	cfg.Duration = 3 * time.Second
	if n := len(TraceItems(cfg, recs)); n != 2 {
		t.Fatalf("duration cut kept %d items, want 2", n)
	}
	cfg.Duration, cfg.MaxRequests = 0, 1
	if n := len(TraceItems(cfg, recs)); n != 1 {
		t.Fatalf("max requests 1 kept %d", n)
	}
}

// TestTraceWindowHeldOnly pins that a replay with a duration holds only the records it may send,
// so a minute of a week-long trace (27 million requests) does not cost the whole week, and that
// an earlier record later in the file still moves the window back.
func TestTraceWindowHeldOnly(t *testing.T) {
	dir := t.TempDir()
	mc := filepath.Join(dir, "t.jsonl")
	az := filepath.Join(dir, "t.csv")
	if err := os.WriteFile(mc, []byte(`{"timestamp": 5000, "input_length": 1, "output_length": 1}
{"timestamp": 100000, "input_length": 2, "output_length": 1}
{"timestamp": 1000, "input_length": 3, "output_length": 1}
{"timestamp": 3000, "input_length": 4, "output_length": 1}
{"timestamp": 7001, "input_length": 5, "output_length": 1}
`), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(az, []byte("TIMESTAMP,ContextTokens,GeneratedTokens\n5,1,1\n100,2,1\n1,3,1\n3,4,1\n7.001,5,1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{mc, az} {
		recs, cut, err := readTraceFile(p, 6*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		var in []int
		for _, r := range recs {
			in = append(in, r.InputTokens)
		}
		if !cut || !reflect.DeepEqual(in, []int{3, 4, 1}) || recs[2].At != 4*time.Second {
			t.Errorf("%s: held %v (cut %v), want the records of 3, 4 and 1 tokens within 6 s of the first", p, in, cut)
		}
		cfg := planCfg("", 1, 6*time.Second, 1)
		cfg.Trace, cfg.Speedup = p, 2
		if items := mustPlan(t, cfg); len(items) != 4 {
			t.Errorf("%s: speedup 2 planned %d items in 6 s, want the 4 of the trace's first 12 s", p, len(items))
		}
	}
}

// TestTraceItemsAllocatesWhatItSends pins that TraceItems allocates for MaxRequests items, not
// for every record of a long trace.
func TestTraceItemsAllocatesWhatItSends(t *testing.T) {
	recs := make([]TraceRecord, 200_000)
	cfg := planCfg("", 1, 0, 1)
	cfg.MaxRequests = 10
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	items := TraceItems(cfg, recs)
	runtime.ReadMemStats(&after)
	if len(items) != 10 || after.TotalAlloc-before.TotalAlloc > 1<<20 {
		t.Fatalf("%d items took %d bytes", len(items), after.TotalAlloc-before.TotalAlloc)
	}
}

func TestRealMooncakeTrace(t *testing.T) {
	if _, err := os.Stat(mooncakeTrace); err != nil {
		t.Skip("trace not present")
	}
	recs, err := ReadTraceFile(mooncakeTrace)
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != 12031 {
		t.Fatalf("read %d records, want 12031", len(recs))
	}
	if last := recs[len(recs)-1].At; last < 50*time.Minute || last > 61*time.Minute {
		t.Fatalf("trace spans %v, want about an hour", last)
	}
	cfg := planCfg("", 1, 0, 1)
	cfg.Trace, cfg.Scale, cfg.MaxRequests = mooncakeTrace, 0.01, 20
	items := mustPlan(t, cfg)
	if len(items) != 20 {
		t.Fatalf("planned %d", len(items))
	}
	// Every conversation in the trace starts with hash id 0: one shared first block.
	bt := 5 * bytesPerToken // round(512 × 0.01) tokens a block
	first := items[0].Messages()[0].Content[:bt]
	for _, it := range items {
		if c := it.Messages()[0].Content; len(c) >= bt && c[:bt] != first {
			t.Fatal("requests do not share hash id 0's block")
		}
	}
}

func TestReadCSV(t *testing.T) {
	for _, c := range []struct {
		name, in string
		at       []time.Duration
		in0      int
	}{
		{"datetime with header", "TIMESTAMP,ContextTokens,GeneratedTokens\n" +
			"2023-11-16 18:15:46.6805900,374,44\n2023-11-16 18:15:50.9951690,396,109\n2023-11-16 18:15:46.1805900,100,1\n",
			[]time.Duration{0, 500 * time.Millisecond, 4814579 * time.Microsecond}, 100},
		{"seconds without header", "10.5,20,3\n12,30,4\n", []time.Duration{0, 1500 * time.Millisecond}, 20},
		{"reordered header", "GeneratedTokens,TIMESTAMP,ContextTokens\n5,0,77\n6,2,88\n", []time.Duration{0, 2 * time.Second}, 77},
		{"datetime with offset", "TIMESTAMP,ContextTokens,GeneratedTokens\n2024-05-10 00:00:00.0090000+00:00,5,5\n2024-05-10 02:00:00.0090000+02:00,6,6\n",
			[]time.Duration{0, 0}, 5},
		{"iso", "TIMESTAMP,ContextTokens,GeneratedTokens\n2024-05-10T00:00:00Z,5,5\n2024-05-10T00:00:01.25Z,6,6\n",
			[]time.Duration{0, 1250 * time.Millisecond}, 5},
		// The 2024 week-long files write a whole second without a fraction.
		{"2024 whole second", "TIMESTAMP,ContextTokens,GeneratedTokens\n2024-05-12 00:00:00+00:00,1452,3\n2024-05-12 00:00:00.041683+00:00,584,3\n",
			[]time.Duration{0, 41683 * time.Microsecond}, 1452},
		{"quoted, extra columns, CRLF", "\"TIMESTAMP\",\"ContextTokens\",\"GeneratedTokens\",\"Deployment\"\r\n" +
			"\"2023-11-16 18:15:46.6805900\",\"374\",\"44\",\"a\"\r\n\"2023-11-16 18:15:47.6805900\", 396, 109,b\r\n",
			[]time.Duration{0, time.Second}, 374},
		{"burstgpt", "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n" +
			"5,ChatGPT,472,18,490,Conversation log\n45,ChatGPT,1087,230,1317,Conversation log\n118.5,GPT-4,0,276,276,API log\n",
			[]time.Duration{0, 40 * time.Second, 113500 * time.Millisecond}, 472},
		{"burstgpt with sessions", "Timestamp,Session ID,Elapsed time,Model,Request tokens,Response tokens,Total tokens,Log Type\n" +
			"5.0,s1,1.5,ChatGPT,472.0,18,490,Conversation log\n6.0,s1,2,ChatGPT,500,0,500,Conversation log\n",
			[]time.Duration{0, time.Second}, 472},
	} {
		t.Run(c.name, func(t *testing.T) {
			recs, err := ReadCSV(strings.NewReader(c.in))
			if err != nil {
				t.Fatal(err)
			}
			if len(recs) != len(c.at) {
				t.Fatalf("got %d records, want %d", len(recs), len(c.at))
			}
			for i, at := range c.at {
				if d := recs[i].At - at; d < -time.Microsecond || d > time.Microsecond {
					t.Errorf("record %d at %v, want %v", i, recs[i].At, at)
				}
			}
			if recs[0].InputTokens != c.in0 {
				t.Errorf("first context tokens %d, want %d", recs[0].InputTokens, c.in0)
			}
		})
	}
}

func TestReadCSVMalformed(t *testing.T) {
	head := "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.68,10,2\n"
	for _, c := range []struct{ name, line string }{
		{"bad time", "yesterday,10,2"},
		{"too few fields", "2023-11-16 18:15:46.68,10"},
		{"bad tokens", "2023-11-16 18:15:46.68,ten,2"},
		{"huge context", "2023-11-16 18:15:46.68,2000000000,2"},
		{"fractional tokens", "2023-11-16 18:15:46.68,5.5,2"},
		{"negative generated", "2023-11-16 18:15:46.68,5,-2"},
		{"bad quote", `"2023-11-16 18:15:46.68,5,2`},
		{"seconds past time.Duration", "1e10,5,2"},
		{"year past time.Duration", "2300-01-01 00:00:00,5,2"},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := ReadCSV(strings.NewReader(head + c.line + "\n"))
			if !errors.Is(err, ErrTrace) || !strings.Contains(err.Error(), "line 3") {
				t.Fatalf("got %v, want ErrTrace naming line 3", err)
			}
		})
	}
}

// TestReadCSVUnknownHeader pins that a file in none of the formats says which formats there are,
// rather than failing on its first timestamp.
func TestReadCSVUnknownHeader(t *testing.T) {
	for _, in := range []string{
		"time,prompt,output\n1,2,3\n",
		"Timestamp,Model,Request tokens\n5,ChatGPT,472\n",
		`[{"timestamp": 0, "input_length": 10, "output_length": 1}]`,
	} {
		_, err := ReadCSV(strings.NewReader(in))
		if !errors.Is(err, ErrTrace) || !strings.Contains(err.Error(), "line 1:") || !strings.Contains(err.Error(), "BurstGPT") {
			t.Errorf("%q: got %v, want ErrTrace naming line 1 and the formats", in, err)
		}
	}
}

func TestReadTraceFileSniffs(t *testing.T) {
	dir := t.TempDir()
	az := filepath.Join(dir, "a.txt")
	mc := filepath.Join(dir, "m.txt")
	if err := os.WriteFile(az, []byte("TIMESTAMP,ContextTokens,GeneratedTokens\n1,2,3\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(mc, []byte("\n{\"timestamp\":1,\"input_length\":2,\"output_length\":3}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{az, mc} {
		recs, err := ReadTraceFile(p)
		if err != nil || len(recs) != 1 || recs[0].InputTokens != 2 || recs[0].OutputTokens != 3 {
			t.Fatalf("%s: %v %+v", p, err, recs)
		}
	}
	// A UTF-8 byte order mark, as Windows tools save files, is not part of the first line.
	for name, body := range map[string]string{
		"bom.jsonl": "\ufeff{\"timestamp\":1,\"input_length\":2,\"output_length\":3}\r\n",
		"bom.csv":   "\ufeffTIMESTAMP,ContextTokens,GeneratedTokens\r\n1,2,3\r\n",
		"bom2.csv":  "\ufeff1,2,3\n",
	} {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		recs, err := ReadTraceFile(p)
		if err != nil || len(recs) != 1 || recs[0].InputTokens != 2 || recs[0].OutputTokens != 3 {
			t.Fatalf("%s: %v %+v", name, err, recs)
		}
	}
	if _, err := ReadMooncake(strings.NewReader("\ufeff{\"timestamp\":1,\"input_length\":2,\"output_length\":3}")); err != nil {
		t.Fatalf("ReadMooncake after a byte order mark: %v", err)
	}
	// Errors count the blank lines before the first record; a file of no record is an error.
	for name, c := range map[string]struct{ body, err string }{
		"late.jsonl": {"\n\n{\"timestamp\":1,\"input_length\":2}\n", "line 3:"},
		"late.csv":   {"\n\nTIMESTAMP,ContextTokens,GeneratedTokens\n1,2\n", "line 4:"},
		"head.csv":   {"TIMESTAMP,ContextTokens,GeneratedTokens\r\n", "no requests"},
		"blank.csv":  {"\n \n", "no requests"},
	} {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(c.body), 0o600); err != nil {
			t.Fatal(err)
		}
		if _, err := ReadTraceFile(p); !errors.Is(err, ErrTrace) || !strings.Contains(err.Error(), c.err) {
			t.Errorf("%s: got %v, want ErrTrace with %q", name, err, c.err)
		}
	}
	if _, err := ReadTraceFile(filepath.Join(dir, "missing")); err == nil {
		t.Fatal("missing file read without error")
	}
}
