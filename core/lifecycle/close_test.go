// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package lifecycle

import (
	"context"
	"errors"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/capyctl/capyctl/core/structs"
	"github.com/capyctl/capyctl/plugins-testkit/poll"
)

// gatedStore holds AppendEvent for one event kind until released.
type gatedStore struct {
	Store
	kind    string
	entered chan struct{}
	release chan struct{}
	once    sync.Once
}

func (s *gatedStore) AppendEvent(ev *structs.Event) (uint64, error) {
	if ev.Kind == s.kind {
		s.once.Do(func() { close(s.entered) })
		<-s.release
	}
	return s.Store.AppendEvent(ev)
}

// stacks returns every goroutine's stack.
func stacks() string {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			return string(buf[:n])
		}
		buf = make([]byte, 2*len(buf))
	}
}

// TestManager_CloseWaitsForBackgroundWork pins that Close returns only once
// every goroutine the manager started has ended: here the background start
// of an operator's start without wait, which, its start failed, schedules a
// retry and journals it. Before, that goroutine was not tracked: Close
// returned while it was still writing to the store (which the agent closes
// right after).
func TestManager_CloseWaitsForBackgroundWork(t *testing.T) {
	gs := &gatedStore{kind: "start_retry_scheduled", entered: make(chan struct{}), release: make(chan struct{})}
	f := newFixture(t, 10, 6, 1, func(c *Config) { gs.Store = c.Store; c.Store = gs })
	f.deploy("a")
	f.drv.mu.Lock()
	f.drv.failStart = errors.New("boom")
	f.drv.mu.Unlock()
	if err := f.m.StartDeployment(context.Background(), "a", StartOptions{}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-gs.entered:
	case <-time.After(30 * time.Second):
		t.Fatal("the failed start never scheduled a retry")
	}

	closed := make(chan struct{})
	go func() { f.m.Close(); close(closed) }()
	// Wait until Close has returned, or waits with every lane gone (then it
	// can only be waiting for the background start, held in the store).
	poll.Until(t, 30*time.Second, "Close to return or wait on the background start", func() bool {
		select {
		case <-closed:
			return true
		default:
		}
		s := stacks()
		return strings.Contains(s, "lifecycle.(*Manager).Close") && !strings.Contains(s, "lifecycle.(*instance).run")
	})
	select {
	case <-closed:
		close(gs.release)
		t.Fatal("Close returned while a goroutine it started was still writing to the store")
	default:
	}
	close(gs.release)
	select {
	case <-closed:
	case <-time.After(30 * time.Second):
		t.Fatal("Close did not return once the background start ended")
	}
}
