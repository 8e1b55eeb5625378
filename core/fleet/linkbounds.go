// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package fleet

import (
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/capyctl/capyctl/core/hostlink/proto/hostv1"
	"github.com/capyctl/capyctl/core/jobspec"
	"github.com/capyctl/capyctl/core/structs"
)

// What a host sends is bounded (the trust review's H3 and M2): a host is
// trusted with what is placed on it and nothing else, so a compromised
// one must not fill the server's memory or database, nor make the server
// believe what is not its own to say. Every host message arrives in one
// handler (link.go), which checks it here first:
//
//   - one message is at most messageBytes (gRPC refuses a larger one and
//     the link ends);
//   - a host sends at most rate messages and byteRate bytes a second
//     (with bursts): over either, the link ends with host_link_flooded
//     and the host links again after its back-off;
//   - its events (each a write of the server's store) are bounded in
//     number and bytes a second as well: over, they are dropped, counted,
//     and the link stays;
//   - names follow the deployment spec's rules and lists have lengths (a
//     message over one is dropped and counted, the link stays); a free
//     text (an instance's message or error, an event's message or an
//     attribute's value) is cut to its length, since an honest engine's
//     error may be long; an instance's status (shown, never acted on) over
//     its bound is dropped, and the server asks the host instead;
//   - the server keeps at most instances journals a host and a bounded
//     set of the deployments it ran;
//   - a host's ledger readings never say a card holds more than the card
//     the host reported, and its inventory's figures are bounded;
//   - a host's events are of the kinds a host's own lifecycle writes, and
//     about deployments it runs, ran lately or was placed.
//
// Every refusal is counted by host and reason
// (capyctl_host_messages_refused_total) and logged once per interval.

// hostLimits are the bounds of what one host may send.
type hostLimits struct {
	messageBytes int
	// rate/burst: messages a second; byteRate/byteBurst: their bytes.
	rate, burst         float64
	byteRate, byteBurst float64
	// eventRate/eventBurst: its events a second (each is a write of the
	// server's store); eventByteRate/eventByteBurst: their bytes.
	eventRate, eventBurst         float64
	eventByteRate, eventByteBurst float64
	instances                     int
	cards, engines, readings      int
	cardBytes, hostBytes          int64
	text, attributes, attrValue   int
	charges                       int
	// statusBytes bounds an instance journal's status (its status_json,
	// which the server shows and never acts on); one over it is dropped
	// and the server asks the host instead.
	statusBytes int
	// knownFor is how long a deployment the host ran (or was placed)
	// stays its own for its events; knownMax bounds that set.
	knownFor time.Duration
	knownMax int
}

// defaultHostLimits leave an honest host far inside them: a host's
// heartbeat is one message every two seconds, an instance's transition a
// journal and an event or two, a host that comes back resends at most 256
// events a flush.
var defaultHostLimits = hostLimits{
	messageBytes: 2 << 20,
	rate:         500, burst: 5000,
	byteRate: 4 << 20, byteBurst: 32 << 20,
	eventRate: 200, eventBurst: 1000, eventByteRate: 256 << 10, eventByteBurst: 1 << 20,
	instances: 512, cards: 64, engines: 256, readings: 136,
	cardBytes: 4 << 40, hostBytes: 256 << 40,
	text: 4096, attributes: 32, attrValue: 1024, charges: 64, statusBytes: 16 << 10,
	knownFor: 15 * time.Minute, knownMax: 2048,
}

// Reasons a host message is refused, as the metric and the log count them.
const (
	refusedTooLarge    = "message_too_large"
	refusedOverRate    = "over_rate"
	refusedInvalid     = "invalid"
	refusedInstances   = "too_many_instances"
	refusedEventsRate  = "events_over_rate"
	refusedEventKind   = "event_kind"
	refusedEventNotOwn = "event_not_its_own"
	refusedReadings    = "readings_over_inventory"
	refusedInventory   = "inventory_over_bounds"
)

// hostRefusalReasons are every reason, in the metric's order.
var hostRefusalReasons = []string{refusedTooLarge, refusedOverRate, refusedInvalid, refusedInstances, refusedEventsRate,
	refusedEventKind, refusedEventNotOwn, refusedReadings, refusedInventory}

