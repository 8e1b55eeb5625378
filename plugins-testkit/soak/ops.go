// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package soak

import (
	"context"
	"fmt"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/capyctl/capyctl/core/api/wire"
	"github.com/capyctl/capyctl/core/structs"
	"github.com/capyctl/capyctl/plugins-testkit/harness"
)

// operation is one kind of operation, drawn with its weight.
type operation struct {
	name   string
	weight int
	// run performs it and says what it did and how it ended ("ok",
	// "refused <code>", "skipped: why").
	run func(r *Runner) (what, outcome string)
}

// operations are the soak's operations and their weights; the fleet
// profile kills its own processes (the server, a host agent, a host's
// driver).
func (r *Runner) operations() []operation {
	if r.fleet != nil {
		ops := r.standaloneOps()
		for i := range ops {
			switch ops[i].name {
			case "kill -9 role":
				ops[i] = operation{"kill -9 server", r.profile.RoleKill, (*Runner).killServer}
			case "kill -9 driver":
				ops[i].run = (*Runner).killFleetDriver
			}
		}
		return append(ops, operation{"kill -9 host agent", 10, (*Runner).opKillHost})
	}
	return r.standaloneOps()
}

// standaloneOps are the operations on a standalone role. Weights are in
// tenths; the role's kill takes the profile's RoleKill weight (the long
// profile kills the role rarely, so that each life of the role lasts long
// enough to show whether its memory grows).
func (r *Runner) standaloneOps() []operation {
	return []operation{
		{"request", 300, (*Runner).opRequest},
		{"stream", 200, (*Runner).opStream},
		{"hang-up", 100, (*Runner).opHangUp},
		{"start", 80, (*Runner).opStart},
		{"stop", 60, (*Runner).opStop},
		{"park", 60, (*Runner).opPark},
		{"wake", 50, (*Runner).opWake},
		{"deploy", 60, (*Runner).opDeploy},
		{"update", 40, (*Runner).opUpdate},
		{"delete", 20, (*Runner).opDelete},
		{"idle timeout", 20, (*Runner).opIdle},
		{"kill -9 engine", 20, (*Runner).opKillEngine},
		{"kill -9 driver", 10, (*Runner).opKillDriver},
		{"kill -9 role", r.profile.RoleKill, (*Runner).opKillRole},
	}
}

// opBound bounds one management operation (a start that waits for a
// switch, a stop that waits out a drain).
const opBound = 120 * time.Second

// draw picks the next operation. A fault (kill -9) is drawn by weight like
// the rest, but the short profile makes sure each one happens at least
// once: at a third, at a half and at two thirds of the run.
func (r *Runner) draw() operation {
	ops := r.operations()
	byName := map[string]operation{}
	total := 0
	for _, o := range ops {
		byName[o.name] = o
		total += o.weight
	}
	next := r.ops + 1
	if r.profile.Ops > 0 {
		switch next {
		case r.profile.Ops / 3:
			return byName["kill -9 engine"]
		case r.profile.Ops / 2:
			return byName["kill -9 driver"]
		case 2 * r.profile.Ops / 3:
			if r.fleet != nil {
				return byName["kill -9 server"]
			}
			return byName["kill -9 role"]
		case 5 * r.profile.Ops / 6:
			if r.fleet != nil {
				return byName["kill -9 host agent"]
			}
		}
	}
	n := r.rng.IntN(total)
	for _, o := range ops {
		if n < o.weight {
			return o
		}
		n -= o.weight
	}
	return ops[0]
}

// pick draws a deployment of the pool that matches ok; nil when none.
func (r *Runner) pick(ok func(d *depState) bool) *depState {
	var cands []*depState
	for _, n := range r.names {
		if d := r.deps[n]; ok(d) {
			cands = append(cands, d)
		}
	}
	if len(cands) == 0 {
		return nil
	}
	return cands[r.rng.IntN(len(cands))]
}

func deployed(d *depState) bool { return d.deployed }

