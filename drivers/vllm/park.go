// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package vllm

import (
	"context"
	"fmt"
	"time"

	"github.com/capyctl/capyctl/drivers/internal/pyengine"
	"github.com/capyctl/capyctl/sdk"
	"github.com/capyctl/capyctl/sdk/enginekit"
)

// stepTimeout bounds one park or wake step that moves no weights.
const stepTimeout = 60 * time.Second

// vLLM's sleep levels (POST /sleep?level=N, engines.md §1.7 note 3).
const (
	// sleepOffloadWeights (level 1) offloads the weights to host memory
	// and discards the KV cache: a host_backed park.
	sleepOffloadWeights = 1
	// sleepDiscardAll (level 2) discards the weights and the KV cache; a
	// wake reloads the weights from disk: a deep park.
	sleepDiscardAll = 2
)

// sleepLevel is vLLM's sleep level for a tier: deep drops the weights and
// the KV cache (reloaded from disk on wake), host_backed keeps the weights
// in host RAM.
func sleepLevel(tier string) (int, error) {
	switch tier {
	case enginekit.ResidencyDeep:
		return sleepDiscardAll, nil
	case enginekit.ResidencyHostBacked:
		return sleepOffloadWeights, nil
	}
	return 0, sdk.Errorf(sdk.CodeParkFailed, "vLLM parks at deep or host_backed, not %q", tier)
}

// parkable returns the instance and the tier to park or wake at, refusing an
// instance launched without sleep mode.
func (d *Driver) parkable(id, tier string) (*enginekit.Instance, string, int, error) {
	in, err := d.reg.Get(id)
	if err != nil {
		return nil, "", 0, err
	}
	if !enginekit.Parks(in.Residency) {
		return nil, "", 0, sdk.Errorf(sdk.CodeParkFailed, "instance %s was launched %s, without sleep mode: it restarts instead of parking", id, in.Residency)
	}
	if tier == "" {
		tier = in.Residency
	}
	level, err := sleepLevel(tier)
	if err != nil {
		return nil, "", 0, err
	}
	if !in.Alive() {
		return nil, "", 0, sdk.Errorf(sdk.CodeParkFailed, "the engine of %s is gone", id)
	}
	return in, tier, level, nil
}

// Park implements sdk.Driver: with nothing running or waiting, POST
// /sleep?level=N, then GET /is_sleeping must say true. The core has stopped
// routing to the instance first; a request sent while vLLM sleeps would
// wait until it wakes. A group's worker has no API (the head's sleep is
// collective over every rank): its park calls nothing and succeeds, and
// the core measures what the rank's processes still hold.
func (d *Driver) Park(ctx context.Context, req *sdk.ParkRequest) (*sdk.ParkResponse, error) {
	in, tier, level, err := d.parkable(req.InstanceID, req.Tier)
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
	if _, err := in.Client.PostJSON(ctx, fmt.Sprintf("%s?level=%d", sleepPath, level), nil, nil); err != nil {
		return nil, sdk.Errorf(sdk.CodeParkFailed, "sleep level %d: %v", level, err)
	}
	asleep, err := isSleeping(ctx, in)
	if err != nil {
		return nil, sdk.Errorf(sdk.CodeParkFailed, "confirm the sleep: %v", err)
	}
	if !asleep {
		return nil, sdk.Errorf(sdk.CodeParkFailed, "vLLM answered the sleep but /is_sleeping says it is awake")
	}
	in.MarkParked(tier)
	return &sdk.ParkResponse{Detail: fmt.Sprintf("asleep at level %d (%s)", level, tier)}, nil
}

// Wake implements sdk.Driver: POST /wake_up?tags=weights, then after a deep
// park a reload of the weights from disk (POST /collective_rpc
// reload_weights: level 2 kept no copy), POST /wake_up?tags=kv_cache, POST
// /reset_prefix_cache, GET /is_sleeping must say false, and finally the
// canary prompt, whose answer the core compares with the one recorded at
// first readiness. A group's worker wakes first and at once, without a
// canary: the head's wake and its canary follow.
func (d *Driver) Wake(ctx context.Context, req *sdk.WakeRequest) (*sdk.WakeResponse, error) {
	tier := req.Tier
	in, err := d.reg.Get(req.InstanceID)
	if err == nil && tier == "" {
		tier = in.Parked()
	}
	in, tier, level, err := d.parkable(req.InstanceID, tier)
	if err != nil {
		return nil, wakeErr(err)
	}
	if in.Worker() {
		return enginekit.WorkerWake(in), nil
	}
	type step struct {
		what, path string
		body       any
		timeout    time.Duration
	}
	steps := []step{{"wake the weights", wakePath + "?tags=weights", nil, stepTimeout}}
	if level == sleepDiscardAll {
		weights := pyengine.WeightsBytes(in.ModelDir)
		steps = append(steps, step{"reload the weights from disk", collectiveRPCPath, map[string]any{"method": "reload_weights"}, pyengine.WakeTimeout(weights, tier)})
	}
	steps = append(steps,
		step{"wake the KV cache", wakePath + "?tags=kv_cache", nil, stepTimeout},
		step{"reset the prefix cache", resetPrefixPath, nil, stepTimeout},
	)
	for _, s := range steps {
		sctx, cancel := context.WithTimeout(ctx, s.timeout)
		_, err := in.Client.PostJSON(sctx, s.path, s.body, nil)
		cancel()
		if err != nil {
			return nil, sdk.Errorf(sdk.CodeWakeFailed, "%s: %v", s.what, err)
		}
	}
	asleep, err := isSleeping(ctx, in)
	if err != nil {
		return nil, sdk.Errorf(sdk.CodeWakeFailed, "confirm the wake: %v", err)
	}
	if asleep {
		return nil, sdk.Errorf(sdk.CodeWakeFailed, "vLLM answered every wake step but /is_sleeping still says it sleeps")
	}
	in.MarkParked("")
	canary, err := wakeCanary(in)(ctx)
	if err != nil {
		return nil, sdk.Errorf(sdk.CodeWakeFailed, "wake check: %v", err)
	}
	return &sdk.WakeResponse{Canary: canary, Detail: fmt.Sprintf("awake after level %d (%s)", level, tier)}, nil
}

// wakeErr keeps a coded error and codes any other as wake_failed.
func wakeErr(err error) error {
	if sdk.CodeOf(err) == sdk.CodeParkFailed {
		return &sdk.Error{Code: sdk.CodeWakeFailed, Message: err.Error()}
	}
	return err
}

// isSleeping asks GET /is_sleeping.
func isSleeping(ctx context.Context, in *enginekit.Instance) (bool, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	var out struct {
		IsSleeping *bool `json:"is_sleeping"`
	}
	if _, err := in.Client.GetJSON(ctx, isSleepingPath, &out); err != nil {
		return false, err
	}
	if out.IsSleeping == nil {
		return false, fmt.Errorf("GET %s: no is_sleeping in the answer", isSleepingPath)
	}
	return *out.IsSleeping, nil
}
