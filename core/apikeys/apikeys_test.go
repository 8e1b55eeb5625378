// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package apikeys

import (
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/capyctl/capyctl/core/structs"
)

func TestKey_Shape(t *testing.T) {
	plain, id, digest := generate()
	if len(plain) != KeyLen || !strings.HasPrefix(plain, "capyk_"+id+"_") {
		t.Fatalf("key %q (id %q)", plain, id)
	}
	if got, ok := idOf(plain); !ok || got != id {
		t.Fatalf("idOf = %q, %v", got, ok)
	}
	d, ok := digestBytes(digest)
	if !ok || !matches(plain, d) || matches(plain+"x", d) {
		t.Fatalf("digest %q does not match its key only", digest)
	}
	if strings.Contains(digest, plain[len(plain)-43:]) {
		t.Fatal("the digest holds the secret")
	}
	other, _, _ := generate()
	if other == plain {
		t.Fatal("two keys alike")
	}
	for _, bad := range []string{"", "capy-role-key", plain[:len(plain)-1], "capyk_ZZZZZZZZZZZZ" + plain[18:], strings.Replace(plain, "_", "-", 2)} {
		if _, ok := idOf(bad); ok {
			t.Errorf("idOf(%q) accepted", bad)
		}
	}
}

func TestScope_Allows(t *testing.T) {
	cases := []struct {
		name   string
		models []string
		model  string
		want   bool
	}{
		{name: "no list allows all", models: nil, model: "anything", want: true},
		{name: "exact", models: []string{"demo"}, model: "demo", want: true},
		{name: "exact, other", models: []string{"demo"}, model: "demo2", want: false},
		{name: "prefix glob", models: []string{"chat-*"}, model: "chat-a", want: true},
		{name: "glob spans slashes", models: []string{"org/*"}, model: "org/team/model", want: true},
		{name: "glob, other", models: []string{"chat-*"}, model: "demo", want: false},
		{name: "question mark", models: []string{"chat-?"}, model: "chat-b", want: true},
		{name: "question mark is one character", models: []string{"chat-?"}, model: "chat-bb", want: false},
		{name: "middle star", models: []string{"a*z"}, model: "abcz", want: true},
		{name: "middle star, backtrack", models: []string{"a*bz"}, model: "abzbz", want: true},
		{name: "middle star, no end", models: []string{"a*z"}, model: "abc", want: false},
		{name: "any of several", models: []string{"demo", "chat-*"}, model: "chat-x", want: true},
		{name: "star alone", models: []string{"*"}, model: "x/y", want: true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s, err := NewScope(c.models)
			if err != nil {
				t.Fatal(err)
			}
			if got := s.Allows(c.model); got != c.want {
				t.Fatalf("Allows(%q) with %v = %v", c.model, c.models, got)
			}
		})
	}
}

// journal is an in-memory Journal.
type journal struct {
	mu     sync.Mutex
	events []structs.Event
	uses   map[string]structs.KeyUse
}

func (j *journal) AppendEvent(e *structs.Event) (uint64, error) {
	j.mu.Lock()
	defer j.mu.Unlock()
	j.events = append(j.events, *e)
	return uint64(len(j.events)), nil
}

func (j *journal) KeyUses() (map[string]structs.KeyUse, error) {
	j.mu.Lock()
	defer j.mu.Unlock()
	out := map[string]structs.KeyUse{}
	for k, v := range j.uses {
		out[k] = v
	}
	return out, nil
}

func (j *journal) PutKeyUses(u map[string]structs.KeyUse) error {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.uses == nil {
		j.uses = map[string]structs.KeyUse{}
	}
	for k, v := range u {
		j.uses[k] = v
	}
	return nil
}

func (j *journal) kinds() []string {
	j.mu.Lock()
	defer j.mu.Unlock()
	var out []string
	for _, e := range j.events {
		out = append(out, e.Kind)
	}
	return out
}

// clock is a settable clock.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) Add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// recorder is an in-memory Recorder.
type recorder struct {
	mu    sync.Mutex
	recs  []structs.RequestUsage
	month int64
}

func (r *recorder) Record(key string, u structs.RequestUsage) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.recs = append(r.recs, u)
	if u.UsageKnown {
		r.month += u.PromptTokens + u.CompletionTokens
	}
}

func (r *recorder) MonthTokens(string, time.Time) int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.month
}

const roleKey = "capy-role-secret"

