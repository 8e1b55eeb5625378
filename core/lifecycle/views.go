// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package lifecycle

import (
	"context"
	"sort"

	"github.com/capyctl/capyctl/core/structs"
	"github.com/capyctl/capyctl/sdk"
)

// DeploymentView is a deployment with its instances, for status and the
// management API.
type DeploymentView struct {
	Record    structs.DeploymentRecord
	Instances []structs.InstanceRecord
}

// Deployment returns one deployment's view.
func (m *Manager) Deployment(name string) (*DeploymentView, error) {
	m.mu.Lock()
	d, ok := m.deployments[name]
	if !ok {
		m.mu.Unlock()
		return nil, structs.Errf(structs.CodeNotFound, "no deployment %s", name)
	}
	v := &DeploymentView{Record: d.rec}
	insts := append([]*instance(nil), d.instances...)
	m.mu.Unlock()
	for _, in := range insts {
		v.Instances = append(v.Instances, in.snapshot())
	}
	return v, nil
}

// InstanceStates returns the states of a deployment's instances (nil for
// an unknown deployment): what a waiting request's progress comment says.
func (m *Manager) InstanceStates(name string) []structs.InstanceState {
	v, err := m.Deployment(name)
	if err != nil {
		return nil
	}
	out := make([]structs.InstanceState, len(v.Instances))
	for i, in := range v.Instances {
		out[i] = in.State
	}
	return out
}

// Deployments returns every deployment's view, sorted by name.
func (m *Manager) Deployments() []*DeploymentView {
	m.mu.Lock()
	names := make([]string, 0, len(m.deployments))
	for n := range m.deployments {
		names = append(names, n)
	}
	m.mu.Unlock()
	sort.Strings(names)
	out := make([]*DeploymentView, 0, len(names))
	for _, n := range names {
		if v, err := m.Deployment(n); err == nil {
			out = append(out, v)
		}
	}
	return out
}

// Logs returns the redacted tail of an instance's engine output.
func (m *Manager) Logs(ctx context.Context, dep string, idx int, maxBytes int64) (string, bool, error) {
	in, err := m.instance(dep, idx)
	if err != nil {
		return "", false, err
	}
	rec := in.snapshot()
	if rec.Launch == nil {
		return "", false, structs.Errf(structs.CodeNotFound, "instance %s has never launched", in.id)
	}
	drv, err := m.cfg.Drivers.Driver(ctx, rec.Driver)
	if err != nil {
		return "", false, err
	}
	resp, err := drv.Logs(ctx, &sdk.LogsRequest{InstanceID: in.id, MaxBytes: maxBytes, LaunchDir: rec.Launch.LaunchDir})
	if err != nil {
		return "", false, driverErr(err, "read engine log")
	}
	return resp.Text, resp.Truncated, nil
}

// UsesEngine returns the deployments that name an engine registration.
func (m *Manager) UsesEngine(name string) []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []string
	for n, d := range m.deployments {
		if d.rec.Spec.Engine == name {
			out = append(out, n)
			continue
		}
		for _, in := range d.instances {
			if in.snapshot().Engine == name {
				out = append(out, n)
				break
			}
		}
	}
	sort.Strings(out)
	return out
}
