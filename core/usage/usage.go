// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

// Package usage counts what each API key used: per key, per model, per
// hour (UTC), the requests, the refused and failed ones by code, the
// prompt, completion and cached tokens the engines reported (never an
// estimate), and the requests' total time. Rows live in the role's bbolt
// store (core/store, bucket usage) for a retention (90 days by default),
// summed as they come.
//
// Recording never waits for the disk: a request adds to rows in memory,
// which a goroutine adds to the store every Interval (10 s by default) and
// at Close. Reads (Query, MonthTokens) see the rows not yet written too. A
// crash loses at most the last Interval's counts; a clean stop loses none.
//
// The same counts feed the /metrics series labelled by key
// (capyctl_key_requests_total, capyctl_key_tokens_total,
// capyctl_key_request_seconds_total) and the keys' monthly budgets
// (MonthTokens).
package usage

import (
	"sort"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/capyctl/capyctl/core/store"
	"github.com/capyctl/capyctl/core/structs"
)

// Defaults of Options.
const (
	DefaultRetention = 90 * 24 * time.Hour
	DefaultInterval  = 10 * time.Second
	// pruneBudget bounds the rows one flush removes.
	pruneBudget = 512
)

// Options configure a Meter.
type Options struct {
	// Retention is how long rows are kept (default 90 days).
	Retention time.Duration
	// Interval is how often counts are written (default 10 s).
	Interval time.Duration
	Now      func() time.Time
	Logger   hclog.Logger
}

// rowKey names one row.
type rowKey struct {
	hour       int64 // Unix seconds
	key, model string
}

// metricKey names one series set.
type metricKey struct{ key, model string }

// totals are the counts since the role started, for /metrics.
type totals struct {
	byCode                     map[string]int64
	prompt, completion, cached int64
	seconds                    float64
}

// Meter counts the keys' usage.
type Meter struct {
	st  *store.Store
	o   Options
	log hclog.Logger

	mu      sync.Mutex
	pending map[rowKey]*structs.KeyUsage
	// month is each key's tokens in the calendar month monthOf, stored
	// and pending together.
	month   map[string]int64
	monthOf time.Time
	metrics map[metricKey]*totals

	stop chan struct{}
	done chan struct{}
}

// Open starts a Meter on st, reading this month's tokens per key; Close it
// before st.
func Open(st *store.Store, o Options) (*Meter, error) {
	if o.Retention == 0 {
		o.Retention = DefaultRetention
	}
	if o.Interval <= 0 {
		o.Interval = DefaultInterval
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Logger == nil {
		o.Logger = hclog.NewNullLogger()
	}
	m := &Meter{st: st, o: o, log: o.Logger.Named("usage"), pending: map[rowKey]*structs.KeyUsage{},
		metrics: map[metricKey]*totals{}, stop: make(chan struct{}), done: make(chan struct{})}
	if err := m.loadMonth(o.Now()); err != nil {
		return nil, err
	}
	go m.run()
	return m, nil
}

// monthStart is the start of now's calendar month (UTC).
func monthStart(now time.Time) time.Time {
	y, mo, _ := now.UTC().Date()
	return time.Date(y, mo, 1, 0, 0, 0, 0, time.UTC)
}

// loadMonth reads the month's stored tokens per key.
func (m *Meter) loadMonth(now time.Time) error {
	start := monthStart(now)
	rows, err := m.st.Usage(store.UsageFilter{Since: start})
	if err != nil {
		return structs.Wrap(structs.CodeInternal, err, "read this month's usage")
	}
	month := map[string]int64{}
	for i := range rows {
		month[rows[i].Key] += rows[i].Tokens()
	}
	m.mu.Lock()
	for k, r := range m.pending {
		if r.Hour.Unix() >= start.Unix() {
			month[k.key] += r.Tokens()
		}
	}
	m.month, m.monthOf = month, start
	m.mu.Unlock()
	return nil
}

// Record counts one request of key (apikeys.Recorder).
func (m *Meter) Record(key string, u structs.RequestUsage) {
	now := m.o.Now().UTC()
	hour := now.Truncate(time.Hour)
	rk := rowKey{hour: hour.Unix(), key: key, model: u.Model}
	m.mu.Lock()
	defer m.mu.Unlock()
	r := m.pending[rk]
	if r == nil {
		r = &structs.KeyUsage{Hour: hour, Key: key, Model: u.Model}
		m.pending[rk] = r
	}
	r.Requests++
	r.RequestMs += u.Duration.Milliseconds()
	if u.Code != "" {
		if r.Errors == nil {
			r.Errors = map[string]int64{}
		}
		r.Errors[u.Code]++
	}
	mt := m.metrics[metricKey{key, u.Model}]
	if mt == nil {
		mt = &totals{byCode: map[string]int64{}}
		m.metrics[metricKey{key, u.Model}] = mt
	}
	code := u.Code
	if code == "" {
		code = "ok"
	}
	mt.byCode[code]++
	mt.seconds += u.Duration.Seconds()
	if !u.UsageKnown {
		return
	}
	r.PromptTokens += u.PromptTokens
	r.CompletionTokens += u.CompletionTokens
	r.CachedTokens += u.CachedTokens
	mt.prompt += u.PromptTokens
	mt.completion += u.CompletionTokens
	mt.cached += u.CachedTokens
	if start := monthStart(now); !start.Equal(m.monthOf) {
		// A new month: every budget starts again.
		m.month, m.monthOf = map[string]int64{}, start
	}
	m.month[key] += u.PromptTokens + u.CompletionTokens
}

// MonthTokens returns the tokens key used in now's calendar month (UTC),
// this role's count (apikeys.Recorder).
func (m *Meter) MonthTokens(key string, now time.Time) int64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	if !monthStart(now).Equal(m.monthOf) {
		return 0
	}
	return m.month[key]
}

