package node_test

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/internal/poll"
	"github.com/kvmesh/kvmesh/kvindex"
	"github.com/kvmesh/kvmesh/node"
	"github.com/kvmesh/kvmesh/node/engine/sim"
)

// imageQuestion is an image conversation's first question, too short to fill a KV block by
// itself: only the images give the first turn's prompt blocks of its own.
func imageQuestion(conv int) string { return fmt.Sprintf("Pictures %d: what differs?", conv) }

// pictures is a conversation's two images: 48 KiB of bytes each, distinct per conversation.
func pictures(conv int) [2]string {
	var out [2]string
	for k := range out {
		b := make([]byte, 48<<10)
		r := rand.New(rand.NewPCG(uint64(conv), uint64(k)))
		for i := range b {
			b[i] = byte(r.Uint32())
		}
		out[k] = base64.StdEncoding.EncodeToString(b)
	}
	return out
}

// imageTurn is a chat conversation's first user turn: the question, then the images as data
// URIs.
func imageTurn(conv int, imgs [2]string) map[string]any {
	parts := []any{map[string]any{"type": "text", "text": imageQuestion(conv)}}
	for _, img := range imgs {
		parts = append(parts, map[string]any{"type": "image_url", "image_url": map[string]string{"url": "data:image/png;base64," + img}})
	}
	return map[string]any{"role": "user", "content": parts}
}

// imageChain is the block chain of an image conversation's first turn.
func imageChain(conv int, imgs [2]string) []uint64 {
	m := kvindex.Message{Role: "user", Content: imageQuestion(conv)}
	for _, img := range imgs {
		m.Parts = append(m.Parts, kvindex.Part{At: len(m.Content), ID: kvindex.PartID("data:image/png;base64," + img),
			Tokens: kvindex.ImageTokensDefault})
	}
	return kvindex.AppendBlocks(nil, model, kvindex.RenderChat(nil, []kvindex.Message{m}), kvindex.DefaultBlockTokens)
}

// secondTurnMessages is a conversation's second turn as the Messages API sends it: the images
// as base64 blocks, the reply, a new question.
func secondTurnMessages(conv int, imgs [2]string, reply string) string {
	blocks := []any{map[string]any{"type": "text", "text": imageQuestion(conv)}}
	for _, img := range imgs {
		blocks = append(blocks, map[string]any{"type": "image",
			"source": map[string]string{"type": "base64", "media_type": "image/png", "data": img}})
	}
	b, _ := json.Marshal(map[string]any{"model": model, "max_tokens": 4, "messages": []any{
		map[string]any{"role": "user", "content": blocks},
		map[string]any{"role": "assistant", "content": reply},
		map[string]any{"role": "user", "content": "And which is brighter?"},
	}})
	return string(b)
}

// TestImageConversationSecondTurnFollowsItsOwner pins images in the prefix: six conversations
// about two large images each, with a short question, the first turn sent to one node, the
// second (first turn, reply, new question) through another that is not the first turn's
// owner: every second turn runs on its owner and finds the images' tokens cached. The odd
// conversations send the second turn through the Messages API, whose image blocks route as
// the chat image parts they translate to. With images outside the prefix chain, second turns
// ran where load sent them, with nothing cached past the text.
func TestImageConversationSecondTurnFollowsItsOwner(t *testing.T) {
	tn := startNet(t, 3, nil)
	urls := tn.URLs()
	const conversations = 6
	const imageTokens = 2 * kvindex.ImageTokensDefault
	for c := range conversations {
		imgs := pictures(c)
		first := map[string]any{"model": model, "max_tokens": 8, "messages": []any{imageTurn(c, imgs)}}
		body, _ := json.Marshal(first)
		resp := post(t, urls[c%3], "/v1/chat/completions", string(body), nil)
		b := readAll(t, resp)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("conversation %d, first turn: %d %s", c, resp.StatusCode, b)
		}
		owner := resp.Header.Get(node.HeaderNode)
		var ans struct {
			Choices []struct {
				Message struct{ Content string } `json:"message"`
			} `json:"choices"`
			Usage usage `json:"usage"`
		}
		if err := json.Unmarshal(b, &ans); err != nil || len(ans.Choices) != 1 {
			t.Fatalf("conversation %d, first turn: %v %s", c, err, b)
		}
		if ans.Usage.PromptTokens < imageTokens {
			t.Errorf("conversation %d: %d prompt tokens, want its images' %d and its text", c, ans.Usage.PromptTokens, imageTokens)
		}
		// The second turn enters at a node that is neither the owner nor the first ingress
		// when they differ: only gossip can have told it where the images are.
		o := indexOf(t, tn, owner)
		ingress := (o + 1) % 3
		if ingress == c%3 {
			ingress = (o + 2) % 3
		}
		chain := imageChain(c, imgs)
		poll.Until(t, 5*time.Second, "the images' prefix to reach the ingress", func() bool {
			return tn.Nodes[ingress].PrefixOf(owner, chain) >= 64
		})
		reply := ans.Choices[0].Message.Content
		ran, cached := secondImageTurn(t, urls[ingress], c, imgs, reply)
		if ran != owner || cached < imageTokens {
			t.Errorf("conversation %d: the second turn ran on %s with %d tokens cached, want the owner %s and its images' %d",
				c, ran, cached, owner, imageTokens)
		}
	}
}

