// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

// Package conformance is the driver conformance suite: any driver, built in
// or third-party, runs it against the testkit's fake engines. The suite
// launches the driver as a real go-plugin subprocess and drives the whole
// protocol through it, as the core does: Describe, Flags, Detect of an
// installation whose interpreter is the fake engine, Plan refusals, then a
// lifecycle — start, ready, serve, abort, park (memory released on the
// simulated GPU, a residue left), wake (the canary unchanged), serve, a
// driver restart with Recover, logs without the key, stop with proof — and
// failures at start. A driver's test names its Target and calls Run:
//
//	func TestConformance(t *testing.T) {
//		conformance.Run(t, conformance.Target{
//			Family:  "vllm",
//			Driver:  conformance.BuiltinDriver("vllm"),
//			Install: func(t testing.TB, dir string) string {
//				return conformance.FakeVenv(t, dir, map[string]string{"vllm": "0.31.0"}, nil)
//			},
//		})
//	}
//
// It imports nothing of CapyCTL's core: a third-party driver's module can
// run it (testbin finds or builds the fake engine).
package conformance

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	goplugin "github.com/hashicorp/go-plugin"

	"github.com/capyctl/capyctl/plugins-testkit/fakeengine"
	"github.com/capyctl/capyctl/sdk"
	"github.com/capyctl/capyctl/sdk/engineapi"
	sdkplugin "github.com/capyctl/capyctl/sdk/plugin"
	"github.com/capyctl/capyctl/sdk/proc"
)

// Target is a driver under test.
type Target struct {
	// Family is the engine family the driver serves ("vllm").
	Family string
	// Driver returns the command that serves the driver over go-plugin
	// (BuiltinDriver, ProgramDriver).
	Driver func(t testing.TB) *exec.Cmd
	// Install makes an installation of the engine under dir whose program
	// runs the fake engine (FakeVenv) and returns the path Detect takes.
	Install func(t testing.TB, dir string) string
	// Model makes the model directory under dir (FakeModel with 2 GiB of
	// weights when nil).
	Model func(t testing.TB, dir string) string
	// Deployment returns the deployment the lifecycle runs (a chat
	// deployment named "conformance" when nil).
	Deployment func(modelDir string) *sdk.Deployment
	// HostEnv are more variables every launch gets (the fake engine's
	// knobs); the suite adds its own.
	HostEnv map[string]string
	// Refusals are deployments the driver must refuse at Plan.
	Refusals []Refusal
	// Failures are launches that must fail at start, besides the engine
	// exiting while it loads, which every driver must report.
	Failures []Failure
	// NoSimGPU skips the memory checks (a fake that holds nothing on the
	// simulated GPU).
	NoSimGPU bool
	// ExitStream wants the driver to serve the exit stream (WaitExit,
	// sdk.ExitWaiter): the suite kills a ready engine with SIGKILL and wants
	// its exit, code 137, streamed. Left false, the step checks only that
	// WaitExit answers "not supported" (the role then polls LIVENESS).
	ExitStream bool
	// IsolatedAsRoot wants the engine out of every other user's reach when
	// the suite runs as root: on a Unix socket or in a network namespace
	// of its own, never on the host's loopback.
	IsolatedAsRoot bool
}

// Refusal is a deployment Plan must refuse with Code.
type Refusal struct {
	// Name names the case.
	Name string
	// ExtraArgs and Env are set on the default deployment (with
	// accept_extra_args).
	ExtraArgs []string
	Env       map[string]string
	// Code is the refusal code expected first.
	Code string
}

// Failure is a launch that must fail while it starts.
type Failure struct {
	// Name names the case.
	Name string
	// Env are the fake engine's knobs that make it fail.
	Env map[string]string
	// ExitCode, when not 0, is the exit code the probe must report.
	ExitCode int
	// Check runs after the probe reported the failure, before the stop.
	Check func(t *testing.T, launch *sdk.Launch)
}

const (
	// rpcTimeout bounds one driver call.
	rpcTimeout = 60 * time.Second
	// abortAnswerTokens is the answer of a request without max_tokens, at
	// tokenRate tokens per second: 250 s, four times any wait of the
	// suite (rpcTimeout), so the abort step sees only an engine that
	// stops the request. Every other request (the suite's, a driver's
	// probes and canaries) bounds its answer with max_tokens.
	abortAnswerTokens = 100_000
	tokenRate         = 400
	// readyDeadline bounds a readiness probe (fakes start at once).
	readyDeadline = 60 * time.Second
	// deviceTotal is the simulated card.
	deviceTotal = 80 << 30
	// defaultWeights are the fake model's weights.
	defaultWeights = 2 << 30
)

