// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package lifecycle

import (
	"context"
	"os"
	"sync"

	"github.com/capyctl/capyctl/core/structs"
)

// StartOptions are the choices of an operator's start.
type StartOptions struct {
	// Wait returns when every instance is ready or one gave up.
	Wait bool
	// Evict lets a start that does not fit park or stop idle models to
	// make room; without it the start is refused capacity_blocked.
	Evict bool
}

// StartDeployment marks a deployment running and starts (or wakes) every
// instance.
func (m *Manager) StartDeployment(ctx context.Context, name string, opts StartOptions) error {
	d, err := m.setDesired(name, structs.DesiredRunning)
	if err != nil {
		return err
	}
	if !opts.Wait {
		m.startAllEvict(name, "operator start", opts.Evict)
		return nil
	}
	errs := make(chan error, len(d))
	for _, in := range d {
		go func(in *instance) {
			errs <- in.send(ctx, &command{kind: cmdStart, why: "operator start", evict: opts.Evict, done: make(chan error, 1)})
		}(in)
	}
	var first error
	for range d {
		if err := <-errs; err != nil && first == nil {
			first = err
		}
	}
	return first
}

// StopDeployment marks a deployment stopped (requests get 409) and stops
// every instance.
func (m *Manager) StopDeployment(ctx context.Context, name string, wait bool) error {
	insts, err := m.setDesired(name, structs.DesiredStopped)
	if err != nil {
		return err
	}
	run := func(ctx context.Context) error {
		var first error
		var mu sync.Mutex
		var wg sync.WaitGroup
		for _, in := range insts {
			wg.Add(1)
			go func(in *instance) {
				defer wg.Done()
				in.abortStartup()
				if err := in.do(ctx, cmdStop, "operator stop"); err != nil {
					mu.Lock()
					if first == nil {
						first = err
					}
					mu.Unlock()
				}
			}(in)
		}
		wg.Wait()
		return first
	}
	if wait {
		return run(ctx)
	}
	// The caller's context ends with its answer; the stop goes on.
	m.goTracked(func() { _ = run(m.ctx) })
	return nil
}

// DeleteDeployment stops every instance, proves the processes gone, and
// deletes the deployment.
func (m *Manager) DeleteDeployment(ctx context.Context, name string) error {
	insts, err := m.setDesired(name, structs.DesiredStopped)
	if err != nil {
		return err
	}
	// Being deleted, the instances start no more (deploy.go's retire).
	retire(insts, true)
	for _, in := range insts {
		in.abortStartup()
		if err := in.do(ctx, cmdStop, "delete"); err != nil {
			retire(insts, false)
			return err
		}
		if s := in.snapshot().State; s != structs.StateStopped && s != structs.StateFailed {
			retire(insts, false)
			return structs.Errf(structs.CodeDeleteRequiresCleanup, "instance %s is still %s", in.id, s)
		}
	}
	m.mu.Lock()
	delete(m.deployments, name)
	for _, in := range insts {
		delete(m.byID, in.id)
	}
	m.mu.Unlock()
	for _, in := range insts {
		in.close()
	}
	if err := m.cfg.Store.DeleteDeployment(name); err != nil {
		return structs.Wrap(structs.CodeInternal, err, "delete deployment")
	}
	// Its engines are proven gone: their launch directories (and logs) go
	// with the deployment (launchdirs.go).
	_ = os.RemoveAll(m.launchesDir(name))
	// And its switching figures (capyctl_turns_ended_total and
	// capyctl_switch_wait*{deployment}).
	m.stats.forget(name)
	m.event("deployment_deleted", name, "", nil)
	m.rebuildRoutes()
	return nil
}

func (m *Manager) setDesired(name, desired string) ([]*instance, error) {
	m.mu.Lock()
	d, ok := m.deployments[name]
	if !ok {
		m.mu.Unlock()
		return nil, structs.Errf(structs.CodeNotFound, "no deployment %s", name)
	}
	changed := d.rec.Desired != desired
	d.rec.Desired = desired
	d.rec.UpdatedAt = m.cfg.Now().UTC()
	rec := d.rec
	insts := append([]*instance(nil), d.instances...)
	m.mu.Unlock()
	if changed {
		if err := m.cfg.Store.PutDeployment(&rec); err != nil {
			return nil, structs.Wrap(structs.CodeInternal, err, "store deployment")
		}
		m.event("deployment_desired", name, "", map[string]any{"desired": desired})
		m.rebuildRoutes()
	}
	return insts, nil
}

func (m *Manager) startAll(name, why string) { m.startAllEvict(name, why, false) }

// startAllEvict starts every instance of a deployment in the background;
// a failed start of a running deployment is retried (see retryStart).
func (m *Manager) startAllEvict(name, why string, evict bool) {
	m.mu.Lock()
	d, ok := m.deployments[name]
	var insts []*instance
	if ok {
		insts = append(insts, d.instances...)
	}
	m.mu.Unlock()
	for _, in := range insts {
		m.goTracked(func() {
			err := in.send(m.ctx, &command{kind: cmdStart, why: why, evict: evict, done: make(chan error, 1)})
			if err != nil {
				m.logger.Warn("start failed", "instance", in.id, "error", err)
				m.retryStart(in, err, 1)
			}
		})
	}
}
