// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package hostlink

import (
	"context"

	"github.com/capyctl/capyctl/core/hostlink/proto/hostv1"
	"github.com/capyctl/capyctl/core/structs"
)

// Handler carries out the server's commands on a host. An error it returns
// becomes the CommandResult's code (its catalogue code, internal for a
// foreign error) and message.
type Handler interface {
	StartInstance(ctx context.Context, c *hostv1.StartInstance) error
	ParkInstance(ctx context.Context, c *hostv1.ParkInstance) error
	WakeInstance(ctx context.Context, c *hostv1.WakeInstance) error
	StopInstance(ctx context.Context, c *hostv1.StopInstance) error
	AbortRequest(ctx context.Context, c *hostv1.AbortRequest) error
	// DeploymentAction runs an action on a deployment the host runs, or
	// on one of its instances (a park: not desired state).
	DeploymentAction(ctx context.Context, c *hostv1.DeploymentAction) error
}

// Execute runs cmd through h once per command_id (see Deduper.Do) and
// returns its result. A command without an action the host knows is
// answered invalid_request, and so is one without a command_id (that one
// is not remembered), so the server is never left without an answer.
//
// The handler runs with ctx's values but not its cancellation: a stream
// that breaks while an engine starts must not abandon the start, since the
// server's retry on the next stream waits for it and answers its result.
// Execute returns an error only when ctx ends while a retry waits.
func (d *Deduper) Execute(ctx context.Context, cmd *hostv1.Command, h Handler) (*hostv1.CommandResult, error) {
	if cmd.GetCommandId() == "" {
		return resultOf(structs.Errf(structs.CodeInvalidRequest, "command without a command_id")), nil
	}
	run := context.WithoutCancel(ctx)
	return d.Do(ctx, cmd.GetCommandId(), func() *hostv1.CommandResult {
		var err error
		switch a := cmd.GetAction().(type) {
		case *hostv1.Command_Start:
			err = h.StartInstance(run, a.Start)
		case *hostv1.Command_Park:
			err = h.ParkInstance(run, a.Park)
		case *hostv1.Command_Wake:
			err = h.WakeInstance(run, a.Wake)
		case *hostv1.Command_Stop:
			err = h.StopInstance(run, a.Stop)
		case *hostv1.Command_Abort:
			err = h.AbortRequest(run, a.Abort)
		case *hostv1.Command_Deployment:
			err = h.DeploymentAction(run, a.Deployment)
		default:
			err = structs.Errf(structs.CodeInvalidRequest, "command %q has no action this host knows", cmd.GetCommandId())
		}
		return resultOf(err)
	})
}

// resultOf turns a handler's error into a CommandResult.
func resultOf(err error) *hostv1.CommandResult {
	if err == nil {
		return &hostv1.CommandResult{Ok: true}
	}
	e := structs.AsError(err)
	return &hostv1.CommandResult{Code: string(e.Code), Message: e.Error()}
}
