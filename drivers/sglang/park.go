// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package sglang

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/capyctl/capyctl/drivers/internal/pyengine"
	"github.com/capyctl/capyctl/sdk"
	"github.com/capyctl/capyctl/sdk/engineapi"
	"github.com/capyctl/capyctl/sdk/enginekit"
)

// stepTimeout bounds one park or wake step that moves no weights.
const stepTimeout = 60 * time.Second

// memoryTags are the memory SGLang releases and resumes.
var memoryTags = []string{"kv_cache", "weights"}

// parkable returns the instance, refusing one launched without the memory
// saver or parked at a tier SGLang does not have.
func (d *Driver) parkable(id, tier string) (*enginekit.Instance, string, error) {
	in, err := d.reg.Get(id)
	if err != nil {
		return nil, "", err
	}
	if !enginekit.Parks(in.Residency) {
		return nil, "", sdk.Errorf(sdk.CodeParkFailed, "instance %s was launched %s, without the memory saver: it restarts instead of parking", id, in.Residency)
	}
	if tier == "" {
		tier = in.Residency
	}
	if !enginekit.Parks(tier) {
		return nil, "", sdk.Errorf(sdk.CodeParkFailed, "SGLang parks at deep or host_backed, not %q", tier)
	}
	if !in.Alive() {
		return nil, "", sdk.Errorf(sdk.CodeParkFailed, "the engine of %s is gone", id)
	}
	return in, tier, nil
}

// Park implements sdk.Driver: only when nothing runs or waits (SGLang
// refuses to release memory under a request), POST
// /release_memory_occupation with the KV cache and the weights. The core
// has stopped routing to the instance first: SGLang itself does not hold
// back a request that arrives while its memory is released.
func (d *Driver) Park(ctx context.Context, req *sdk.ParkRequest) (*sdk.ParkResponse, error) {
	in, tier, err := d.parkable(req.InstanceID, req.Tier)
	if err != nil {
		return nil, err
	}
	if in.Worker() {
		return enginekit.WorkerPark(in, tier), nil
	}
	if err := enginekit.CheckIdle(ctx, in, metricNames); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, stepTimeout)
	defer cancel()
	if _, err := in.Client.PostJSON(ctx, releasePath, map[string]any{"tags": memoryTags}, nil); err != nil {
		return nil, sdk.Errorf(sdk.CodeParkFailed, "release memory: %v", err)
	}
	in.MarkParked(tier)
	return &sdk.ParkResponse{Detail: fmt.Sprintf("released %s (%s)", strings.Join(memoryTags, ", "), tier)}, nil
}

// Wake implements sdk.Driver: POST /resume_memory_occupation; unless the
// launch kept a copy of the weights in host RAM (host_backed), POST
// /update_weights_from_disk to reload them; POST /flush_cache; then the
// canary prompt, whose answer the core compares with the one recorded at
// first readiness.
func (d *Driver) Wake(ctx context.Context, req *sdk.WakeRequest) (*sdk.WakeResponse, error) {
	in, tier, err := d.parkable(req.InstanceID, req.Tier)
	if err != nil {
		if sdk.CodeOf(err) == sdk.CodeParkFailed {
			return nil, &sdk.Error{Code: sdk.CodeWakeFailed, Message: err.Error()}
		}
		return nil, err
	}
	if in.Worker() {
		return enginekit.WorkerWake(in), nil
	}
	sctx, cancel := context.WithTimeout(ctx, stepTimeout)
	_, err = in.Client.PostJSON(sctx, resumePath, map[string]any{"tags": []string{"weights", "kv_cache"}}, nil)
	cancel()
	if err != nil {
		return nil, sdk.Errorf(sdk.CodeWakeFailed, "resume memory: %v", err)
	}
	if in.Residency != enginekit.ResidencyHostBacked {
		weights := pyengine.WeightsBytes(in.ModelDir)
		rctx, cancel := context.WithTimeout(ctx, pyengine.WakeTimeout(weights, enginekit.ResidencyDeep))
		var out struct {
			Success *bool  `json:"success"`
			Message string `json:"message"`
		}
		_, err := in.Client.PostJSON(rctx, reloadPath, map[string]any{"model_path": in.ModelDir}, &out)
		cancel()
		if err != nil {
			return nil, sdk.Errorf(sdk.CodeWakeFailed, "reload the weights from disk: %v", err)
		}
		if out.Success != nil && !*out.Success {
			return nil, sdk.Errorf(sdk.CodeWakeFailed, "reload the weights from disk: %s", out.Message)
		}
	}
	// A flush is refused while requests run or wait; none should.
	fctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	var last error
	err = engineapi.Poll(fctx, func(ctx context.Context) (bool, error) {
		_, last = in.Client.PostJSON(ctx, flushPath, nil, nil)
		return last == nil, nil
	})
	cancel()
	if err != nil {
		return nil, sdk.Errorf(sdk.CodeWakeFailed, "flush the cache: %v", last)
	}
	in.MarkParked("")
	canary, err := wakeCanary(in)(ctx)
	if err != nil {
		return nil, sdk.Errorf(sdk.CodeWakeFailed, "wake check: %v", err)
	}
	return &sdk.WakeResponse{Canary: canary, Detail: "resumed (" + tier + ")"}, nil
}
