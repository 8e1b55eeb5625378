// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package admission

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

// serveLine runs a one-place deployment: every waiter in order joins the
// line behind one request being served, then the places are freed one at
// a time; it returns the keys in the order the line granted them.
func serveLine(t *testing.T, d *Deployment, first *Place, waiters []*Waiter, keys []string) []string {
	t.Helper()
	byWaiter := map[*Waiter]string{}
	for i, w := range waiters {
		byWaiter[w] = keys[i]
	}
	var order []string
	current := first
	for len(order) < len(waiters) {
		current.Done()
		var next *Waiter
		for _, w := range waiters {
			select {
			case <-w.C():
				if _, done := byWaiter[w]; done {
					next = w
				}
			default:
			}
			if next != nil {
				break
			}
		}
		if next == nil {
			t.Fatalf("a freed place went to nobody (%d served)", len(order))
		}
		order = append(order, byWaiter[next])
		delete(byWaiter, next)
		current = next.Place()
	}
	current.Done()
	return order
}

// TestDeployment_FairLine: a key with 200 requests waiting does not
// starve another key's: B's request, joining behind A's 200, is granted
// within two places freed (the request being served and one more of A's),
// and the rest keeps its arrival order; weights share the places in
// their ratio while both keys wait; one key alone is first come first
// served; a key that waited long gets no credit for later.
func TestDeployment_FairLine(t *testing.T) {
	newLine := func() (*Deployment, *Place) {
		d := New(Config{MaxWaitingTotal: 1000}).Deployment("d")
		d.SetLimits(1, 500)
		ready(d, 1)
		p, w, err := d.EnterFor(1, Fair{Key: "A"})
		if err != nil || p == nil || w != nil {
			t.Fatalf("the first request: %v %v %v", p, w, err)
		}
		return d, p
	}
	enter := func(d *Deployment, f Fair) *Waiter {
		t.Helper()
		p, w, err := d.EnterFor(1, f)
		if err != nil || p != nil || w == nil {
			t.Fatalf("enter %+v: %v %v %v", f, p, w, err)
		}
		return w
	}

	t.Run("200 of A, then one of B", func(t *testing.T) {
		d, first := newLine()
		var ws []*Waiter
		var keys []string
		for i := 0; i < 200; i++ {
			ws = append(ws, enter(d, Fair{Key: "A"}))
			keys = append(keys, fmt.Sprintf("A%d", i))
		}
		ws = append(ws, enter(d, Fair{Key: "B"}))
		keys = append(keys, "B")
		if pos := ws[200].Position(); pos != 1 {
			t.Fatalf("B's position behind 200 of A: %d, want 1 (one of A ahead)", pos)
		}
		order := serveLine(t, d, first, ws, keys)
		b := -1
		for i, k := range order {
			if k == "B" {
				b = i
			}
		}
		// Freed places: the first request's (granted A0), then A0's
		// (granted B): B starts within two service times.
		if b < 0 || b > 1 {
			t.Fatalf("B granted %d-th: %v", b+1, order[:5])
		}
		for i, k := range append(order[:b:b], order[b+1:]...) {
			if k != fmt.Sprintf("A%d", i) {
				t.Fatalf("A's requests out of their order at %d: %v", i, order)
			}
		}
	})

	t.Run("weights", func(t *testing.T) {
		d, first := newLine()
		var ws []*Waiter
		var keys []string
		for i := 0; i < 40; i++ {
			ws = append(ws, enter(d, Fair{Key: "A", Weight: 1}))
			keys = append(keys, "A")
		}
		for i := 0; i < 40; i++ {
			ws = append(ws, enter(d, Fair{Key: "B", Weight: 3}))
			keys = append(keys, "B")
		}
		order := serveLine(t, d, first, ws, keys)
		// The first 40 granted while both wait: B gets three for one of A.
		head := strings.Join(order[:40], "")
		if a := strings.Count(head, "A"); a < 9 || a > 11 {
			t.Fatalf("A got %d of the first 40 places with weights 1:3: %s", a, head)
		}
	})

	t.Run("one key alone is first come first served", func(t *testing.T) {
		d, first := newLine()
		var ws []*Waiter
		var keys []string
		for i := 0; i < 20; i++ {
			ws = append(ws, enter(d, Fair{}))
			keys = append(keys, fmt.Sprint(i))
		}
		order := serveLine(t, d, first, ws, keys)
		for i, k := range order {
			if k != fmt.Sprint(i) {
				t.Fatalf("order %v", order)
			}
		}
	})

	t.Run("a newcomer waits for the turns already due", func(t *testing.T) {
		d, first := newLine()
		var ws []*Waiter
		for i := 0; i < 10; i++ {
			ws = append(ws, enter(d, Fair{Key: "A"}))
		}
		// Five of A served: the line's time is A4's; A5 is due next.
		current := first
		for i := 0; i < 5; i++ {
			current.Done()
			<-ws[i].C()
			current = ws[i].Place()
		}
		b := enter(d, Fair{Key: "B"})
		if pos := b.Position(); pos != 1 {
			t.Fatalf("B's position %d behind A's five left, want 1 (A5, due at the line's time, first)", pos)
		}
	})

	t.Run("a key whose waiters left keeps no debt", func(t *testing.T) {
		d, _ := newLine()
		var gone []*Waiter
		for i := 0; i < 5; i++ {
			gone = append(gone, enter(d, Fair{Key: "A"}))
		}
		for _, w := range gone {
			w.Leave()
		}
		for i := 0; i < 3; i++ {
			enter(d, Fair{Key: "B"})
		}
		if pos := enter(d, Fair{Key: "A"}).Position(); pos > 1 {
			t.Fatalf("A's request at %d behind B's three, its left waiters counted against it", pos)
		}
	})

	t.Run("no credit for a key that waited", func(t *testing.T) {
		d, first := newLine()
		var ws []*Waiter
		var keys []string
		// A waited alone for a long time; once the line emptied, B's
		// flood and A's next request take turns again.
		for i := 0; i < 10; i++ {
			ws = append(ws, enter(d, Fair{Key: "A"}))
			keys = append(keys, "A")
		}
		serveLine(t, d, first, ws, keys)
		if len(d.fair.last) != 0 {
			t.Fatalf("tags kept with an empty line: %v", d.fair.last)
		}
		p, _, _ := d.EnterFor(1, Fair{Key: "B"})
		ws, keys = nil, nil
		for i := 0; i < 5; i++ {
			ws = append(ws, enter(d, Fair{Key: "B"}))
			keys = append(keys, "B")
		}
		ws = append(ws, enter(d, Fair{Key: "A"}))
		keys = append(keys, "A")
		if pos := ws[5].Position(); pos > 1 {
			t.Fatalf("A's request behind B's flood at %d", pos)
		}
		serveLine(t, d, p, ws, keys)
	})
}

