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
	var refusal *structs.Error
	var limit string
	switch {
	case lim.MonthlyTokens > 0 && monthUsed >= lim.MonthlyTokens:
		next := nextMonth(now)
		limit = LimitMonthlyTokens
		refusal = structs.Errf(structs.CodeQuotaExceeded, "the API key used %d of its %d tokens this month; the budget renews at %s",
			monthUsed, lim.MonthlyTokens, next.Format(time.RFC3339))
		refusal.RetryAfter = retrySeconds(next.Sub(now))
	case tpm > 0 && st.tokens.tokens <= 0:
		limit = LimitTPM
		refusal = structs.Errf(structs.CodeRateLimited, "the API key is over its %d tokens per minute", lim.TPM)
		refusal.RetryAfter = retrySeconds(st.tokens.until(1, tpm))
	case rpm > 0 && st.requests.tokens < 1:
		limit = LimitRPM
		refusal = structs.Errf(structs.CodeRateLimited, "the API key is over its %d requests per minute", lim.RPM)
		refusal.RetryAfter = retrySeconds(st.requests.until(1, rpm))
	case lim.Concurrency > 0 && st.inFlight >= lim.Concurrency:
		limit = LimitConcurrency
		refusal = structs.Errf(structs.CodeRateLimited, "the API key has %d requests running, its limit", lim.Concurrency)
		refusal.RetryAfter = 1
	default:
		if rpm > 0 {
			st.requests.tokens--
		}
		st.inFlight++
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
