package route

import "time"

// Reservation is what this node dispatched to a peer and has not yet seen in the peer's
// state. Keep it to Release the request when it finishes or is refused.
type Reservation struct {
	ID            uint64
	Peer          string
	At            time.Time // dispatch time
	PrefillTokens int
	Blocks        int
}

type resEntry struct {
	id      uint64
	at      time.Time
	prefill int
	blocks  int
	held    bool // Hold: no record clears it
}

// peerRes holds one peer's live reservations, oldest first, and their sums.
type peerRes struct {
	entries []resEntry
	prefill int
	blocks  int
}

// HeldTTL bounds a Hold its Release never cleared: a minute, the waiting room's default TTL,
// over any prefill a request can wait for.
const HeldTTL = time.Minute

// reserved is the sum of live reservations on one peer.
type reserved struct {
	prefill, blocks, requests int
}

func (p *peerRes) removeAt(i int) {
	e := p.entries[i]
	p.prefill -= e.prefill
	p.blocks -= e.blocks
	p.entries = append(p.entries[:i], p.entries[i+1:]...)
}

// Reserve records that this node dispatched prefillTokens (the uncached part of the prompt)
// and blocks (the KV blocks the request will need) to peer at now. Until cleared, they count
// in that peer's busy check, load, free KV and predicted TTFT and TPOT, so the next request of a
// burst sees the peer as it will be, not as its last record said.
func (r *Router) Reserve(now time.Time, peer string, prefillTokens, blocks int) Reservation {
	return r.reserve(now, peer, prefillTokens, blocks, false)
}

// Hold reserves blocks on peer for the decode half of a split request while its prefill runs
// elsewhere: the half reaches peer only with the handover, so no record of peer reflects it
// before then and only Release (or HeldTTL) clears it.
func (r *Router) Hold(now time.Time, peer string, blocks int) Reservation {
	return r.reserve(now, peer, 0, blocks, true)
}

func (r *Router) reserve(now time.Time, peer string, prefillTokens, blocks int, held bool) Reservation {
	prefillTokens, blocks = max(prefillTokens, 0), max(blocks, 0)
	r.mu.Lock()
	defer r.mu.Unlock()
	r.nextID++
	res := Reservation{ID: r.nextID, Peer: peer, At: now, PrefillTokens: prefillTokens, Blocks: blocks}
	p := r.res[peer]
	if p == nil {
		p = &peerRes{}
		r.res[peer] = p
	}
	if len(p.entries) >= r.conf().MaxReservationsPerPeer {
		p.removeAt(0)
	}
	p.entries = append(p.entries, resEntry{id: res.ID, at: now, prefill: prefillTokens, blocks: blocks, held: held})
	p.prefill += prefillTokens
	p.blocks += blocks
	return res
}

// Observe tells the router that a state record of peer was received at received. Every
// reservation dispatched, and any refusal seen, at least ObserveMargin before received is taken
// to be included in that record and stops counting. Call it for the node's own state too when
// it is refreshed.
func (r *Router) Observe(peer string, received time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if ref, ok := r.refs[peer]; ok && !received.Before(ref.at.Add(onDur(r.conf().ObserveMargin))) {
		delete(r.refs, peer)
	}
	p := r.res[peer]
	if p == nil {
		return
	}
	for i := 0; i < len(p.entries); {
		if !p.entries[i].held && !received.Before(p.entries[i].at.Add(onDur(r.conf().ObserveMargin))) {
			p.removeAt(i)
			continue
		}
		i++
	}
	if len(p.entries) == 0 {
		delete(r.res, peer)
	}
}

// refusal is the last time a peer's owner turned down a request this node forwarded, and the
// highest priority it turned down since its last record.
type refusal struct {
	at       time.Time
	priority int
}

