// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

// Package engines owns the registry of engine installations: detecting an
// installation through its family's driver, pinning its digest, refusing a
// changed one, and refusing to remove one a deployment uses.
package engines

import (
	"context"
	"regexp"
	"sort"
	"strings"
	"time"

	"github.com/capyctl/capyctl/core/structs"
	"github.com/capyctl/capyctl/sdk"
)

// Store is the part of the store the registry needs.
type Store interface {
	PutEngine(*structs.EngineRecord) error
	GetEngine(name string) (*structs.EngineRecord, error)
	ListEngines() ([]structs.EngineRecord, error)
	DeleteEngine(name string) error
}

// Drivers hands out drivers by family.
type Drivers interface {
	Driver(ctx context.Context, family string) (sdk.Driver, error)
	Families() []string
}

// Users reports which deployments use an engine.
type Users interface {
	UsesEngine(name string) []string
}

// Registry is the engine registry.
type Registry struct {
	store   Store
	drivers Drivers
	users   Users
	now     func() time.Time
}

// New returns a registry.
func New(store Store, drivers Drivers, users Users) *Registry {
	return &Registry{store: store, drivers: drivers, users: users, now: time.Now}
}

var nameRE = regexp.MustCompile(`^[a-z0-9][a-z0-9._-]{0,62}$`)

// detectionOrder is the order families are asked to recognise a path when
// the operator names none.
var detectionOrder = []string{structs.FamilyVLLM, structs.FamilySGLang, structs.FamilyTensorFold, structs.FamilyLlamaCpp}

// Detect inspects an installation through its driver without registering
// it.
func (r *Registry) Detect(ctx context.Context, req AddRequest) (*sdk.DetectResponse, string, error) {
	family := req.Family
	if req.Manifest != "" && family == "" {
		family = structs.FamilyCustom
	}
	dreq := &sdk.DetectRequest{Path: req.Path, Manifest: req.Manifest, Name: req.Name}
	if family != "" {
		drv, err := r.drivers.Driver(ctx, family)
		if err != nil {
			return nil, "", err
		}
		resp, err := drv.Detect(ctx, dreq)
		if err != nil {
			return nil, "", detectErr(err, req.Path)
		}
		return resp, family, nil
	}
	available := map[string]bool{}
	for _, f := range r.drivers.Families() {
		available[f] = true
	}
	var firstErr error
	for _, f := range detectionOrder {
		if !available[f] {
			continue
		}
		drv, err := r.drivers.Driver(ctx, f)
		if err != nil {
			continue
		}
		resp, err := drv.Detect(ctx, dreq)
		if err == nil && resp.Family != "" {
			return resp, f, nil
		}
		if err != nil && firstErr == nil && sdk.CodeOf(err) != string(structs.CodeEngineUnsupported) {
			firstErr = err
		}
	}
	if firstErr != nil {
		return nil, "", detectErr(firstErr, req.Path)
	}
	return nil, "", structs.Errf(structs.CodeEngineUnsupported,
		"%s is not an installation CapyCTL recognises (a vLLM, SGLang or TensorFold venv, or a llama-server binary); for any other program use capyctl engine add --custom", req.Path)
}

func detectErr(err error, path string) error {
	if code := sdk.CodeOf(err); code != "" && code != string(structs.CodeDriverError) && structs.Known(structs.Code(code)) {
		return &structs.Error{Code: structs.Code(code), Message: err.Error(), Cause: err}
	}
	var se *structs.Error
	if e, ok := err.(*structs.Error); ok {
		se = e
		return se
	}
	return structs.Wrap(structs.CodeEngineUnsupported, err, "detect %s", path)
}

// AddRequest names an installation to detect and register.
type AddRequest struct {
	Name   string
	Family string
	Path   string
	// Manifest is a custom engine's manifest (HCL text).
	Manifest string
	// ManifestFile names the manifest's file, for diagnostics.
	ManifestFile string
	Approvals    structs.Approvals
	Env          map[string]string
	// ExpectDigest, when set, must equal the detected digest (the digest
	// the operator confirmed).
	ExpectDigest string
	DryRun       bool
}

