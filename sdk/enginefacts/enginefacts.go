// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

// Package enginefacts is one data table per first-party engine family:
// the versions CapyCTL supports, the park (sleep/wake) and abort APIs, the
// park levels, the metric names of the idle signal, and the routes the
// engine answers without its key, each with its source. The drivers read
// these tables and the engine pages render them. The testkit's fake
// engines keep tables of their own (plugins-testkit/fakeengine/facts.go)
// and never read these, so that a wrong fact here fails a driver's test
// against its fake (and TestFacts_DriversAgreeWithTheFakes names the
// disagreement). It imports nothing of CapyCTL.
package enginefacts

import (
	"fmt"
	"strings"
)

// Fact is one value (a route, an API call, a metric name) and where it
// comes from.
type Fact struct {
	// Key names an API fact for the code that calls it ("sleep"); empty
	// on the others.
	Key string
	// Value is the fact itself: "/health", "POST /sleep?level=1",
	// "vllm:num_requests_running".
	Value string
	// Since and Until bound the releases that have it ("" when every
	// supported release does).
	Since, Until string
	// Note says more, in a few words.
	Note string
	// Source is the engine's file (or the reference section) that shows it.
	Source string
}

// Metrics are the Prometheus names a driver reads for the idle signal.
type Metrics struct {
	// Running and Waiting are the request gauges.
	Running, Waiting Fact
	// KVUsage are the KV usage gauges (0..1); the first found wins.
	KVUsage []Fact
	// Figures are further samples reported by name.
	Figures []Fact
}

// Engine is one engine family's table.
type Engine struct {
	// Family is the driver's family name.
	Family string
	// Name is the engine's name on the pages.
	Name string
	// Verified are the releases CapyCTL is verified with; empty when the
	// family has no release list (llama.cpp's builds).
	Verified []string
	// Versions says in words which releases the table covers.
	Versions string
	// Park are the calls that park and wake the engine (none: it is
	// stopped instead).
	Park []Fact
	// Levels are the park levels and what each keeps.
	Levels []Fact
	// Abort are the ways a request is aborted.
	Abort []Fact
	// Metrics are the idle signal's names.
	Metrics Metrics
	// GuardedPrefixes are the path prefixes the engine checks its key on
	// when it guards by prefix (vLLM); every other path is open.
	GuardedPrefixes []Fact
	// OpenPrefixes are the path prefixes the engine lets through without
	// its key when it exempts by prefix (SGLang).
	OpenPrefixes []Fact
	// OpenRoutes are the routes that answer any caller without the key,
	// as the exposure report lists them.
	OpenRoutes []Fact
	// ParkOpenRoutes are further routes open without the key while the
	// engine can park (vLLM's development mode).
	ParkOpenRoutes []Fact
	// Env are variables the driver sets because the engine (or a library
	// it loads) needs them, and when.
	Env []Fact
	// APIRoutes are the engine's routes for the APIs beyond chat that
	// CapyCTL answers (Anthropic's Messages and its token count, OpenAI's
	// Responses) and its tokenize routes. A fact with a Key ("messages",
	// "count_tokens", "responses") is one the driver names in the
	// endpoint, so that the router sends those requests to the engine
	// (native); one without is recorded with the reason CapyCTL does not
	// use it (the router translates to chat, or refuses count_tokens).
	APIRoutes []Fact
}

// API route keys of APIRoutes (the endpoint fields they fill).
const (
	RouteMessages    = "messages"
	RouteCountTokens = "count_tokens"
	RouteResponses   = "responses"
)

// Route returns the path of the API route with the key, "" when the
// engine's table names none (CapyCTL does not use the engine's own).
func (e *Engine) Route(key string) string {
	for _, f := range e.APIRoutes {
		if f.Key == key {
			return f.Value
		}
	}
	return ""
}

// Values returns the facts' values.
func Values(fs []Fact) []string {
	out := make([]string, len(fs))
	for i, f := range fs {
		out[i] = f.Value
	}
	return out
}

// MetricNames returns every metric name of the table: Running, Waiting,
// the KV usage names and the figures.
func (m Metrics) Names() []string {
	out := []string{m.Running.Value, m.Waiting.Value}
	out = append(out, Values(m.KVUsage)...)
	return append(out, Values(m.Figures)...)
}

// Path returns the value of the park or abort fact with the key; it
// panics when there is none (a driver asking for a path its table lacks
// is a programming error, caught when the driver package loads).
func (e *Engine) Path(key string) string {
	for _, f := range append(append([]Fact{}, e.Park...), e.Abort...) {
		if f.Key == key {
			return f.Value
		}
	}
	panic("enginefacts: " + e.Family + " has no fact " + key)
}

// Engines are the tables, in page order.
func Engines() []*Engine { return []*Engine{VLLM, SGLang, LlamaCpp, TensorFold} }

// Lookup returns a family's table, or nil.
func Lookup(family string) *Engine {
	for _, e := range Engines() {
		if e.Family == family {
			return e
		}
	}
	return nil
}

// Markdown renders the table as the engine pages show it.
func (e *Engine) Markdown() string {
	var b strings.Builder
	versions := e.Versions
	if len(e.Verified) > 0 {
		versions += " (verified: " + strings.Join(e.Verified, ", ") + ")"
	}
	fmt.Fprintf(&b, "Facts for %s %s, from `sdk/enginefacts`, which the driver reads.\n\n", e.Name, versions)
	b.WriteString("| fact | value | releases | note | source |\n|---|---|---|---|---|\n")
	rows := func(what string, fs []Fact) {
		for _, f := range fs {
			rel := "all"
			switch {
			case f.Since != "" && f.Until != "":
				rel = f.Since + " to " + f.Until
			case f.Since != "":
				rel = f.Since + " on"
			case f.Until != "":
				rel = "up to " + f.Until
			}
			fmt.Fprintf(&b, "| %s | `%s` | %s | %s | %s |\n", what, cell(f.Value), rel, cell(f.Note), cell(f.Source))
		}
	}
	rows("park", e.Park)
	rows("park level", e.Levels)
	rows("abort", e.Abort)
	rows("running gauge", []Fact{e.Metrics.Running})
	rows("waiting gauge", []Fact{e.Metrics.Waiting})
	rows("KV usage", e.Metrics.KVUsage)
	rows("figure", e.Metrics.Figures)
	rows("key-guarded prefix", e.GuardedPrefixes)
	rows("key-exempt prefix", e.OpenPrefixes)
	rows("open without the key", e.OpenRoutes)
	rows("open without the key while it can park", e.ParkOpenRoutes)
	rows("environment", e.Env)
	for _, f := range e.APIRoutes {
		what := "API route, not used"
		if f.Key != "" {
			what = "API route, served natively"
		}
		rows(what, []Fact{f})
	}
	return b.String()
}

// cell escapes text for a Markdown table cell.
func cell(s string) string {
	s = strings.ReplaceAll(s, "|", `\|`)
	return strings.ReplaceAll(s, "\n", " ")
}
