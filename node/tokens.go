package node

import (
	"math"

	"github.com/kvmesh/kvmesh/kvindex"
	"github.com/kvmesh/kvmesh/node/engine"
	"github.com/kvmesh/kvmesh/node/journey"
)

// promptTokens counts promptBytes of model's rendered prompt in its engines' tokens: with the
// figure this node's engine taught it, else the mean of the figures the model's other nodes
// publish (updateMeshTokens), else kvindex's 4-byte rule. An ingress that does not serve a
// model so counts it as the owner will, and fits its default TTFT target to it.
func (n *Node) promptTokens(model string, promptBytes int) int {
	if _, learned := n.tok.BytesPerToken(model); !learned {
		if mesh := n.meshTok.Load(); mesh != nil && (*mesh)[model] > 0 {
			return int(math.Ceil(float64(promptBytes) / (*mesh)[model]))
		}
	}
	return n.tok.Tokens(model, promptBytes)
}

// updateMeshTokens takes, once a second from the room loop, the mean bytes per token each
// model's other nodes publish (gossip ModelInfo.BytesPerToken), so a request's count reads a
// map instead of walking the members.
func (n *Node) updateMeshTokens() {
	if mean := n.mesh.BytesPerToken(); mean != nil {
		n.meshTok.Store(&mean)
	}
}

// newTokenCalibration is the node's per-model bytes-per-token figure, at its defaults.
func newTokenCalibration() *kvindex.Calibration {
	c, err := kvindex.NewCalibration(kvindex.DefaultCalibrationConfig())
	if err != nil {
		panic(err) // the defaults are valid
	}
	return c
}

// learnTokens learns model's bytes per token from a request this node's engine finished: the
// rendered prompt's bytes against the engine's usage.prompt_tokens. Only an external engine
// teaches it: the embedded one counts prompts with kvmesh's own 4-byte rule. A request relayed
// from a peer teaches the ingress nothing (the relay copies bytes and reads no usage); the
// owner that ran it learns, and its own re-check counts the prompt with what it learned. A
// prompt with images or audio teaches nothing: the engine's count holds what its encoders
// spent on them, which kvmesh only estimates, and would skew the text's figure.
func (n *Node) learnTokens(p *journey.Request, u *engine.Usage) {
	if n.ext == nil || u.PromptTokens <= 0 || p.PartTokens > 0 {
		return
	}
	if f, ok := n.tok.Observe(p.Adm.Model, len(p.Req.Prompt), u.PromptTokens); ok {
		n.m.BytesPerToken.WithLabelValues(p.Adm.Model).Set(f)
	}
}
