// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package api

import (
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/gorilla/mux"

	"github.com/capyctl/capyctl/core/api/wire"
	"github.com/capyctl/capyctl/core/apikeys"
	"github.com/capyctl/capyctl/core/store"
	"github.com/capyctl/capyctl/core/structs"
	"github.com/capyctl/capyctl/core/usage"
)

// keysOf returns the role's keeper of named keys, or why there is none.
func (b *Backend) keysOf() (*apikeys.Keeper, error) {
	if b.Role.Role == "host" {
		return nil, structs.Errf(structs.CodeUnsupported, "a host keeps no named API keys: create them on a server (capyctl create api-key on the server's machine)")
	}
	if b.Keys == nil {
		return nil, structs.Errf(structs.CodeUnsupported, "this role keeps no named API keys")
	}
	return b.Keys, nil
}

// APIKeyView converts a key for the API: never its digest.
func APIKeyView(v apikeys.View, now time.Time) wire.APIKey {
	k := v.Key
	out := wire.APIKey{
		Name: k.Name, Role: k.Role, Models: nonNil(slices.Clone(k.Models)), Weight: k.EffectiveWeight(),
		Limits:    wire.APIKeyLimits{RPM: k.Limits.RPM, TPM: k.Limits.TPM, Concurrency: k.Limits.Concurrency, MonthlyTokens: k.Limits.MonthlyTokens},
		CreatedAt: k.CreatedAt, UpdatedAt: k.UpdatedAt, ExpiresAt: k.ExpiresAt, Expired: k.Expired(now),
		FirstUsedAt: v.FirstUsedAt, LastUsedAt: v.LastUsedAt,
	}
	if k.ID != "" {
		out.Prefix = apikeys.Prefix(k.ID)
	}
	if st := v.Standing; st != nil {
		out.Standing = &wire.APIKeyStanding{RemainingRequests: st.RemainingRequests, RemainingTokens: st.RemainingTokens,
			InFlight: st.InFlight, MonthTokens: st.MonthTokens}
	}
	return out
}

func (b *Backend) listAPIKeys(w http.ResponseWriter, r *http.Request) {
	keys, err := b.keysOf()
	if err != nil {
		writeMgmtError(w, err)
		return
	}
	now := time.Now()
	var peers map[string][2]time.Time
	if b.PeerKeyUses != nil {
		peers = b.PeerKeyUses(r)
	}
	out := wire.APIKeyList{APIVersion: wire.APIVersion, Keys: []wire.APIKey{}}
	for _, v := range keys.List() {
		// In a cluster, the first and last use on any server.
		if u, ok := peers[v.Key.Name]; ok {
			if !u[0].IsZero() && (v.FirstUsedAt.IsZero() || u[0].Before(v.FirstUsedAt)) {
				v.FirstUsedAt = u[0]
			}
			if u[1].After(v.LastUsedAt) {
				v.LastUsedAt = u[1]
			}
		}
		out.Keys = append(out.Keys, APIKeyView(v, now))
	}
	writeJSON(w, http.StatusOK, out)
}

func (b *Backend) getAPIKey(w http.ResponseWriter, r *http.Request) {
	keys, err := b.keysOf()
	if err != nil {
		writeMgmtError(w, err)
		return
	}
	v, err := keys.Get(mux.Vars(r)["name"])
	if err != nil {
		writeMgmtError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, APIKeyView(v, time.Now()))
}

// parseExpires reads a key's expiry: a positive duration ("720h", "30m");
// "0" and "never" are never (where allowed).
func parseExpires(s string, allowNever bool) (time.Duration, error) {
	s = strings.TrimSpace(s)
	if allowNever && (s == "0" || s == "never") {
		return 0, nil
	}
	d, err := structs.ParseDuration(s)
	if err != nil || d <= 0 {
		return 0, structs.Errf(structs.CodeInvalidRequest, "expires %q is not a positive duration (like 720h or 30m)", s)
	}
	return d.D(), nil
}

func (b *Backend) createAPIKey(w http.ResponseWriter, r *http.Request) {
	keys, err := b.keysOf()
	if err != nil {
		writeMgmtError(w, err)
		return
	}
	data, err := readBody(r)
	if err != nil {
		writeMgmtError(w, err)
		return
	}
	var req wire.APIKeyCreateRequest
	if err := decodeStrict(data, &req); err != nil {
		writeMgmtError(w, err)
		return
	}
	spec := apikeys.Spec{Models: req.Models, Weight: req.Weight, Limits: structs.KeyLimits{
		RPM: req.Limits.RPM, TPM: req.Limits.TPM, Concurrency: req.Limits.Concurrency, MonthlyTokens: req.Limits.MonthlyTokens}}
	if req.Expires != "" {
		if spec.ExpiresIn, err = parseExpires(req.Expires, false); err != nil {
			writeMgmtError(w, err)
			return
		}
	}
	plain, rec, err := keys.Create(req.Name, spec)
	if err != nil {
		writeMgmtError(w, err)
		return
	}
	// IMPORTANT: the key in clear, this once; the answer is not cached
	// (managementAuth sends Cache-Control: no-store).
	writeJSON(w, http.StatusCreated, wire.APIKeyCreated{APIKey: APIKeyView(apikeys.View{Key: rec}, time.Now()), Key: plain})
}

