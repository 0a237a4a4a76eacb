package kvindex

import (
	"encoding/base64"
	"encoding/binary"
	"slices"
	"strings"
	"testing"
)

// chatChain is the chain of one user message holding text with an image after its first
// before bytes.
func chatChain(text string, before int, image string, tokens int) ([]uint64, []byte) {
	m := Message{Role: "user", Content: text, Parts: []Part{{At: before, ID: PartID(image), Tokens: tokens}}}
	prompt := RenderChat(nil, []Message{m})
	return Blocks("m", prompt, DefaultBlockTokens), prompt
}

// commonBlocks is how many blocks two chains share from block 0.
func commonBlocks(a, b []uint64) int {
	n := 0
	for n < min(len(a), len(b)) && a[n] == b[n] {
		n++
	}
	return n
}

// TestPartsInTheChain pins how an image stands in the prefix chain: the same image at the same
// place gives the same blocks, another image (or the same image named by URL rather than
// sent as data) makes the chain diverge at the block holding the image's first byte and never
// meet again, text before the image keeps its blocks, and the image's estimate is in the
// prompt's token count.
func TestPartsInTheChain(t *testing.T) {
	const blockBytes = DefaultBlockTokens * BytesPerToken
	before := strings.Repeat("b", 100)
	text := before + strings.Repeat("a", 300) // 100 bytes before the image, 300 after it
	dataA := "data:image/png;base64," + base64.StdEncoding.EncodeToString([]byte("the bytes of image A"))
	dataB := "data:image/png;base64," + base64.StdEncoding.EncodeToString([]byte("the bytes of image B"))
	url := "https://example.com/a.png"
	a, prompt := chatChain(text, len(before), dataA, ImageTokensDefault)
	first := (len("<|user|>\n") + len(before)) / blockBytes // the block holding the image's first byte

	again, _ := chatChain(text, len(before), strings.Clone(dataA), ImageTokensDefault)
	if !slices.Equal(a, again) {
		t.Fatal("the same image at the same place gave other blocks")
	}
	if want := Tokens(len(RenderChat(nil, []Message{{Role: "user", Content: text}}))) + ImageTokensDefault; Tokens(len(prompt)) != want {
		t.Errorf("the prompt is %d tokens, want %d (its text's and the image's %d)", Tokens(len(prompt)), want, ImageTokensDefault)
	}
	for name, other := range map[string]string{"another image": dataB, "the image by URL": url} {
		b, _ := chatChain(text, len(before), other, ImageTokensDefault)
		if len(b) != len(a) {
			t.Fatalf("%s: %d blocks, want %d", name, len(b), len(a))
		}
		if got := commonBlocks(a, b); got != first {
			t.Errorf("%s: the chains share %d blocks, want the %d before the image", name, got, first)
		}
		for i := first; i < len(a); i++ {
			if a[i] == b[i] {
				t.Errorf("%s: block %d, past the image, is shared", name, i)
			}
		}
	}
	// The next turn (reply and question appended) starts with this one's blocks.
	turn2 := RenderChat(nil, []Message{
		{Role: "user", Content: text, Parts: []Part{{At: len(before), ID: PartID(dataA), Tokens: ImageTokensDefault}}},
		{Role: "assistant", Content: "a reply"}, {Role: "user", Content: "and then?"},
	})
	next := Blocks("m", turn2, DefaultBlockTokens)
	// The first turn's last full block may hold "<|assistant|>\n", which the next turn's
	// reply continues: all but that one are shared.
	if got := commonBlocks(a, next); got < len(a)-1 {
		t.Errorf("the next turn shares %d of the first turn's %d blocks", got, len(a))
	}
}

