// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package structs

import (
	"strings"
	"time"
)

// DefaultKeyName is the name of the role's own API key (the api_key of the
// credentials file): the key every role had before named keys, allowed
// every model until an operator revokes it.
const DefaultKeyName = "default"

// APIKey is a named key of the inference API (core/apikeys keeps them): its
// public identifier, the digest of its secret, the models it may use and
// its limits. IMPORTANT: never the secret itself; the key is shown once, to
// whoever created it.
type APIKey struct {
	Name string `json:"name"`
	// ID is the short public identifier the key carries, so that a
	// presented key finds its record without comparing every digest;
	// empty for the role's key.
	ID string `json:"id,omitempty"`
	// Digest is "sha256:<hex>" of the whole key; empty for the role's key.
	Digest string `json:"digest,omitempty"`
	// Role marks the role's own key (DefaultKeyName): its secret is the
	// role's credential, compared as it is now, so that a rotated
	// credentials file keeps working.
	Role bool `json:"role,omitempty"`
	// Models are the model names and globs (path.Match) the key may use;
	// empty: every model.
	Models []string  `json:"models,omitempty"`
	Limits KeyLimits `json:"limits"`
	// Weight is the key's share of a contended model's places (weighted
	// fair queuing); 0 reads as 1.
	Weight    int       `json:"weight,omitempty"`
	CreatedAt time.Time `json:"created_at"`
	UpdatedAt time.Time `json:"updated_at,omitzero"`
	// ExpiresAt is when the key stops working (zero: never).
	ExpiresAt time.Time `json:"expires_at,omitzero"`
}

// UseID is the key's identity in the records of its use: its public
// identifier, or "role" for the role's key. A key revoked and created
// again under its name has another.
func (k APIKey) UseID() string {
	if k.Role || k.ID == "" {
		return "role"
	}
	return k.ID
}

// KeyUse is when one role first and last authenticated a request with a
// key (each role keeps its own: it is not replicated).
type KeyUse struct {
	Name        string    `json:"name"`
	FirstUsedAt time.Time `json:"first_used_at,omitzero"`
	LastUsedAt  time.Time `json:"last_used_at,omitzero"`
	// ExpiredAt is set once the key's expiry was announced (an event).
	ExpiredAt time.Time `json:"expired_at,omitzero"`
}

// KeyLimits are an API key's limits; zero is no limit.
type KeyLimits struct {
	// RPM is requests per minute.
	RPM int64 `json:"rpm,omitempty"`
	// TPM is tokens per minute, counted from the engines' usage.
	TPM int64 `json:"tpm,omitempty"`
	// Concurrency is requests in flight at once.
	Concurrency int64 `json:"concurrency,omitempty"`
	// MonthlyTokens is a budget of tokens per calendar month (UTC).
	MonthlyTokens int64 `json:"monthly_tokens,omitempty"`
}

// Any reports whether any limit is set.
func (l KeyLimits) Any() bool {
	return l.RPM > 0 || l.TPM > 0 || l.Concurrency > 0 || l.MonthlyTokens > 0
}

// EffectiveWeight is the key's weight, 1 when unset.
func (k APIKey) EffectiveWeight() int {
	if k.Weight <= 0 {
		return 1
	}
	return k.Weight
}

// Expired reports whether the key is past its expiry at now.
func (k APIKey) Expired(now time.Time) bool {
	return !k.ExpiresAt.IsZero() && !now.Before(k.ExpiresAt)
}

// ValidKeyName reports whether name may name an API key: 1 to 64
// characters of letters, digits, '-', '_' and '.', starting with a letter
// or digit (it is a Prometheus label value, a bbolt key and a CLI
// argument).
func ValidKeyName(name string) bool {
	if len(name) == 0 || len(name) > 64 {
		return false
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
		case i > 0 && strings.IndexByte("-_.", c) >= 0:
		default:
			return false
		}
	}
	return true
}

// KeyUsage is one row of an API key's usage: one key, one model, one hour
// (UTC), as one role counted it (core/usage).
type KeyUsage struct {
	// Hour is the row's hour, truncated (UTC).
	Hour  time.Time `json:"hour"`
	Key   string    `json:"key"`
	Model string    `json:"model"`
	// Requests counts every request that named the model, refused ones
	// included; Errors counts the refused and failed ones by code.
	Requests         int64            `json:"requests"`
	Errors           map[string]int64 `json:"errors,omitempty"`
	PromptTokens     int64            `json:"prompt_tokens"`
	CompletionTokens int64            `json:"completion_tokens"`
	// CachedTokens counts the prompt tokens the engines reported cached,
	// where they report them.
	CachedTokens int64 `json:"cached_tokens"`
	// RequestMs is the requests' total time, in milliseconds.
	RequestMs int64 `json:"request_ms"`
}

// Add adds o's counts to u.
func (u *KeyUsage) Add(o *KeyUsage) {
	u.Requests += o.Requests
	u.PromptTokens += o.PromptTokens
	u.CompletionTokens += o.CompletionTokens
	u.CachedTokens += o.CachedTokens
	u.RequestMs += o.RequestMs
	for c, n := range o.Errors {
		if u.Errors == nil {
			u.Errors = map[string]int64{}
		}
		u.Errors[c] += n
	}
}

// Tokens is the prompt and completion tokens together.
func (u *KeyUsage) Tokens() int64 { return u.PromptTokens + u.CompletionTokens }

// RequestUsage is what one inference request used, as the router settled
// it: the API keys' limits and usage count it.
type RequestUsage struct {
	// Model is the model name the request asked for; empty when it named
	// none, or one its key may not use or that no deployment serves (so
	// that a stranger's guesses add no rows).
	Model string
	// Code is the refusal or failure code; empty for an answer.
	Code string
	// UsageKnown says the engine reported the token counts.
	UsageKnown                                   bool
	PromptTokens, CompletionTokens, CachedTokens int64
	// Duration is the request's total time.
	Duration time.Duration
}
