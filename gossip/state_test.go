package gossip

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"reflect"
	"slices"
	"testing"
	"time"
)

func fullState() State {
	return State{
		Name: "gpu-07", HTTPAddr: "10.0.0.7:8080", QUICAddr: "10.0.0.7:7443",
		Models:    []ModelInfo{{Name: "llama-3.1-8b", ContextTokens: 131072, BytesPerToken: 3.5}, {Name: "qwen2.5-7b", ContextTokens: 32768}},
		Adapters:  []Adapter{{Name: "sql", Parent: "llama-3.1-8b", Resident: true}, {Name: "chat", Parent: "llama-3.1-8b"}},
		LoRASlots: 4, LoRAFree: 3,
		Role: "mixed", EngineKind: "sim", HalvesOnly: true, MessagesNative: true, EngineHealthy: true, BlockTokens: 16,
		KVBlocksTotal: 8192, KVBlocksUsed: 5000, HitRate: 0.42, Running: 12, Waiting: 3,
		QueuedPrefillTokens: 9000, PriorityScheduling: true, QueuedBeforeHigh: 1000, QueuedLowWaiting: 5000,
		InFlightTokens: 40000, PrefillTokensPerSecond: 12000.5, KeyUsage: []KeyUsage{{ID: 7, TokensPerSecond: 1500.5}, {ID: 3, TokensPerSecond: 2}},
		DecodeStepSeconds: 0.021, MaxRunning: 256, PowerWatts: 612.5, PowerCapWatts: 700,
		TempC: 71, VRAMTotalBytes: 80 << 30, VRAMUsedBytes: 70 << 30, Vendor: "nvidia",
		GPUName: "H100 SXM", CarbonIntensity: 231, CarbonZone: "DE", CarbonAgeSeconds: 120,
		CarbonStale: true, SoftwareVersion: "v0.3.0", BootID: 0xdeadbeefcafe, Seq: 77,
		GossipAddr: "10.0.0.7:7946",
	}
}

func TestStateRoundTrip(t *testing.T) {
	for _, s := range []State{{}, {Name: "a", Running: -1}, fullState()} {
		b, err := EncodeState(s)
		if err != nil {
			t.Fatal(err)
		}
		got, err := DecodeState(b)
		if err != nil {
			t.Fatalf("decode: %v", err)
		}
		if !reflect.DeepEqual(got, s) {
			t.Fatalf("round trip\n got %+v\nwant %+v", got, s)
		}
	}
	b, _ := EncodeState(fullState())
	if len(b) > 400 {
		t.Errorf("full record is %d bytes, want a few hundred at most", len(b))
	}
}

func TestDecodeStateUnknownTagSkipped(t *testing.T) {
	b, _ := EncodeState(State{Name: "a", Running: 3})
	// A newer node's field 200 of 3 bytes, in the middle of the record.
	ext := append([]byte{}, b...)
	ext = binary.AppendUvarint(ext, 200)
	ext = append(ext, 3, 'x', 'y', 'z')
	ext = append(ext, tagName, 1, 'b') // tagName again: a duplicate, see below
	got, err := DecodeState(ext[:len(ext)-3])
	if err != nil || got.Name != "a" || got.Running != 3 {
		t.Fatalf("unknown tag: %+v, %v", got, err)
	}
	if _, err := DecodeState(ext); !errors.Is(err, ErrMalformed) {
		t.Fatalf("duplicate name accepted: %v", err)
	}
}

// TestStateHalvesOnly pins a decode node's HalvesOnly on the wire: tag 40, one byte, and a
// record without it, an older node's, decodes as a decode node that runs whole requests.
func TestStateHalvesOnly(t *testing.T) {
	old := []byte{StateVersion, tagName, 1, 'd', tagRole, 6, 'd', 'e', 'c', 'o', 'd', 'e'}
	if s, err := DecodeState(old); err != nil || s.Role != "decode" || s.HalvesOnly {
		t.Fatalf("an older record: %+v, %v; want a decode node, HalvesOnly false", s, err)
	}
	b, err := EncodeState(State{Name: "d", Role: "decode", HalvesOnly: true})
	if want := append(slices.Clone(old), 40, 1, 1); err != nil || !bytes.Equal(b, want) {
		t.Fatalf("encoded %x, %v; want %x", b, err, want)
	}
	if s, err := DecodeState(b); err != nil || !s.HalvesOnly {
		t.Fatalf("decoded %+v, %v; want HalvesOnly", s, err)
	}
}

