package node

import (
	"github.com/kvmesh/kvmesh/kvindex"
	"github.com/kvmesh/kvmesh/node/engine"
)

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
// owner that ran it learns, and its own re-check counts the prompt with what it learned.
func (n *Node) learnTokens(p *prepared, u *engine.Usage) {
	if n.ext == nil || u.PromptTokens <= 0 {
		return
	}
	if f, ok := n.tok.Observe(p.adm.Model, len(p.req.Prompt), u.PromptTokens); ok {
		n.m.bytesPerToken.WithLabelValues(p.adm.Model).Set(f)
	}
}
