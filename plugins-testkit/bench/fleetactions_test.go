// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package bench

import (
	"context"
	"sync"
	"syscall"
	"testing"
	"time"

	mgmtclient "github.com/capyctl/capyctl/core/api/client"
	"github.com/capyctl/capyctl/core/api/wire"
	"github.com/capyctl/capyctl/plugins-testkit/harness"
	"github.com/capyctl/capyctl/plugins-testkit/poll"
)

// transitionReps is how many engine deaths BenchmarkFleet_TransitionSeen
// times.
const transitionReps = 15

var (
	transitionOnce sync.Once
	// transitionSeen: from the engine's kill -9 to the first transition
	// the host's own status shows, and to the first the server's shows.
	transitionSeen [2][]time.Duration
)

// BenchmarkFleet_TransitionSeen is how soon a host's transition reaches
// the server's status (issue 27's figure: within 50 ms). The engine of a
// deployment the server placed is killed with SIGKILL; the host's status
// and the server's are each read every millisecond until they show a
// transition newer than the one before the kill. The host's delay is the
// exit noticed (the driver's exit stream); the server's, minus the host's,
// is the journal's trip over the host link. The instance, stopped by its
// engine's death, is started again through the server before the next
// kill.
func BenchmarkFleet_TransitionSeen(b *testing.B) {
	transitionOnce.Do(func() {
		s := startFleetBench(b, harness.SimpleSpec("demo", "fake"), "--tokens", "4")
		for i := 0; i < transitionReps; i++ {
			before := bothReady(b, s)
			t0 := time.Now()
			if err := syscall.Kill(before.PID, syscall.SIGKILL); err != nil {
				b.Fatalf("kill the engine: %v", err)
			}
			var wg sync.WaitGroup
			for k, mgmt := range []*mgmtclient.Client{s.host.r.Mgmt, s.server.Mgmt} {
				wg.Add(1)
				go func() {
					defer wg.Done()
					transitionSeen[k] = append(transitionSeen[k], firstTransitionAfter(b, mgmt, before.Since, t0))
				}()
			}
			wg.Wait()
		}
	})
	for i := 0; i < b.N; i++ {
	}
	b.ReportMetric(pct(transitionSeen[0], .5), "host-seen-p50-ms")
	b.ReportMetric(pct(transitionSeen[1], .5), "server-seen-p50-ms")
	hop := make([]time.Duration, len(transitionSeen[1]))
	for i := range hop {
		hop[i] = transitionSeen[1][i] - transitionSeen[0][i]
	}
	b.ReportMetric(pct(hop, .5), "server-after-host-p50-ms")
	b.ReportMetric(pct(hop, 1), "server-after-host-max-ms")
	b.ReportMetric(pct(transitionSeen[1], .95), "server-seen-p95-ms")
	b.ReportMetric(pct(transitionSeen[1], 1), "server-seen-max-ms")
}

// bothReady waits until the host and the server both show demo's instance
// ready on one engine process, and returns the host's view.
func bothReady(b testing.TB, s *fleetSetup) wire.InstanceStatus {
	b.Helper()
	// An engine that died stays stopped until asked for: start it.
	if _, err := s.server.Mgmt.Action(context.Background(), "demo", wire.ActionRequest{Action: "start", Wait: true}); err != nil {
		b.Fatalf("start demo through the server: %v", err)
	}
	var inst wire.InstanceStatus
	poll.Until(b, 60*time.Second, "demo ready on the host and at the server", func() bool {
		h, err := s.host.r.Mgmt.Deployment(context.Background(), "demo")
		if err != nil || len(h.Instances) == 0 || h.Instances[0].State != "ready" || h.Instances[0].PID == 0 {
			return false
		}
		v, err := s.server.Mgmt.Deployment(context.Background(), "demo")
		if err != nil || len(v.Instances) == 0 || v.Instances[0].State != "ready" {
			return false
		}
		inst = h.Instances[0]
		return true
	})

	return inst
}

// firstTransitionAfter reads a deployment's status every millisecond until
// its instance shows a transition since after before, and returns how long
// after t0 that was seen.
func firstTransitionAfter(b testing.TB, mgmt *mgmtclient.Client, before, t0 time.Time) time.Duration {
	deadline := t0.Add(60 * time.Second)
	for time.Now().Before(deadline) {
		v, err := mgmt.Deployment(context.Background(), "demo")
		if err == nil && len(v.Instances) > 0 && v.Instances[0].Since.After(before) {
			return time.Since(t0)
		}
		time.Sleep(time.Millisecond)
	}
	b.Errorf("no transition seen at %s within 60 s of the engine's kill", mgmt.Base())
	return time.Since(t0)
}
