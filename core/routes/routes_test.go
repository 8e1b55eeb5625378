// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package routes

import (
	"sync/atomic"
	"testing"
	"time"
)

func TestTable_Lookup(t *testing.T) {
	a := &Route{Deployment: "a", Routes: []string{"alpha", "al"}}
	b := &Route{Deployment: "b"}
	tab := NewTable(a, b)
	cases := []struct {
		name string
		want *Route
	}{{"alpha", a}, {"al", a}, {"b", b}, {"a", nil}, {"zzz", nil}}
	for _, c := range cases {
		if got := tab.Lookup(c.name); got != c.want {
			t.Errorf("Lookup(%q) = %v, want %v", c.name, got, c.want)
		}
	}
	if l := tab.List(); len(l) != 2 || l[0] != a || l[1] != b {
		t.Fatalf("List = %v", l)
	}
}

// TestBoard_Changed: a waiter that took the channel before a publish is
// woken by it, whatever the order, and reads the new table.
func TestBoard_Changed(t *testing.T) {
	var b Board
	if b.Load() == nil || len(b.Load().List()) != 0 {
		t.Fatal("a new board does not hold an empty table")
	}
	ch := b.Changed()
	if ch != b.Changed() {
		t.Fatal("two waiters before a publish got different channels")
	}
	select {
	case <-ch:
		t.Fatal("closed before any publish")
	default:
	}
	next := NewTable(&Route{Deployment: "x"})
	woke := make(chan *Table)
	go func() {
		<-ch
		woke <- b.Load()
	}()
	b.Publish(next)
	select {
	case got := <-woke:
		if got != next {
			t.Fatal("the woken waiter read an old table")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the waiter was not woken")
	}
	if b.Changed() == ch {
		t.Fatal("the next change reuses a closed channel")
	}
}

func TestTarget_Touch(t *testing.T) {
	var used atomic.Int64
	tg := &Target{LastUsed: &used}
	now := time.Unix(100, 5)
	tg.Touch(now)
	if used.Load() != now.UnixNano() {
		t.Fatalf("last use %d", used.Load())
	}
	(&Target{}).Touch(now) // nil LastUsed records nothing and does not panic
}
