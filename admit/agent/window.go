package agent

import (
	"container/list"
	"slices"
	"time"
)

func (a *Registry) homeLocked(name string) *home {
	h := a.homes[name]
	if h == nil {
		// The config was validated in New, so this cannot fail.
		ctl, _ := NewController(a.cfg.Controller)
		h = &home{ctl: ctl}
		a.homes[name] = h
	}
	return h
}

// growLocked records that e's new step has a prompt of prompt tokens. A step that asks again
// (a held step retried) has the prompt it had and is no sample; a shorter prompt (the client
// cut its context) starts over from it.
func (a *Registry) growLocked(e *entry, prompt int) {
	if e.prompt > 0 && prompt > e.prompt {
		g := float64(prompt - e.prompt)
		if a.grown {
			a.growth += growthWeight * (g - a.growth)
		} else {
			a.growth, a.grown = g, true
		}
	}
	e.prompt = prompt
}

// learnFootprintLocked takes e, an agent that ended, into the moving averages the agents'
// footprint is made of: its step-end contexts summed, and its steps. Their ratio is the mean
// context an agent holds, weighted by steps, so that a long session, which holds more KV for
// longer, counts for more. Only an agent that ended is a sample: one still running has its
// larger contexts ahead.
func (a *Registry) learnFootprintLocked(e *entry) {
	if e.Steps == 0 {
		return
	}
	if a.ended == 0 {
		a.heldAvg, a.stepsAvg = float64(e.held), float64(e.Steps)
	} else {
		a.heldAvg += growthWeight * (float64(e.held) - a.heldAvg)
		a.stepsAvg += growthWeight * (float64(e.Steps) - a.stepsAvg)
	}
	a.ended++
}

// footprintLocked is the agents' footprint in tokens (see Stats.FootprintTokens), 0 unknown.
func (a *Registry) footprintLocked() float64 {
	if a.stepsAvg <= 0 {
		return 0
	}
	return a.heldAvg / a.stepsAvg
}

// shareLocked is the share of the KV pool e needs at its next step: its context plus one
// step's growth (0 when the pool's size is not known yet).
func (a *Registry) shareLocked(e *entry) float64 {
	if a.pool <= 0 {
		return 0
	}
	return (float64(e.ContextTokens) + a.growth) / a.pool
}

func (a *Registry) touchLocked(e *entry, now time.Time) {
	e.LastStep = now
	a.lru.MoveToBack(e.lru)
	if e.State == Active {
		a.homes[e.Home].active.MoveToBack(e.slot)
	}
}

func (a *Registry) setInflightLocked(e *entry, n int) {
	switch {
	case e.inflight == 0 && n > 0:
		a.inStep++
	case e.inflight > 0 && n == 0:
		a.inStep--
	}
	e.inflight, e.InStep = n, n > 0
}

// setStateLocked moves e to state s, at the back of s's list in its home.
func (a *Registry) setStateLocked(h *home, e *entry, s State, now time.Time) {
	if e.slot != nil {
		h.listOf(e.State).Remove(e.slot)
		e.slot = nil
	}
	e.State = s
	e.PausedAt = time.Time{}
	e.granted = false
	if s != Active {
		e.kept = false
	}
	if s == Paused {
		e.PausedAt = now
		if e.ready {
			// Resumed and paused again before the node took its held step: it still waits.
			e.ready, e.Pending = false, true
		}
	}
	if l := h.listOf(s); l != nil {
		e.slot = l.PushBack(e)
	}
}

// enforceLocked pauses the idle-longest active agents that are between steps until the home
// is back within its window. Agents mid-step are skipped: their StepDone calls this again.
func (a *Registry) enforceLocked(h *home, now time.Time) {
	w := h.ctl.Window()
	for h.active.Len() > w {
		var victim *entry
		for el := h.active.Front(); el != nil; el = el.Next() {
			if e := el.Value.(*entry); !e.InStep {
				victim = e
				break
			}
		}
		if victim == nil {
			return
		}
		a.setStateLocked(h, victim, Paused, now)
		a.pauses++
	}
}

// fillLocked gives free slots to paused agents, longest paused first, then to waiting ones.
func (a *Registry) fillLocked(h *home, now time.Time) {
	w := h.ctl.Window()
	for h.active.Len() < w {
		var el *list.Element
		if el = h.paused.Front(); el != nil {
			a.resumes++
		} else if el = h.waiting.Front(); el != nil {
			a.admitted++
		} else {
			return
		}
		e := el.Value.(*entry)
		a.setStateLocked(h, e, Active, now)
		h.ctl.Joined(a.shareLocked(e))
		e.granted = e.Pending
		if e.Pending {
			e.Pending = false
			if !e.ready {
				e.ready = true
				a.ready = append(a.ready, e.ID)
				a.compactReadyLocked()
			}
		}
	}
}

// victimLocked is the agent idle longest that is not mid-step, or nil.
func (a *Registry) victimLocked() *entry {
	for el := a.lru.Front(); el != nil; el = el.Next() {
		if e := el.Value.(*entry); !e.InStep {
			return e
		}
	}
	return nil
}

func (a *Registry) removeLocked(e *entry, now time.Time) {
	h := a.homes[e.Home]
	wasActive := e.State == Active
	a.removeLockedFrom(h.listOf(e.State), e)
	if wasActive {
		h.ctl.Left(h.active.Len(), a.shareLocked(e))
		a.fillLocked(h, now)
	}
}

// removeLockedFrom takes e out of the registry and its home list l, without refilling.
func (a *Registry) removeLockedFrom(l *list.List, e *entry) {
	a.setInflightLocked(e, 0)
	l.Remove(e.slot)
	e.slot = nil
	a.lru.Remove(e.lru)
	delete(a.agents, e.ID)
	e.ready = false
}

// compactReadyLocked drops stale ids (agents removed or paused since) once the list is
// long, so a node that rarely calls Resumable cannot grow it without bound.
func (a *Registry) compactReadyLocked() {
	if len(a.ready) < 2*a.cfg.MaxAgents+16 {
		return
	}
	a.ready = slices.DeleteFunc(a.ready, func(id string) bool {
		e := a.agents[id]
		return e == nil || !e.ready
	})
}
