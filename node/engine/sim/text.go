package sim

import (
	"strings"

	"github.com/cespare/xxhash/v2"
)

// vocab holds the output words: each is exactly kvindex.BytesPerToken bytes, so one generated
// token is one word and the output re-tokenises to the same count.
var vocab = [...]string{
	"the ", "and ", "for ", "you ", "not ", "are ", "but ", "can ",
	"was ", "one ", "all ", "new ", "may ", "use ", "get ", "way ",
	"has ", "two ", "how ", "out ", "day ", "see ", "now ", "any ",
	"its ", "our ", "set ", "run ", "key ", "end ", "top ", "map ",
}

// splitmix64 is a fast, well-mixed bijection: token i's word is splitmix64(stream seed + i).
func splitmix64(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9
	x = (x ^ (x >> 27)) * 0x94d049bb133111eb
	return x ^ (x >> 31)
}

// textSeed mixes the request's seed with its prompt so equal seeds on different prompts differ.
func textSeed(seed uint64, prompt []byte) uint64 {
	return splitmix64(seed ^ xxhash.Sum64(prompt))
}

// naturalLength is where a request's output ends on its own. The rule: 70% of requests run to
// maxTokens; the other 30% end after a uniform 1..maxTokens tokens (finishing "stop" when that
// is below maxTokens).
func naturalLength(seed uint64, maxTokens int) int {
	h := splitmix64(seed ^ 0x6e61747572616c) // "natural"
	if h%10 < 7 {
		return maxTokens
	}
	return 1 + int((h>>8)%uint64(maxTokens))
}

// word returns the text of generated token i.
func word(seed uint64, i int) string {
	return vocab[splitmix64(seed+uint64(i))%uint64(len(vocab))]
}

// output accumulates a sequence's generated text and decides what may be sent: text that could
// still be the start of a stop sequence is held back until it cannot be, so a stop string that
// spans tokens is caught and never sent.
type output struct {
	stops   []string
	maxStop int
	include bool // include_stop_str_in_output: a matched stop string is sent too
	text    strings.Builder
	sent    int // bytes of text already handed out
}

func newOutput(stops []string, include bool) *output {
	o := &output{include: include}
	for _, s := range stops {
		if s == "" {
			continue
		}
		o.stops = append(o.stops, s)
		o.maxStop = max(o.maxStop, len(s))
	}
	return o
}

// add appends a token's text. It returns the text now safe to send and whether a stop
// sequence matched (the returned text then ends just before it, or just after it when the
// stop string is included). The earliest stop in the text wins, whichever string it is: a
// complete match is held while an earlier one could still complete with the next tokens
// ("d f" begun before a matched " "). With check false (min_tokens not reached yet) stop
// sequences are not looked for and the text is sent at once.
func (o *output) add(tok string, check bool) (string, bool) {
	o.text.WriteString(tok)
	if len(o.stops) == 0 || !check {
		return o.flush(), false
	}
	all := o.text.String()
	cut, end, rank := o.match(all)
	hold := o.partial(all, cut, rank)
	if cut >= 0 && hold < 0 {
		return o.cut(all, cut, end), true
	}
	safe := len(all)
	if hold >= 0 {
		safe = hold
	}
	out := all[o.sent:safe]
	o.sent = safe
	return out, false
}

// finish ends the output: the earliest complete stop in the held text still ends it there.
func (o *output) finish() (string, bool) {
	all := o.text.String()
	if cut, end, _ := o.match(all); cut >= 0 && len(o.stops) > 0 {
		return o.cut(all, cut, end), true
	}
	return o.flush(), false
}

// match returns the earliest complete stop in the unsent text (on a tie, the first listed):
// its start, its end and its index in stops; cut is -1 without one.
func (o *output) match(all string) (cut, end, rank int) {
	cut = -1
	for k, s := range o.stops {
		if i := strings.Index(all[o.sent:], s); i >= 0 && (cut < 0 || o.sent+i < cut) {
			cut, end, rank = o.sent+i, o.sent+i+len(s), k
		}
	}
	return cut, end, rank
}

// partial returns where the earliest unfinished stop begins (a suffix of the text that is a
// proper prefix of a stop string) if it would win over a complete match at cut of stop rank
// (cut -1: any), else -1.
func (o *output) partial(all string, cut, rank int) int {
	for i := max(o.sent, len(all)-o.maxStop+1); i < len(all); i++ {
		if cut >= 0 && i > cut {
			return -1
		}
		for k, s := range o.stops {
			if len(s) > len(all)-i && strings.HasPrefix(s, all[i:]) && (cut < 0 || i < cut || k < rank) {
				return i
			}
		}
	}
	return -1
}

// cut hands out the text up to a match at [cut, end) and nothing after it.
func (o *output) cut(all string, cut, end int) string {
	if !o.include {
		end = cut
	}
	out := all[o.sent:end]
	o.sent = len(all)
	return out
}

// flush returns everything not yet sent.
func (o *output) flush() string {
	all := o.text.String()
	out := all[o.sent:]
	o.sent = len(all)
	return out
}