// TestPartsAtTheirPlaces pins the place of parts: the same image first or last in a message
// gives different prompts, several parts keep their order, and a place outside the content is
// clamped rather than a panic.
func TestPartsAtTheirPlaces(t *testing.T) {
	img, aud := Part{ID: PartID("img"), Tokens: 8}, Part{ID: PartID("aud"), Tokens: 4}
	render := func(parts ...Part) string {
		return string(RenderChat(nil, []Message{{Role: "user", Content: "hello world", Parts: parts}}))
	}
	head, tail := img, img
	tail.At = len("hello world")
	if render(head) == render(tail) {
		t.Error("an image before the text renders as one after it")
	}
	mid := img
	mid.At = 5
	two := aud
	two.At = 5
	got := render(mid, two)
	want := "<|user|>\nhello" + string(appendPlaceholder(nil, img)) + string(appendPlaceholder(nil, aud)) + " world\n<|assistant|>\n"
	if got != want {
		t.Errorf("render = %q, want %q", got, want)
	}
	far, back := img, aud
	far.At, back.At = 1000, 2
	if got, want := render(far, back), render(tail, Part{At: 11, ID: aud.ID, Tokens: aud.Tokens}); got != want {
		t.Errorf("out-of-range places render %q, want them clamped to %q", got, want)
	}
	if n := len(appendPlaceholder(nil, Part{ID: 1, Tokens: 0})); n != MinPartTokens*BytesPerToken {
		t.Errorf("a zero-token part's placeholder is %d bytes, want %d", n, MinPartTokens*BytesPerToken)
	}
	if n := len(appendPlaceholder(nil, Part{ID: 1, Tokens: 1 << 30})); n != MaxPartTokens*BytesPerToken {
		t.Errorf("a 2^30-token part's placeholder is %d bytes, want %d", n, MaxPartTokens*BytesPerToken)
	}
}

// wav is base64 WAV data: a canonical 44-byte header with byteRate, then n bytes of sound.
func wav(byteRate uint32, n int) string {
	h := make([]byte, 44+n)
	copy(h[0:], "RIFF")
	copy(h[8:], "WAVEfmt ")
	binary.LittleEndian.PutUint32(h[28:], byteRate)
	return base64.StdEncoding.EncodeToString(h)
}

// TestPartTokenEstimates pins the documented estimates: images by detail, audio by seconds of
// sound at AudioTokensPerSecond, the seconds from a WAV header's byte rate, from MP3's
// assumed 128 kbit/s, or from the 16 kHz 16-bit mono default.
func TestPartTokenEstimates(t *testing.T) {
	if ImageTokens("") != 1024 || ImageTokens("high") != 1024 || ImageTokens("auto") != 1024 || ImageTokens("low") != 256 {
		t.Errorf("image estimates %d %d %d %d", ImageTokens(""), ImageTokens("high"), ImageTokens("auto"), ImageTokens("low"))
	}
	raw := func(n int) string { return base64.StdEncoding.EncodeToString(make([]byte, n)) }
	tests := []struct {
		name, format, data string
		want               int
	}{
		{"wav 10 s at 44.1 kHz stereo", "wav", wav(176400, 1764000), 250},
		{"wav 2 s at 16 kHz mono", "wav", wav(32000, 64000), 50},
		{"wav without a header", "wav", raw(320000), 250},
		{"wav header of 1 B/s, not taken", "wav", wav(1, 32000-44), 25},
		{"mp3 4 s", "mp3", raw(64000), 100},
		{"no format", "", raw(32000), 25},
		{"tiny", "wav", raw(10), MinPartTokens},
		{"not base64", "wav", "!!!!", MinPartTokens},
		{"empty", "mp3", "", MinPartTokens},
	}
	for _, tt := range tests {
		if got := AudioTokens(tt.format, tt.data); got != tt.want {
			t.Errorf("%s: %d tokens, want %d", tt.name, got, tt.want)
		}
	}
}

// FuzzAudioTokens: any data and format give an estimate within MinPartTokens and MaxPartTokens, without a
// panic, and a placeholder of exactly its bytes.
func FuzzAudioTokens(f *testing.F) {
	f.Add("wav", wav(176400, 100))
	f.Add("mp3", "AAAA")
	f.Add("", "UklGRiQAAABXQVZFZm10IBAAAAABAAEAgD4AAAB9AAACABAAZGF0YQAAAAA=")
	f.Fuzz(func(t *testing.T, format, data string) {
		n := AudioTokens(format, data)
		if n < MinPartTokens {
			t.Fatalf("%d tokens", n)
		}
		if n > MaxPartTokens {
			t.Fatalf("%d tokens, over MaxPartTokens", n)
		}
		p := Part{ID: PartID(data), Tokens: min(n, 1<<16)}
		if got := len(appendPlaceholder(nil, p)); got != PartBytes(p) {
			t.Fatalf("placeholder of %d bytes, want %d", got, PartBytes(p))
		}
	})
}