// TestDeployment_FairLineAcrossTurns: the line of a model whose turn ended
// (another model held its memory) waits in fair order too: when its next
// turn opens, B's one request behind A's 200 is granted within two places,
// and OldestWaiting still names the oldest request, which in fair order is
// not always the head of the line.
func TestDeployment_FairLineAcrossTurns(t *testing.T) {
	now := time.Unix(1_000_000, 0)
	d := New(Config{MaxWaitingTotal: 1000, Now: func() time.Time { return now }}).Deployment("d")
	d.SetLimits(1, 500)
	ready(d, 1)
	if !closedNow(d.Contend(0, 0)) {
		t.Fatal("the idle model's turn did not end")
	}
	var ws []*Waiter
	var keys []string
	for i := 0; i < 200; i++ {
		p, w, err := d.EnterFor(1, Fair{Key: "A"})
		if err != nil || p != nil || w == nil {
			t.Fatalf("A%d while the turn is over: %v %v %v", i, p, w, err)
		}
		ws, keys = append(ws, w), append(keys, fmt.Sprintf("A%d", i))
	}
	now = now.Add(time.Minute)
	_, wb, err := d.EnterFor(1, Fair{Key: "B", Weight: 4})
	if err != nil || wb == nil {
		t.Fatalf("B: %v %v", wb, err)
	}
	ws, keys = append(ws, wb), append(keys, "B")
	if pos := wb.Position(); pos != 0 {
		t.Fatalf("B of weight 4 at %d, want the head of the line", pos)
	}
	if at, ok := d.OldestWaiting(); !ok || !at.Equal(now.Add(-time.Minute)) {
		t.Fatalf("OldestWaiting %v %v, want A0's arrival a minute before B", at, ok)
	}
	// C, of the default weight, is due after A0 (equal tags, A0 came first).
	_, wc, err := d.EnterFor(1, Fair{Key: "C"})
	if err != nil || wc == nil {
		t.Fatalf("C: %v %v", wc, err)
	}
	if pos := wc.Position(); pos != 2 {
		t.Fatalf("C at %d behind 200 of A, want 2 (after B and A0)", pos)
	}
	d.Reopen()
	// The reopened turn granted the head of the line its place.
	var first *Waiter
	for _, w := range ws {
		if closedNow(w.C()) {
			first = w
		}
	}
	if first != wb {
		t.Fatal("the next turn did not start with B's request")
	}
	order := serveLine(t, d, wb.Place(), append(ws[:200:200], wc), append(keys[:200:200], "C"))
	// Places freed: B's (granted A0), A0's (granted C): C starts within two
	// service times of the turn's start.
	if order[0] != "A0" || order[1] != "C" {
		t.Fatalf("after B: %v, want A0 then C", order[:3])
	}
	for i, k := range order[2:] {
		if k != fmt.Sprintf("A%d", i+1) {
			t.Fatalf("A's requests out of their order at %d: %v", i, order[:i+3])
		}
	}
}