func newKeeper(t *testing.T) (*Keeper, *journal, *clock, *recorder) {
	t.Helper()
	clk := &clock{t: time.Date(2026, 5, 10, 12, 0, 0, 0, time.UTC)}
	j, rec := &journal{}, &recorder{}
	k, err := New(Config{Backend: NewMemoryBackend(RoleKeyRecord(clk.Now())), Journal: j, Usage: rec,
		RoleKey: func() string { return roleKey }, Now: clk.Now})
	if err != nil {
		t.Fatal(err)
	}
	return k, j, clk, rec
}

func TestKeeper_Authenticate(t *testing.T) {
	k, j, clk, _ := newKeeper(t)
	bob, rec, err := k.Create("bob", Spec{Models: []string{"demo"}, ExpiresIn: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	if rec.Digest == "" || strings.Contains(rec.Digest, bob) || rec.ID == "" {
		t.Fatalf("record %+v", rec)
	}
	if _, _, err := k.Create("bob", Spec{}); !structs.HasCode(err, structs.CodeAPIKeyExists) {
		t.Fatalf("a second bob: %v", err)
	}
	wrongSecret := bob[:len(bob)-4] + "AAAA"
	cases := []struct {
		name string
		key  string
		who  string // "" : refused
	}{
		{name: "the role's key is default", key: roleKey, who: "default"},
		{name: "a named key", key: bob, who: "bob"},
		{name: "its identifier with another secret", key: wrongSecret},
		{name: "nothing", key: ""},
		{name: "an unknown named key", key: "capyk_000000000000_" + bob[len(bob)-43:]},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p, err := k.Authenticate(c.key)
			switch {
			case c.who == "" && !structs.HasCode(err, structs.CodeUnauthorized):
				t.Fatalf("Authenticate = %+v, %v; want unauthorized", p, err)
			case c.who != "" && (err != nil || p.Key.Name != c.who):
				t.Fatalf("Authenticate = %+v, %v; want %s", p, err, c.who)
			case err != nil && strings.Contains(err.Error(), c.key) && c.key != "":
				t.Fatalf("the refusal echoes the key: %v", err)
			}
		})
	}
	p, _ := k.Authenticate(bob)
	if !p.Scope.Allows("demo") || p.Scope.Allows("chat-a") {
		t.Fatal("bob's scope")
	}
	// An update applies to the next request.
	models := []string{"chat-*"}
	if _, err := k.Update("bob", Patch{Models: &models}); err != nil {
		t.Fatal(err)
	}
	p, _ = k.Authenticate(bob)
	if p.Scope.Allows("demo") || !p.Scope.Allows("chat-a") {
		t.Fatal("bob's scope after the update")
	}
	// Past its expiry, the key is refused.
	clk.Add(time.Hour)
	if _, err := k.Authenticate(bob); !structs.HasCode(err, structs.CodeUnauthorized) || !strings.Contains(err.Error(), "expired") {
		t.Fatalf("an expired key: %v", err)
	}
	// Revoked, gone; the role's key revoked, gone too.
	clk.Add(-time.Hour)
	if err := k.Revoke("bob"); err != nil {
		t.Fatal(err)
	}
	if _, err := k.Authenticate(bob); !structs.HasCode(err, structs.CodeUnauthorized) {
		t.Fatalf("a revoked key: %v", err)
	}
	if err := k.Revoke("bob"); !structs.HasCode(err, structs.CodeNotFound) {
		t.Fatalf("revoke twice: %v", err)
	}
	if err := k.Revoke("default"); err != nil {
		t.Fatal(err)
	}
	if _, err := k.Authenticate(roleKey); !structs.HasCode(err, structs.CodeUnauthorized) {
		t.Fatalf("the revoked role key: %v", err)
	}
	want := []string{EventCreated, EventUpdated, EventRevoked, EventRevoked}
	if got := j.kinds(); strings.Join(got, ",") != strings.Join(want, ",") {
		t.Fatalf("events %v, want %v", got, want)
	}
	for _, e := range j.events {
		for _, v := range e.Payload {
			if s, ok := v.(string); ok && (strings.Contains(s, "capyk_") || strings.Contains(s, "sha256:")) {
				t.Fatalf("event %s holds a key or digest: %v", e.Kind, e.Payload)
			}
		}
	}
}