// TestStateMessagesNative pins MessagesNative on the wire: tag 45, one byte; a record without
// it, an older node's, says its engine takes no Messages request as sent.
func TestStateMessagesNative(t *testing.T) {
	old := []byte{StateVersion, tagName, 1, 'n'}
	if s, err := DecodeState(old); err != nil || s.MessagesNative {
		t.Fatalf("an older record: %+v, %v; want MessagesNative false", s, err)
	}
	b, err := EncodeState(State{Name: "n", MessagesNative: true})
	if want := append(slices.Clone(old), 45, 1, 1); err != nil || !bytes.Equal(b, want) {
		t.Fatalf("encoded %x, %v; want %x", b, err, want)
	}
	if s, err := DecodeState(b); err != nil || !s.MessagesNative {
		t.Fatalf("decoded %+v, %v; want MessagesNative", s, err)
	}
}

func TestDecodeStateMalformed(t *testing.T) {
	good, _ := EncodeState(fullState())
	tests := []struct {
		name string
		in   []byte
		want error
	}{
		{"empty", nil, ErrMalformed},
		{"major 2", append([]byte{2}, good[1:]...), ErrVersion},
		{"truncated", good[:len(good)-1], ErrMalformed},
		{"tag zero", []byte{1, 0, 0}, ErrMalformed},
		{"length beyond end", []byte{1, tagName, 5, 'a'}, ErrMalformed},
		{"float of 4 bytes", []byte{1, tagHitRate, 4, 0, 0, 0, 0}, ErrMalformed},
		{"bool of 2", []byte{1, tagEngineHealthy, 1, 2}, ErrMalformed},
		{"int with trailing byte", []byte{1, tagRunning, 2, 2, 0}, ErrMalformed},
		{"boot id of 3 bytes", []byte{1, tagBootID, 3, 1, 2, 3}, ErrMalformed},
		{"bad model", []byte{1, tagModel, 2, modelTagCtx, 9}, ErrMalformed},
		{"oversized", append([]byte{1}, make([]byte, MaxStateBytes)...), ErrMalformed},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := DecodeState(tt.in); !errors.Is(err, tt.want) {
				t.Fatalf("DecodeState = %v, want %v", err, tt.want)
			}
		})
	}
	many := State{Models: make([]ModelInfo, maxModels+1)}
	if _, err := EncodeState(many); !errors.Is(err, ErrMalformed) {
		t.Fatalf("too many models encoded: %v", err)
	}
}

// agentState is fullState home to 80 agents, advertising the most agent keys and API key
// usage entries a record may carry.
func agentState() State {
	s := fullState()
	s.Agents = 80
	for i := range MaxAgentKeys {
		s.AgentKeys = append(s.AgentKeys, uint64(i+1)*(math.MaxUint64/(MaxAgentKeys+1))) // full-width keys
	}
	s.KeyUsage = nil
	for i := range MaxKeyUsage {
		s.KeyUsage = append(s.KeyUsage, KeyUsage{ID: math.MaxUint64 - uint64(i), TokensPerSecond: 1e6 + float64(i)})
	}
	return s
}

func TestStateAgentKeys(t *testing.T) {
	s := agentState()
	b, err := EncodeState(s)
	if err != nil {
		t.Fatal(err)
	}
	got, err := DecodeState(b)
	if err != nil || !reflect.DeepEqual(got, s) {
		t.Fatalf("round trip: %v\n got %+v\nwant %+v", err, got, s)
	}
	if n := 2 + len(b); n > maxMessage {
		t.Fatalf("a record with %d agent keys is a %d-byte message, over the %d-byte broadcast limit", MaxAgentKeys, n, maxMessage)
	}

	t.Run("encode refuses", func(t *testing.T) {
		for name, keys := range map[string][]uint64{
			"too many":   append(slices.Clone(s.AgentKeys), math.MaxUint64),
			"unsorted":   {3, 1, 2},
			"duplicates": {1, 2, 2},
		} {
			if _, err := EncodeState(State{Name: "a", AgentKeys: keys}); !errors.Is(err, ErrMalformed) {
				t.Errorf("%s: EncodeState = %v, want ErrMalformed", name, err)
			}
		}
	})

	keys := func(ks ...uint64) []byte {
		var v []byte
		for _, k := range ks {
			v = binary.LittleEndian.AppendUint64(v, k)
		}
		return v
	}
	field := func(v []byte) []byte {
		b := []byte{StateVersion, tagAgentKeys}
		b = binary.AppendUvarint(b, uint64(len(v)))
		return append(b, v...)
	}
	tooMany := make([]uint64, MaxAgentKeys+1)
	for i := range tooMany {
		tooMany[i] = uint64(i + 1)
	}
	tests := []struct {
		name string
		in   []byte
	}{
		{"empty keys", field(nil)},
		{"7 bytes", field(keys(1)[:7])},
		{"12 bytes", field(keys(1, 2)[:12])},
		{"descending", field(keys(2, 1))},
		{"repeated", field(keys(5, 5))},
		{"over the bound", field(keys(tooMany...))},
		{"the field twice", append(field(keys(1)), field(keys(2))[1:]...)},
	}
	for _, tt := range tests {
		t.Run("decode refuses "+tt.name, func(t *testing.T) {
			if _, err := DecodeState(tt.in); !errors.Is(err, ErrMalformed) {
				t.Fatalf("DecodeState = %v, want ErrMalformed", err)
			}
		})
	}
	if got, err := DecodeState(field(keys(1, 7, 9))); err != nil || !slices.Equal(got.AgentKeys, []uint64{1, 7, 9}) {
		t.Fatalf("three keys: %v, %v", got.AgentKeys, err)
	}
}

