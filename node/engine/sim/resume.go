package sim

import "github.com/kvmesh/kvmesh/node/engine"

// A resumed request (engine.Request.Resume) continues a generation another engine began and
// lost. Its words come from the original's text seed (the original Seed and PromptHash, not
// the continuation's prompt), its cap and natural length from the original's MaxTokens
// (MaxTokens + Resume.Tokens), and its output from the original's stop filter as it stood
// when the last chunk the client received was sent: replay regenerates the first tokens
// through the filter, unsent, until the filter has handed out Resume.Bytes, which is where an
// unbroken run stood at that moment (a chunk goes out at each token that frees text). The
// tokens after that are generated and sent as the unbroken run would have, held text
// included, so the continuation's text is exactly the rest of the unbroken run's.

// resumeSeed is the text seed of the generation r continues: textSeed of the original
// request's seed and prompt.
func resumeSeed(r *engine.Resume) uint64 { return splitmix64(r.Seed ^ r.PromptHash) }

// replay feeds the first words of tseed's text through out (minTokens as in completeLocked)
// until out has handed out sent bytes, and returns how many words it fed: the tokens the
// original generation had made when it sent them. It stops before limit words, so the
// continuation has at least its last token left to generate (and finish on). A sent that is
// not where one of the original's chunks ended (text from another engine) gives a
// continuation that is deterministic but not that text's.
func replay(out *output, tseed uint64, sent, minTokens, limit int) int {
	g := 0
	for ; g < limit && out.sent < sent; g++ {
		out.add(word(tseed, g), g+1 >= minTokens)
	}
	return g
}