func TestKeeper_Validation(t *testing.T) {
	k, _, _, _ := newKeeper(t)
	cases := []struct {
		name string
		key  string
		spec Spec
	}{
		{name: "empty name", key: "", spec: Spec{}},
		{name: "a space", key: "a b", spec: Spec{}},
		{name: "leading dash", key: "-a", spec: Spec{}},
		{name: "negative limit", key: "a", spec: Spec{Limits: structs.KeyLimits{RPM: -1}}},
		{name: "weight too big", key: "a", spec: Spec{Weight: MaxWeight + 1}},
		{name: "empty glob", key: "a", spec: Spec{Models: []string{" "}}},
		{name: "negative expiry", key: "a", spec: Spec{ExpiresIn: -time.Second}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if _, _, err := k.Create(c.key, c.spec); !structs.HasCode(err, structs.CodeInvalidRequest) {
				t.Fatalf("Create = %v, want invalid_request", err)
			}
		})
	}
	if _, err := k.Update("nobody", Patch{}); !structs.HasCode(err, structs.CodeNotFound) {
		t.Fatalf("update of nobody: %v", err)
	}
}

// admit authenticates key and admits a request; the headers come back.
func admit(t *testing.T, k *Keeper, key string) (*Ticket, http.Header, error) {
	t.Helper()
	p, err := k.Authenticate(key)
	if err != nil {
		t.Fatal(err)
	}
	var hdr RateHeaders
	tk, err := p.Admit(&hdr)
	h := http.Header{}
	hdr.Apply(h)
	return tk, h, err
}

func TestKeeper_RequestsPerMinute(t *testing.T) {
	k, _, clk, rec := newKeeper(t)
	key, _, err := k.Create("bob", Spec{Limits: structs.KeyLimits{RPM: 5}})
	if err != nil {
		t.Fatal(err)
	}
	for i := 1; i <= 5; i++ {
		tk, h, err := admit(t, k, key)
		if err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
		if got, want := h.Get(HeaderRemainingRequests), string(rune('0'+5-i)); got != want || h.Get(HeaderLimitRequests) != "5" {
			t.Fatalf("request %d: remaining %q, want %q (%v)", i, got, want, h)
		}
		tk.EndUntaken()
	}
	_, h, err := admit(t, k, key)
	e := structs.AsError(err)
	if !structs.HasCode(err, structs.CodeRateLimited) || e.RetryAfter != 12 || h.Get(HeaderRemainingRequests) != "0" || e.Details["limit"] != LimitRPM {
		t.Fatalf("the sixth: %v (retry %d) %v", err, e.RetryAfter, h)
	}
	if len(rec.recs) != 1 || rec.recs[0].Code != string(structs.CodeRateLimited) {
		t.Fatalf("the refusal's usage: %+v", rec.recs)
	}
	// One fifth of a minute later, one request is allowed again.
	clk.Add(12 * time.Second)
	if _, _, err := admit(t, k, key); err != nil {
		t.Fatalf("after 12s: %v", err)
	}
	if _, _, err := admit(t, k, key); !structs.HasCode(err, structs.CodeRateLimited) {
		t.Fatalf("right after: %v", err)
	}
	// Raising the limit lets the next one in.
	rpm := int64(100)
	if _, err := k.Update("bob", Patch{RPM: &rpm}); err != nil {
		t.Fatal(err)
	}
	clk.Add(time.Second)
	if _, _, err := admit(t, k, key); err != nil {
		t.Fatalf("after raising the limit: %v", err)
	}
}

