// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package lifecycle

import (
	"context"
	"errors"

	"github.com/capyctl/capyctl/core/structs"
)

// activation is one deployment-level activation that concurrent requests
// join (a model is never started twice for them).
type activation struct {
	done chan struct{}
	err  error
}

// Activate makes sure a deployment has a ready instance, starting one when
// none is: concurrent callers join the same activation. It returns when an
// instance is ready, the activation failed, or ctx ended (the activation
// itself goes on). An activation that waited a request's deadline for
// room gives up (activation_timeout) and frees its instance's lane for
// what queued behind it; a caller whose own ctx has not ended asks again
// (its wait is its own: a request that joined the activation late keeps
// what is left of its deadline).
func (m *Manager) Activate(ctx context.Context, name string) error {
	for {
		err := m.activateOnce(ctx, name)
		if !errors.Is(err, errRoomWait) || ctx.Err() != nil {
			return err
		}
	}
}

// activateOnce is one activation, joined or begun.
func (m *Manager) activateOnce(ctx context.Context, name string) error {
	m.mu.Lock()
	d, ok := m.deployments[name]
	if !ok {
		m.mu.Unlock()
		return structs.Errf(structs.CodeUnknownModel, "no deployment %s", name)
	}
	switch d.rec.Desired {
	case structs.DesiredStopped:
		m.mu.Unlock()
		if d.rec.Spec.Lifecycle.Activation == structs.ActivationExplicit {
			return structs.Errf(structs.CodeDeploymentInactive,
				"deployment %s activates only on an operator's start: capyctl start deployment %s", name, name)
		}
		return structs.Errf(structs.CodeDeploymentStopped,
			"deployment %s was stopped by an operator: capyctl start deployment %s", name, name)
	}
	for _, in := range d.instances {
		if in.state() == structs.StateReady {
			m.mu.Unlock()
			// The state changes before the route table is republished:
			// make sure the table the router reads has the instance.
			if r := m.Routes().Lookup(firstRoute(d.rec.Spec, name)); r == nil || len(r.Ready) == 0 {
				m.rebuildRoutes()
			}
			return nil
		}
	}
	if d.rec.Spec.Group != nil {
		// IMPORTANT: a group member is started by the server only, every
		// member's ledger first and the head last; this host alone would
		// wake one rank of several.
		m.mu.Unlock()
		e := structs.Errf(structs.CodeUnavailable, "deployment %s is a group member and not ready: the server starts its group", name)
		e.RetryAfter = 1
		return e
	}
	act := d.activation
	if act == nil {
		act = &activation{done: make(chan struct{})}
		d.activation = act
		target := pickActivationTarget(d.instances)
		if !m.goTracked(func() { m.runActivation(name, d, act, target) }) {
			act.err = structs.Errf(structs.CodeShuttingDown, "the role is shutting down")
			d.activation = nil
			close(act.done)
		}
	}
	m.mu.Unlock()
	select {
	case <-act.done:
		return act.err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// pickActivationTarget prefers a parked instance (wake), then a stopped or
// failed one (start), then one already on its way.
func pickActivationTarget(insts []*instance) *instance {
	rank := func(s structs.InstanceState) int {
		switch s {
		case structs.StateWaking, structs.StateStarting:
			return 0
		case structs.StateParked:
			return 1
		case structs.StateStopped:
			return 2
		case structs.StateFailed:
			return 3
		}
		return 4
	}
	var best *instance
	for _, in := range insts {
		if best == nil || rank(in.state()) < rank(best.state()) {
			best = in
		}
	}
	return best
}

// firstRoute returns a deployment's first public name.
func firstRoute(spec structs.Deployment, name string) string {
	if len(spec.Routes) > 0 {
		return spec.Routes[0]
	}
	return name
}

// runActivation runs the activation in the instance's lane. It runs
// under the manager's context, not a caller's (the model starts for the
// retry even when its requests left), so each of its waits carries its
// own bound: the wait for room by a request's deadline (switchTurns), the
// driver calls by their deadlines, readiness by the startup deadline.
func (m *Manager) runActivation(name string, d *deployment, act *activation, target *instance) {
	var err error
	if target == nil {
		err = structs.Errf(structs.CodeUnavailable, "deployment %s has no instance", name)
	} else {
		err = target.send(m.ctx, &command{kind: cmdStart, why: "request", evict: true, room: roomTurns, done: make(chan error, 1)})
	}
	if err != nil {
		ae := structs.AsError(err)
		if ae.Code == structs.CodeInternal || ae.Code == structs.CodeLaunchFailed || ae.Code == structs.CodeStartupTimeout {
			err = &structs.Error{Code: structs.CodeActivationFailed, Message: ae.Message, Details: ae.Details, Cause: err}
		}
	}
	m.mu.Lock()
	act.err = err
	if d.activation == act {
		d.activation = nil
	}
	m.mu.Unlock()
	close(act.done)
}
