// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package admission

import (
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/capyctl/capyctl/plugins-testkit/poll"
)

// TestController_CloseWaitsForCallbacks pins that the OnSaturated call the
// controller starts has an owner: Close returns only once it has ended.
func TestController_CloseWaitsForCallbacks(t *testing.T) {
	entered, release := make(chan string, 4), make(chan struct{})
	c := New(Config{OnSaturated: func(dep, inst string) {
		entered <- dep + " " + inst
		<-release
	}})
	d := c.Deployment("d")
	d.SetLimits(2, 8)
	ready(d, 1)
	for i := 0; i < 2; i++ {
		p, _, _ := d.Enter(1)
		p.Cut(SettleAtStop)
	}
	if _, w, err := d.Enter(1); err != nil || w == nil {
		t.Fatalf("the request must wait: %v", err)
	}
	select {
	case s := <-entered:
		if s != "d d/0" {
			t.Fatalf("callback for %q", s)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("no OnSaturated call")
	}
	closed := make(chan struct{})
	go func() { c.Close(); close(closed) }()
	poll.Until(t, 30*time.Second, "Close to return or wait for the callback", func() bool {
		select {
		case <-closed:
			return true
		default:
		}
		buf := make([]byte, 1<<20)
		s := string(buf[:runtime.Stack(buf, true)])
		return strings.Contains(s, "admission.(*Controller).Close")
	})
	select {
	case <-closed:
		close(release)
		t.Fatal("Close returned while an OnSaturated call was running")
	default:
	}
	close(release)
	<-closed
}