func TestKeeper_TokensConcurrencyBudget(t *testing.T) {
	k, j, clk, rec := newKeeper(t)
	key, _, err := k.Create("bob", Spec{Limits: structs.KeyLimits{TPM: 100, Concurrency: 2, MonthlyTokens: 250}})
	if err != nil {
		t.Fatal(err)
	}
	a, _, err := admit(t, k, key)
	if err != nil {
		t.Fatal(err)
	}
	b, _, err := admit(t, k, key)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := admit(t, k, key); !structs.HasCode(err, structs.CodeRateLimited) || structs.AsError(err).Details["limit"] != LimitConcurrency {
		t.Fatalf("a third at once: %v", err)
	}
	a.Take()
	a.EndUntaken() // taken: not ended here
	if _, _, err := admit(t, k, key); !structs.HasCode(err, structs.CodeRateLimited) {
		t.Fatalf("a taken ticket gave its place back before it settled: %v", err)
	}
	// a used 150 tokens: the key is over its 100 per minute until the
	// bucket is back above zero (half a minute).
	a.Settle(structs.RequestUsage{Model: "demo", UsageKnown: true, PromptTokens: 50, CompletionTokens: 100})
	a.Settle(structs.RequestUsage{Model: "demo", UsageKnown: true, PromptTokens: 50, CompletionTokens: 100}) // twice: once
	_, h, err := admit(t, k, key)
	if !structs.HasCode(err, structs.CodeRateLimited) || structs.AsError(err).Details["limit"] != LimitTPM || h.Get(HeaderRemainingTokens) != "0" {
		t.Fatalf("over the tokens per minute: %v %v", err, h)
	}
	if e := structs.AsError(err); e.RetryAfter < 30 || e.RetryAfter > 31 {
		t.Fatalf("retry after %d, want about 30", e.RetryAfter)
	}
	b.EndUntaken()
	clk.Add(31 * time.Second)
	c, h, err := admit(t, k, key)
	if err != nil || h.Get(HeaderLimitTokens) != "100" {
		t.Fatalf("after the refill: %v %v", err, h)
	}
	c.Settle(structs.RequestUsage{Model: "demo", UsageKnown: true, PromptTokens: 50, CompletionTokens: 50})
	// 250 tokens this month: the budget is spent.
	clk.Add(time.Hour)
	_, _, err = admit(t, k, key)
	e := structs.AsError(err)
	next := time.Date(2026, 6, 1, 0, 0, 0, 0, time.UTC)
	if !structs.HasCode(err, structs.CodeQuotaExceeded) || e.RetryAfter != int(next.Sub(clk.Now()).Seconds()) {
		t.Fatalf("over the monthly budget: %v (retry %d)", err, e.RetryAfter)
	}
	if n := len(rec.recs); n != 6 {
		t.Fatalf("recorded %d requests, want 6 (2 settled, 4 refused): %+v", n, rec.recs)
	}
	k.emitLimited()
	var limited *structs.Event
	for i := range j.events {
		if j.events[i].Kind == EventLimited {
			limited = &j.events[i]
		}
	}
	if limited == nil || limited.Payload["total"] != int64(4) {
		t.Fatalf("limited event %+v", limited)
	}
}