// suite is one Run's state.
type suite struct {
	tg     Target
	dir    string
	sim    *simGPU
	model  string
	inst   *sdk.Installation
	desc   *sdk.DescribeResponse
	driver *driverProc
	seq    int
	// root is Run's test: a relaunched driver lives as long as it does.
	root *testing.T
}

// Run runs the suite against a target.
func Run(t *testing.T, tg Target) {
	if tg.Family == "" || tg.Driver == nil || tg.Install == nil {
		t.Fatal("conformance: a Target needs Family, Driver and Install")
	}
	s := &suite{tg: tg, dir: t.TempDir(), root: t}
	if tg.Model == nil {
		s.model = FakeModel(t, s.dir, defaultWeights)
	} else {
		s.model = tg.Model(t, s.dir)
	}
	if !tg.NoSimGPU {
		s.sim = newSimGPU(t, s.dir, deviceTotal)
	}
	s.driver = launchDriver(t, tg.Driver(t))
	path := tg.Install(t, s.dir)

	t.Run("describe", s.testDescribe)
	t.Run("flags", s.testFlags)
	t.Run("detect", func(t *testing.T) { s.testDetect(t, path) })
	if s.inst == nil || s.desc == nil {
		t.Fatal("conformance: describe or detect failed; the rest cannot run")
	}
	t.Run("refusals", s.testRefusals)
	t.Run("lifecycle", s.testLifecycle)
	t.Run("exit", s.testExit)
	failures := append([]Failure{{
		Name:     "engine exits while loading",
		Env:      map[string]string{fakeengine.EnvName("exit-during-startup"): "3"},
		ExitCode: 3,
	}}, tg.Failures...)
	for _, f := range failures {
		t.Run("failure/"+f.Name, func(t *testing.T) { s.testFailure(t, f) })
	}
}

// driverProc is a driver served over go-plugin.
type driverProc struct {
	client *goplugin.Client
	drv    sdk.Driver
}

// launchDriver starts the driver command as a go-plugin subprocess.
func launchDriver(t testing.TB, cmd *exec.Cmd) *driverProc {
	t.Helper()
	client := goplugin.NewClient(&goplugin.ClientConfig{
		HandshakeConfig:  sdkplugin.Handshake,
		VersionedPlugins: sdkplugin.VersionedPlugins(nil),
		Cmd:              cmd,
		AllowedProtocols: []goplugin.Protocol{goplugin.ProtocolGRPC},
		Logger:           hclog.NewNullLogger(),
		StartTimeout:     30 * time.Second,
	})
	t.Cleanup(client.Kill)
	rpc, err := client.Client()
	if err != nil {
		t.Fatalf("launch driver %v: %v", cmd.Args, err)
	}
	raw, err := rpc.Dispense(sdkplugin.PluginName)
	if err != nil {
		t.Fatalf("dispense driver: %v", err)
	}
	drv, ok := raw.(sdk.Driver)
	if !ok {
		t.Fatalf("the plugin is a %T, not an sdk.Driver", raw)
	}
	return &driverProc{client: client, drv: drv}
}

func ctxT() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), rpcTimeout)
}

func (s *suite) testDescribe(t *testing.T) {
	ctx, cancel := ctxT()
	defer cancel()
	d, err := s.driver.drv.Describe(ctx, &sdk.DescribeRequest{})
	if err != nil {
		t.Fatal(err)
	}
	c := &d.Capabilities
	switch {
	case d.Name != s.tg.Family:
		t.Fatalf("Describe name %q, want %q", d.Name, s.tg.Family)
	case d.Protocol != sdk.ProtocolVersion:
		t.Fatalf("protocol %d, want %d", d.Protocol, sdk.ProtocolVersion)
	case len(c.APIs) == 0:
		t.Fatal("no API in the capabilities")
	case c.AbortMode == sdk.AbortModeUnspecified:
		t.Fatal("no abort mode")
	case c.AbortMode == sdk.AbortModeRequestID && c.RequestIDField == "" && c.RequestIDHeader == "":
		t.Fatal("abort by request ID without a request ID field or header")
	}
	for _, tier := range c.ParkTiers {
		if tier != "deep" && tier != "host_backed" {
			t.Fatalf("unknown park tier %q", tier)
		}
	}
	s.desc = d
}

