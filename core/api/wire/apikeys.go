// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package wire

import "time"

// APIKeyLimits are a key's limits; 0 (or absent) is no limit.
type APIKeyLimits struct {
	// RPM is requests per minute.
	RPM int64 `json:"rpm,omitempty"`
	// TPM is tokens per minute, counted from the engines' usage.
	TPM int64 `json:"tpm,omitempty"`
	// Concurrency is requests in flight at once.
	Concurrency int64 `json:"concurrency,omitempty"`
	// MonthlyTokens is a token budget per calendar month (UTC).
	MonthlyTokens int64 `json:"monthly_tokens,omitempty"`
}

// APIKeyCreateRequest is POST /management/v1/api-keys.
type APIKeyCreateRequest struct {
	Name string `json:"name"`
	// Models are names and globs ('*' any run, '?' one character); empty:
	// every model.
	Models []string     `json:"models,omitempty"`
	Limits APIKeyLimits `json:"limits,omitzero"`
	// Weight is the key's share of a contended model's places (default 1).
	Weight int `json:"weight,omitempty"`
	// Expires is a duration after which the key stops working ("720h");
	// empty: never.
	Expires string `json:"expires,omitempty"`
}

// APIKeyUpdateRequest is PATCH /management/v1/api-keys/{name}: each field
// present replaces the key's.
type APIKeyUpdateRequest struct {
	Models        *[]string `json:"models,omitempty"`
	RPM           *int64    `json:"rpm,omitempty"`
	TPM           *int64    `json:"tpm,omitempty"`
	Concurrency   *int64    `json:"concurrency,omitempty"`
	MonthlyTokens *int64    `json:"monthly_tokens,omitempty"`
	Weight        *int      `json:"weight,omitempty"`
	// Expires is a duration from now; "0" or "never": never.
	Expires *string `json:"expires,omitempty"`
}

// APIKey is a key as the management API shows it: never its secret.
type APIKey struct {
	Name string `json:"name"`
	// Prefix is the key's first characters (its public identifier), to
	// tell keys apart; empty for the role's key.
	Prefix string `json:"prefix,omitempty"`
	// Role marks the role's own key (the credentials file's api_key).
	Role bool `json:"role,omitempty"`
	// Models are its names and globs; empty: every model.
	Models      []string     `json:"models"`
	Limits      APIKeyLimits `json:"limits"`
	Weight      int          `json:"weight"`
	CreatedAt   time.Time    `json:"created_at"`
	UpdatedAt   time.Time    `json:"updated_at,omitzero"`
	ExpiresAt   time.Time    `json:"expires_at,omitzero"`
	Expired     bool         `json:"expired,omitempty"`
	FirstUsedAt time.Time    `json:"first_used_at,omitzero"`
	LastUsedAt  time.Time    `json:"last_used_at,omitzero"`
	// Standing is where a key with limits stands against them on the
	// server that answers (in a cluster, with what the other servers told
	// it): what its next request would see.
	Standing *APIKeyStanding `json:"standing,omitempty"`
}

// APIKeyStanding is where a key stands against its limits now.
type APIKeyStanding struct {
	// RemainingRequests and RemainingTokens are what is left of the
	// minute's requests and tokens (its limits set).
	RemainingRequests int64 `json:"remaining_requests"`
	RemainingTokens   int64 `json:"remaining_tokens"`
	// InFlight are its requests running now; MonthTokens the tokens it
	// used this calendar month (UTC).
	InFlight    int64 `json:"in_flight"`
	MonthTokens int64 `json:"month_tokens"`
}

// APIKeyList answers GET /management/v1/api-keys.
type APIKeyList struct {
	APIVersion string   `json:"api_version"`
	Keys       []APIKey `json:"keys"`
}

// APIKeyCreated answers a create: the key in clear, this once.
type APIKeyCreated struct {
	APIKey
	// Key is the secret: shown once, kept nowhere (the role keeps only
	// its digest).
	Key string `json:"key"`
}

// UsageRow is one key's usage of one model in one hour (UTC).
type UsageRow struct {
	// Hour is the row's hour (UTC); absent in totals over a period.
	Hour  time.Time `json:"hour,omitzero"`
	Key   string    `json:"key"`
	Model string    `json:"model"`
	// Requests counts every request, refused ones included; Errors the
	// refused and failed ones by code.
	Requests         int64            `json:"requests"`
	Errors           map[string]int64 `json:"errors,omitempty"`
	PromptTokens     int64            `json:"prompt_tokens"`
	CompletionTokens int64            `json:"completion_tokens"`
	CachedTokens     int64            `json:"cached_tokens"`
	RequestMs        int64            `json:"request_ms"`
}

// UsageResponse answers GET /management/v1/usage.
type UsageResponse struct {
	APIVersion string     `json:"api_version"`
	Since      time.Time  `json:"since"`
	Rows       []UsageRow `json:"rows"`
	// Servers names the servers whose counts are in the rows (a fleet);
	// Missing those that did not answer.
	Servers []string `json:"servers,omitempty"`
	Missing []string `json:"missing,omitempty"`
}
