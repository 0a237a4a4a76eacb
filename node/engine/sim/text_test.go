package sim

import (
	"strings"
	"testing"
)

// FuzzOutputStop checks the stop-sequence filter on arbitrary token texts and stop strings:
// what is sent is exactly the text before the first stop match, or through it with include
// (include_stop_str_in_output), or all of it, whatever the token boundaries.
func FuzzOutputStop(f *testing.F) {
	f.Add("the and for you", "d f", "x", 4, false)
	f.Add("aaaaaaaa", "aa", "", 1, true)
	f.Add("hello world", "", "world", 3, false)
	f.Add("abcabcabd", "abd", "cab", 2, true)
	f.Add("00d f", "d f", " ", 4, false) // a later-listed stop matched first must not cut an earlier one
	f.Fuzz(func(t *testing.T, text, stop1, stop2 string, piece int, include bool) {
		if piece < 1 || piece > 16 {
			piece = 4
		}
		o := newOutput([]string{stop1, stop2}, include)
		var sent strings.Builder
		stopped := false
		for i := 0; i < len(text) && !stopped; i += piece {
			out, st := o.add(text[i:min(i+piece, len(text))], true)
			sent.WriteString(out)
			stopped = st
		}
		if !stopped {
			rest, hit := o.finish()
			sent.WriteString(rest)
			stopped = hit
		}
		want := text
		cut := -1
		for _, s := range []string{stop1, stop2} {
			if s == "" {
				continue
			}
			if i := strings.Index(text, s); i >= 0 && (cut < 0 || i < cut) {
				cut = i
				if include {
					want = text[:i+len(s)]
				} else {
					want = text[:i]
				}
			}
		}
		if stopped != (cut >= 0) {
			t.Fatalf("stopped = %v, but first match at %d in %q", stopped, cut, text)
		}
		if sent.String() != want {
			t.Fatalf("sent %q, want %q (text %q, stops %q %q, piece %d)", sent.String(), want, text, stop1, stop2, piece)
		}
	})
}

// TestOutputMinTokens: before min_tokens, a stop string is not looked for; after, it is.
func TestOutputMinTokens(t *testing.T) {
	o := newOutput([]string{"and"}, false)
	var sent strings.Builder
	for i, tok := range []string{"and ", "for ", "and "} {
		out, stopped := o.add(tok, i >= 2)
		sent.WriteString(out)
		if stopped != (i == 2) {
			t.Fatalf("token %d: stopped %v", i, stopped)
		}
	}
	if sent.String() != "and for " {
		t.Errorf("sent %q, want %q", sent.String(), "and for ")
	}
}

func TestVocabWordsAreOneToken(t *testing.T) {
	for _, w := range vocab {
		if len(w) != 4 {
			t.Errorf("vocab word %q is %d bytes, want 4", w, len(w))
		}
	}
}
