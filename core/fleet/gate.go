// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package fleet

import (
	"container/list"
	"context"
	"net"
	"sort"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
)

// The cluster listener is open to the network (0.0.0.0:8444 by default):
// anyone who reaches it can connect and start a TLS handshake. What a peer
// holds before it has shown a certificate of this cluster's CA is bounded
// here, so that a flood of connections that never finish their handshake
// (300 idle TCP connections blocked every join, link, relay and renewal on
// main before this gate) costs bounded goroutines and cuts no host off:
//
//   - A handshake has handshakeDeadline to finish (TLS 1.3 needs one round
//     trip; three seconds is generous across continents).
//   - One address holds at most gateLimits.perAddress handshakes and join
//     conversations at a time; more are closed at once.
//   - Addresses no certificate was verified from lately (strangers) share
//     gateLimits.strangers slots. When they are all taken, a new
//     connection closes the oldest stranger's slot instead of being turned
//     away: an idle flood then only ever holds the newest connections, and a
//     host that joins finishes its handshake in milliseconds, long before
//     a flood's next few hundred connections would push it out.
//   - Addresses a host's or server's certificate was verified from within
//     gateLimits.knownFor (the cluster's own machines: hosts linking again,
//     relays, renewals, server-to-server calls) draw on a pool of their own
//     that strangers never take, so an established host keeps its link,
//     relay and renewals whatever strangers do.
//
// A slot is held for the handshake and, for a conversation without a
// client certificate (a join), until its connection closes; a connection
// with a verified certificate gives its slot back once its handshake is
// done: its traffic is outside the gate.

// handshakeDeadline bounds a cluster handshake.
const handshakeDeadline = 3 * time.Second

// gateLimits bound the cluster listener's unverified connections.
type gateLimits struct {
	// strangers are the slots of addresses not known, all together.
	strangers int
	// known are the slots of known addresses, all together.
	known int
	// perAddress and perKnownAddress bound one address's slots.
	perAddress, perKnownAddress int
	// knownFor is how long an address stays known after the last
	// certificate verified from it.
	knownFor time.Duration
}

// defaultGateLimits are the cluster listener's bounds.
var defaultGateLimits = gateLimits{strangers: 256, known: 128, perAddress: 8, perKnownAddress: 64, knownFor: time.Hour}

// Reasons a connection is refused or cut, as the refusal log counts them.
const (
	refusedPerAddress = "handshakes_per_address"
	refusedKnownFull  = "known_pool_full"
	evictedOldest     = "oldest_stranger_evicted"
	refusedHandshake  = "handshake_failed"
	refusedUnknown    = "relay_from_unknown_host"
)

// handshakeGate hands out the slots (see the top of the file).
type handshakeGate struct {
	limits gateLimits
	now    func() time.Time

	mu        sync.Mutex
	perAddr   map[string]int
	strangers int
	known     int
	pending   list.List            // the strangers' slots, oldest first
	verified  map[string]time.Time // address -> last certificate verified from it
}

func newHandshakeGate(l gateLimits) *handshakeGate {
	return &handshakeGate{limits: l, now: time.Now, perAddr: map[string]int{}, verified: map[string]time.Time{}}
}

// gateSlot is one connection's slot.
type gateSlot struct {
	g     *handshakeGate
	addr  string
	known bool
	conn  net.Conn
	elem  *list.Element // in pending while a stranger's slot is held
	held  bool
}

// admit takes a slot for c, or says why it is refused; evicted is the
// reason to count when a stranger's slot was taken from its holder.
func (g *handshakeGate) admit(c net.Conn) (slot *gateSlot, refused, evicted string) {
	addr := remoteIP(c.RemoteAddr())
	var victim *gateSlot
	g.mu.Lock()
	slot = &gateSlot{g: g, addr: addr, conn: c, held: true}
	if at, ok := g.verified[addr]; ok && g.now().Sub(at) < g.limits.knownFor {
		slot.known = true
	}
	switch {
	case slot.known && (g.known >= g.limits.known || g.perAddr[addr] >= g.limits.perKnownAddress):
		g.mu.Unlock()
		return nil, refusedKnownFull, ""
	case slot.known:
		g.known++
	case g.perAddr[addr] >= g.limits.perAddress:
		g.mu.Unlock()
		return nil, refusedPerAddress, ""
	default:
		if g.strangers >= g.limits.strangers {
			if front := g.pending.Front(); front != nil {
				victim = front.Value.(*gateSlot)
				g.releaseLocked(victim)
			}
		}
		g.strangers++
		slot.elem = g.pending.PushBack(slot)
	}
	g.perAddr[addr]++
	g.mu.Unlock()
	if victim != nil {
		victim.conn.Close() // its handshake or join fails; its slot is already back
		evicted = evictedOldest
	}
	return slot, "", evicted
}