// Refused records that peer's owner turned down a request of priority at now: its exact state
// is busier than its last record says. Until a record received ObserveMargin after now (or
// until ReservationTTL), the peer is busy for requests of that priority and below, so the
// waiting room does not hand the next one to an owner that has just said no, over and over,
// on the strength of a record the refusal has already proved out of date.
func (r *Router) Refused(now time.Time, peer string, priority int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if old, ok := r.refs[peer]; ok && now.Before(old.at.Add(r.conf().ReservationTTL)) {
		priority = max(priority, old.priority)
	}
	r.refs[peer] = refusal{at: now, priority: priority}
}

// refusedLocked reports whether a refusal still marks peer busy for a request of priority.
func (r *Router) refusedLocked(now time.Time, peer string, priority int) bool {
	ref, ok := r.refs[peer]
	if !ok {
		return false
	}
	if !now.Before(ref.at.Add(r.conf().ReservationTTL)) {
		delete(r.refs, peer)
		return false
	}
	return priority <= ref.priority
}

// Release drops a reservation (request finished, refused or failed). It reports whether the
// reservation was still counting; releasing twice is harmless.
func (r *Router) Release(res Reservation) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	p := r.res[res.Peer]
	if p == nil {
		return false
	}
	for i := range p.entries {
		if p.entries[i].id == res.ID {
			p.removeAt(i)
			if len(p.entries) == 0 {
				delete(r.res, res.Peer)
			}
			return true
		}
	}
	return false
}

// Reserved returns the prefill tokens, blocks and requests reserved on peer at now.
func (r *Router) Reserved(now time.Time, peer string) (prefillTokens, blocks, requests int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	rv := r.reservedLocked(now, peer)
	return rv.prefill, rv.blocks, rv.requests
}

// reservedLocked expires reservations older than the TTL and returns the sums. It does not
// allocate.
func (r *Router) reservedLocked(now time.Time, peer string) reserved {
	p := r.res[peer]
	if p == nil {
		return reserved{}
	}
	for i := 0; i < len(p.entries); {
		ttl := r.conf().ReservationTTL
		if p.entries[i].held {
			ttl = HeldTTL
		}
		if !now.Before(p.entries[i].at.Add(ttl)) {
			p.removeAt(i)
			continue
		}
		i++
	}
	if len(p.entries) == 0 {
		delete(r.res, peer)
		return reserved{}
	}
	return reserved{prefill: p.prefill, blocks: p.blocks, requests: len(p.entries)}
}

// sessions is a bounded LRU of session → peer name.
type sessions struct {
	max        int
	m          map[string]*sessEntry
	head, tail *sessEntry // head is the most recent
}

type sessEntry struct {
	key, peer  string
	prev, next *sessEntry
}

func (s *sessions) unlink(e *sessEntry) {
	if e.prev != nil {
		e.prev.next = e.next
	} else {
		s.head = e.next
	}
	if e.next != nil {
		e.next.prev = e.prev
	} else {
		s.tail = e.prev
	}
	e.prev, e.next = nil, nil
}

func (s *sessions) pushFront(e *sessEntry) {
	e.next = s.head
	if s.head != nil {
		s.head.prev = e
	}
	s.head = e
	if s.tail == nil {
		s.tail = e
	}
}

func (s *sessions) get(key string) (string, bool) {
	e := s.m[key]
	if e == nil {
		return "", false
	}
	return e.peer, true
}

// put records key → peer as most recent; it allocates only for a new session.
func (s *sessions) put(key, peer string) {
	if s.max == 0 {
		return
	}
	if e := s.m[key]; e != nil {
		e.peer = peer
		if s.head != e {
			s.unlink(e)
			s.pushFront(e)
		}
		return
	}
	if len(s.m) >= s.max {
		old := s.tail
		s.unlink(old)
		delete(s.m, old.key)
	}
	e := &sessEntry{key: key, peer: peer}
	s.m[key] = e
	s.pushFront(e)
}

// Stick records that session's last request went to peer. Route already records its first
// candidate; call Stick when dispatch ended on another candidate.
func (r *Router) Stick(session, peer string) {
	if session == "" {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.sess.put(session, peer)
}

// SessionPeer returns the peer session last went to, if remembered.
func (r *Router) SessionPeer(session string) (string, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.sess.get(session)
}