// refusal describes a management call's outcome: "ok", "refused <code>",
// or a violation when it hung past its bound or answered without a code
// (or with internal, a bug by definition).
func (r *Runner) refusal(what string, ctx context.Context, err error) string {
	if err == nil {
		return "ok"
	}
	if ctx.Err() != nil {
		r.fail(what, fmt.Sprintf("%s did not return within %s: %v", what, opBound, err))
	}
	code := string(structs.CodeOf(err))
	if code == "" || code == string(structs.CodeInternal) {
		r.fail(what, fmt.Sprintf("%s answered without a coded refusal: %v", what, err))
	}
	if _, ok := r.codes[strings.SplitN(code, ":", 2)[0]]; !ok {
		r.fail(what, fmt.Sprintf("%s answered %q, a code outside the catalogue: %v", what, code, err))
	}
	return "refused " + code + ": " + firstLine(err.Error())
}

// action runs a management action on a deployment, bounded.
func (r *Runner) action(d *depState, req wire.ActionRequest) string {
	what := fmt.Sprintf("%s %s (wait %v evict %v)", req.Action, d.spec.name, req.Wait, req.Evict)
	ctx, cancel := ctxFor(opBound)
	defer cancel()
	_, err := r.role.Mgmt.Action(ctx, d.spec.name, req)
	out := r.refusal(what, ctx, err)
	switch req.Action {
	case wire.ActionStart:
		if err == nil || !structs.HasCode(err, structs.CodeNotFound) {
			d.desired = "running"
		}
	case wire.ActionStop:
		if err == nil || !structs.HasCode(err, structs.CodeNotFound) {
			d.desired = "stopped"
		}
	}
	return out
}

func (r *Runner) opStart() (string, string) {
	d := r.pick(deployed)
	if d == nil {
		return "start", "skipped: nothing deployed"
	}
	req := wire.ActionRequest{Action: wire.ActionStart, Wait: r.rng.IntN(3) > 0, Evict: r.rng.IntN(2) == 0}
	return "start " + d.spec.name, r.action(d, req)
}

func (r *Runner) opStop() (string, string) {
	d := r.pick(deployed)
	if d == nil {
		return "stop", "skipped: nothing deployed"
	}
	return "stop " + d.spec.name, r.action(d, wire.ActionRequest{Action: wire.ActionStop, Wait: r.rng.IntN(3) > 0})
}

func (r *Runner) opPark() (string, string) {
	d := r.pick(deployed)
	if d == nil {
		return "park", "skipped: nothing deployed"
	}
	return "park " + d.spec.name, r.action(d, wire.ActionRequest{Action: wire.ActionPark, Wait: r.rng.IntN(3) > 0})
}

// opWake starts a parked deployment through the management API (a
// request's wake is opRequest's).
func (r *Runner) opWake() (string, string) {
	parked := map[string]bool{}
	if snap, err := r.snapshot(); err == nil {
		for _, d := range snap.Deployments {
			for _, in := range d.Instances {
				if in.State == "parked" {
					parked[d.Name] = true
				}
			}
		}
	}
	d := r.pick(func(d *depState) bool { return d.deployed && parked[d.spec.name] })
	if d == nil {
		return "wake", "skipped: nothing parked"
	}
	return "wake " + d.spec.name, r.action(d, wire.ActionRequest{Action: wire.ActionStart, Wait: true, Evict: true})
}

// opDeploy writes a deployment of the pool that is not deployed, through
// the CLI, activated or not.
func (r *Runner) opDeploy() (string, string) {
	d := r.pick(func(d *depState) bool { return !d.deployed })
	if d == nil {
		return "deploy", "skipped: the whole pool is deployed"
	}
	activate := r.rng.IntN(2) == 0
	d.variant = r.rng.IntN(6)
	args := []string{}
	if activate {
		args = append(args, "--activate")
	}
	what := fmt.Sprintf("deploy %s (variant %d, activate %v)", d.spec.name, d.variant, activate)
	code, out := r.cli(append([]string{"deploy", "--file", r.writeSpec(d)}, args...)...)
	if code != 0 {
		return what, r.cliRefusal(what, code, out)
	}
	d.deployed, d.revision, d.desired = true, 1, "on_demand"
	if activate {
		d.desired = "running"
	}
	return what, "ok"
}

