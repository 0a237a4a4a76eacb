package sim

import (
	"strings"
	"testing"
)

// FuzzOutputStop checks the stop-sequence filter on arbitrary token texts and stop strings:
// what is sent is exactly the text before the first stop match (or all of it), whatever the
// token boundaries.
func FuzzOutputStop(f *testing.F) {
	f.Add("the and for you", "d f", "x", 4)
	f.Add("aaaaaaaa", "aa", "", 1)
	f.Add("hello world", "", "world", 3)
	f.Add("abcabcabd", "abd", "cab", 2)
	f.Fuzz(func(t *testing.T, text, stop1, stop2 string, piece int) {
		if piece < 1 || piece > 16 {
			piece = 4
		}
		o := newOutput([]string{stop1, stop2})
		var sent strings.Builder
		stopped := false
		for i := 0; i < len(text) && !stopped; i += piece {
			out, st := o.add(text[i:min(i+piece, len(text))])
			sent.WriteString(out)
			stopped = st
		}
		consumed := text
		if !stopped {
			sent.WriteString(o.flush())
		}
		want := consumed
		cut := -1
		for _, s := range []string{stop1, stop2} {
			if s == "" {
				continue
			}
			if i := strings.Index(text, s); i >= 0 && (cut < 0 || i < cut) {
				cut = i
			}
		}
		if cut >= 0 {
			want = text[:cut]
		}
		if stopped != (cut >= 0) {
			t.Fatalf("stopped = %v, but first match at %d in %q", stopped, cut, text)
		}
		if sent.String() != want {
			t.Fatalf("sent %q, want %q (text %q, stops %q %q, piece %d)", sent.String(), want, text, stop1, stop2, piece)
		}
	})
}

func TestVocabWordsAreOneToken(t *testing.T) {
	for _, w := range vocab {
		if len(w) != 4 {
			t.Errorf("vocab word %q is %d bytes, want 4", w, len(w))
		}
	}
}
