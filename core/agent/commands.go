// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package agent

import (
	"context"

	"github.com/capyctl/capyctl/core/api/wire"
	"github.com/capyctl/capyctl/core/hostlink"
	"github.com/capyctl/capyctl/core/hostlink/proto/hostv1"
	"github.com/capyctl/capyctl/core/lifecycle"
	"github.com/capyctl/capyctl/core/structs"
)

// hostCommands carries out the leader's commands on this host (the host
// link's Commands, through its Deduper): what is not desired state.
type hostCommands struct{ lc *lifecycle.Manager }

var _ hostlink.Handler = hostCommands{}

// Commands implements hostagent.Local.
func (a *Agent) Commands() hostlink.Handler { return hostCommands{a.Lifecycle} }

// DeploymentAction parks a deployment, or starts, stops or parks one of
// its instances, on this host's own lifecycle.
func (c hostCommands) DeploymentAction(ctx context.Context, d *hostv1.DeploymentAction) error {
	dep, idx := d.GetDeployment(), int(d.GetInstance())
	switch {
	case d.GetAction() == wire.ActionPark && idx < 0:
		return c.lc.ParkDeployment(ctx, dep, d.GetWait())
	case d.GetAction() == wire.ActionPark:
		return c.lc.ParkInstance(ctx, dep, idx, d.GetWait())
	case d.GetAction() == wire.ActionStart && idx >= 0:
		return c.lc.StartInstance(ctx, dep, idx, lifecycle.StartOptions{Wait: d.GetWait(), Evict: d.GetEvict()})
	case d.GetAction() == wire.ActionStop && idx >= 0:
		return c.lc.StopInstance(ctx, dep, idx, d.GetWait())
	}
	return structs.Errf(structs.CodeInvalidRequest, "no action %q on %s (instance %d) a host takes as a command", d.GetAction(), dep, idx)
}

// StartInstance, ParkInstance, WakeInstance, StopInstance and
// AbortRequest are the per-instance commands of a server that plans the
// instances itself: this host plans its own (its share of the desired
// state), and aborts travel as the relay's hang-ups.
func (hostCommands) StartInstance(context.Context, *hostv1.StartInstance) error { return planned() }
func (hostCommands) ParkInstance(context.Context, *hostv1.ParkInstance) error   { return planned() }
func (hostCommands) WakeInstance(context.Context, *hostv1.WakeInstance) error   { return planned() }
func (hostCommands) StopInstance(context.Context, *hostv1.StopInstance) error   { return planned() }
func (hostCommands) AbortRequest(context.Context, *hostv1.AbortRequest) error   { return planned() }

func planned() error {
	return structs.Errf(structs.CodeUnsupported, "this host plans its own instances from its share of the desired state: send a DeploymentAction")
}
