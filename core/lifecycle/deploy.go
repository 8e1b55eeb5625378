// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package lifecycle

import (
	"context"
	"fmt"

	"github.com/capyctl/capyctl/core/structs"
)

// DeployOptions are the choices of a deploy.
type DeployOptions struct {
	// Activate starts the deployment once written (desired running).
	Activate bool
	// ExpectedRevision must equal the current revision for an update (0 for
	// a create, or to skip the check).
	ExpectedRevision uint64
	// Validate runs the driver's Plan as a dry run before writing.
	Validate func(ctx context.Context, spec *structs.Deployment) error
}

// Deploy creates a deployment or writes a new revision of it.
func (m *Manager) Deploy(ctx context.Context, spec *structs.Deployment, opts DeployOptions) (*structs.DeploymentRecord, bool, error) {
	if err := m.fillGroup(spec); err != nil {
		return nil, false, err
	}
	if opts.Validate != nil {
		if err := opts.Validate(ctx, spec); err != nil {
			return nil, false, err
		}
	}
	now := m.cfg.Now().UTC()
	m.mu.Lock()
	d, exists := m.deployments[spec.Name]
	if exists && opts.ExpectedRevision != 0 && d.rec.Revision != opts.ExpectedRevision {
		cur := d.rec.Revision
		m.mu.Unlock()
		return nil, false, structs.Errf(structs.CodeRevisionConflict,
			"deployment %s is at revision %d, not %d", spec.Name, cur, opts.ExpectedRevision).
			WithDetail("current_revision", cur)
	}
	if !exists && opts.ExpectedRevision > 1 {
		m.mu.Unlock()
		return nil, false, structs.Errf(structs.CodeNotFound, "deployment %s does not exist", spec.Name)
	}
	for name, other := range m.deployments {
		if name == spec.Name {
			continue
		}
		for _, r := range other.rec.Spec.Routes {
			for _, mine := range spec.Routes {
				if r == mine {
					m.mu.Unlock()
					return nil, false, structs.Errf(structs.CodeConflict,
						"route %q is already served by deployment %s", r, name)
				}
			}
		}
	}
	rec := structs.DeploymentRecord{Name: spec.Name, Spec: *spec, CreatedAt: now, UpdatedAt: now, Desired: structs.DesiredOnDemand}
	var old []*instance
	if exists {
		rec.Revision = d.rec.Revision + 1
		rec.CreatedAt = d.rec.CreatedAt
		rec.Desired = d.rec.Desired
		if rec.Desired == structs.DesiredStopped && opts.Activate {
			rec.Desired = structs.DesiredRunning
		}
		old = d.instances
	} else {
		rec.Revision = 1
	}
	if opts.Activate {
		rec.Desired = structs.DesiredRunning
	}
	if spec.Lifecycle.Activation == structs.ActivationExplicit && rec.Desired == structs.DesiredOnDemand {
		rec.Desired = structs.DesiredStopped
	}
	m.mu.Unlock()

	// A new revision replaces the running instances: stop the old ones
	// first. Retired, they start no more: a start a request or a retry
	// queued behind the stop would launch an engine that no deployment
	// owns once the new instances take their place.
	retire(old, true)
	for _, in := range old {
		in.abortStartup()
		if err := in.do(ctx, cmdStop, fmt.Sprintf("revision %d replaces %d", rec.Revision, rec.Revision-1)); err != nil {
			retire(old, false) // the old revision stays
			return nil, false, err
		}
	}
	if err := m.cfg.Store.PutDeployment(&rec); err != nil {
		retire(old, false)
		return nil, false, structs.Wrap(structs.CodeInternal, err, "store deployment")
	}
	m.mu.Lock()
	if exists {
		for _, in := range old {
			delete(m.byID, in.id)
			in.close()
		}
	}
	nd := &deployment{rec: rec}
	for i := 0; i < spec.Instances; i++ {
		ir := m.newInstanceRecord(&rec, i)
		if exists {
			for _, in := range old {
				if in.idx == i {
					prev := in.snapshot()
					ir.Attempts = 0
					ir.LastError = prev.LastError
					ir.Generation = prev.Generation
				}
			}
		}
		if err := m.cfg.Store.PutInstance(ir); err != nil {
			m.mu.Unlock()
			return nil, false, structs.Wrap(structs.CodeInternal, err, "store instance")
		}
		nd.instances = append(nd.instances, m.newInstance(ir))
	}
	if exists {
		for _, in := range old {
			if in.idx >= spec.Instances {
				_ = m.cfg.Store.DeleteInstance(spec.Name, in.idx)
			}
		}
	}
	m.deployments[spec.Name] = nd
	m.mu.Unlock()
	kind := "deployment_created"
	if exists {
		kind = "deployment_revised"
	}
	m.event(kind, spec.Name, "", map[string]any{"revision": rec.Revision, "desired": rec.Desired})
	m.rebuildRoutes()
	if rec.Desired == structs.DesiredRunning {
		m.startAll(spec.Name, "deploy --activate")
	}
	return &rec, !exists, nil
}

// retire marks instances as replaced or being deleted (they start no
// more), or, when what retired them failed, as current again.
func retire(insts []*instance, retired bool) {
	for _, in := range insts {
		in.retired.Store(retired)
	}
}