func TestKeeper_UseEvents(t *testing.T) {
	clk := &clock{t: time.Date(2026, 5, 10, 12, 0, 0, 0, time.UTC)}
	j := &journal{}
	cfg := Config{Backend: NewMemoryBackend(), Journal: j, Now: clk.Now, FlushInterval: time.Hour, LimitedEvery: time.Hour}
	k, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	k.Start()
	key, _, err := k.Create("bob", Spec{ExpiresIn: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 3; i++ {
		if _, err := k.Authenticate(key); err != nil {
			t.Fatal(err)
		}
	}
	clk.Add(2 * time.Minute)
	k.Close() // writes what it holds: the first use, the expiry
	got := strings.Join(j.kinds(), ",")
	if strings.Count(got, EventFirstUsed) != 1 || !strings.HasPrefix(got, EventCreated) {
		t.Fatalf("events %s: one first use", got)
	}
	u := j.uses[mustKey(t, k, "bob").UseID()]
	if u.FirstUsedAt.IsZero() || u.LastUsedAt.IsZero() {
		t.Fatalf("use %+v", u)
	}
	// A second keeper on the same journal announces nothing again.
	k2, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	before := len(j.kinds())
	k2.Start()
	if _, err := k2.Authenticate(key); err == nil {
		t.Fatal("an expired key authenticated")
	}
	k2.Close()
	if after := j.kinds(); len(after) != before+boolInt(!strings.Contains(got, EventExpired)) {
		t.Fatalf("events after a restart: %v (before %d)", after, before)
	}
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

func mustKey(t *testing.T, k *Keeper, name string) structs.APIKey {
	t.Helper()
	recs, _ := k.cfg.Backend.Keys()
	for _, r := range recs {
		if r.Name == name {
			return r
		}
	}
	t.Fatalf("no key %s", name)
	return structs.APIKey{}
}

// TestKeeper_SharedCounts: two servers' keepers of one key tell each
// other their counts: the requests admitted on one come off the other's
// requests per minute, the requests running on one count against the
// other's concurrency, and a server that went silent counts no more.
func TestKeeper_SharedCounts(t *testing.T) {
	clk := &clock{t: time.Date(2026, 5, 10, 12, 0, 0, 0, time.UTC)}
	plain, id, digest := generate()
	rec := structs.APIKey{Name: "bob", ID: id, Digest: digest, Limits: structs.KeyLimits{RPM: 5, Concurrency: 3}, CreatedAt: clk.Now()}
	newK := func() *Keeper {
		k, err := New(Config{Backend: NewMemoryBackend(rec), Now: clk.Now})
		if err != nil {
			t.Fatal(err)
		}
		return k
	}
	a, b := newK(), newK()
	// Each server heard of the other before the key's first request (a
	// report without it: a key made after the servers met).
	b.ObservePeer("a", map[string]Counts{})
	a.ObservePeer("b", map[string]Counts{})
	var held []*Ticket
	for i := 0; i < 3; i++ {
		tk, _, err := admit(t, a, plain)
		if err != nil {
			t.Fatalf("request %d on a: %v", i, err)
		}
		held = append(held, tk)
	}
	b.ObservePeer("a", a.Counts())
	// b saw a's three requests running: none more at once.
	if _, _, err := admit(t, b, plain); !structs.HasCode(err, structs.CodeRateLimited) || structs.AsError(err).Details["limit"] != LimitConcurrency {
		t.Fatalf("b, with a's three running: %v", err)
	}
	for _, tk := range held {
		tk.EndUntaken()
	}
	b.ObservePeer("a", a.Counts())
	// Three of five requests a minute used on a: two left on b.
	for i := 0; i < 2; i++ {
		tk, h, err := admit(t, b, plain)
		if err != nil {
			t.Fatalf("request %d on b: %v (%v)", i, err, h)
		}
		tk.EndUntaken()
	}
	if _, _, err := admit(t, b, plain); !structs.HasCode(err, structs.CodeRateLimited) || structs.AsError(err).Details["limit"] != LimitRPM {
		t.Fatalf("b's sixth of the minute: %v", err)
	}
	// A server that hears of a peer for the first time takes only the
	// peer's last minute off its buckets: the rest is history.
	clk.Add(2 * time.Minute)
	tk, _, err := admit(t, a, plain) // one in a's last minute
	if err != nil {
		t.Fatal(err)
	}
	tk.EndUntaken()
	c := newK()
	c.ObservePeer("a", a.Counts())
	for i := 0; i < 5; i++ {
		tk, _, err := admit(t, c, plain)
		switch {
		case i < 4 && err != nil:
			t.Fatalf("c, new to a, request %d: %v", i, err)
		case i == 4 && !structs.HasCode(err, structs.CodeRateLimited):
			t.Fatalf("c's fifth, with a's one of the last minute: %v", err)
		case err == nil:
			tk.EndUntaken()
		}
	}
	// a went silent: its running requests count no more.
	held = held[:0]
	for i := 0; i < 3; i++ {
		clk.Add(12 * time.Second)
		tk, _, err := admit(t, a, plain)
		if err != nil {
			t.Fatalf("a again: %v", err)
		}
		held = append(held, tk)
	}
	b.ObservePeer("a", a.Counts())
	clk.Add(time.Minute)
	b.ForgetPeers(map[string]bool{"a": true}, 10*time.Second)
	if tk, _, err := admit(t, b, plain); err != nil {
		t.Fatalf("b after a went silent: %v", err)
	} else {
		tk.EndUntaken()
	}
}

// TestKeeper_SharedMonthlyBudget: the tokens a key used this month on the
// other servers count against its monthly budget here; those of an
// earlier month do not.
func TestKeeper_SharedMonthlyBudget(t *testing.T) {
	clk := &clock{t: time.Date(2026, 5, 10, 12, 0, 0, 0, time.UTC)}
	plain, id, digest := generate()
	rec := structs.APIKey{Name: "bob", ID: id, Digest: digest, Limits: structs.KeyLimits{MonthlyTokens: 1000}, CreatedAt: clk.Now()}
	k, err := New(Config{Backend: NewMemoryBackend(rec), Now: clk.Now})
	if err != nil {
		t.Fatal(err)
	}
	// The other server spent the budget last month: nothing of it counts.
	k.ObservePeer("a", map[string]Counts{rec.UseID(): {Month: "2026-04", MonthTokens: 1000}})
	tk, _, err := admit(t, k, plain)
	if err != nil {
		t.Fatalf("with last month's tokens on a: %v", err)
	}
	tk.EndUntaken()
	// This month's 1000 on the other server: the budget is spent here too.
	k.ObservePeer("a", map[string]Counts{rec.UseID(): {Month: "2026-05", MonthTokens: 1000}})
	if _, _, err := admit(t, k, plain); !structs.HasCode(err, structs.CodeQuotaExceeded) || structs.AsError(err).Details["limit"] != LimitMonthlyTokens {
		t.Fatalf("with this month's budget spent on a: %v", err)
	}
}