// opUpdate writes a new revision of a deployed deployment.
func (r *Runner) opUpdate() (string, string) {
	d := r.pick(deployed)
	if d == nil {
		return "update", "skipped: nothing deployed"
	}
	d.variant++
	what := fmt.Sprintf("update %s to variant %d (replacing revision %d)", d.spec.name, d.variant, d.revision)
	code, out := r.cli("deploy", "--file", r.writeSpec(d), "--revision", strconv.FormatUint(d.revision, 10))
	if code != 0 {
		return what, r.cliRefusal(what, code, out)
	}
	d.revision++
	return what, "ok"
}

// opDelete deletes a deployment through the management API.
func (r *Runner) opDelete() (string, string) {
	d := r.pick(deployed)
	if d == nil {
		return "delete", "skipped: nothing deployed"
	}
	what := "delete " + d.spec.name
	ctx, cancel := ctxFor(opBound)
	defer cancel()
	err := r.role.Mgmt.Delete(ctx, d.spec.name)
	out := r.refusal(what, ctx, err)
	if err == nil {
		d.deployed, d.revision, d.desired = false, 0, ""
	} else {
		d.desired = "stopped" // a delete stops first, whatever it finds
	}
	return what, out
}

// idleBound bounds the wait for an idle timer: the pool's
// ready_idle_timeout (3 s) or parked_idle_timeout (5 s), the role's check
// every second, and the park or stop itself.
const idleBound = 5*time.Second + time.Second + 20*time.Second

// opIdle lets a ready deployment with idle timers idle: with no request in
// flight, its ready_idle_timeout parks it (or stops it, restart only)
// within its bound, and a parked one's parked_idle_timeout then stops it.
func (r *Runner) opIdle() (string, string) {
	r.reqs.wait()
	snap, err := r.snapshot()
	if err != nil {
		r.fail("idle timeout", "snapshot: "+err.Error())
	}
	ready := map[string]bool{}
	for _, d := range snap.Deployments {
		if d.Spec != nil && d.Spec.Lifecycle.ReadyIdleTimeout > 0 && len(d.Instances) > 0 && d.Instances[0].State == "ready" {
			ready[d.Name] = true
		}
	}
	d := r.pick(func(d *depState) bool { return ready[d.spec.name] })
	if d == nil {
		return "idle timeout", "skipped: no ready deployment with idle timers"
	}
	what := "idle " + d.spec.name
	state := func() string {
		st, err := r.role.Mgmt.Deployment(context.Background(), d.spec.name)
		if err != nil || len(st.Instances) == 0 {
			return "?"
		}
		return st.Instances[0].State
	}
	start := time.Now()
	var now string
	if !waitFor(idleBound, func() bool { now = state(); return now == "parked" || now == "stopped" }) {
		r.fail(what, fmt.Sprintf("%s stayed %s for %s with no request: its ready_idle_timeout did not act", d.spec.name, now, idleBound))
	}
	took := time.Since(start).Round(100 * time.Millisecond)
	if now == "stopped" {
		return what, fmt.Sprintf("ok: stopped after %s", took)
	}
	if !waitFor(idleBound, func() bool { now = state(); return now == "stopped" }) {
		r.fail(what, fmt.Sprintf("%s stayed %s for %s with no request: its parked_idle_timeout did not act", d.spec.name, now, idleBound))
	}
	return what, fmt.Sprintf("ok: parked, then stopped after %s", time.Since(start).Round(100*time.Millisecond))
}

// opKillEngine kills a running engine with SIGKILL.
func (r *Runner) opKillEngine() (string, string) {
	snap, err := r.snapshot()
	if err != nil {
		r.fail("kill -9 engine", "snapshot: "+err.Error())
	}
	var cands []string
	pids := map[string]int{}
	for _, d := range snap.Deployments {
		for _, in := range d.Instances {
			if in.State == "ready" && in.PID > 0 && harness.Alive(in.PID) {
				cands = append(cands, in.ID)
				pids[in.ID] = in.PID
			}
		}
	}
	if len(cands) == 0 {
		return "kill -9 engine", "skipped: no engine runs"
	}
	id := cands[r.rng.IntN(len(cands))]
	_ = killPID(pids[id])
	return fmt.Sprintf("kill -9 engine %d of %s", pids[id], id), "ok"
}

