// Package agent is agent-level admission: for agentic workloads the unit of admission is the
// agent (a loop of generate, call a tool, generate again with a longer context), not the
// request. Each home node (the node whose KV cache holds an agent's prefix) has a window W of
// active agents. An active agent's steps are admitted without new admission cost and routed
// home, and its prefix stays cached while it waits for a tool; agents beyond the window wait,
// so the prefixes of the agents that are running stay cached instead of being evicted by
// newcomers and recomputed when their owners return from a tool call (middle-phase
// thrashing).
//
// # The window rule
//
// Controller regulates W by AIMD from two engine signals sampled once per control interval,
// KV use U and prefix hit rate H (both 0..1), and one learned figure, the agents' footprint F:
// the mean context an agent holds at the ends of its steps (weighted by steps), as a share of
// the pool, learned from the agents that ended. The rule has two phases. Until F is known
// (until as many agents have ended as F would let into the window: the first to end are the
// shortest sessions, with the smallest contexts):
//
//   - increase W by Alpha (1) while the KV use predicted SlowStartSteps (4) steps ahead, U
//     plus that many steps of the active agents' growth (the growth of one step is Next - U;
//     U when Next is not given), is under TargetU (0.8) and the agents wanting a slot fill W:
//     every active agent comes back longer, so a window sized on the contexts of now
//     overflows the pool a few steps later, and the way back, a cut, pauses agents whose
//     prefixes are then lost;
//   - multiply W by Beta (0.7) when U >= HighU (0.9) and H is falling, that is H is below the
//     EWMA of earlier samples (weight HitWeight 0.2) by more than HitMargin (0.05), or H is
//     under HitFloor (0.5): KV full while hits collapse, or stay collapsed, is thrashing;
//   - decrease by attrition: an agent that leaves the window (finished or gone) while Next,
//     less what that agent needed, is at or above HighU takes its slot with it
//     (Controller.Left), so the window follows the active agents down without pausing any;
//   - slow start (SlowStartSteps 4): until the first tick at which that use ahead reaches
//     TargetU (every decrease is such a tick), an increase adds not Alpha but the agents the
//     headroom holds at the use per agent it predicts, capped at doubling and at the agents
//     that want a slot, and at least Alpha (Alpha alone before any growth is predicted).
//
// Once F is known, the window has a ceiling, floor(HighU / F) agents (ControllerStats.Cap):
//
//   - increase by Alpha (or slow start's step) while W is under the ceiling and the agents
//     wanting a slot fill W;
//   - multiply W by Beta when U >= HighU and the EWMA of H is under HitFloor;
//   - decrease by attrition while W is above the ceiling (F grew): a leaving agent takes its
//     slot with it.
//
// In both phases: hold otherwise; hold for CooldownTicks (1) ticks after a decrease, because U
// falls only as the paused agents' prefixes age out, about an interval after the cut; clamp to
// [MinWindow, MaxWindow] (1, 512); a new home starts at InitialWindow (8).
//
// With constant U, H and F the window only moves one way (the EWMA equals H, so H never falls,
// and H is either under the floor or not) and settles at a bound, the ceiling, or holds, so a
// constant load cannot make it oscillate. Why each rule has its shape (the additive probe, the
// multiplicative cut, slow start's horizon, the ceiling from the footprint, H's average once
// the ceiling is known) is in docs/design/agents.md.
//
// The package does not say where U and H come from. The node feeds it signals that see
// thrashing with any engine: U is the share of the KV pool the window needs (the engine's KV
// use by running sequences plus the blocks of the active agents' prefixes that no running
// sequence holds), Next adds to it each active agent's growth per step (Stats.GrowthTokens,
// a moving average of how much an agent's prompt grows from one step to the next), and H is
// the share of the agents' earlier context served from the prefix cache over the last
// interval (from the cached-token counts the engine reports per request). The Registry learns
// F itself (Stats.FootprintTokens over the pool's size, Signals.PoolTokens) and moves Next
// between ticks by the share of each agent that leaves or enters the window.
//
// # Step boundaries
//
// The node calls Arrive when an agent's step arrives and StepDone when it ends; these are the
// only points at which an agent changes state, so no generation is ever interrupted. When W
// shrinks below the active count, Tick pauses the active agents idle longest among those
// between steps; agents mid-step are paused at their StepDone if the home is still over its
// window. A paused agent's next step gets Wait, never an error. When room appears (W grew, an
// agent finished, left or was swept) paused agents resume longest paused first, then waiting
// new agents in arrival order; Resumable lists those with a held step, and the node calls
// Arrive again for each, which admits it.
//
// # Bounds
//
// The registry holds at most MaxAgents agents; a new agent beyond that evicts the agent idle
// longest that is not mid-step (ErrFull when all are). Sweep removes agents silent past
// IdleTimeout and agents whose StepDone never came within StepTimeout. Abandon removes an agent
// whose held step left without running (a waiting, paused or just-resumed agent would
// otherwise keep its place or slot for a step that is not coming). Finish removes an agent
// whose last step is done. Release removes an agent, unless mid-step, that another home keeps
// (the node registered it twice before gossip said where it lives). ForgetHome drops a
// node that left the mesh with its agents. Homes are node names, so their number is bounded
// by the membership.
//
// # Concurrency
//
// Registry is safe for concurrent use; one mutex guards it and no method blocks or starts a
// goroutine. Controller is not safe for concurrent use on its own. The package is pure: time
// is passed in, it does no I/O.
//
// # Zero value
//
// The zero Registry and Controller are not usable; build them with New and NewController. A
// zero Config or ControllerConfig field takes its default, so Config{} is DefaultConfig().
package agent