func (b *Backend) updateAPIKey(w http.ResponseWriter, r *http.Request) {
	keys, err := b.keysOf()
	if err != nil {
		writeMgmtError(w, err)
		return
	}
	data, err := readBody(r)
	if err != nil {
		writeMgmtError(w, err)
		return
	}
	var req wire.APIKeyUpdateRequest
	if err := decodeStrict(data, &req); err != nil {
		writeMgmtError(w, err)
		return
	}
	p := apikeys.Patch{Models: req.Models, RPM: req.RPM, TPM: req.TPM, Concurrency: req.Concurrency,
		MonthlyTokens: req.MonthlyTokens, Weight: req.Weight}
	if req.Expires != nil {
		d, err := parseExpires(*req.Expires, true)
		if err != nil {
			writeMgmtError(w, err)
			return
		}
		p.ExpiresIn = &d
	}
	name := mux.Vars(r)["name"]
	if _, err := keys.Update(name, p); err != nil {
		writeMgmtError(w, err)
		return
	}
	v, err := keys.Get(name)
	if err != nil {
		writeMgmtError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, APIKeyView(v, time.Now()))
}

func (b *Backend) revokeAPIKey(w http.ResponseWriter, r *http.Request) {
	keys, err := b.keysOf()
	if err != nil {
		writeMgmtError(w, err)
		return
	}
	name := mux.Vars(r)["name"]
	if err := keys.Revoke(name); err != nil {
		writeMgmtError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, wire.Removed{APIVersion: wire.APIVersion, Removed: name})
}

// UsageFilter reads GET /usage's query: key, model, and since (a duration
// back from now, or an RFC 3339 time; default 24h).
func UsageFilter(r *http.Request, now time.Time) (store.UsageFilter, error) {
	q := r.URL.Query()
	f := store.UsageFilter{Key: q.Get("key"), Model: q.Get("model"), Since: now.Add(-24 * time.Hour)}
	if s := q.Get("since"); s != "" {
		if t, err := time.Parse(time.RFC3339, s); err == nil {
			f.Since = t
		} else if d, ok := days(s); ok {
			f.Since = now.Add(-d)
		} else if d, err := structs.ParseDuration(s); err == nil {
			f.Since = now.Add(-d.D())
		} else {
			return f, structs.Errf(structs.CodeInvalidRequest, "since %q is neither a duration (24h, 7d as 168h) nor an RFC 3339 time", s)
		}
	}
	f.Since = f.Since.UTC().Truncate(time.Hour)
	return f, nil
}

// days reads "7d" as seven days.
func days(s string) (time.Duration, bool) {
	n, ok := strings.CutSuffix(s, "d")
	if !ok {
		return 0, false
	}
	v, err := strconv.Atoi(n)
	if err != nil || v < 0 || v > 100*365 {
		return 0, false
	}
	return time.Duration(v) * 24 * time.Hour, true
}

// MergeUsage sums rows of the same hour, key and model (several servers'
// counts), ordered by hour, key and model.
func MergeUsage(rows []wire.UsageRow) []wire.UsageRow {
	type k struct {
		hour       time.Time
		key, model string
	}
	sum := map[k]*structs.KeyUsage{}
	for _, r := range rows {
		id := k{r.Hour.UTC(), r.Key, r.Model}
		cur := sum[id]
		if cur == nil {
			cur = &structs.KeyUsage{Hour: r.Hour.UTC(), Key: r.Key, Model: r.Model}
			sum[id] = cur
		}
		cur.Add(&structs.KeyUsage{Requests: r.Requests, Errors: r.Errors, PromptTokens: r.PromptTokens,
			CompletionTokens: r.CompletionTokens, CachedTokens: r.CachedTokens, RequestMs: r.RequestMs})
	}
	out := make([]structs.KeyUsage, 0, len(sum))
	for _, r := range sum {
		out = append(out, *r)
	}
	usage.Sort(out)
	return UsageRows(out)
}

// UsageRows converts usage rows for the API.
func UsageRows(rows []structs.KeyUsage) []wire.UsageRow {
	out := make([]wire.UsageRow, 0, len(rows))
	for _, r := range rows {
		out = append(out, wire.UsageRow{Hour: r.Hour, Key: r.Key, Model: r.Model, Requests: r.Requests, Errors: r.Errors,
			PromptTokens: r.PromptTokens, CompletionTokens: r.CompletionTokens, CachedTokens: r.CachedTokens, RequestMs: r.RequestMs})
	}
	return out
}

func (b *Backend) usageView(w http.ResponseWriter, r *http.Request) {
	if b.Usage == nil {
		writeMgmtError(w, structs.Errf(structs.CodeUnsupported, "this role counts no usage: a host's requests are counted by the server that relayed them"))
		return
	}
	f, err := UsageFilter(r, time.Now())
	if err != nil {
		writeMgmtError(w, err)
		return
	}
	rows, err := b.Usage.Query(f)
	if err != nil {
		writeMgmtError(w, err)
		return
	}
	out := wire.UsageResponse{APIVersion: wire.APIVersion, Since: f.Since, Rows: UsageRows(rows)}
	if b.PeerUsage != nil {
		// A cluster: each server counted the requests it took.
		peer, servers, missing := b.PeerUsage(r)
		out.Rows, out.Servers, out.Missing = MergeUsage(append(out.Rows, peer...)), servers, missing
	}
	writeJSON(w, http.StatusOK, out)
}
