// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package lifecycle

import (
	"context"
	"errors"
	"time"

	"github.com/capyctl/capyctl/sdk"
)

// startMonitor watches a running engine's process and reports its death to
// the lane: at once where the driver serves the exit stream (WaitExit),
// else within about one liveness interval.
func (in *instance) startMonitor(drv sdk.Driver) {
	in.stopMonitor()
	ctx, cancel := context.WithCancel(in.m.ctx)
	in.monMu.Lock()
	in.monCancel = cancel
	in.monMu.Unlock()
	in.m.goTracked(func() {
		exit := in.watchExit(ctx, drv)
		if exit == nil {
			return
		}
		c := &command{kind: cmdExited, why: "engine exited", done: make(chan error, 1), exit: exit}
		in.m.goTracked(func() { _ = in.send(in.m.ctx, c) })
	})
}

// watchExit returns how the engine ended, or nil when ctx ends first. It
// holds the driver's exit stream, which costs nothing while the engine
// runs. It polls LIVENESS every LivenessInterval instead where the driver
// does not serve the stream (one built before it: sdk.ErrNotSupported), and
// for one interval whenever the stream breaks (the driver died or is being
// relaunched, which says nothing about the engine), before watching again.
func (in *instance) watchExit(ctx context.Context, drv sdk.Driver) *sdk.ProbeResponse {
	w, streams := drv.(sdk.ExitWaiter)
	t := time.NewTicker(in.m.cfg.LivenessInterval)
	defer t.Stop()
	for {
		if streams {
			ev, err := w.WaitExit(ctx, &sdk.WaitExitRequest{InstanceID: in.id})
			switch {
			case ctx.Err() != nil:
				return nil
			case err == nil:
				return &sdk.ProbeResponse{Exited: true, ExitCode: ev.ExitCode, Detail: ev.Detail, LastLogLines: ev.LastLogLines}
			case errors.Is(err, sdk.ErrNotSupported):
				streams = false
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		pctx, pcancel := context.WithTimeout(ctx, 5*time.Second)
		resp, err := drv.Probe(pctx, &sdk.ProbeRequest{InstanceID: in.id, Kind: sdk.ProbeKindLiveness})
		pcancel()
		if err != nil {
			// The driver is unreachable (relaunching): that says nothing
			// about the engine.
			continue
		}
		if resp.Exited || !resp.Alive {
			return resp
		}
	}
}

func (in *instance) stopMonitor() {
	in.monMu.Lock()
	defer in.monMu.Unlock()
	if in.monCancel != nil {
		in.monCancel()
		in.monCancel = nil
	}
}
