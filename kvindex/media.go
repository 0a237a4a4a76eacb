package kvindex

import (
	"encoding/base64"
	"encoding/binary"
	"strings"

	"github.com/cespare/xxhash/v2"
)

// Part is an image or audio clip in a chat message, as the prefix rule sees it. RenderChat
// puts it in the prompt at its place as Tokens tokens of text derived from ID alone (Placeholder), so
// the blocks that cover it hash the part's identity, chained after the text before it: the same
// image at the same place gives the same blocks, another image makes the chain diverge there,
// and the text after the part keeps its blocks only behind the same part. The prompt's token
// count holds the part's estimate, so the context budget and KV estimates count it.
type Part struct {
	// At is the offset in Message.Content where the part stands. A message's parts are in
	// order of At; an At past the content (or before the previous part's) is taken as the
	// nearest valid place.
	At int
	// ID identifies the part's content (PartID).
	ID uint64
	// Tokens is what the part costs an engine's prompt (ImageTokens, AudioTokens); fewer than
	// MinPartTokens counts as MinPartTokens, more than MaxPartTokens as MaxPartTokens.
	Tokens int
}

// PartID is the identity of an image or audio part: the hash of its source as sent, an
// image's URL (a data: URI holding the image's own bytes) or an audio clip's base64 data. The
// source is hashed as sent, not decoded: a conversation re-sends the very string it sent, so
// decoding (an allocation the size of the image) would add nothing to the identity. A
// fetched image's URL is identity enough for routing: the engine that fetched it holds the
// image's KV under it, whatever the bytes behind the URL are now.
func PartID(source string) uint64 { return xxhash.Sum64String(source) }

// Token estimates of non-text parts: what an engine's prompt spends on them, which kvmesh cannot
// know without the model's image processor or audio encoder.
const (
	// ImageTokensDefault is an image's estimate: vision models served by vLLM spend hundreds to
	// a few thousand tokens an image (LLaVA-1.5 576 on any image, LLaVA-NeXT up to 2,880;
	// Qwen2.5-VL one per 28×28-pixel patch, so 1,024 on an 896×896 image).
	ImageTokensDefault = 1024
	// ImageTokensLow is an image's estimate with detail "low", which asks for a low-resolution
	// view: 256, a 448×448 image at Qwen2.5-VL's patching.
	ImageTokensLow = 256
	// AudioTokensPerSecond is an audio clip's tokens per second: Whisper-style encoders, such
	// as Qwen2-Audio's, give one token per 40 ms of sound.
	AudioTokensPerSecond = 25
	// AudioBytesPerSecond is the byte rate assumed of a clip whose format does not give its
	// own: WAV of 16 kHz 16-bit mono (what speech encoders resample to). A WAV clip's header
	// gives its rate; MP3 is taken at 128 kbit/s (AudioMP3BytesPerSecond).
	AudioBytesPerSecond    = 32000
	AudioMP3BytesPerSecond = 16000
	// MinPartTokens is the fewest tokens a part stands for: its placeholder holds the whole
	// 16-hex-digit ID. MaxPartTokens is the most, past any model's context: a placeholder is
	// at most 4 MiB.
	MinPartTokens = 4
	MaxPartTokens = 1 << 20
	// wavMinByteRate is the lowest byte rate taken from a WAV header (8 kHz 8-bit mono), so
	// that a header cannot make a small clip count as hours.
	wavMinByteRate = 8000
)

// ImageTokens is an image part's token estimate under its detail field.
func ImageTokens(detail string) int {
	if detail == "low" {
		return ImageTokensLow
	}
	return ImageTokensDefault
}

// AudioTokens is an audio part's token estimate from its base64 data's size and format:
// the clip's seconds (its bytes over its byte rate) at AudioTokensPerSecond, rounded up.
func AudioTokens(format, data string) int {
	n := base64.StdEncoding.DecodedLen(len(data)) - (len(data) - len(strings.TrimRight(data, "=")))
	rate := AudioBytesPerSecond
	switch format {
	case "mp3":
		rate = AudioMP3BytesPerSecond
	default:
		if r, ok := wavByteRate(data); ok {
			rate, n = r, n-44 // the canonical header's 44 bytes hold no sound
		}
	}
	t := (int64(max(n, 0))*AudioTokensPerSecond + int64(rate) - 1) / int64(rate)
	return int(min(max(t, MinPartTokens), MaxPartTokens))
}

// wavByteRate reads the byte rate of a canonical WAV header ("RIFF", "WAVE", "fmt ") at the
// start of base64 data.
func wavByteRate(data string) (int, bool) {
	const headerChars = 48 // 36 bytes: up to the fmt chunk's byte rate
	if len(data) < headerChars {
		return 0, false
	}
	h, err := base64.StdEncoding.DecodeString(data[:headerChars])
	if err != nil || string(h[0:4]) != "RIFF" || string(h[8:12]) != "WAVE" || string(h[12:16]) != "fmt " {
		return 0, false
	}
	r := binary.LittleEndian.Uint32(h[28:32])
	if r < wavMinByteRate || r > 1<<24 {
		return 0, false
	}
	return int(r), true
}

// partTokens is p's tokens, within MinPartTokens and MaxPartTokens.
func partTokens(p Part) int { return min(max(p.Tokens, MinPartTokens), MaxPartTokens) }

// PartBytes is the length of p's placeholder in a rendered prompt.
func PartBytes(p Part) int { return partTokens(p) * BytesPerToken }

// appendPlaceholder appends p's placeholder: its ID's 16 hex digits, repeated to PartBytes.
func appendPlaceholder(dst []byte, p Part) []byte {
	const digits = "0123456789abcdef"
	var hex [16]byte
	for i := range hex {
		hex[i] = digits[p.ID>>(60-4*i)&0xf]
	}
	for n := PartBytes(p); n > 0; n -= len(hex) {
		dst = append(dst, hex[:min(n, len(hex))]...)
	}
	return dst
}

// appendContent appends m's content with its parts' placeholders at their places.
func appendContent(dst []byte, m Message) []byte {
	at := 0
	for _, p := range m.Parts {
		next := min(max(p.At, at), len(m.Content))
		dst = append(dst, m.Content[at:next]...)
		dst = appendPlaceholder(dst, p)
		at = next
	}
	return append(dst, m.Content[at:]...)
}
