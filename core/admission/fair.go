// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package admission

import "slices"

// A deployment's line is served fairly between the API keys its requests
// carry: weighted fair queuing, self-clocked (SCFQ, Golestani 1994). Each
// waiter gets a virtual finish tag, max(the line's virtual time, the tag
// of its key's previous waiter) + 1/weight; the line is kept in tag order
// (arrival breaks ties) and served from its head, and the line's virtual
// time is the tag of the waiter served last. One key with 200 requests
// waiting takes one place in turn with another key's: the other key's
// request waits at most for the request being served and one more.
// Requests of one key, and a line with one key, keep their arrival order.
// Each request costs one: how long an answer takes is not known when it
// is queued. A key that waited gets no credit for later: once the line is
// empty, every key starts again at the line's time.

// Fair is who a request is for the line: its key and the key's weight
// (0 reads as 1; a key of weight 2 gets two places for one of a key of
// weight 1 while both wait).
type Fair struct {
	Key    string
	Weight int
}

// fairLine is a deployment's fair queuing state; d.mu guards it.
type fairLine struct {
	vtime float64
	last  map[string]float64 // each waiting key's last tag
	seq   uint64
}

// enqueue puts w in the line in tag order; d.mu is held.
func (d *Deployment) enqueue(w *Waiter, f Fair) {
	l := &d.fair
	weight := float64(max(f.Weight, 1))
	if l.last == nil {
		l.last = map[string]float64{}
	}
	start := max(l.vtime, l.last[f.Key])
	w.key, w.tag = f.Key, start+1/weight
	l.last[f.Key] = w.tag
	l.seq++
	w.seq = l.seq
	i, _ := slices.BinarySearchFunc(d.queue, w, func(a, b *Waiter) int {
		switch {
		case a.tag < b.tag:
			return -1
		case a.tag > b.tag:
			return 1
		case a.seq < b.seq:
			return -1
		case a.seq > b.seq:
			return 1
		}
		return 0
	})
	d.queue = slices.Insert(d.queue, i, w)
}

// served advances the line's virtual time to the waiter just served;
// d.mu is held.
func (d *Deployment) served(w *Waiter) {
	l := &d.fair
	l.vtime = max(l.vtime, w.tag)
	if tag, ok := l.last[w.key]; ok && tag <= l.vtime {
		delete(l.last, w.key) // nothing of the key waits: it starts at the line's time
	}
	d.idleLine()
}

// idleLine forgets every key's tag once nobody waits; d.mu is held.
func (d *Deployment) idleLine() {
	if len(d.queue) == 0 {
		clear(d.fair.last)
	}
}