// hostEventKinds are the kinds of event a host's own lifecycle writes
// (core/lifecycle, core/agent's desired state, its management API), the
// only ones the server takes from a host; "instance_" + a state is one
// too. The server's own kinds (host_*, deployment_adopted, group_*...)
// never come from a host.
var hostEventKinds = map[string]bool{
	"deployment_created": true, "deployment_revised": true, "deployment_deleted": true, "deployment_desired": true,
	"turn_ending": true, "turn_ended": true, "switch_planned": true, "switch_released": true, "switch_failed": true,
	"switch_done": true, "start_gave_up": true, "start_retry_scheduled": true, "engine_exited": true,
	"wake_failed": true, "engine_added": true, "engine_removed": true,
}

// hostLocalKind reports whether kind is one a host journals for itself
// only (its own API keys' events: the cluster's keys are the servers'):
// such an event is not taken, nor counted as a refusal.
func hostLocalKind(kind string) bool { return strings.HasPrefix(kind, "api_key_") }

// hostEventKind reports whether a host may emit an event of kind.
func hostEventKind(kind string) bool {
	if hostEventKinds[kind] {
		return true
	}
	st, ok := strings.CutPrefix(kind, "instance_")
	return ok && len(st) <= 32 && jobspec.NameRe.MatchString(st)
}

// bucket is a token bucket: rate a second, burst at most.
type bucket struct {
	tokens, rate, burst float64
	at                  time.Time
}

func newBucket(rate, burst float64) bucket { return bucket{tokens: burst, rate: rate, burst: burst} }

// take takes n tokens at now, or none and false.
func (b *bucket) take(n float64, now time.Time) bool {
	if !b.at.IsZero() {
		b.tokens = min(b.burst, b.tokens+now.Sub(b.at).Seconds()*b.rate)
	}
	b.at = now
	if b.tokens < n {
		return false
	}
	b.tokens -= n
	return true
}

// hostGuard is one host's account: its buckets, its refusals, and the
// deployments lately its own. It outlives the host's links, so a host
// that links again starts where it left off.
type hostGuard struct {
	limits hostLimits

	mu                        sync.Mutex
	msgs, bytes, evs, evBytes bucket
	refused                   map[string]uint64
	known                     map[string]time.Time // deployment -> last seen as the host's
}

func newHostGuard(l hostLimits) *hostGuard {
	return &hostGuard{limits: l, msgs: newBucket(l.rate, l.burst), bytes: newBucket(l.byteRate, l.byteBurst),
		evs: newBucket(l.eventRate, l.eventBurst), evBytes: newBucket(l.eventByteRate, l.eventByteBurst), refused: map[string]uint64{}, known: map[string]time.Time{}}
}

// admit takes one message of size bytes from the link's buckets; false:
// the host is over its rate and its link ends.
func (g *hostGuard) admit(size int, now time.Time) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.msgs.take(1, now) && g.bytes.take(float64(size), now)
}

// admitEvent takes an event of size bytes from the events' buckets.
func (g *hostGuard) admitEvent(size int, now time.Time) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.evs.take(1, now) && g.evBytes.take(float64(size), now)
}

// count counts one refusal of reason.
func (g *hostGuard) count(reason string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.refused[reason]++
}

// counts are the refusals so far, by reason.
func (g *hostGuard) counts() map[string]uint64 {
	g.mu.Lock()
	defer g.mu.Unlock()
	out := make(map[string]uint64, len(g.refused))
	for k, v := range g.refused {
		out[k] = v
	}
	return out
}

// remember marks deployments as the host's at now; the set keeps the
// newest knownMax, none older than knownFor.
func (g *hostGuard) remember(now time.Time, deps ...string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, d := range deps {
		if d != "" {
			g.known[d] = now
		}
	}
	if len(g.known) <= g.limits.knownMax {
		return
	}
	oldest, at := "", now
	for d, t := range g.known {
		if now.Sub(t) > g.limits.knownFor {
			delete(g.known, d)
		} else if t.Before(at) {
			oldest, at = d, t
		}
	}
	if len(g.known) > g.limits.knownMax {
		delete(g.known, oldest)
	}
}

// knows reports whether dep was the host's within knownFor of now.
func (g *hostGuard) knows(dep string, now time.Time) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	t, ok := g.known[dep]
	return ok && now.Sub(t) <= g.limits.knownFor
}

// refuseHost counts and logs (once per interval) one refused message of
// host for reason; it takes only the guard's and the log's own locks, so
// it may be called with mu held.
func (s *Server) refuseHost(g *hostGuard, host, reason string) {
	g.count(reason)
	s.hostRefused.note(reason, host)
}