// release gives the slot back; later calls do nothing.
func (s *gateSlot) release() {
	s.g.mu.Lock()
	defer s.g.mu.Unlock()
	s.g.releaseLocked(s)
}

func (g *handshakeGate) releaseLocked(s *gateSlot) {
	if !s.held {
		return
	}
	s.held = false
	if s.known {
		g.known--
	} else {
		g.strangers--
		g.pending.Remove(s.elem)
		s.elem = nil
	}
	if n := g.perAddr[s.addr] - 1; n > 0 {
		g.perAddr[s.addr] = n
	} else {
		delete(g.perAddr, s.addr)
	}
}

// verifiedFrom records that a certificate of this cluster's CA was
// verified on a connection from addr's address.
func (g *handshakeGate) verifiedFrom(addr net.Addr) {
	ip := remoteIP(addr)
	g.mu.Lock()
	defer g.mu.Unlock()
	now := g.now()
	g.verified[ip] = now
	for a, at := range g.verified {
		if now.Sub(at) >= g.limits.knownFor {
			delete(g.verified, a)
		}
	}
}

// held returns the slots held by strangers and by known addresses.
func (g *handshakeGate) held() (strangers, known int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.strangers, g.known
}

func remoteIP(a net.Addr) string {
	if t, ok := a.(*net.TCPAddr); ok {
		return t.IP.String()
	}
	if a == nil {
		return ""
	}
	host, _, err := net.SplitHostPort(a.String())
	if err != nil {
		return a.String()
	}
	return host
}

// ipOf is the address part of a "host:port".
func ipOf(hostport string) string {
	host, _, err := net.SplitHostPort(hostport)
	if err != nil {
		return hostport
	}
	return host
}

// gatedConn gives its slot back when it closes (a join conversation's
// slot lasts as long as its connection).
type gatedConn struct {
	net.Conn
	slot *gateSlot
}

func (c *gatedConn) Close() error {
	c.slot.release()
	return c.Conn.Close()
}

// refusalLog counts the cluster listener's refusals (a handshake over a
// bound or failed, a join refused, a relay from a host the server does
// not know) and logs them once per interval with their counts: a flood of
// refused attempts writes one line a minute, not one per attempt.
type refusalLog struct {
	logger   hclog.Logger
	interval time.Duration
	// what the log line says is refused, and the words for who by.
	what, by, bys string

	mu     sync.Mutex
	counts map[string]int
	addrs  map[string]int
	since  time.Time
}

// refusalLogInterval is how often refusals are logged.
const refusalLogInterval = time.Minute

func newRefusalLog(logger hclog.Logger, interval time.Duration) *refusalLog {
	return &refusalLog{logger: logger, interval: interval, what: "cluster listener refusals", by: "address", bys: "addresses",
		counts: map[string]int{}, addrs: map[string]int{}, since: time.Now()}
}

// note counts one refusal of reason from the address addr.
func (r *refusalLog) note(reason, addr string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.counts[reason]++
	if len(r.addrs) < 4096 || r.addrs[addr] > 0 {
		r.addrs[addr]++
	}
}

// run flushes the counts every interval until ctx ends.
func (r *refusalLog) run(ctx context.Context) {
	t := time.NewTicker(r.interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			r.flush()
			return
		case <-t.C:
			r.flush()
		}
	}
}

// flush logs the counts since the last line, if any, and starts again.
func (r *refusalLog) flush() {
	r.mu.Lock()
	counts, addrs, since := r.counts, r.addrs, r.since
	r.counts, r.addrs, r.since = map[string]int{}, map[string]int{}, time.Now()
	r.mu.Unlock()
	if len(counts) == 0 {
		return
	}
	total := 0
	reasons := make([]string, 0, len(counts))
	for k, n := range counts {
		total += n
		reasons = append(reasons, k)
	}
	sort.Strings(reasons)
	busiest, most := "", 0
	for a, n := range addrs {
		if n > most || (n == most && a < busiest) {
			busiest, most = a, n
		}
	}
	kv := []any{"refused", total, "over", time.Since(since).Round(time.Second).String(), r.bys, len(addrs),
		"busiest_" + r.by, busiest, "busiest_count", most}
	for _, k := range reasons {
		kv = append(kv, k, counts[k])
	}
	r.logger.Warn(r.what+" (counted, logged once per interval)", kv...)
}