// Query returns the rows the filter selects, the stored ones and those
// not yet written summed, oldest hour first, then by key and model.
func (m *Meter) Query(f store.UsageFilter) ([]structs.KeyUsage, error) {
	rows, err := m.st.Usage(f)
	if err != nil {
		return nil, structs.Wrap(structs.CodeInternal, err, "read usage")
	}
	byKey := map[rowKey]*structs.KeyUsage{}
	for i := range rows {
		r := rows[i]
		byKey[rowKey{r.Hour.Unix(), r.Key, r.Model}] = &r
	}
	since := f.Since.UTC().Truncate(time.Hour).Unix()
	m.mu.Lock()
	for k, r := range m.pending {
		if k.hour < since || (f.Key != "" && k.key != f.Key) || (f.Model != "" && k.model != f.Model) {
			continue
		}
		cur := byKey[k]
		if cur == nil {
			cur = &structs.KeyUsage{Hour: r.Hour, Key: r.Key, Model: r.Model}
			byKey[k] = cur
		}
		cur.Add(r)
	}
	m.mu.Unlock()
	out := make([]structs.KeyUsage, 0, len(byKey))
	for _, r := range byKey {
		out = append(out, *r)
	}
	Sort(out)
	return out, nil
}

// Sort orders rows by hour, then key, then model.
func Sort(rows []structs.KeyUsage) {
	sort.Slice(rows, func(i, j int) bool {
		a, b := &rows[i], &rows[j]
		if !a.Hour.Equal(b.Hour) {
			return a.Hour.Before(b.Hour)
		}
		if a.Key != b.Key {
			return a.Key < b.Key
		}
		return a.Model < b.Model
	})
}

// Flush writes the pending counts and prunes rows past the retention.
func (m *Meter) Flush() error {
	m.mu.Lock()
	rows := make([]structs.KeyUsage, 0, len(m.pending))
	for _, r := range m.pending {
		rows = append(rows, *r)
	}
	taken := m.pending
	m.pending = map[rowKey]*structs.KeyUsage{}
	m.mu.Unlock()
	cutoff := m.o.Now().Add(-m.o.Retention)
	err := m.st.Update(func(tx *store.Tx) error {
		if len(rows) > 0 {
			if err := tx.AddUsage(rows); err != nil {
				return err
			}
		}
		_, err := tx.PruneUsage(cutoff, pruneBudget)
		return err
	})
	if err != nil {
		// The counts go back, to be written with the next flush.
		m.mu.Lock()
		for k, r := range taken {
			if cur := m.pending[k]; cur != nil {
				r.Add(cur)
			}
			m.pending[k] = r
		}
		m.mu.Unlock()
		return structs.Wrap(structs.CodeInternal, err, "write usage")
	}
	return nil
}

func (m *Meter) run() {
	defer close(m.done)
	t := time.NewTicker(m.o.Interval)
	defer t.Stop()
	for {
		select {
		case <-m.stop:
			if err := m.Flush(); err != nil {
				m.log.Warn("write usage at stop", "error", err)
			}
			return
		case <-t.C:
			if err := m.Flush(); err != nil {
				m.log.Warn("write usage", "error", err)
			}
		}
	}
}

// Close writes what is pending and stops the Meter. A second call does
// nothing.
func (m *Meter) Close() {
	select {
	case <-m.stop:
		return
	default:
	}
	close(m.stop)
	<-m.done
}

var (
	descRequests = prometheus.NewDesc("capyctl_key_requests_total",
		"Requests by API key, model and outcome code (ok, or the refusal's or failure's code) since the role started.", []string{"key", "model", "code"}, nil)
	descTokens = prometheus.NewDesc("capyctl_key_tokens_total",
		"Tokens the engines reported by API key, model and kind (prompt, completion, cached) since the role started.", []string{"key", "model", "kind"}, nil)
	descSeconds = prometheus.NewDesc("capyctl_key_request_seconds_total",
		"The requests' total time by API key and model since the role started.", []string{"key", "model"}, nil)
)

// Describe implements prometheus.Collector.
func (m *Meter) Describe(ch chan<- *prometheus.Desc) {
	ch <- descRequests
	ch <- descTokens
	ch <- descSeconds
}

// Collect implements prometheus.Collector.
func (m *Meter) Collect(ch chan<- prometheus.Metric) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for k, t := range m.metrics {
		for code, n := range t.byCode {
			ch <- prometheus.MustNewConstMetric(descRequests, prometheus.CounterValue, float64(n), k.key, k.model, code)
		}
		ch <- prometheus.MustNewConstMetric(descTokens, prometheus.CounterValue, float64(t.prompt), k.key, k.model, "prompt")
		ch <- prometheus.MustNewConstMetric(descTokens, prometheus.CounterValue, float64(t.completion), k.key, k.model, "completion")
		ch <- prometheus.MustNewConstMetric(descTokens, prometheus.CounterValue, float64(t.cached), k.key, k.model, "cached")
		ch <- prometheus.MustNewConstMetric(descSeconds, prometheus.CounterValue, t.seconds, k.key, k.model)
	}
}