// guardOf returns host's guard, made on first use.
func (s *Server) guardOf(host string) *hostGuard {
	s.mu.Lock()
	defer s.mu.Unlock()
	h := s.hostLocked(host)
	if h.guard == nil {
		h.guard = newHostGuard(s.limits)
	}
	return h.guard
}

// checkName checks a deployment name a host sends ("" allowed).
func checkName(what, name string) error {
	if name == "" || jobspec.NameRe.MatchString(name) {
		return nil
	}
	return fmt.Errorf("%s %q is not a deployment name", what, trimForLog(name))
}

// checkInstanceID checks an instance ID (deployment/index) a host sends
// and returns its deployment.
func checkInstanceID(id string) (string, error) {
	dep, idx, ok := strings.Cut(id, "/")
	if !ok || len(idx) == 0 || len(idx) > 6 || strings.Trim(idx, "0123456789") != "" || !jobspec.NameRe.MatchString(dep) {
		return "", fmt.Errorf("instance id %q is not deployment/index", trimForLog(id))
	}
	return dep, nil
}

// clip cuts a free text a host sent to at most limit bytes (on a rune
// boundary).
func clip(s string, limit int) string {
	if len(s) <= limit {
		return s
	}
	return strings.ToValidUTF8(s[:limit], "")
}

// clipJournal cuts a journal's free texts to their length and drops a
// status over its bound.
func (l hostLimits) clipJournal(j *hostv1.InstanceJournal) {
	j.Message, j.ErrorMessage = clip(j.GetMessage(), l.text), clip(j.GetErrorMessage(), l.text)
	if len(j.GetStatusJson()) > l.statusBytes {
		j.StatusJson = nil
	}
}

// clipEvent cuts an event's free texts to their length.
func (l hostLimits) clipEvent(ev *hostv1.Event) {
	ev.Message = clip(ev.GetMessage(), l.text)
	for k, v := range ev.GetAttributes() {
		ev.Attributes[k] = clip(v, l.attrValue)
	}
}

// checkText checks a text's length.
func (l hostLimits) checkText(what, s string, limit int) error {
	if len(s) > limit {
		return fmt.Errorf("%s is %d bytes, over %d", what, len(s), limit)
	}
	return nil
}

// checkJournal checks one instance journal.
func (l hostLimits) checkJournal(j *hostv1.InstanceJournal) error {
	dep, err := checkInstanceID(j.GetInstanceId())
	if err != nil {
		return err
	}
	if d := j.GetDeployment(); d != "" && d != dep {
		return fmt.Errorf("instance %s names deployment %q", j.GetInstanceId(), trimForLog(d))
	}
	for what, v := range map[string]string{"state": j.GetState(), "why": j.GetWhy(), "residency": j.GetResidency(), "phase": j.GetPhase(),
		"error_code": j.GetErrorCode()} {
		if err := l.checkText(what, v, 64); err != nil {
			return err
		}
	}
	if err := l.checkText("endpoint", j.GetEndpoint(), l.text); err != nil {
		return err
	}
	if len(j.GetCharges()) > l.charges {
		return fmt.Errorf("%d charges, over %d", len(j.GetCharges()), l.charges)
	}
	for k, v := range j.GetCharges() {
		if len(k) > 64 || v < 0 || v > l.hostBytes {
			return fmt.Errorf("charge %q of %d bytes", trimForLog(k), v)
		}
	}
	return nil
}

// checkEvent checks one event's shape (its kind and whose it is are
// checked by eventOwn) and returns its deployment ("" for none).
func (l hostLimits) checkEvent(ev *hostv1.Event) (string, error) {
	if len(ev.GetKind()) > 64 {
		return "", fmt.Errorf("event kind of %d bytes", len(ev.GetKind()))
	}
	if len(ev.GetAttributes()) > l.attributes {
		return "", fmt.Errorf("%d event attributes, over %d", len(ev.GetAttributes()), l.attributes)
	}
	for k := range ev.GetAttributes() {
		if len(k) > 64 {
			return "", fmt.Errorf("event attribute name of %d bytes", len(k))
		}
	}
	dep := ev.GetAttributes()["deployment"]
	if err := checkName("event deployment", dep); err != nil {
		return "", err
	}
	if id := ev.GetInstanceId(); id != "" {
		d, err := checkInstanceID(id)
		if err != nil {
			return "", err
		}
		if dep != "" && dep != d {
			return "", fmt.Errorf("event of instance %s names deployment %s", id, dep)
		}
		dep = d
	}
	return dep, nil
}