// secondImageTurn sends conversation conv's second turn to url, through the Messages API for
// odd conversations, and returns the node that ran it and its cached tokens.
func secondImageTurn(t *testing.T, url string, conv int, imgs [2]string, reply string) (string, int) {
	t.Helper()
	if conv%2 == 1 {
		a, ran := messagesJSON(t, url, secondTurnMessages(conv, imgs, reply), nil)
		if a.Usage.CacheRead == nil {
			return ran, 0
		}
		return ran, *a.Usage.CacheRead
	}
	body, _ := json.Marshal(map[string]any{"model": model, "max_tokens": 4, "messages": []any{
		imageTurn(conv, imgs),
		map[string]any{"role": "assistant", "content": reply},
		map[string]any{"role": "user", "content": "And which is brighter?"},
	}})
	resp := post(t, url, "/v1/chat/completions", string(body), nil)
	b := readAll(t, resp)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("second turn: %d %s", resp.StatusCode, b)
	}
	return resp.Header.Get(node.HeaderNode), decodeUsage(t, b).PromptTokensDetails.CachedTokens
}

// imagesByURL is a chat body asking about n images named by URL: a small body whose prompt
// is n image estimates long.
func imagesByURL(n int) string {
	parts := []any{map[string]any{"type": "text", "text": imageQuestion(0)}}
	for i := range n {
		parts = append(parts, map[string]any{"type": "image_url", "image_url": map[string]string{"url": fmt.Sprintf("https://example.com/%d.png", i)}})
	}
	b, _ := json.Marshal(map[string]any{"model": model, "max_tokens": 4, "messages": []any{map[string]any{"role": "user", "content": parts}}})
	return string(b)
}

// TestImagesCountInTheBudget pins that an image counts at its estimate, whatever its bytes: a
// question about three images named by URL (a body of a few hundred bytes) reports their
// tokens, one about as many images as the model's context holds is refused as too long for
// it (one about twice as many before its prompt is rendered), and the Messages API's
// count_tokens counts an image block's estimate.
func TestImagesCountInTheBudget(t *testing.T) {
	ctx := sim.DefaultConfig().Models[0].ContextTokens
	url := startNet(t, 1, nil).URLs()[0]
	resp := post(t, url, "/v1/chat/completions", imagesByURL(3), nil)
	b := readAll(t, resp)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("three images: %d %s", resp.StatusCode, b)
	}
	if u := decodeUsage(t, b); u.PromptTokens < 3*kvindex.ImageTokensDefault || u.PromptTokens > 3*kvindex.ImageTokensDefault+30 {
		t.Errorf("three images: %d prompt tokens, want their %d and a short question's", u.PromptTokens, 3*kvindex.ImageTokensDefault)
	}
	checkRefusal(t, post(t, url, "/v1/chat/completions", imagesByURL(ctx/kvindex.ImageTokensDefault), nil), http.StatusBadRequest,
		"context_length_exceeded", "messages", []string{fmt.Sprintf("context is %d tokens", ctx)})
	// Images past the context by themselves are refused before the prompt is rendered.
	checkRefusal(t, post(t, url, "/v1/chat/completions", imagesByURL(2*ctx/kvindex.ImageTokensDefault), nil), http.StatusBadRequest,
		"context_length_exceeded", "messages", []string{"images and audio alone count", fmt.Sprintf("context is %d tokens", ctx)})

	count := func(blocks []any) int {
		b, _ := json.Marshal(map[string]any{"model": model, "messages": []any{map[string]any{"role": "user", "content": blocks}}})
		resp := post(t, url, "/v1/messages/count_tokens", string(b), nil)
		body := readAll(t, resp)
		var c struct {
			InputTokens int `json:"input_tokens"`
		}
		if err := json.Unmarshal(body, &c); err != nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("count_tokens: %d %s", resp.StatusCode, body)
		}
		return c.InputTokens
	}
	text := map[string]any{"type": "text", "text": imageQuestion(0)}
	image := map[string]any{"type": "image", "source": map[string]string{"type": "url", "url": "https://example.com/a.png"}}
	if without, with := count([]any{text}), count([]any{text, image}); with != without+kvindex.ImageTokensDefault {
		t.Errorf("count_tokens: %d with an image, %d without, want %d more", with, without, kvindex.ImageTokensDefault)
	}
}