func FuzzDecodeState(f *testing.F) {
	good, _ := EncodeState(fullState())
	f.Add(good)
	agents, _ := EncodeState(agentState())
	f.Add(agents)
	f.Add([]byte{1})
	f.Add([]byte{1, tagModel, 3, modelTagName, 1, 'm'})
	f.Fuzz(func(t *testing.T, b []byte) {
		s, err := DecodeState(b)
		if err != nil {
			if !errors.Is(err, ErrMalformed) && !errors.Is(err, ErrVersion) {
				t.Fatalf("unexpected error class: %v", err)
			}
			return
		}
		// Whatever decodes re-encodes to a record that decodes to the same encoding.
		b1, err := EncodeState(s)
		if err != nil {
			t.Fatalf("decoded state does not encode: %v", err)
		}
		s2, err := DecodeState(b1)
		if err != nil {
			t.Fatalf("re-encoded state does not decode: %v", err)
		}
		if b2, _ := EncodeState(s2); !bytes.Equal(b1, b2) {
			t.Fatalf("encoding not stable: %x vs %x", b1, b2)
		}
	})
}

func FuzzDecodeDelta(f *testing.F) {
	f.Add(append(deltaHeader("n1", 5), 1, 0, 1, 1, 0, 1, 2, 3, 4, 5, 6, 7, 8))
	f.Fuzz(func(t *testing.T, b []byte) {
		if len(b) < 2 {
			return
		}
		name, boot, s, err := decodeDelta(b[2:])
		if err == nil && (name == "" || boot == 0 || s.Seq == 0 || s.Snapshot) {
			t.Fatalf("accepted invalid delta %q %d %+v", name, boot, s)
		}
	})
}

func TestConfigValidate(t *testing.T) {
	tests := []struct {
		name string
		mod  func(*Config)
		ok   bool
	}{
		{"key", func(c *Config) { c.Key = make([]byte, 32) }, true},
		{"insecure", func(c *Config) { c.Insecure = true }, true},
		{"no key", func(c *Config) {}, false},
		{"bad key", func(c *Config) { c.Key = make([]byte, 20) }, false},
		{"no name", func(c *Config) { c.Insecure, c.Name = true, "" }, false},
		{"bad policy", func(c *Config) { c.Insecure, c.StalePolicy = true, "maybe" }, false},
		{"tiny bandwidth", func(c *Config) { c.Insecure, c.MaxBytesPerSecond = true, 100 }, false},
		{"any port", func(c *Config) { c.Insecure, c.BindPort = true, AnyPort }, true},
		{"port below AnyPort", func(c *Config) { c.Insecure, c.BindPort = true, -2 }, false},
		{"negative interval", func(c *Config) { c.Insecure, c.StaleAfter = true, -time.Second }, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := DefaultConfig()
			c.Name = "n"
			tt.mod(&c)
			_, err := New(c)
			if (err == nil) != tt.ok {
				t.Fatalf("New = %v, want ok=%v", err, tt.ok)
			}
			if err != nil && !errors.Is(err, ErrConfig) {
				t.Fatalf("error %v is not ErrConfig", err)
			}
		})
	}
}

// TestZeroConfigIsTheDefault pins the zero rule: a zero field takes its default, and AnyPort
// survives filling.
func TestZeroConfigIsTheDefault(t *testing.T) {
	g, err := New(Config{Name: "n", Insecure: true})
	if err != nil {
		t.Fatal(err)
	}
	want := DefaultConfig()
	want.Name, want.Insecure = "n", true
	if fmt.Sprintf("%+v", g.cfg) != fmt.Sprintf("%+v", want) {
		t.Errorf("New filled\n%+v\nwant\n%+v", g.cfg, want)
	}
	c := want
	c.BindPort = AnyPort
	if g, err := New(c); err != nil || g.cfg.BindPort != AnyPort {
		t.Errorf("AnyPort: %v", err)
	}
}

