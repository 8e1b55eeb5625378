// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

// Package custom is the driver for programs CapyCTL has no integration for
// (SPEC E5): a manifest states the command, the API served, an optional
// health path and an optional idle signal. CapyCTL owns the process: a
// private loopback port, a clean environment, its own process
// group, a per-launch key, readiness by a real answer, and a stop that
// proves every process gone. A custom engine does not park (restart only),
// its options are not policed, and closing a request's connection is all
// it is known to honour (no abort is sent).
package custom

import (
	"context"
	"encoding/json"
	"os"
	"strings"
	"time"

	"github.com/capyctl/capyctl/sdk"
	"github.com/capyctl/capyctl/sdk/enginekit"
)

// Family is this driver's engine family.
const Family = "custom"

// detailManifest is the installation detail holding the manifest as JSON.
const detailManifest = "manifest_json"

// Driver is the custom-engine driver.
type Driver struct {
	enginekit.RestartOnly
	// Version is the driver\'s version in Describe: the capyctl build that
	// serves it sets its own (`capyctl driver <family>`); the driver does
	// not import the core to learn it.
	Version string
	reg     *enginekit.Registry[*handle]
	// stopGrace is the default grace period after SIGTERM.
	stopGrace time.Duration
}

var (
	_ sdk.Driver     = (*Driver)(nil)
	_ sdk.ExitWaiter = (*Driver)(nil)
)

// New returns the driver.
func New() *Driver {
	return &Driver{reg: enginekit.NewRegistry[*handle](), stopGrace: 10 * time.Second}
}

// Describe implements sdk.Driver.
func (d *Driver) Describe(context.Context, *sdk.DescribeRequest) (*sdk.DescribeResponse, error) {
	return enginekit.Describe(Family, d.Version, &sdk.Capabilities{
		APIs:       []string{"chat", "decisions"},
		AbortMode:  sdk.AbortModeCloseConnection,
		IdleSignal: true,
	}, `{"custom":{}}`), nil
}

// Detect implements sdk.Driver: the program must exist and be executable;
// the manifest must parse. The digest is the program's sha256.
func (d *Driver) Detect(_ context.Context, req *sdk.DetectRequest) (*sdk.DetectResponse, error) {
	prog := req.Path
	if prog == "" {
		return nil, sdk.Errorf(sdk.CodeEngineNotFound, "no program named")
	}
	st, err := os.Stat(prog)
	if err != nil {
		return nil, sdk.Errorf(sdk.CodeEngineNotFound, "program %s: %v", prog, enginekit.UnwrapPathErr(err))
	}
	if st.IsDir() || st.Mode()&0o111 == 0 {
		return nil, sdk.Errorf(sdk.CodeEngineNotFound, "program %s is not an executable file", prog)
	}
	if req.Manifest == "" {
		return nil, sdk.Errorf("invalid_config", "a custom engine needs a manifest (--manifest <file>)")
	}
	m, err := ParseManifest([]byte(req.Manifest), "manifest.hcl")
	if err != nil {
		return nil, err
	}
	digest, err := enginekit.FileDigest(prog)
	if err != nil {
		return nil, sdk.Errorf(sdk.CodeEngineNotFound, "read program %s: %v", prog, err)
	}
	mj, _ := json.Marshal(m)
	notes := []string{
		"custom engines run restart only: CapyCTL stops and starts them instead of parking",
		"CapyCTL does not check a custom engine's options; it counts the memory its deployments state in resources",
	}
	if m.Idle == nil {
		notes = append(notes, "no idle signal: a request a client abandons stays counted until the engine's next stop")
	}
	return &sdk.DetectResponse{
		Family:   Family,
		Version:  m.Version,
		Verified: false,
		Digest:   digest,
		Program:  prog,
		Notes:    notes,
		Details:  map[string]string{detailManifest: string(mj), "api": m.API},
	}, nil
}

// Flags implements sdk.Driver: a custom engine's options are its own; only
// the environment names CapyCTL owns are listed.
func (d *Driver) Flags(context.Context, *sdk.FlagsRequest) (*sdk.FlagsResponse, error) {
	rules := []*sdk.FlagRule{
		{Name: "DO_NOT_TRACK", Kind: sdk.FlagKindEnv, Class: sdk.FlagClassOwned, Reason: "set to 1 so the engine reports nothing off the host (engine_telemetry = \"allow\" lifts it)"},
		{Name: "CAPYCTL_*", Kind: sdk.FlagKindEnv, Class: sdk.FlagClassReserved, Reason: "CapyCTL's own variables"},
		{Name: "CUDA_VISIBLE_DEVICES", Kind: sdk.FlagKindEnv, Class: sdk.FlagClassOwned, Reason: "the ledger pins the instance to a card"},
		{Name: "LD_*", Kind: sdk.FlagKindEnv, Class: sdk.FlagClassReserved, Reason: "dynamic-loader variables change what runs"},
		{Name: "PATH", Kind: sdk.FlagKindEnv, Class: sdk.FlagClassOwned, Reason: "the engine runs with a closed PATH"},
		{Name: "HOME", Kind: sdk.FlagKindEnv, Class: sdk.FlagClassOwned, Reason: "the engine's home is its launch directory"},
		{Name: "<manifest key_env>", Kind: sdk.FlagKindEnv, Class: sdk.FlagClassOwned, Reason: "receives the per-launch key"},
		{Name: "--*", Kind: sdk.FlagKindOption, Class: sdk.FlagClassPassed, Reason: "a custom engine's options are not policed; extra_args need accept_extra_args = true"},
	}
	return &sdk.FlagsResponse{Family: Family, Rules: rules}, nil
}

// reservedEnv reports whether a deployment may not set an environment name.
func reservedEnv(name, keyEnv string) bool {
	switch {
	case name == "DO_NOT_TRACK", name == "PATH", name == "HOME", name == "CUDA_VISIBLE_DEVICES",
		strings.HasPrefix(name, "CAPYCTL_"), strings.HasPrefix(name, "LD_"), keyEnv != "" && name == keyEnv:
		return true
	}
	return false
}
