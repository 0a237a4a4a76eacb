package route

import "slices"

// part is what a search asks of a peer: to run a request whole, or one half of a split one.
type part uint8

const (
	partWhole   part = iota // Route's candidates
	partLocal               // a decode peer running a request whole (PairSearch.Local)
	partPrefill             // the prefill half (PairSearch.Prefill)
	partDecode              // the decode half (PairSearch.Decode)
)

// filter is routing's filters of a peer on its own record, in order, for part pt of req, which needs need bytes of VRAM (0: unknown) on one of vendors (empty: any): model,
// staleness, health, ejection and capability (runs, for the role). It returns whether p
// passes, and if not the reason of the first filter that drops it. Every search runs it: Route
// for its candidates and PairSearch for each of its three. The filters that weigh a peer
// against the others run after it, in every search too: the power cap and the thermal limit
// (limit, dropLimited). Only the busy test, which asks what each part costs the peer, is each
// search's own.
func filter(cfg *Config, pt part, req *Request, p *Peer, need uint64, vendors []string) (Reason, bool) {
	switch {
	case !req.Serves(p):
		return ReasonModel, false
	case !p.Self && (p.Stale || p.Age > max(cfg.MaxAge, p.MaxAge)) && cfg.StalePolicy == StaleClosed:
		return ReasonStale, false
	case !p.Healthy:
		return ReasonUnhealthy, false
	case p.Ejected:
		return ReasonEjected, false
	case need > 0 && p.VRAMTotalBytes > 0 && need > p.VRAMTotalBytes,
		len(vendors) > 0 && !slices.Contains(vendors, p.Vendor), !runs(cfg, pt, p):
		return ReasonCapability, false
	}
	return 0, true
}

// runs reports whether p's role runs part pt, which is the capability filter's role check. A
// request whole runs on a peer of a role Config.Roles allows (RolesAllow), never on a prefill
// or decode peer, but for partLocal, a decode peer only. A half runs on a peer of its role or a
// mixed one that Config.Roles allows, never on a WholeOnly peer.
func runs(cfg *Config, pt part, p *Peer) bool {
	switch pt {
	case partLocal:
		return p.Role == RoleDecode && RolesAllow(cfg.Roles, p.Role)
	case partPrefill, partDecode:
		half := RolePrefill
		if pt == partDecode {
			half = RoleDecode
		}
		return !p.WholeOnly && (p.Role == half || IsMixed(p.Role) && RolesAllow(cfg.Roles, p.Role))
	}
	return !IsHalf(p.Role) && RolesAllow(cfg.Roles, p.Role)
}

// limit marks c, p's candidate, over its power cap (unless the power cap filter is off) and at
// or above the thermal hard limit, for dropLimited.
func limit(cfg *Config, c *Candidate, p *Peer) {
	c.overCap = !cfg.DisablePowerCapFilter && p.PowerCapWatts > 0 && p.PowerWatts >= cfg.PowerCapFraction*p.PowerCapWatts
	c.tooHot = p.TempC >= cfg.ThermalHardC
}

// dropLimited drops from dst the candidates limit marked, power before thermal: one over its
// power cap only when a candidate under its cap and cool will remain, one too hot always. It
// counts them in counts and returns dst shortened, in its order.
func dropLimited(dst []Candidate, counts *FilterCounts) []Candidate {
	anyCool, anyLimited := false, false
	for i := range dst {
		if dst[i].overCap || dst[i].tooHot {
			anyLimited = true
		} else {
			anyCool = true
		}
	}
	if !anyLimited {
		return dst
	}
	n := 0
	for i := range dst {
		switch c := &dst[i]; {
		case c.overCap && anyCool:
			counts[ReasonPowerCap]++
		case c.tooHot:
			counts[ReasonThermal]++
		default:
			if n != i {
				dst[n] = *c
			}
			n++
		}
	}
	return dst[:n]
}
