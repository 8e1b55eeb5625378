// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package hostagent

import (
	"context"
	"net/http"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/capyctl/capyctl/core/hostlink"
	"github.com/capyctl/capyctl/core/hostlink/proto/hostv1"
	"github.com/capyctl/capyctl/core/structs"
)

// fakeLocal is a host's side without engines that records the shares it
// is given (core/fleet's tests have the full one).
type fakeLocal struct {
	mu      sync.Mutex
	desired []*hostv1.Desired
	applied chan struct{} // closed and replaced at each share applied
}

func newFakeLocal() *fakeLocal { return &fakeLocal{applied: make(chan struct{})} }

func (l *fakeLocal) Inventory() *hostv1.Inventory                     { return &hostv1.Inventory{} }
func (l *fakeLocal) Readings() []*hostv1.LedgerReading                { return nil }
func (l *fakeLocal) Journals() []*hostv1.InstanceJournal              { return nil }
func (l *fakeLocal) RelayHandler() http.Handler                       { return http.NotFoundHandler() }
func (l *fakeLocal) Events(c uint64, _ int) ([]*hostv1.Event, uint64) { return nil, c }
func (l *fakeLocal) Changed() <-chan struct{}                         { return nil }
func (l *fakeLocal) Commands() hostlink.Handler                       { return nil }

func (l *fakeLocal) ApplyDesired(_ context.Context, d *hostv1.Desired) []*hostv1.DesiredResult {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.desired = append(l.desired, d)
	close(l.applied)
	l.applied = make(chan struct{})
	return nil
}

func (l *fakeLocal) appliedSignal() <-chan struct{} {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.applied
}

func (l *fakeLocal) lastDesired() *hostv1.Desired {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.desired) == 0 {
		return nil
	}
	return l.desired[len(l.desired)-1]
}

func (l *fakeLocal) shares() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.desired)
}

// testLogger is a logger that discards.
func testLogger() hclog.Logger { return hclog.NewNullLogger() }

// TestHost_RefusesAnOlderTerm: a host that has seen term 5 refuses a share
// of term 4 (stale_term, answered on the link it came on) and never
// applies it; a share of term 5 or later is applied, and within a term an
// older share than the pending one is dropped.
func TestHost_RefusesAnOlderTerm(t *testing.T) {
	local := newFakeLocal()
	dir := t.TempDir()
	if err := os.MkdirAll(hostPKIDir(dir), 0o700); err != nil {
		t.Fatal(err)
	}
	h := &Host{o: HostOptions{StateDir: dir, Local: local}, logger: testLogger(), desiredDue: make(chan struct{}, 1)}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan struct{})
	go func() { defer close(done); h.reconcileDesired(ctx) }()
	defer func() { cancel(); <-done }()
	l := newServerLink("s1", true)
	h.seeTerm(5)

	h.offerDesired(l, &hostv1.Desired{Term: 4, Index: 9, Engines: []*hostv1.DesiredEngine{{Name: "old"}}})
	select {
	case m := <-l.out:
		if a := m.GetApplied(); a.GetCode() != string(structs.CodeStaleTerm) || a.GetTerm() != 4 {
			t.Fatalf("the answer to an older term: %v", m)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no answer to an older term's share")
	}
	applied := local.appliedSignal()
	h.offerDesired(l, &hostv1.Desired{Term: 6, Index: 10, Engines: []*hostv1.DesiredEngine{{Name: "new"}}})
	select {
	case <-applied:
	case <-time.After(10 * time.Second):
		t.Fatal("a newer term's share was not applied")
	}
	if d := local.lastDesired(); d.GetTerm() != 6 || local.shares() != 1 {
		t.Fatalf("applied %v (%d shares)", d, local.shares())
	}
	if h.Term() != 6 {
		t.Fatalf("the newest term seen: %d", h.Term())
	}
	// The fence survives a restart of the host.
	again := &Host{o: h.o, logger: testLogger()}
	again.loadTerm()
	if again.Term() != 6 {
		t.Fatalf("the term after a restart: %d", again.Term())
	}
}
