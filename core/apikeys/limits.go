// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package apikeys

import (
	"math"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/capyctl/capyctl/core/structs"
)

// The limits a refusal names (events, metrics, the error's details).
const (
	LimitRPM           = "rpm"
	LimitTPM           = "tpm"
	LimitConcurrency   = "concurrency"
	LimitMonthlyTokens = "monthly_tokens"
)

// The OpenAI-style rate-limit headers, on every answer to a key with the
// limit they describe.
const (
	HeaderLimitRequests     = "X-Ratelimit-Limit-Requests"
	HeaderRemainingRequests = "X-Ratelimit-Remaining-Requests"
	HeaderResetRequests     = "X-Ratelimit-Reset-Requests"
	HeaderLimitTokens       = "X-Ratelimit-Limit-Tokens"
	HeaderRemainingTokens   = "X-Ratelimit-Remaining-Tokens"
	HeaderResetTokens       = "X-Ratelimit-Reset-Tokens"
)

// bucket is a token bucket that refills at a steady rate per minute up to
// its capacity. A tokens-per-minute bucket may go below zero: a request's
// tokens are known only once the engine answered, and are all debited.
type bucket struct {
	tokens float64
	at     time.Time
}

// refill brings the bucket to now; a new bucket starts full.
func (b *bucket) refill(now time.Time, capacity float64) {
	if b.at.IsZero() {
		b.tokens, b.at = capacity, now
		return
	}
	if dt := now.Sub(b.at); dt > 0 {
		b.tokens = math.Min(capacity, b.tokens+dt.Minutes()*capacity)
		b.at = now
	}
	b.tokens = math.Min(b.tokens, capacity) // a lowered limit
}

// until is how long the bucket takes to hold want tokens (0: it does).
func (b *bucket) until(want, capacity float64) time.Duration {
	if b.tokens >= want || capacity <= 0 {
		return 0
	}
	return time.Duration((want - b.tokens) / capacity * float64(time.Minute))
}

// keyState is one key's counters on this role.
type keyState struct {
	mu       sync.Mutex
	requests bucket
	tokens   bucket
	inFlight int64
	// refused counts the refusals by limit since the last event.
	refused map[string]int64
	// admitted and used count this role's admitted requests and settled
	// tokens since it started, for the other servers of a cluster
	// (Counts); peers is what each of them last said of theirs.
	admitted, used int64
	peers          map[string]Counts
	// recent counts the admitted requests and used tokens per second of
	// the last minute, for a peer that hears of this server for the first
	// time (Counts.RecentRequests).
	recent [60]secondCount
}

// secondCount is one second's requests admitted and tokens used.
type secondCount struct {
	sec        int64
	req, token int64
}

// note adds to now's second; the caller holds st.mu.
func (st *keyState) note(now time.Time, req, tokens int64) {
	sec := now.Unix()
	c := &st.recent[sec%60]
	if c.sec != sec {
		*c = secondCount{sec: sec}
	}
	c.req += req
	c.token += tokens
}

// lastMinute sums the last minute's seconds; the caller holds st.mu.
func (st *keyState) lastMinute(now time.Time) (req, tokens int64) {
	from := now.Unix() - 59
	for _, c := range st.recent {
		if c.sec >= from {
			req += c.req
			tokens += c.token
		}
	}
	return req, tokens
}

// Counts are one key's use on one server, as the servers of a cluster
// tell each other (Keeper.Counts, Keeper.ObservePeer): cumulative counts
// since that server started, so that a lost report loses nothing but
// time.
type Counts struct {
	// Requests admitted and Tokens settled since the server started.
	Requests int64 `json:"requests"`
	Tokens   int64 `json:"tokens"`
	// RecentRequests and RecentTokens are those of the last minute: what
	// a server hearing of this one for the first time takes off its
	// buckets (the rest is history).
	RecentRequests int64 `json:"recent_requests"`
	RecentTokens   int64 `json:"recent_tokens"`
	// InFlight are the key's requests running there now.
	InFlight int64 `json:"in_flight"`
	// MonthTokens are the tokens the key used there in Month
	// ("2006-01", UTC).
	Month       string `json:"month"`
	MonthTokens int64  `json:"month_tokens"`
	// At is when the server said it (the receiver's clock).
	At time.Time `json:"-"`
}

