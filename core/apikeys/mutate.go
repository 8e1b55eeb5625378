// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package apikeys

import (
	"slices"
	"time"

	"github.com/capyctl/capyctl/core/structs"
)

// MaxWeight bounds a key's weight in a contended model's line.
const MaxWeight = 1000

// Spec is what a new key is given.
type Spec struct {
	// Models are names and globs; empty allows every model.
	Models []string
	Limits structs.KeyLimits
	// Weight is the key's share of a contended model's places (0: 1).
	Weight int
	// ExpiresIn makes the key expire that long after its creation (0:
	// never).
	ExpiresIn time.Duration
}

// Patch changes a key: each field set replaces the key's.
type Patch struct {
	Models        *[]string
	RPM           *int64
	TPM           *int64
	Concurrency   *int64
	MonthlyTokens *int64
	Weight        *int
	// ExpiresIn makes the key expire that long after now; 0 never.
	ExpiresIn *time.Duration
}

// validate checks a record's fields.
func validate(rec *structs.APIKey) error {
	if !structs.ValidKeyName(rec.Name) {
		return structs.Errf(structs.CodeInvalidRequest,
			"API key name %q: use 1 to 64 letters, digits, '-', '_' or '.', starting with a letter or digit", rec.Name)
	}
	if _, err := NewScope(rec.Models); err != nil {
		return structs.Errf(structs.CodeInvalidRequest, "models: %v", err)
	}
	l := rec.Limits
	if l.RPM < 0 || l.TPM < 0 || l.Concurrency < 0 || l.MonthlyTokens < 0 {
		return structs.Errf(structs.CodeInvalidRequest, "a limit is negative: use 0 for no limit")
	}
	if rec.Weight < 0 || rec.Weight > MaxWeight {
		return structs.Errf(structs.CodeInvalidRequest, "weight %d is outside 0..%d", rec.Weight, MaxWeight)
	}
	return nil
}

// Create makes a new key and returns it in clear, once, with its record.
// IMPORTANT: the caller hands the key to whoever asked and forgets it.
func (k *Keeper) Create(name string, spec Spec) (string, structs.APIKey, error) {
	if spec.ExpiresIn < 0 {
		return "", structs.APIKey{}, structs.Errf(structs.CodeInvalidRequest, "expires must be a positive duration")
	}
	now := k.cfg.Now().UTC()
	plain, id, digest := generate()
	rec := structs.APIKey{Name: name, ID: id, Digest: digest, Models: slices.Clone(spec.Models), Limits: spec.Limits,
		Weight: spec.Weight, CreatedAt: now}
	if spec.ExpiresIn > 0 {
		rec.ExpiresAt = now.Add(spec.ExpiresIn)
	}
	if err := validate(&rec); err != nil {
		return "", structs.APIKey{}, err
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	if err := k.cfg.Backend.CreateKey(&rec); err != nil {
		return "", structs.APIKey{}, err
	}
	if err := k.reloadLocked(); err != nil {
		return "", structs.APIKey{}, err
	}
	payload := describe(&rec)
	k.event(EventCreated, payload)
	k.logger.Info("API key created", "key", name)
	return plain, rec, nil
}

// describe is a key's record as events show it: never its digest.
func describe(rec *structs.APIKey) map[string]any {
	p := map[string]any{"key": rec.Name}
	if len(rec.Models) > 0 {
		p["models"] = rec.Models
	}
	if rec.Limits.Any() {
		p["limits"] = rec.Limits
	}
	if rec.Weight > 0 {
		p["weight"] = rec.Weight
	}
	if !rec.ExpiresAt.IsZero() {
		p["expires_at"] = rec.ExpiresAt.UTC()
	}
	return p
}

// Update changes a key's scope, limits, weight or expiry; not_found
// without one.
func (k *Keeper) Update(name string, p Patch) (structs.APIKey, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	cur, ok := k.snap.Load().byName[name]
	if !ok {
		return structs.APIKey{}, structs.Errf(structs.CodeNotFound, "no API key named %q (capyctl list api-keys lists them)", name)
	}
	rec := cur.rec
	rec.Models = slices.Clone(rec.Models)
	now := k.cfg.Now().UTC()
	var changed []string
	if p.Models != nil {
		rec.Models = slices.Clone(*p.Models)
		changed = append(changed, "models")
	}
	set := func(dst *int64, v *int64, what string) {
		if v != nil {
			*dst = *v
			changed = append(changed, what)
		}
	}
	set(&rec.Limits.RPM, p.RPM, LimitRPM)
	set(&rec.Limits.TPM, p.TPM, LimitTPM)
	set(&rec.Limits.Concurrency, p.Concurrency, LimitConcurrency)
	set(&rec.Limits.MonthlyTokens, p.MonthlyTokens, LimitMonthlyTokens)
	if p.Weight != nil {
		rec.Weight = *p.Weight
		changed = append(changed, "weight")
	}
	if p.ExpiresIn != nil {
		switch {
		case *p.ExpiresIn < 0:
			return structs.APIKey{}, structs.Errf(structs.CodeInvalidRequest, "expires must be a positive duration, or 0 for never")
		case *p.ExpiresIn == 0:
			rec.ExpiresAt = time.Time{}
		default:
			rec.ExpiresAt = now.Add(*p.ExpiresIn)
		}
		changed = append(changed, "expires")
	}
	if len(changed) == 0 {
		return structs.APIKey{}, structs.Errf(structs.CodeInvalidRequest, "nothing to change: give --models, a limit, --weight or --expires")
	}
	if err := validate(&rec); err != nil {
		return structs.APIKey{}, err
	}
	rec.UpdatedAt = now
	if err := k.cfg.Backend.UpdateKey(&rec); err != nil {
		return structs.APIKey{}, err
	}
	if err := k.reloadLocked(); err != nil {
		return structs.APIKey{}, err
	}
	payload := describe(&rec)
	payload["changed"] = changed
	k.event(EventUpdated, payload)
	return rec, nil
}

// Revoke removes a key: the next request with it is 401. not_found
// without one.
func (k *Keeper) Revoke(name string) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	if err := k.cfg.Backend.RevokeKey(name); err != nil {
		return err
	}
	if err := k.reloadLocked(); err != nil {
		return err
	}
	k.event(EventRevoked, map[string]any{"key": name})
	k.logger.Info("API key revoked", "key", name)
	return nil
}

// RoleKeyRecord is the record that makes the role's own key the key named
// default, allowed every model.
func RoleKeyRecord(now time.Time) structs.APIKey {
	return structs.APIKey{Name: structs.DefaultKeyName, Role: true, CreatedAt: now.UTC()}
}