func (s *suite) testFlags(t *testing.T) {
	ctx, cancel := ctxT()
	defer cancel()
	fl, err := s.driver.drv.Flags(ctx, &sdk.FlagsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if fl.Family != s.tg.Family || len(fl.Rules) == 0 {
		t.Fatalf("Flags = %v", fl)
	}
	seen := map[string]bool{}
	for _, r := range fl.Rules {
		key := r.Kind.String() + "/" + r.Name
		switch {
		case r.Name == "" || r.Reason == "":
			t.Errorf("rule %v lacks a name or reason", r)
		case r.Kind == sdk.FlagKindUnspecified || r.Class == sdk.FlagClassUnspecified:
			t.Errorf("rule %s lacks a kind or class", r.Name)
		case (r.Class == sdk.FlagClassGated) != (r.Approval != ""):
			t.Errorf("rule %s: class %v with approval %q", r.Name, r.Class, r.Approval)
		case seen[key]:
			t.Errorf("rule %s listed twice", key)
		}
		seen[key] = true
	}
}

func (s *suite) testDetect(t *testing.T, path string) {
	ctx, cancel := ctxT()
	defer cancel()
	det, err := s.driver.drv.Detect(ctx, &sdk.DetectRequest{Path: path})
	if err != nil {
		t.Fatalf("Detect(%s): %v", path, err)
	}
	if det.Family != s.tg.Family || det.Version == "" || !strings.HasPrefix(det.Digest, "sha256:") || det.Program == "" {
		t.Fatalf("Detect = %v", det)
	}
	again, err := s.driver.drv.Detect(ctx, &sdk.DetectRequest{Path: path})
	if err != nil || again.Digest != det.Digest {
		t.Fatalf("the digest of an unchanged installation changed: %v %v", again, err)
	}
	if _, err := s.driver.drv.Detect(ctx, &sdk.DetectRequest{Path: t.TempDir()}); err == nil {
		t.Fatal("Detect of an empty directory succeeded")
	}
	s.inst = &sdk.Installation{Name: s.tg.Family, Family: s.tg.Family, Path: path, Version: det.Version,
		Verified: det.Verified, Digest: det.Digest, Details: det.Details}
}

// deployment is the target's deployment.
func (s *suite) deployment() *sdk.Deployment {
	if s.tg.Deployment != nil {
		return s.tg.Deployment(s.model)
	}
	return &sdk.Deployment{Name: "conformance", Revision: 1, API: "chat", ServedName: "conformance", ModelDir: s.model}
}

// host is the host policy of a launch, with the suite's knobs and more.
func (s *suite) host(extra map[string]string) *sdk.HostPolicy {
	env := map[string]string{
		// Answers far longer than any wait of the suite (see abortAnswer),
		// so that an engine that does not stop an aborted request fails
		// the abort step instead of ending the request by itself within
		// its wait; bounded ones (max_tokens) end quickly.
		fakeengine.EnvName("tokens"):     strconv.Itoa(abortAnswerTokens),
		fakeengine.EnvName("token-rate"): strconv.Itoa(tokenRate),
		// The engine prints its key: the logs must not show it.
		fakeengine.EnvName("log-secret"): "true",
	}
	if s.sim != nil {
		env[fakeengine.EnvSimState] = s.sim.gpu.Path()
	}
	for k, v := range s.tg.HostEnv {
		env[k] = v
	}
	for k, v := range extra {
		env[k] = v
	}
	return &sdk.HostPolicy{EngineTelemetry: "off", EngineLogs: "file", Retention: "standard", HostEnv: env}
}

// launchContext is a fresh launch context.
func (s *suite) launchContext(t *testing.T) *sdk.LaunchContext {
	s.seq++
	id := fmt.Sprintf("conformance/%d", s.seq)
	lctx := &sdk.LaunchContext{
		Port: int32(freePort(t)), LaunchDir: filepath.Join(s.dir, "launches", fmt.Sprintf("%d", s.seq)),
		InstanceID: id, LaunchID: fmt.Sprintf("L%d", s.seq),
	}
	if s.sim != nil {
		lctx.DeviceUUIDs = []string{s.sim.dev.UUID}
		lctx.DeviceTotalBytes = deviceTotal
		lctx.DeviceBytes = 20 << 30
		lctx.KVCacheBytes = 4 << 30
	}
	return lctx
}

func (s *suite) testRefusals(t *testing.T) {
	cases := append([]Refusal{{Name: "extra args without accept_extra_args"}}, s.tg.Refusals...)
	for _, c := range cases {
		t.Run(c.Name, func(t *testing.T) {
			dep := s.deployment()
			if c.Code == "" { // the built-in case
				dep.ExtraArgs, dep.AcceptExtraArgs = []string{"--some-option"}, false
				c.Code = "extra_args_not_accepted"
			} else {
				dep.AcceptExtraArgs = true
				dep.ExtraArgs = c.ExtraArgs
				dep.Env = c.Env
			}
			ctx, cancel := ctxT()
			defer cancel()
			plan, err := s.driver.drv.Plan(ctx, &sdk.PlanRequest{Installation: *s.inst, Deployment: *dep, Host: *s.host(nil)})
			if err != nil {
				t.Fatalf("Plan failed instead of refusing: %v", err)
			}
			rs := plan.Refusals
			if len(rs) == 0 || rs[0].Code != c.Code || rs[0].Message == "" {
				t.Fatalf("refusals %v, want %s first", rs, c.Code)
			}
		})
	}
}

// started is a launch under test.
type started struct {
	lctx   *sdk.LaunchContext
	dep    *sdk.Deployment
	host   *sdk.HostPolicy
	plan   *sdk.PlanResponse
	launch *sdk.Launch
	key    string
}

// start plans and starts a launch.
func (s *suite) start(t *testing.T, extraEnv map[string]string) *started {
	t.Helper()
	st := &started{lctx: s.launchContext(t), dep: s.deployment(), host: s.host(extraEnv), key: "-conformance-key-" + fmt.Sprint(time.Now().UnixNano())} // a leading "-", as one launch key in 64 has
	ctx, cancel := ctxT()
	defer cancel()
	plan, err := s.driver.drv.Plan(ctx, &sdk.PlanRequest{Installation: *s.inst, Deployment: *st.dep, Host: *st.host, Launch: *st.lctx})
	if err != nil {
		t.Fatalf("Plan: %v", err)
	}
	if len(plan.Refusals) > 0 || len(plan.Argv) == 0 || plan.Residency == "" {
		t.Fatalf("Plan = %v", plan)
	}
	for _, a := range plan.Argv {
		if strings.Contains(a, st.key) {
			t.Fatal("the key is in the plan")
		}
	}
	st.plan = plan
	resp, err := s.driver.drv.Start(ctx, &sdk.StartRequest{Installation: *s.inst, Deployment: *st.dep, Host: *st.host, Launch: *st.lctx,
		Plan: *plan, EngineKey: st.key, AdminKey: st.key + "-admin"})
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	st.launch = &resp.Launch
	if st.launch.Pgid <= 1 || len(st.launch.Processes) == 0 {
		t.Fatalf("Start recorded no processes: %v", st.launch)
	}
	pgid := int(st.launch.Pgid)
	t.Cleanup(func() {
		if len(proc.GroupPIDs(pgid)) > 0 {
			_ = syscall.Kill(-pgid, syscall.SIGKILL)
		}
	})
	return st
}

// enginePID is the launch's engine process.
func (st *started) enginePID() int {
	for _, p := range st.launch.Processes {
		if p.Role == "engine" {
			return int(p.Pid)
		}
	}
	return 0
}

// held is what the launch's processes hold on the simulated GPU.
func (s *suite) held(t *testing.T, st *started) int64 {
	pids := append(proc.GroupPIDs(int(st.launch.Pgid)), st.enginePID())
	return s.sim.heldBy(t, pids)
}

func (s *suite) probe(t *testing.T, id string, kind sdk.ProbeKind) *sdk.ProbeResponse {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), readyDeadline+10*time.Second)
	defer cancel()
	p, err := s.driver.drv.Probe(ctx, &sdk.ProbeRequest{InstanceID: id, Kind: kind, Deadline: readyDeadline})
	if err != nil {
		t.Fatalf("Probe %v: %v", kind, err)
	}
	return p
}

