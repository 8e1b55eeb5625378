// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package decisions

import "testing"

func ip(v int) *int { return &v }

func TestRequest_Validate(t *testing.T) {
	good := func() Request {
		return Request{Model: "m", State: "s", Questions: []Question{
			{ID: "a", Type: TypeNoul, Text: "?"},
			{ID: "b", Type: TypeChoice, Text: "?", Options: []string{"x", "y"}},
			{ID: "c", Type: TypeScore, Text: "?", Min: ip(1), Max: ip(5)},
		}}
	}
	cases := []struct {
		name   string
		mutate func(r *Request)
		ok     bool
	}{
		{"valid", func(*Request) {}, true},
		{"no model", func(r *Request) { r.Model = "" }, false},
		{"no questions", func(r *Request) { r.Questions = nil }, false},
		{"repeated id", func(r *Request) { r.Questions[1].ID = "a" }, false},
		{"unknown type", func(r *Request) { r.Questions[0].Type = "maybe" }, false},
		{"one option", func(r *Request) { r.Questions[1].Options = []string{"x"} }, false},
		{"duplicate options", func(r *Request) { r.Questions[1].Options = []string{"x", "x"} }, false},
		{"score without bounds", func(r *Request) { r.Questions[2].Max = nil }, false},
		{"score too wide", func(r *Request) { r.Questions[2].Max = ip(500) }, false},
		{"noul with options", func(r *Request) { r.Questions[0].Options = []string{"x", "y"} }, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := good()
			c.mutate(&r)
			if err := r.Validate(); (err == nil) != c.ok {
				t.Fatalf("Validate() = %v, want ok=%v", err, c.ok)
			}
		})
	}
}

func TestCheck(t *testing.T) {
	req := ReadinessRequest("m")
	cases := []struct {
		name  string
		probs map[string]float64
		ok    bool
	}{
		{"complete", map[string]float64{"yes": 0.9, "no": 0.05, "unknown": 0.05}, true},
		{"missing label", map[string]float64{"yes": 0.95, "no": 0.05}, false},
		{"extra label", map[string]float64{"yes": 0.9, "no": 0.05, "unknown": 0.05, "maybe": 0}, false},
		{"does not sum to one", map[string]float64{"yes": 0.5, "no": 0.1, "unknown": 0.1}, false},
		{"negative", map[string]float64{"yes": 1.2, "no": -0.2, "unknown": 0}, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			resp := &Response{Answers: []Answer{{ID: "ready", Type: TypeNoul, Probabilities: c.probs}}}
			if err := Check(req, resp); (err == nil) != c.ok {
				t.Fatalf("Check() = %v, want ok=%v", err, c.ok)
			}
		})
	}
}

func TestExpected(t *testing.T) {
	q := Question{ID: "s", Type: TypeScore, Text: "?", Min: ip(1), Max: ip(3)}
	got := Expected(q, map[string]float64{"1": 0.25, "2": 0.5, "3": 0.25})
	if got != 2 {
		t.Fatalf("Expected = %v, want 2", got)
	}
}