// opKillDriver kills a driver process with SIGKILL: the role launches a
// new one and recovers its instances.
func (r *Runner) opKillDriver() (string, string) {
	var fams []string
	pids := map[string][]int{}
	for _, f := range families {
		if p := harness.DriverPIDs(r.role.StateDir, f); len(p) > 0 {
			fams = append(fams, f)
			pids[f] = p
		}
	}
	if len(fams) == 0 {
		return "kill -9 driver", "skipped: no driver runs"
	}
	f := fams[r.rng.IntN(len(fams))]
	for _, pid := range pids[f] {
		_ = killPID(pid)
	}
	return fmt.Sprintf("kill -9 driver %s %v", f, pids[f]), "ok"
}

// opKillRole kills the role with SIGKILL and starts it again on its state
// directory: engines run on and are re-attached.
func (r *Runner) opKillRole() (string, string) {
	r.reqs.roleKilled()
	r.role.Kill9()
	r.lives = append(r.lives, r.role.Output())
	r.role.Restart()
	r.roleLives++
	r.quiet.newLife()
	return fmt.Sprintf("kill -9 role, restarted (life %d)", r.roleLives), "ok"
}

// writeSpec writes a deployment's spec at its variant and returns the
// file.
func (r *Runner) writeSpec(d *depState) string {
	return r.role.WriteFile(fmt.Sprintf("specs/%s-%d.hcl", d.spec.name, d.variant), d.spec.render(d.variant))
}

// cli runs a capyctl command against the role, bounded.
func (r *Runner) cli(args ...string) (int, string) {
	ctx, cancel := ctxFor(opBound)
	defer cancel()
	cmd := exec.CommandContext(ctx, r.role.Bin, append(args, "--state-dir", r.role.StateDir)...)
	cmd.Env = []string{"PATH=/usr/bin:/bin", "HOME=" + r.role.StateDir}
	b, err := cmd.CombinedOutput()
	if ctx.Err() != nil {
		r.fail(strings.Join(args, " "), fmt.Sprintf("capyctl %s did not return within %s\n%s", strings.Join(args, " "), opBound, b))
	}
	code := 0
	if err != nil {
		code = -1
		if ee, ok := err.(*exec.ExitError); ok {
			code = ee.ExitCode()
		}
	}
	return code, string(b)
}

// cliRefusal checks a failed CLI command printed a coded error: "error
// [<code>]: <message>".
func (r *Runner) cliRefusal(what string, exit int, out string) string {
	i := strings.Index(out, "error [")
	if i < 0 {
		r.fail(what, fmt.Sprintf("%s: exit %d without a coded error:\n%s", what, exit, out))
	}
	rest := out[i+len("error ["):]
	j := strings.IndexByte(rest, ']')
	if j < 0 {
		r.fail(what, fmt.Sprintf("%s: exit %d with a malformed error:\n%s", what, exit, out))
	}
	code := rest[:j]
	if code == string(structs.CodeInternal) {
		r.fail(what, fmt.Sprintf("%s: internal error:\n%s", what, out))
	}
	return "refused " + code + ": " + firstLine(rest[j+1:])
}

// firstLine is s's first line, trimmed and shortened.
func firstLine(s string) string {
	s = strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(s), ":"))
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		s = s[:i]
	}
	if len(s) > 200 {
		s = s[:200] + "…"
	}
	return s
}

// snapshot reads the role's snapshot, bounded.
func (r *Runner) snapshot() (*wire.Snapshot, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return r.role.Mgmt.Snapshot(ctx)
}

// killPID sends SIGKILL to a process.
func killPID(pid int) error { return syscall.Kill(pid, syscall.SIGKILL) }