func (s *suite) testLifecycle(t *testing.T) {
	st := s.start(t, nil)
	id := st.lctx.InstanceID

	// ready
	ready := s.probe(t, id, sdk.ProbeKindReadiness)
	if !ready.Ready || ready.Endpoint.BaseURL == "" {
		t.Fatalf("not ready: %v", ready)
	}
	canary := ready.Canary
	if canary == "" {
		t.Fatal("readiness recorded no canary answer")
	}
	ep := &ready.Endpoint
	if ep.ServedName != st.dep.ServedName {
		t.Fatalf("endpoint %v", ep)
	}
	s.checkListener(t, st, ep)
	if live := s.probe(t, id, sdk.ProbeKindLiveness); !live.Alive {
		t.Fatalf("liveness %v", live)
	}

	// serve
	s.serve(t, ep)
	s.waitIdle(t, id)
	var readyBytes int64
	if s.sim != nil {
		readyBytes = s.held(t, st)
		if readyBytes <= 0 {
			t.Fatal("the ready engine holds nothing on the simulated GPU")
		}
	}

	// abort
	if contains(s.desc.Capabilities.APIs, "chat") {
		s.testAbort(t, id, ep)
	}

	// park → parked → wake → serve, at each tier the driver has, when the
	// launch parks.
	tiers := s.desc.Capabilities.ParkTiers
	parks := st.plan.Residency == "deep" || st.plan.Residency == "host_backed"
	if parks {
		for _, tier := range tiers {
			s.park(t, st, tier, readyBytes)
			s.wake(t, st, ep, tier, canary, readyBytes)
		}
		// A driver restart while parked: the new driver finds the engine
		// parked, and wakes it.
		if len(tiers) > 0 {
			s.park(t, st, tiers[0], readyBytes)
			if rec := s.restartAndRecover(t, st, "parked", tiers[0]); !rec.Parked {
				t.Fatalf("Recover of a parked engine: %v, want parked", rec)
			}
			s.wake(t, st, ep, tiers[0], canary, readyBytes)
		}
	}

	// A driver restart while ready: the engine survives, a new driver
	// re-attaches.
	if rec := s.restartAndRecover(t, st, "ready", ""); rec.Parked {
		t.Fatalf("Recover of a ready engine says parked: %v", rec)
	}
	again := s.probe(t, id, sdk.ProbeKindReadiness)
	if !again.Ready {
		t.Fatalf("not ready after re-attaching: %v", again)
	}
	s.checkListener(t, st, &again.Endpoint)
	s.serve(t, &again.Endpoint)
	s.waitIdle(t, id)

	// logs: the engine's output, its key redacted
	ctx, cancel := ctxT()
	logs, err := s.driver.drv.Logs(ctx, &sdk.LogsRequest{InstanceID: id, MaxBytes: 64 << 10})
	cancel()
	if err != nil || strings.TrimSpace(logs.Text) == "" {
		t.Fatalf("Logs = %v, %v", logs, err)
	}
	if strings.Contains(logs.Text, st.key) {
		t.Fatal("the engine key is in the logs")
	}
	if !strings.Contains(logs.Text, proc.Redacted) {
		t.Fatalf("the engine printed its key (log-secret) but the logs show no redaction:\n%s", logs.Text)
	}

	// stop with proof
	ctx, cancel = ctxT()
	stop, err := s.driver.drv.Stop(ctx, &sdk.StopRequest{InstanceID: id, Grace: 10 * time.Second, Launch: st.launch})
	cancel()
	if err != nil || !stop.Gone {
		t.Fatalf("Stop = %v, %v", stop, err)
	}
	if left := proc.GroupPIDs(int(st.launch.Pgid)); len(left) > 0 {
		t.Fatalf("processes left after a stop that reported them gone: %v", left)
	}
	if s.sim != nil {
		if n := s.sim.heldBy(t, []int{st.enginePID()}); n != 0 {
			t.Fatalf("%d bytes still held on the simulated GPU after the stop", n)
		}
	}
}

