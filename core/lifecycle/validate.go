// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package lifecycle

import (
	"context"

	"github.com/capyctl/capyctl/core/structs"
	"github.com/capyctl/capyctl/sdk"
)

// ValidateDeployment checks a deployment against this host when it is
// written: the engine exists, its driver can serve the API, and the driver's
// Plan (a dry run, launch context incomplete) has no refusal. Bad input is
// refused here, never when a request arrives at 3 a.m.
func (m *Manager) ValidateDeployment(ctx context.Context, spec *structs.Deployment) error {
	// The first steps of a start (start.go), with the model optional.
	res, err := m.resolve(ctx, spec, false)
	if err != nil {
		return err
	}
	eng, drv, modelDir := res.eng, res.drv, res.modelDir
	pdep := ToDeployment(spec, 0, modelDir)
	pdep.EngineConfigJSON = familyConfig(spec, eng.Family)
	plan, err := drv.Plan(ctx, &sdk.PlanRequest{Installation: *ToInstallation(eng), Deployment: *pdep, Host: *m.hostPolicy(eng)})
	if err != nil {
		return driverErr(err, "plan")
	}
	if err := refusalErr(plan.Refusals); err != nil {
		return err
	}
	if m.cfg.Placer != nil {
		if v, ok := m.cfg.Placer.(interface {
			Validate(spec *structs.Deployment, eng *structs.EngineRecord, hints *sdk.MemoryHints, residency string) error
		}); ok {
			return v.Validate(spec, eng, &plan.Hints, plan.Residency)
		}
	}
	return nil
}
