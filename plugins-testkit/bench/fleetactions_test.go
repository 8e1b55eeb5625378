// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package bench

import (
	"context"
	"fmt"
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
	// the host's own status shows ([side][0]), and to the first the
	// server's shows ([side][1]); side 0 is this build, side 1, with
	// CAPYCTL_BENCH_BASELINE, a server and host of the baseline build.
	transitionSeen [2][2][]time.Duration
)

// BenchmarkFleet_TransitionSeen is how soon a host's transition reaches
// the server's status (issue 27's figure: within 50 ms). The engine of a
// deployment the server placed is killed with SIGKILL; the host's status
// and the server's are each read every millisecond until they show a
// transition newer than the one before the kill. The host's delay is the
// exit noticed (the driver's exit stream); the server's, minus the host's,
// is the journal's trip over the host link (and, in a build whose server
// asks the host for each status, that call). The instance, stopped by its
// engine's death, is started again through the server before the next
// kill. With CAPYCTL_BENCH_BASELINE naming another build's bin directory,
// a server and a host of that build are measured in the same rounds
// (baseline-*).
func BenchmarkFleet_TransitionSeen(b *testing.B) {
	transitionOnce.Do(func() {
		s := startFleetBench(b, harness.SimpleSpec("demo", "fake"), "--tokens", "4")
		sides := [][2]*mgmtclient.Client{{s.host.r.Mgmt, s.server.Mgmt}}
		if bin := baselineBin(); bin != "" {
			server, host := startFleet(b, bin, harness.SimpleSpec("demo", "fake"), "--tokens", "4")
			sides = append(sides, [2]*mgmtclient.Client{host.r.Mgmt, server.Mgmt})
		}
		for i := 0; i < transitionReps; i++ {
			for side, mgmts := range sides {
				before := bothReady(b, mgmts[0], mgmts[1])
				t0 := time.Now()
				if err := syscall.Kill(before.PID, syscall.SIGKILL); err != nil {
					b.Fatalf("kill the engine: %v", err)
				}
				var wg sync.WaitGroup
				for k, mgmt := range mgmts {
					wg.Add(1)
					go func() {
						defer wg.Done()
						transitionSeen[side][k] = append(transitionSeen[side][k], firstTransitionAfter(b, mgmt, before.Since, t0))
					}()
				}
				wg.Wait()
			}
		}
	})
	for i := 0; i < b.N; i++ {
	}
	for side, prefix := range []string{"", "baseline-"} {
		seen := transitionSeen[side]
		if len(seen[1]) == 0 {
			continue
		}
		b.ReportMetric(pct(seen[0], .5), prefix+"host-seen-p50-ms")
		b.ReportMetric(pct(seen[1], .5), prefix+"server-seen-p50-ms")
		hop := make([]time.Duration, len(seen[1]))
		for i := range hop {
			hop[i] = seen[1][i] - seen[0][i]
		}
		b.ReportMetric(pct(hop, .5), prefix+"server-after-host-p50-ms")
		b.ReportMetric(pct(hop, 1), prefix+"server-after-host-max-ms")
		b.ReportMetric(pct(seen[1], .95), prefix+"server-seen-p95-ms")
		b.ReportMetric(pct(seen[1], 1), prefix+"server-seen-max-ms")
	}
}