// testExit: a ready engine killed with SIGKILL is reported by the exit
// stream, which stays open while the engine runs.
func (s *suite) testExit(t *testing.T) {
	st := s.start(t, nil)
	id := st.lctx.InstanceID
	if ready := s.probe(t, id, sdk.ProbeKindReadiness); !ready.Ready {
		t.Fatalf("not ready: %v", ready)
	}
	w, ok := s.driver.drv.(sdk.ExitWaiter)
	if !ok {
		t.Fatalf("the plugin client %T has no WaitExit", s.driver.drv)
	}
	ctx, cancel := ctxT()
	defer cancel()
	type result struct {
		ev  *sdk.ExitEvent
		err error
	}
	done := make(chan result, 1)
	go func() {
		ev, err := w.WaitExit(ctx, &sdk.WaitExitRequest{InstanceID: id})
		done <- result{ev, err}
	}()
	if !s.tg.ExitStream {
		if r := <-done; !errors.Is(r.err, sdk.ErrNotSupported) {
			t.Fatalf("WaitExit of a driver without the exit stream = %v, %v; want not supported (or set Target.ExitStream)", r.ev, r.err)
		}
	} else {
		// A liveness round trip while the stream is open: the stream must
		// not have ended for an engine that runs.
		if live := s.probe(t, id, sdk.ProbeKindLiveness); !live.Alive {
			t.Fatalf("liveness %v", live)
		}
		select {
		case r := <-done:
			t.Fatalf("WaitExit returned while the engine runs: %v, %v", r.ev, r.err)
		default:
		}
		if err := syscall.Kill(st.enginePID(), syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		r := <-done
		if r.err != nil || !r.ev.Exited || r.ev.ExitCode != 128+int32(syscall.SIGKILL) {
			t.Fatalf("WaitExit after a SIGKILL of the engine = %v, %v; want exited with code 137", r.ev, r.err)
		}
	}
	sctx, scancel := ctxT()
	defer scancel()
	if stop, err := s.driver.drv.Stop(sctx, &sdk.StopRequest{InstanceID: id, Grace: 10 * time.Second, Launch: st.launch}); err != nil || !stop.Gone {
		t.Fatalf("Stop = %v, %v", stop, err)
	}
}

// park parks at a tier and checks that the card keeps only a residue.
func (s *suite) park(t *testing.T, st *started, tier string, readyBytes int64) {
	t.Helper()
	ctx, cancel := ctxT()
	_, err := s.driver.drv.Park(ctx, &sdk.ParkRequest{InstanceID: st.lctx.InstanceID, Tier: tier})
	cancel()
	if err != nil {
		t.Fatalf("Park %s: %v", tier, err)
	}
	if s.sim != nil {
		parked := s.held(t, st)
		if parked <= 0 || parked >= readyBytes {
			t.Fatalf("parked %s: %d bytes held on the simulated GPU, ready %d: want a residue above 0 and below the ready charge", tier, parked, readyBytes)
		}
	}
}

// wake wakes from a tier, checks the canary and the memory, and serves.
func (s *suite) wake(t *testing.T, st *started, ep *sdk.Endpoint, tier, canary string, readyBytes int64) {
	t.Helper()
	id := st.lctx.InstanceID
	ctx, cancel := ctxT()
	woke, err := s.driver.drv.Wake(ctx, &sdk.WakeRequest{InstanceID: id, Tier: tier})
	cancel()
	if err != nil {
		t.Fatalf("Wake %s: %v", tier, err)
	}
	if woke.Canary != canary {
		t.Fatalf("wake %s: canary %q, want the readiness answer %q", tier, woke.Canary, canary)
	}
	if s.sim != nil {
		if n := s.held(t, st); n != readyBytes {
			t.Fatalf("woken from %s: %d bytes held, want %d as when ready", tier, n, readyBytes)
		}
	}
	s.serve(t, ep)
	s.waitIdle(t, id)
}

// restartAndRecover kills the driver, launches a new one and re-attaches
// to the launch as the core would after a restart.
func (s *suite) restartAndRecover(t *testing.T, st *started, recorded, tier string) *sdk.RecoverResponse {
	t.Helper()
	s.driver.client.Kill()
	s.driver = launchDriver(s.root, s.tg.Driver(t))
	ctx, cancel := ctxT()
	defer cancel()
	rec, err := s.driver.drv.Recover(ctx, &sdk.RecoverRequest{InstanceID: st.lctx.InstanceID, Launch: *st.launch, Installation: *s.inst,
		Deployment: *st.dep, Host: *st.host, Context: *st.lctx, EngineKey: st.key, AdminKey: st.key + "-admin",
		RecordedState: recorded, ParkTier: tier})
	if err != nil || rec.State != sdk.RecoverStateRunning {
		t.Fatalf("Recover (%s) after a driver restart: %v %v", recorded, rec, err)
	}
	return rec
}

// checkListener wants the engine where its endpoint says: on a Unix
// socket in its 0700 launch directory with nothing on the leased port, or
// on the leased loopback port, saying which routes answer any local user.
func (s *suite) checkListener(t *testing.T, st *started, ep *sdk.Endpoint) {
	t.Helper()
	port := st.lctx.Port
	if ns, ok := engineapi.NetnsFromURL(ep.BaseURL); ok {
		var engine proc.Identity
		for _, p := range st.launch.Processes {
			if p.Role == "engine" {
				engine = proc.Identity{PID: int(p.Pid), StartTicks: p.StartTicks}
			}
		}
		if ep.Listener != "netns" || ns.Port != int(port) || ns.Engine != engine {
			t.Fatalf("endpoint %v: a namespaced engine not on the leased port %d of the launched engine %+v, or not reported", ep, port, engine)
		}
		if len(ep.OpenRoutes) > 0 {
			t.Fatalf("endpoint %v: in a namespace of its own yet routes open to other users", ep)
		}
		// A foreign client on the host's loopback reaches nothing: the
		// leased port is closed there.
		if c, err := net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", port)); err == nil {
			c.Close()
			t.Fatalf("the engine is said to be in a namespace of its own, but 127.0.0.1:%d answers on the host", port)
		}
		ctx, cancel := ctxT()
		defer cancel()
		if _, err := engineClient(ep).GetJSON(ctx, "/v1/models", nil); err != nil {
			t.Fatalf("the namespaced engine does not answer through its namespace: %v", err)
		}
		t.Logf("the engine listens on port %d in a network namespace of its own", port)
		return
	}
	if s.tg.IsolatedAsRoot && os.Geteuid() == 0 && ep.Listener != "unix" {
		t.Fatalf("endpoint %v: as root the engine must be on a Unix socket or in a network namespace of its own, not on the host's loopback where any user reaches it", ep)
	}
	if sock, ok := engineapi.UnixSocket(ep.BaseURL); ok {
		if ep.Listener != "unix" || filepath.Dir(sock) != st.lctx.LaunchDir {
			t.Fatalf("endpoint %v: a socket outside the launch directory %s, or not reported", ep, st.lctx.LaunchDir)
		}
		if fi, err := os.Stat(st.lctx.LaunchDir); err != nil || fi.Mode().Perm() != 0o700 {
			t.Fatalf("launch directory %v, %v: want mode 0700", fi, err)
		}
		if c, err := net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", port)); err == nil {
			c.Close()
			t.Fatalf("the engine serves on %s and something listens on the leased port %d too", sock, port)
		}
		t.Logf("the engine listens on %s only", sock)
		return
	}
	if ep.BaseURL != fmt.Sprintf("http://127.0.0.1:%d", port) {
		t.Fatalf("endpoint %v: neither the leased loopback port %d nor a socket", ep, port)
	}
	if ep.Listener == "unix" {
		t.Fatalf("endpoint %v: says unix but is a port", ep)
	}
	if ep.Listener == "tcp" && len(ep.OpenRoutes) == 0 {
		t.Fatalf("endpoint %v: on TCP without saying which routes answer any local user", ep)
	}
	t.Logf("the engine listens on the loopback port %d; open without the key: %v (%s)", port, ep.OpenRoutes, ep.ExposureNote)
}