// Added is what an add detected, and whether it registered it.
type Added struct {
	// Record is the registration (stored when Registered).
	Record           *structs.EngineRecord
	ToolchainMissing []string
	Notes            []string
	Details          map[string]string
	Registered       bool
}

// Add detects and registers an installation (or, with DryRun, only says
// what it would register).
func (r *Registry) Add(ctx context.Context, req AddRequest) (*Added, error) {
	if req.Name != "" && !nameRE.MatchString(req.Name) {
		return nil, structs.Errf(structs.CodeInvalidRequest, "engine name %q must match %s", req.Name, nameRE)
	}
	det, family, err := r.Detect(ctx, req)
	if err != nil {
		return nil, err
	}
	name := req.Name
	if name == "" {
		name = family
	}
	if !nameRE.MatchString(name) {
		return nil, structs.Errf(structs.CodeInvalidRequest, "engine name %q must match %s", name, nameRE)
	}
	rec := &structs.EngineRecord{
		Name: name, Family: det.Family, Path: req.Path, Program: det.Program, Version: det.Version,
		Verified: det.Verified, Digest: det.Digest, Details: det.Details, Approvals: req.Approvals,
		Env: req.Env, AddedAt: r.now().UTC(),
	}
	if rec.Family == "" {
		rec.Family = family
	}
	out := &Added{Record: rec, ToolchainMissing: det.ToolchainMissing, Notes: det.Notes, Details: det.Details}
	if len(det.ToolchainMissing) > 0 && !req.DryRun {
		return nil, structs.Errf(structs.CodeToolchainMissing,
			"the engine needs build tools that are not on its PATH: %s", strings.Join(det.ToolchainMissing, ", "))
	}
	if req.DryRun {
		return out, nil
	}
	if req.ExpectDigest != "" && req.ExpectDigest != rec.Digest {
		return nil, structs.Errf(structs.CodeInstallationDrift,
			"the installation changed while you confirmed it: confirmed %s, now %s", req.ExpectDigest, rec.Digest)
	}
	if existing, err := r.store.GetEngine(name); err == nil && existing != nil {
		return nil, structs.Errf(structs.CodeEngineExists, "an engine named %s is registered (%s %s); remove it first", name, existing.Family, existing.Version)
	}
	if err := r.store.PutEngine(rec); err != nil {
		return nil, structs.Wrap(structs.CodeInternal, err, "store engine")
	}
	out.Registered = true
	return out, nil
}

// Remove deletes a registration no deployment uses.
func (r *Registry) Remove(name string) error {
	if _, err := r.store.GetEngine(name); err != nil {
		return structs.Errf(structs.CodeEngineNotFound, "no engine %s is registered", name)
	}
	if users := r.users.UsesEngine(name); len(users) > 0 {
		return structs.Errf(structs.CodeEngineInUse, "engine %s is used by %s; delete or redeploy them first", name, strings.Join(users, ", ")).
			WithDetail("deployments", users)
	}
	return r.store.DeleteEngine(name)
}

// Registration is a registered installation and the deployments using it.
type Registration struct {
	structs.EngineRecord
	UsedBy []string
}

// List returns the registrations with the deployments using each, sorted
// by name.
func (r *Registry) List() ([]Registration, error) {
	recs, err := r.store.ListEngines()
	if err != nil {
		return nil, err
	}
	out := make([]Registration, 0, len(recs))
	for _, rec := range recs {
		out = append(out, Registration{EngineRecord: rec, UsedBy: r.users.UsesEngine(rec.Name)})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// Flags returns a family's flag policy as its driver answers it.
func (r *Registry) Flags(ctx context.Context, family string) (*sdk.FlagsResponse, error) {
	drv, err := r.drivers.Driver(ctx, family)
	if err != nil {
		return nil, err
	}
	resp, err := drv.Flags(ctx, &sdk.FlagsRequest{})
	if err != nil {
		if sdk.CodeOf(err) == "" {
			return nil, structs.Wrap(structs.CodeUnsupported, err, "flags of %s", family)
		}
		return nil, err
	}
	return resp, nil
}
