// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package usage

import (
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/capyctl/capyctl/core/store"
	"github.com/capyctl/capyctl/core/structs"
)

type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) Set(t time.Time) {
	c.mu.Lock()
	c.t = t
	c.mu.Unlock()
}

func TestMeter_RecordQueryRestart(t *testing.T) {
	path := filepath.Join(t.TempDir(), "capyctl.db")
	st, err := store.Open(path, store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	clk := &clock{t: time.Date(2026, 5, 31, 23, 10, 0, 0, time.UTC)}
	m, err := Open(st, Options{Now: clk.Now, Interval: time.Hour, Retention: 48 * time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	ok := structs.RequestUsage{Model: "demo", UsageKnown: true, PromptTokens: 5, CompletionTokens: 16, CachedTokens: 2, Duration: 90 * time.Millisecond}
	m.Record("bob", ok)
	m.Record("bob", ok)
	m.Record("bob", structs.RequestUsage{Code: "rate_limited"})
	m.Record("alice", structs.RequestUsage{Model: "demo", Code: "engine_error", Duration: time.Second})
	// Not written yet, read all the same.
	rows, err := m.Query(store.UsageFilter{Key: "bob"})
	if err != nil || len(rows) != 2 {
		t.Fatalf("pending rows = %+v, %v", rows, err)
	}
	demo := rows[1]
	if demo.Model != "demo" || demo.Requests != 2 || demo.PromptTokens != 10 || demo.CompletionTokens != 32 || demo.CachedTokens != 4 || demo.RequestMs != 180 {
		t.Fatalf("bob's demo row = %+v", demo)
	}
	if rows[0].Model != "" || rows[0].Errors["rate_limited"] != 1 {
		t.Fatalf("bob's refused row = %+v", rows[0])
	}
	if got := m.MonthTokens("bob", clk.Now()); got != 42 {
		t.Fatalf("month tokens = %d, want 42", got)
	}
	if rows, _ := m.Query(store.UsageFilter{Since: clk.Now().Add(time.Hour)}); len(rows) != 0 {
		t.Fatalf("rows of a later hour: %+v", rows)
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(m)
	series := gather(t, reg)
	for name, want := range map[string]float64{
		`capyctl_key_tokens_total{key="bob",kind="prompt",model="demo"}`:           10,
		`capyctl_key_tokens_total{key="bob",kind="completion",model="demo"}`:       32,
		`capyctl_key_tokens_total{key="bob",kind="cached",model="demo"}`:           4,
		`capyctl_key_requests_total{code="ok",key="bob",model="demo"}`:             2,
		`capyctl_key_requests_total{code="rate_limited",key="bob",model=""}`:       1,
		`capyctl_key_requests_total{code="engine_error",key="alice",model="demo"}`: 1,
		`capyctl_key_request_seconds_total{key="alice",model="demo"}`:              1,
	} {
		if got, ok := series[name]; !ok || got != want {
			t.Errorf("%s = %v (%v), want %v", name, got, ok, want)
		}
	}
	// A restart: Close writes, a new Meter reads the month back.
	m.Close()
	m2, err := Open(st, Options{Now: clk.Now, Interval: time.Hour, Retention: 48 * time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	if got := m2.MonthTokens("bob", clk.Now()); got != 42 {
		t.Fatalf("month tokens after a restart = %d, want 42", got)
	}
	rows, _ = m2.Query(store.UsageFilter{})
	if len(rows) != 3 {
		t.Fatalf("rows after a restart = %+v", rows)
	}
	// The next month starts every budget again.
	clk.Set(time.Date(2026, 6, 1, 0, 5, 0, 0, time.UTC))
	if got := m2.MonthTokens("bob", clk.Now()); got != 0 {
		t.Fatalf("month tokens in June = %d", got)
	}
	m2.Record("bob", ok)
	if got := m2.MonthTokens("bob", clk.Now()); got != 21 {
		t.Fatalf("month tokens in June = %d, want 21", got)
	}
	// Past the retention, rows go at the next write.
	clk.Set(time.Date(2026, 6, 2, 23, 30, 0, 0, time.UTC))
	if err := m2.Flush(); err != nil {
		t.Fatal(err)
	}
	rows, _ = m2.Query(store.UsageFilter{})
	if len(rows) != 1 || !rows[0].Hour.Equal(time.Date(2026, 6, 1, 0, 0, 0, 0, time.UTC)) {
		t.Fatalf("rows past the retention = %+v", rows)
	}
	m2.Close()
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
}

// gather reads every series as "name{labels}" -> value, labels sorted.
func gather(t *testing.T, reg *prometheus.Registry) map[string]float64 {
	t.Helper()
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, f := range fams {
		for _, m := range f.GetMetric() {
			var labels []string
			for _, l := range m.GetLabel() {
				labels = append(labels, l.GetName()+`="`+l.GetValue()+`"`)
			}
			out[f.GetName()+"{"+strings.Join(labels, ",")+"}"] = m.GetCounter().GetValue()
		}
	}
	return out
}
