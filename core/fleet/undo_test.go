// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package fleet

import (
	"context"
	"slices"
	"testing"
	"time"
)

func TestUndo_RunsInReverseOnce(t *testing.T) {
	var got []int
	var u undo
	for i := range 3 {
		u.push(func() { got = append(got, i) })
	}
	moved := u.handOver()
	u.run()
	if len(got) != 0 {
		t.Fatalf("the handed-over cleanups ran on the old stack: %v", got)
	}
	moved.push(func() { got = append(got, 9) })
	moved.run()
	moved.run()
	if !slices.Equal(got, []int{9, 2, 1, 0}) {
		t.Fatalf("ran %v, want [9 2 1 0]", got)
	}
}

func TestOpenCount_WaitsOnItsSignal(t *testing.T) {
	var c openCount
	if !c.wait(context.Background()) {
		t.Fatal("nothing open, and the wait did not return at once")
	}
	c.add(2)
	ended, cancel := context.WithCancel(context.Background())
	cancel()
	if c.wait(ended) {
		t.Fatal("the wait returned with two open")
	}
	// The signal a waiter waits on: closed when the count falls to zero,
	// not before.
	c.mu.Lock()
	signal := c.empty
	c.mu.Unlock()
	if signal == nil {
		t.Fatal("a waiter left no signal to wait on")
	}
	done := make(chan bool)
	go func() { done <- c.wait(context.Background()) }()
	c.add(-1)
	select {
	case <-signal:
		t.Fatal("the signal fired with one still open")
	default:
	}
	c.add(-1)
	select {
	case <-signal:
	default:
		t.Fatal("the count fell to zero and the signal did not fire")
	}
	select {
	case ok := <-done:
		if !ok {
			t.Fatal("the wait failed")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the wait did not see the count fall to zero")
	}
}
