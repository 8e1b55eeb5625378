// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package lifecycle

import (
	"context"
	"time"

	"github.com/capyctl/capyctl/sdk"
	pb "github.com/capyctl/capyctl/sdk/proto/driverv1"
)

// startMonitor watches a running engine's process and reports its death to
// the lane within about one liveness interval.
func (in *instance) startMonitor(drv sdk.Driver) {
	in.stopMonitor()
	ctx, cancel := context.WithCancel(in.m.ctx)
	in.monMu.Lock()
	in.monCancel = cancel
	in.monMu.Unlock()
	in.m.goTracked(func() {
		t := time.NewTicker(in.m.cfg.LivenessInterval)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			pctx, pcancel := context.WithTimeout(ctx, 5*time.Second)
			resp, err := drv.Probe(pctx, &pb.ProbeRequest{InstanceId: in.id, Kind: pb.ProbeKind_PROBE_KIND_LIVENESS})
			pcancel()
			if err != nil {
				// The driver is unreachable (relaunching): that says nothing
				// about the engine.
				continue
			}
			if resp.GetExited() || !resp.GetAlive() {
				c := &command{kind: cmdExited, why: "engine exited", done: make(chan error, 1), exit: resp}
				in.m.goTracked(func() { _ = in.send(in.m.ctx, c) })
				return
			}
		}
	})
}

func (in *instance) stopMonitor() {
	in.monMu.Lock()
	defer in.monMu.Unlock()
	if in.monCancel != nil {
		in.monCancel()
		in.monCancel = nil
	}
}