// peerFigures sums what the other servers said: requests running there
// and tokens used there in now's month. The caller holds st.mu.
func (st *keyState) peerFigures(now time.Time) (inFlight, month int64) {
	m := now.UTC().Format("2006-01")
	for _, c := range st.peers {
		inFlight += c.InFlight
		if c.Month == m {
			month += c.MonthTokens
		}
	}
	return inFlight, month
}

// observe takes a peer's new counts: the requests and tokens it used
// since its last report come off this server's buckets, as if they had
// been used here. baseline says the peer is new to this server: what it
// counted before is its history, not this minute's.
func (st *keyState) observe(lim structs.KeyLimits, peer string, c Counts, now time.Time, baseline bool) {
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.peers == nil {
		st.peers = map[string]Counts{}
	}
	prev := st.peers[peer] // a key new in a known peer's report: counted from 0
	dReq, dTok := c.Requests-prev.Requests, c.Tokens-prev.Tokens
	switch {
	case baseline:
		// A peer this server had not heard of (its own start, or the
		// peer's first report): its last minute counts, the rest is
		// history.
		dReq, dTok = c.RecentRequests, c.RecentTokens
	case dReq < 0 || dTok < 0:
		// The peer started again: its counts since its start.
		dReq, dTok = c.Requests, c.Tokens
	}
	if rpm := float64(lim.RPM); rpm > 0 && dReq > 0 {
		st.requests.refill(now, rpm)
		st.requests.tokens -= float64(dReq)
	}
	if tpm := float64(lim.TPM); tpm > 0 && dTok > 0 {
		st.tokens.refill(now, tpm)
		st.tokens.tokens -= float64(dTok)
	}
	c.At = now
	st.peers[peer] = c
}

// RateHeaders are the rate-limit headers of one answer.
type RateHeaders struct {
	pairs [6][2]string
	n     int
}

func (h *RateHeaders) add(k, v string) {
	h.pairs[h.n] = [2]string{k, v}
	h.n++
}

// Apply sets the headers on an answer.
func (h *RateHeaders) Apply(hdr http.Header) {
	for i := 0; i < h.n; i++ {
		hdr[h.pairs[i][0]] = []string{h.pairs[i][1]}
	}
}

// resetString writes a reset duration as OpenAI does ("1s", "6m0s",
// "20ms").
func resetString(d time.Duration) string {
	if d <= 0 {
		return "0s"
	}
	if d < time.Second {
		return strconv.FormatInt(max(d.Milliseconds(), 1), 10) + "ms"
	}
	return d.Round(time.Second).String()
}

// retrySeconds is a Retry-After in whole seconds, at least 1.
func retrySeconds(d time.Duration) int {
	s := int(math.Ceil(d.Seconds()))
	return max(s, 1)
}

// nextMonth is the start of the calendar month (UTC) after now's.
func nextMonth(now time.Time) time.Time {
	y, m, _ := now.UTC().Date()
	return time.Date(y, m+1, 1, 0, 0, 0, 0, time.UTC)
}

// MonthStart is the start of now's calendar month (UTC).
func MonthStart(now time.Time) time.Time {
	y, m, _ := now.UTC().Date()
	return time.Date(y, m, 1, 0, 0, 0, 0, time.UTC)
}