// checkInventory checks an inventory's lengths and figures.
func (l hostLimits) checkInventory(inv *hostv1.Inventory) error {
	if inv == nil {
		return nil
	}
	if len(inv.GetCards()) > l.cards || len(inv.GetEngines()) > l.engines {
		return fmt.Errorf("%d cards and %d engines, over %d and %d", len(inv.GetCards()), len(inv.GetEngines()), l.cards, l.engines)
	}
	if b := inv.GetHostMemoryBytes(); b < 0 || b > l.hostBytes {
		return fmt.Errorf("host memory of %d bytes", b)
	}
	for _, c := range inv.GetCards() {
		if len(c.GetUuid()) > 128 || len(c.GetName()) > 256 || c.GetMemoryBytes() < 0 || c.GetMemoryBytes() > l.cardBytes {
			return fmt.Errorf("card %q of %d bytes", trimForLog(c.GetUuid()), c.GetMemoryBytes())
		}
	}
	for _, e := range inv.GetEngines() {
		if len(e.GetName()) > 128 || len(e.GetFamily()) > 128 || len(e.GetVersion()) > 256 || len(e.GetDigest()) > 256 {
			return fmt.Errorf("engine %q: a field over its length", trimForLog(e.GetName()))
		}
	}
	return nil
}

// checkReadings checks a host's ledger readings against the inventory it
// reported: a card's domain never holds more than the card (the free
// memory the server places by is room less charges), the host's memory
// no more than the host's.
func (l hostLimits) checkReadings(rs []*hostv1.LedgerReading, inv *hostv1.Inventory) error {
	if len(rs) > l.readings {
		return fmt.Errorf("%d readings, over %d", len(rs), l.readings)
	}
	byUUID, byIndex := map[string]int64{}, map[string]int64{}
	var cards int64
	for _, c := range inv.GetCards() {
		byUUID[c.GetUuid()] = c.GetMemoryBytes()
		byIndex[fmt.Sprintf("gpu%d", c.GetIndex())] = c.GetMemoryBytes()
		cards += c.GetMemoryBytes()
	}
	for _, r := range rs {
		if len(r.GetDomain()) > 64 || len(r.GetDeviceUuid()) > 128 {
			return fmt.Errorf("a reading's domain or device over its length")
		}
		for _, v := range []int64{r.GetCapacityBytes(), r.GetUsedBytes(), r.GetExternalBytes(), r.GetChargedBytes(), r.GetRoomBytes()} {
			if v < 0 {
				return fmt.Errorf("domain %s: a negative figure", trimForLog(r.GetDomain()))
			}
		}
		var most int64
		switch d := r.GetDomain(); {
		case d == "unified" || d == "system":
			// The pool is the host's memory (a unified card may report
			// none of its own): the larger figure the inventory gives.
			most = max(inv.GetHostMemoryBytes(), cards)
			if most == 0 {
				most = l.hostBytes
			}
		case strings.HasPrefix(d, "gpu"):
			m, ok := byUUID[r.GetDeviceUuid()]
			if !ok || r.GetDeviceUuid() == "" {
				m, ok = byIndex[d]
			}
			if !ok {
				return fmt.Errorf("domain %s: no such card in the host's inventory", trimForLog(d))
			}
			most = m
		default:
			most = l.hostBytes
		}
		if r.GetCapacityBytes() > most || r.GetRoomBytes() > most {
			return fmt.Errorf("domain %s: capacity %d and room %d bytes, over the %d its inventory holds",
				trimForLog(r.GetDomain()), r.GetCapacityBytes(), r.GetRoomBytes(), most)
		}
	}
	return nil
}

// trimForLog shortens what a host sent to a loggable length.
func trimForLog(s string) string {
	if len(s) > 80 {
		return s[:80] + "..."
	}
	return s
}

// errHostLinkFlooded ends the link of a host over its rate.
func errHostLinkFlooded(host string, l hostLimits) error {
	return structs.Errf(structs.CodeHostLinkFlooded, "host %s sent more than %.0f messages or %s a second (bursts of %.0f, %s): its link is closed; it may link again",
		host, l.rate, structs.FormatBytes(int64(l.byteRate)), l.burst, structs.FormatBytes(int64(l.byteBurst)))
}
