// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package lifecycle

import (
	"testing"

	"github.com/capyctl/capyctl/core/structs"
	"github.com/capyctl/capyctl/sdk"
)

// TestDriverErr_EveryCodeIsInTheCatalogue: a driver's coded failure
// becomes a product error whose code is in the catalogue: the SDK's own
// codes are rows of it, and any other string a driver returns (a
// third-party driver may return anything) is driver_error with the
// driver's code attached. Before, the code went through as it was: the
// soak saw a request answered 500 with "instance_not_found", a code no
// client can look up (a driver killed during a start, relaunched, asked
// for the readiness of an instance it never started).
func TestDriverErr_EveryCodeIsInTheCatalogue(t *testing.T) {
	cases := []struct {
		code string
		want structs.Code
	}{
		{sdk.CodeInstanceNotFound, structs.CodeInstanceNotFound},
		{sdk.CodeLaunchFailed, structs.CodeLaunchFailed},
		{sdk.CodeStartupTimeout, structs.CodeStartupTimeout},
		{sdk.CodeOffLoopback, structs.CodeOffLoopback},
		{sdk.CodeParkFailed, structs.CodeParkFailed},
		{sdk.CodeWakeFailed, structs.CodeWakeFailed},
		{sdk.CodeStopFailed, structs.CodeStopFailed},
		{sdk.CodeNotIdle, structs.CodeEngineNotIdle},
		{sdk.CodeInvalidManifest, structs.CodeInvalidManifest},
		{sdk.CodeEngineNotFound, structs.CodeEngineNotFound},
		{sdk.CodeToolchainMissing, structs.CodeToolchainMissing},
		{sdk.CodeDriverUnavailable, structs.CodeDriverUnavailable},
		{sdk.CodeDriverTimeout, structs.CodeDriverTimeout},
		{"driver_error", structs.CodeDriverError},
		{"capability_missing:lmcache", structs.CodeCapabilityMissing + ":lmcache"},
		{"made_up_by_a_driver", structs.CodeDriverError},
	}
	for _, c := range cases {
		t.Run(c.code, func(t *testing.T) {
			e := structs.AsError(driverErr(sdk.Errorf(c.code, "the driver says no"), "probe"))
			if e.Code != c.want || !structs.Known(e.Code) {
				t.Fatalf("code %s (known %v), want %s", e.Code, structs.Known(e.Code), c.want)
			}
		})
	}
}

// TestStart_ADriverThatLostTheInstanceFailsTheLaunch: a readiness probe
// answered instance_not_found (the driver was relaunched during the
// start) fails the launch: the instance's error is launch_failed and a
// request's activation answers activation_failed, both in the catalogue.
func TestStart_ADriverThatLostTheInstanceFailsTheLaunch(t *testing.T) {
	f := newFixture(t, 10, 6, 1)
	f.drv.probeErr = sdk.Errorf(sdk.CodeInstanceNotFound, "no instance a/0 on this driver")
	f.deploy("a")
	err := f.activate("a")
	if !structs.HasCode(err, structs.CodeActivationFailed) {
		t.Fatalf("activation: %v (%s), want activation_failed", err, structs.AsError(err).Code)
	}
	if rec := f.inst("a"); rec.State != structs.StateFailed || rec.LastError == nil || rec.LastError.Code != structs.CodeLaunchFailed {
		t.Fatalf("instance %s, last error %+v: want failed with launch_failed", rec.State, rec.LastError)
	}
	f.expectNothingHeld("after the failed start")
}