// engineClient is a client of the endpoint's engine, on its port or its
// socket, with its key.
func engineClient(ep *sdk.Endpoint) *engineapi.EngineClient {
	return engineapi.NewEngineClient(ep.BaseURL, ep.AuthHeader, ep.AuthValue)
}

// chatRequest builds a chat request to an endpoint; engineClient(ep) sends
// it.
func chatRequest(ctx context.Context, ep *sdk.Endpoint, stream bool, maxTokens int, requestID string) (*http.Request, error) {
	body := map[string]any{
		"model":    ep.ServedName,
		"messages": []map[string]string{{"role": "user", "content": "Hello from the conformance suite"}},
		"stream":   stream,
	}
	if maxTokens > 0 {
		body["max_tokens"] = maxTokens
	}
	if f := ep.RequestIDField; f != "" && requestID != "" {
		body[f] = requestID
	}
	b, _ := json.Marshal(body)
	req, err := engineClient(ep).NewRequest(ctx, http.MethodPost, ep.ChatPath, strings.NewReader(string(b)))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	if h := ep.RequestIDHeader; h != "" && requestID != "" {
		req.Header.Set(h, requestID)
	}
	return req, nil
}

// serve sends one short chat request through the endpoint, as the router
// would, and wants an answer.
func (s *suite) serve(t *testing.T, ep *sdk.Endpoint) {
	t.Helper()
	ctx, cancel := ctxT()
	defer cancel()
	req, err := chatRequest(ctx, ep, false, 16, "")
	if err != nil {
		t.Fatal(err)
	}
	resp, err := engineClient(ep).HTTPClient().Do(req)
	if err != nil {
		t.Fatalf("serve: %v", err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("serve: %d %s", resp.StatusCode, body)
	}
	if text, err := engineapi.ChatAnswer(body); err != nil || text == "" {
		t.Fatalf("serve: no answer in %s (%v)", body, err)
	}
}

// waitIdle polls Load until nothing runs or waits.
func (s *suite) waitIdle(t *testing.T, id string) {
	t.Helper()
	ctx, cancel := ctxT()
	defer cancel()
	var last *sdk.LoadResponse
	err := engineapi.Poll(ctx, func(ctx context.Context) (bool, error) {
		l, err := s.driver.drv.Load(ctx, &sdk.LoadRequest{InstanceID: id})
		if err != nil {
			return false, err
		}
		last = l
		return l.Known && l.Running == 0 && l.Waiting == 0, nil
	})
	if err != nil {
		t.Fatalf("the engine never read idle: %v (last %v)", err, last)
	}
}

// testAbort starts a streamed request that would run for minutes
// (abortAnswerTokens), asks the driver to abort it and wants the engine to
// stop working on it within rpcTimeout: by request ID, the engine ends the
// stream without finishing the answer; by closing the connection, the
// engine reads idle once the client hung up. An engine that lets an
// abandoned request run on fails either way.
func (s *suite) testAbort(t *testing.T, id string, ep *sdk.Endpoint) {
	t.Helper()
	rctx, hangUp := context.WithTimeout(context.Background(), rpcTimeout)
	defer hangUp()
	const rid = "conformance-abort-1"
	req, err := chatRequest(rctx, ep, true, 0, rid)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := engineClient(ep).HTTPClient().Do(req)
	if err != nil {
		t.Fatalf("abort: the request: %v", err)
	}
	defer resp.Body.Close()
	rd := bufio.NewReader(resp.Body)
	for {
		line, err := rd.ReadString('\n')
		if err != nil {
			t.Fatalf("abort: the stream ended before its first token: %v", err)
		}
		if strings.Contains(line, `"content"`) {
			break
		}
	}
	ctx, cancel := ctxT()
	ab, err := s.driver.drv.Abort(ctx, &sdk.AbortRequest{InstanceID: id, RequestID: rid})
	cancel()
	if err != nil {
		t.Fatalf("Abort: %v", err)
	}
	switch ab.Mode {
	case sdk.AbortModeRequestID:
		if !ab.Sent {
			t.Fatal("abort by request ID sent nothing")
		}
		// The engine ends the stream itself, long before its answer's end.
		rest, err := io.ReadAll(rd)
		if err != nil {
			t.Fatalf("the engine did not end the aborted request's stream within %s: %v", rpcTimeout, err)
		}
		if strings.Contains(string(rest), `"finish_reason":"stop"`) || strings.Contains(string(rest), `"finish_reason":"length"`) {
			t.Fatal("the aborted request ran to its end")
		}
	case sdk.AbortModeCloseConnection:
		hangUp() // what the router does
		t.Log("abort: the client hung up; the engine must read idle long before the request's own end")
	default:
		t.Fatalf("abort mode %v", ab.Mode)
	}
	s.waitIdle(t, id)
}

// testFailure starts a launch that must fail while it loads and wants the
// probe to say so at once, with the engine's last log lines.
func (s *suite) testFailure(t *testing.T, f Failure) {
	st := s.start(t, f.Env)
	id := st.lctx.InstanceID
	p := s.probe(t, id, sdk.ProbeKindReadiness)
	if p.Ready || !p.Exited || p.Code != sdk.CodeLaunchFailed {
		t.Fatalf("probe of a failing launch: %v", p)
	}
	if len(p.LastLogLines) == 0 {
		t.Fatal("the failure carries no log lines")
	}
	if f.ExitCode != 0 && int(p.ExitCode) != f.ExitCode {
		t.Fatalf("exit code %d, want %d", p.ExitCode, f.ExitCode)
	}
	if f.Check != nil {
		f.Check(t, st.launch)
	}
	ctx, cancel := ctxT()
	stop, err := s.driver.drv.Stop(ctx, &sdk.StopRequest{InstanceID: id, Grace: 5 * time.Second, Launch: st.launch})
	cancel()
	if err != nil || !stop.Gone {
		t.Fatalf("Stop after a failed start = %v, %v", stop, err)
	}
	if s.sim != nil {
		if n := s.sim.heldBy(t, []int{st.enginePID()}); n != 0 {
			t.Fatalf("%d bytes still held after the failed launch stopped", n)
		}
	}
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// ShmSegmentsOf lists the /dev/shm entries whose name holds the pid (the
// fake SGLang names its segment sglang_loads_<pid>.shm).
func ShmSegmentsOf(pid int) []string {
	matches, _ := filepath.Glob(filepath.Join("/dev/shm", fmt.Sprintf("*_%d.shm", pid)))
	var out []string
	for _, m := range matches {
		if _, err := os.Stat(m); err == nil {
			out = append(out, m)
		}
	}
	return out
}