func TestStateClaims(t *testing.T) {
	due := time.UnixMilli(1_800_000_000_123)
	s := State{Name: "a", Claims: []Claim{{Peer: "gpu-07", Blocks: 1900, Arrived: due}, {Peer: "gpu-08", Blocks: 1, Priority: -3}}}
	b, err := EncodeState(s)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := DecodeState(b); err != nil || !reflect.DeepEqual(got, s) {
		t.Fatalf("round trip: %v\n got %+v\nwant %+v", err, got, s)
	}

	over := State{Name: "a", Claims: make([]Claim, MaxClaims+1)}
	for i := range over.Claims {
		over.Claims[i] = Claim{Peer: "p", Blocks: 1}
	}
	if _, err := EncodeState(over); !errors.Is(err, ErrMalformed) {
		t.Errorf("EncodeState of %d claims = %v, want ErrMalformed", len(over.Claims), err)
	}
	claim := func(fs ...[]byte) []byte {
		var v []byte
		for _, f := range fs {
			v = append(v, f...)
		}
		b := []byte{StateVersion, tagClaim}
		b = binary.AppendUvarint(b, uint64(len(v)))
		return append(b, v...)
	}
	peer := func(name string) []byte { return append([]byte{claimTagPeer, byte(len(name))}, name...) }
	blocks := func(n int64) []byte {
		v := binary.AppendVarint(nil, n)
		return append([]byte{claimTagBlocks, byte(len(v))}, v...)
	}
	tooMany := []byte{StateVersion}
	for range MaxClaims + 1 {
		tooMany = append(tooMany, claim(peer("p"), blocks(1))[1:]...)
	}
	for name, in := range map[string][]byte{
		"no peer":        claim(blocks(5)),
		"no blocks":      claim(peer("p")),
		"negative":       claim(peer("p"), blocks(-5)),
		"past the bound": claim(peer("p"), blocks(MaxClaimBlocks+1)),
		"peer twice":     claim(peer("p"), peer("q"), blocks(5)),
		"over the bound": tooMany,
	} {
		if _, err := DecodeState(in); !errors.Is(err, ErrMalformed) {
			t.Errorf("%s: DecodeState = %v, want ErrMalformed", name, err)
		}
	}
	got, err := DecodeState(append(claim(peer("p"), blocks(5)), claim(peer("q"), blocks(7))[1:]...))
	if err != nil || !reflect.DeepEqual(got.Claims, []Claim{{Peer: "p", Blocks: 5}, {Peer: "q", Blocks: 7}}) {
		t.Fatalf("two claims: %+v, %v", got.Claims, err)
	}
}

func TestClaimOutranks(t *testing.T) {
	t0 := time.Unix(1000, 0)
	for _, tt := range []struct {
		claim    Claim
		prio     int
		deadline time.Time
		want     bool
	}{
		{Claim{Priority: 1}, 0, t0, true},
		{Claim{Priority: 0, Arrived: t0.Add(-time.Hour)}, 1, t0, false},
		{Claim{Arrived: t0}, 0, t0.Add(time.Millisecond), true},
		{Claim{Arrived: t0}, 0, t0, false}, // its own request
		{Claim{Arrived: t0.Add(time.Second)}, 0, t0, false},
		{Claim{Arrived: t0}, 0, time.Time{}, true},
		{Claim{}, 0, t0, false},
		{Claim{}, 0, time.Time{}, false},
	} {
		if got := tt.claim.Outranks(tt.prio, tt.deadline); got != tt.want {
			t.Errorf("%+v.Outranks(%d, %v) = %v, want %v", tt.claim, tt.prio, tt.deadline, got, tt.want)
		}
	}
}

// A record carries at most MaxAdapters adapters: more is refused on both sides.
func TestStateAdaptersBounded(t *testing.T) {
	s := State{Name: "a", Models: []ModelInfo{{Name: "m"}}}
	for i := range MaxAdapters + 1 {
		s.Adapters = append(s.Adapters, Adapter{Name: fmt.Sprint("lora-", i), Parent: "m"})
	}
	if _, err := EncodeState(s); !errors.Is(err, ErrMalformed) {
		t.Fatalf("EncodeState of %d adapters = %v, want ErrMalformed", len(s.Adapters), err)
	}
	ok := s
	ok.Adapters = s.Adapters[:MaxAdapters]
	b, err := EncodeState(ok)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := DecodeState(b); err != nil || !reflect.DeepEqual(got, ok) {
		t.Fatalf("round trip of %d adapters: %v", MaxAdapters, err)
	}
	var extra enc
	extra.str(adapterTagName, "one-more")
	b = binary.AppendUvarint(b, tagAdapter)
	b = binary.AppendUvarint(b, uint64(len(extra.b)))
	b = append(b, extra.b...)
	if _, err := DecodeState(b); !errors.Is(err, ErrMalformed) {
		t.Errorf("DecodeState of %d adapters = %v, want ErrMalformed", MaxAdapters+1, err)
	}
}