// admit takes a request's share of the key's limits, or refuses it with
// rate_limited or quota_exceeded (nothing taken). The headers describe the
// limits after the request, refused or not.
func (st *keyState) admit(lim structs.KeyLimits, now time.Time, monthUsed int64, hdr *RateHeaders) *structs.Error {
	st.mu.Lock()
	defer st.mu.Unlock()
	rpm, tpm := float64(lim.RPM), float64(lim.TPM)
	if rpm > 0 {
		st.requests.refill(now, rpm)
	}
	if tpm > 0 {
		st.tokens.refill(now, tpm)
	}
	peerInFlight, peerMonth := st.peerFigures(now)
	var refusal *structs.Error
	var limit string
	switch {
	case lim.MonthlyTokens > 0 && monthUsed+peerMonth >= lim.MonthlyTokens:
		next := nextMonth(now)
		limit = LimitMonthlyTokens
		refusal = structs.Errf(structs.CodeQuotaExceeded, "the API key used %d of its %d tokens this month; the budget renews at %s",
			monthUsed+peerMonth, lim.MonthlyTokens, next.Format(time.RFC3339))
		refusal.RetryAfter = retrySeconds(next.Sub(now))
	case tpm > 0 && st.tokens.tokens <= 0:
		limit = LimitTPM
		refusal = structs.Errf(structs.CodeRateLimited, "the API key is over its %d tokens per minute", lim.TPM)
		refusal.RetryAfter = retrySeconds(st.tokens.until(1, tpm))
	case rpm > 0 && st.requests.tokens < 1:
		limit = LimitRPM
		refusal = structs.Errf(structs.CodeRateLimited, "the API key is over its %d requests per minute", lim.RPM)
		refusal.RetryAfter = retrySeconds(st.requests.until(1, rpm))
	case lim.Concurrency > 0 && st.inFlight+peerInFlight >= lim.Concurrency:
		limit = LimitConcurrency
		refusal = structs.Errf(structs.CodeRateLimited, "the API key has %d requests running, its limit", lim.Concurrency)
		refusal.RetryAfter = 1
	default:
		if rpm > 0 {
			st.requests.tokens--
		}
		st.inFlight++
		st.admitted++
		st.note(now, 1, 0)
	}
	if refusal != nil {
		refusal.WithDetail("limit", limit)
		if st.refused == nil {
			st.refused = map[string]int64{}
		}
		st.refused[limit]++
	}
	if rpm > 0 {
		hdr.add(HeaderLimitRequests, strconv.FormatInt(lim.RPM, 10))
		hdr.add(HeaderRemainingRequests, strconv.FormatInt(int64(math.Max(0, math.Floor(st.requests.tokens))), 10))
		hdr.add(HeaderResetRequests, resetString(st.requests.until(rpm, rpm)))
	}
	if tpm > 0 {
		hdr.add(HeaderLimitTokens, strconv.FormatInt(lim.TPM, 10))
		hdr.add(HeaderRemainingTokens, strconv.FormatInt(int64(math.Max(0, math.Floor(st.tokens.tokens))), 10))
		hdr.add(HeaderResetTokens, resetString(st.tokens.until(tpm, tpm)))
	}
	return refusal
}

// settle gives back a request's place and debits its tokens.
func (st *keyState) settle(lim structs.KeyLimits, now time.Time, tokens int64) {
	st.mu.Lock()
	defer st.mu.Unlock()
	st.inFlight = max(st.inFlight-1, 0)
	st.used += max(tokens, 0)
	st.note(now, 0, max(tokens, 0))
	if lim.TPM > 0 && tokens > 0 {
		st.tokens.refill(now, float64(lim.TPM))
		st.tokens.tokens -= float64(tokens)
	}
}

// takeRefused returns and clears the refusal counts.
func (st *keyState) takeRefused() map[string]int64 {
	st.mu.Lock()
	defer st.mu.Unlock()
	r := st.refused
	st.refused = nil
	return r
}

// Standing is where a key stands against its limits on this server, as
// its next request would see it: what is left of the requests and tokens
// per minute, the requests running (on every server this one heard of)
// and the tokens used this month.
type Standing struct {
	RemainingRequests int64
	RemainingTokens   int64
	InFlight          int64
	MonthTokens       int64
}

// standing reads st without taking anything.
func (st *keyState) standing(lim structs.KeyLimits, now time.Time, monthUsed int64) Standing {
	st.mu.Lock()
	defer st.mu.Unlock()
	var out Standing
	if rpm := float64(lim.RPM); rpm > 0 {
		st.requests.refill(now, rpm)
		out.RemainingRequests = int64(math.Max(0, math.Floor(st.requests.tokens)))
	}
	if tpm := float64(lim.TPM); tpm > 0 {
		st.tokens.refill(now, tpm)
		out.RemainingTokens = int64(math.Max(0, math.Floor(st.tokens.tokens)))
	}
	peerInFlight, peerMonth := st.peerFigures(now)
	out.InFlight = st.inFlight + peerInFlight
	out.MonthTokens = monthUsed + peerMonth
	return out
}