// bothReady waits until a host and its server both show demo's instance
// ready on one engine process, and returns the host's view.
func bothReady(b testing.TB, host, server *mgmtclient.Client) wire.InstanceStatus {
	b.Helper()
	// An engine that died stays stopped until asked for: start it.
	if _, err := server.Action(context.Background(), "demo", wire.ActionRequest{Action: "start", Wait: true}); err != nil {
		b.Fatalf("start demo through the server: %v", err)
	}
	var inst wire.InstanceStatus
	poll.Until(b, 60*time.Second, "demo ready on the host and at the server", func() bool {
		h, err := host.Deployment(context.Background(), "demo")
		if err != nil || len(h.Instances) == 0 || h.Instances[0].State != "ready" || h.Instances[0].PID == 0 {
			return false
		}
		v, err := server.Deployment(context.Background(), "demo")
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

// actionReps is how many of each action BenchmarkFleet_ActionsThroughTheServer
// times on each side.
const actionReps = 20

var (
	actionsOnce sync.Once
	// actionTimes: stop, start, park, wake (a start of the parked
	// deployment) and deploy-to-ready, each on the
	// standalone role ([k][0]), through the server to its host ([k][1])
	// and, with CAPYCTL_BENCH_BASELINE, through a server and host of the
	// baseline build ([k][2]).
	actionTimes [5][3][]time.Duration
	// deployCalls: the deploy call alone (its answer), by side.
	deployCalls [3][]time.Duration
	// statusReads: a read of demo's status (ready), by side.
	statusReads [3][]time.Duration
)

// BenchmarkFleet_ActionsThroughTheServer is what the server adds to an
// action (issue 27's figure: at most 20 ms over the same action on a host):
// stop, start, park and wake (a start of the parked deployment) with wait,
// and a deploy until its instance is ready, each
// through a standalone role and through a server that places it on its
// host, alternated, on the same fake engine. The deploy is read every
// millisecond until ready (the CLI's wait reads every 20 ms), and counted
// without the engine's own start, which the instance measures and which
// varies with the machine's load more than the rest. The fake engine is
// restart only, so its park stops it and its wake starts it: what differs
// is the server's path (a park is a command to each host, a start a change
// of the desired state). With
// CAPYCTL_BENCH_BASELINE naming another build's bin directory, a server
// and a host of that build are measured in the same rounds (baseline-*).
// Each round also times 5 reads of the deployment's status (status-read-*).
func BenchmarkFleet_ActionsThroughTheServer(b *testing.B) {
	actionsOnce.Do(func() {
		s := startFleetBench(b, harness.SimpleSpec("demo", "fake"), "--tokens", "4")
		sides := []*mgmtclient.Client{s.alone.r.Mgmt, s.server.Mgmt}
		if bin := baselineBin(); bin != "" {
			server, _ := startFleet(b, bin, harness.SimpleSpec("demo", "fake"), "--tokens", "4")
			sides = append(sides, server.Mgmt)
		}
		ctx := context.Background()
		for i := 0; i < actionReps; i++ {
			for k, mgmt := range sides {
				for a, action := range []string{"stop", "start", "park", "start"} {
					t0 := time.Now()
					if _, err := mgmt.Action(ctx, "demo", wire.ActionRequest{Action: action, Wait: true}); err != nil {
						b.Fatalf("%s demo at %s: %v", action, mgmt.Base(), err)
					}
					actionTimes[a][k] = append(actionTimes[a][k], time.Since(t0))
				}
				toReady, call := deployToReady(b, mgmt, fmt.Sprintf("bench-%d", i))
				actionTimes[4][k] = append(actionTimes[4][k], toReady)
				deployCalls[k] = append(deployCalls[k], call)
				for r := 0; r < 5; r++ {
					t0 := time.Now()
					if _, err := mgmt.Deployment(ctx, "demo"); err != nil {
						b.Fatalf("demo's status at %s: %v", mgmt.Base(), err)
					}
					statusReads[k] = append(statusReads[k], time.Since(t0))
				}
			}
		}
	})
	for i := 0; i < b.N; i++ {
	}
	for a, name := range []string{"stop", "start", "park", "wake", "deploy-less-engine-start"} {
		alone, server := pct(actionTimes[a][0], .5), pct(actionTimes[a][1], .5)
		b.ReportMetric(alone, name+"-standalone-p50-ms")
		b.ReportMetric(server, name+"-server-p50-ms")
		b.ReportMetric(server-alone, name+"-added-p50-ms")
		if len(actionTimes[a][2]) > 0 {
			base := pct(actionTimes[a][2], .5)
			b.ReportMetric(base, name+"-baseline-server-p50-ms")
			b.ReportMetric(base-alone, name+"-baseline-added-p50-ms")
		}
	}
	for k, side := range []string{"standalone", "server", "baseline-server"} {
		if len(deployCalls[k]) > 0 {
			b.ReportMetric(pct(deployCalls[k], .5), "deploy-call-"+side+"-p50-ms")
			b.ReportMetric(pct(statusReads[k], .5), "status-read-"+side+"-p50-ms")
		}
	}
}

// deployToReady deploys a copy of demo under name (its own route, the same
// model and engine) and times it until its instance is ready; it returns
// that time less the start the instance itself measured (the engine's
// launch and load, which vary with the machine's load): the control
// plane's own share, and how long the deploy call itself took. Then it
// deletes the copy.
func deployToReady(b testing.TB, mgmt *mgmtclient.Client, name string) (toReady, call time.Duration) {
	b.Helper()
	ctx := context.Background()
	v, err := mgmt.Deployment(ctx, "demo")
	if err != nil || v.Spec == nil {
		b.Fatalf("demo's spec at %s: %v", mgmt.Base(), err)
	}
	spec := *v.Spec
	spec.Name, spec.Routes = name, []string{name}
	t0 := time.Now()
	if _, err := mgmt.Deploy(ctx, wire.DeployRequest{Deployment: spec, Activate: true}, ""); err != nil {
		b.Fatalf("deploy %s at %s: %v", name, mgmt.Base(), err)
	}
	call = time.Since(t0)
	var ready wire.InstanceStatus
	for {
		st, err := mgmt.Deployment(ctx, name)
		if err == nil && len(st.Instances) > 0 && st.Instances[0].State == "ready" {
			ready = st.Instances[0]
			break
		}
		if time.Since(t0) > time.Minute {
			b.Fatalf("%s not ready at %s within a minute: %v %+v", name, mgmt.Base(), err, st)
		}
		time.Sleep(time.Millisecond)
	}
	took := time.Since(t0)
	if ready.Timings == nil || ready.Timings.StartMs <= 0 {
		b.Fatalf("%s at %s is ready with no measured start: %+v", name, mgmt.Base(), ready)
	}
	if err := mgmt.Delete(ctx, name); err != nil {
		b.Fatalf("delete %s at %s: %v", name, mgmt.Base(), err)
	}
	return took - time.Duration(ready.Timings.StartMs)*time.Millisecond, call
}
