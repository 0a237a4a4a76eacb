package node

import (
	"context"
	"fmt"

	"time"

	"github.com/kvmesh/kvmesh/admit/agent"
	"github.com/kvmesh/kvmesh/admit/route"
	"github.com/kvmesh/kvmesh/node/agentgate"
	"github.com/kvmesh/kvmesh/node/api"
	"github.com/kvmesh/kvmesh/node/journey"
	"github.com/kvmesh/kvmesh/node/metrics"
	"github.com/kvmesh/kvmesh/node/nodeconfig"
)

// CodeAgentPaused is an owner's refusal of an agent step whose agent is outside its window
// (paused, or new and waiting for a slot). The ingress holds the step and retries it at the
// same owner; the client never sees this code unless the step's queue TTL runs out.
const CodeAgentPaused = journey.CodeAgentPaused

// DefaultAgentInterval is the agent window's control interval when Config.AgentInterval is 0.
const DefaultAgentInterval = nodeconfig.DefaultAgentInterval

// HeaderAgentFinal, set to 1 on an agent's last step, ends the agent at its home once that
// step is done, so its window slot goes to the next agent at once instead of after the idle
// timeout.
const HeaderAgentFinal = api.HeaderAgentFinal

// buildAgents sets up agent admission when cfg.Agents is set. It does no I/O.
func (n *Node) buildAgents() error {
	if n.cfg.AgentInterval <= 0 {
		n.cfg.AgentInterval = DefaultAgentInterval
	}
	if n.cfg.Agents == nil {
		return nil
	}
	reg, err := agent.New(*n.cfg.Agents)
	if err != nil {
		return fmt.Errorf("node: %w", err)
	}
	home, err := agent.NewHome(agent.HomeConfig{Name: n.cfg.Name, Interval: n.cfg.AgentInterval,
		LeaseIntervals: n.cfg.AgentLeaseIntervals, Key: route.AgentKey, Preferred: route.PreferredHome}, reg)
	if err != nil {
		return fmt.Errorf("node: %w", err)
	}
	var demote func([]uint64) int
	if n.sim != nil {
		demote = n.sim.Demote
	}
	n.agents = agentgate.New(home, demote)
	n.reg.MustRegister(metrics.NewAgentCollector(n.agents, n.cfg.Name))
	return nil
}

// runAgents is the window's control loop: an agentTick every AgentInterval.
func (n *Node) runAgents(ctx context.Context) {
	defer n.agents.Stop()
	ticking(ctx, n.cfg.AgentInterval, func() { n.agentTick(time.Now()) })
}

// agentTick is one control interval of the window, fed the engine's state and the agents
// peers are home to.
func (n *Node) agentTick(now time.Time) {
	st := n.eng.State()
	n.agents.Tick(now, agent.Engine{KVBlocksTotal: st.KVBlocksTotal, KVBlocksUsed: st.KVBlocksUsed,
		BlockTokens: st.BlockTokens}, n.agentsAdvertised())
}

// agentsAdvertised returns, by route.AgentKey, the healthy peers that advertise being home to
// an agent (meshview.Mesh.AgentsAdvertised), or nil when none does.
func (n *Node) agentsAdvertised() map[uint64][]string { return n.mesh.AgentsAdvertised() }
