// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

// Package decisions is the wire format of decision requests (POST
// /v1/systemone): typed questions about a state, answered with a complete
// set of probabilities per question and the engine's usage. CapyCTL's
// router validates requests and answers with it; engines that serve
// decision models (llama.cpp 0.7.0+, SGLang 0.5.22+, custom engines with
// api = "decisions") answer the same format on their own /v1/systemone.
//
// Question types:
//
//	noul    a yes-or-no question that the state may not answer: labels
//	        "yes", "no", "unknown"
//	choice  one of 2-32 options: the labels are the options
//	score   an integer in [min, max] (at most 101 values): the labels are
//	        the integers written in decimal; the answer also carries
//	        "expected", the probability-weighted mean
package decisions

import (
	"encoding/json"
	"fmt"
	"math"
	"strconv"
)

// Path is the decision endpoint, on CapyCTL and on engines.
const Path = "/v1/systemone"

// Object is the answer's "object" field.
const Object = "systemone.decision"

// Question types.
const (
	TypeNoul   = "noul"
	TypeChoice = "choice"
	TypeScore  = "score"
)

// Bounds of a request.
const (
	MaxQuestions  = 64
	MaxOptions    = 32
	MaxScoreRange = 100
	MaxStateBytes = 1 << 20
	// SumTolerance is how far a probability set may sum from 1.
	SumTolerance = 1e-3
)

// Request is a decision request.
type Request struct {
	Model string `json:"model"`
	// State is the situation the questions are about.
	State     string     `json:"state"`
	Questions []Question `json:"questions"`
	// Rid is set by CapyCTL for engines that take a request ID in the body.
	Rid string `json:"rid,omitempty"`
}

// Question is one typed question.
type Question struct {
	ID      string   `json:"id"`
	Type    string   `json:"type"`
	Text    string   `json:"text"`
	Options []string `json:"options,omitempty"`
	Min     *int     `json:"min,omitempty"`
	Max     *int     `json:"max,omitempty"`
}

// Response is a decision answer.
type Response struct {
	ID      string   `json:"id"`
	Object  string   `json:"object"`
	Created int64    `json:"created"`
	Model   string   `json:"model"`
	Answers []Answer `json:"answers"`
	Usage   Usage    `json:"usage"`
	// Timings are the engine's own figures, when it reports them
	// (prompt_ms and others).
	Timings map[string]float64 `json:"timings,omitempty"`
}

// Answer answers one question.
type Answer struct {
	ID   string `json:"id"`
	Type string `json:"type"`
	// Probabilities has one entry per label of the question.
	Probabilities map[string]float64 `json:"probabilities"`
	// Expected is the probability-weighted mean of a score.
	Expected *float64 `json:"expected,omitempty"`
}

// Usage counts tokens.
type Usage struct {
	PromptTokens     int64 `json:"prompt_tokens"`
	CompletionTokens int64 `json:"completion_tokens"`
	TotalTokens      int64 `json:"total_tokens"`
}

// Labels returns the labels a question's answer must cover, in order.
func (q Question) Labels() []string {
	switch q.Type {
	case TypeNoul:
		return []string{"yes", "no", "unknown"}
	case TypeChoice:
		return q.Options
	case TypeScore:
		if q.Min == nil || q.Max == nil {
			return nil
		}
		out := make([]string, 0, *q.Max-*q.Min+1)
		for v := *q.Min; v <= *q.Max; v++ {
			out = append(out, strconv.Itoa(v))
		}
		return out
	}
	return nil
}

// Validate checks a request's shape; the error names the field.
func (r *Request) Validate() error {
	if r.Model == "" {
		return fmt.Errorf("model is required")
	}
	if len(r.State) > MaxStateBytes {
		return fmt.Errorf("state is longer than %d bytes", MaxStateBytes)
	}
	if len(r.Questions) == 0 || len(r.Questions) > MaxQuestions {
		return fmt.Errorf("questions must hold 1 to %d questions", MaxQuestions)
	}
	seen := map[string]bool{}
	for i, q := range r.Questions {
		where := fmt.Sprintf("questions[%d]", i)
		if q.ID == "" {
			return fmt.Errorf("%s.id is required", where)
		}
		if seen[q.ID] {
			return fmt.Errorf("%s.id %q is repeated", where, q.ID)
		}
		seen[q.ID] = true
		if q.Text == "" {
			return fmt.Errorf("%s.text is required", where)
		}
		switch q.Type {
		case TypeNoul:
			if len(q.Options) > 0 || q.Min != nil || q.Max != nil {
				return fmt.Errorf("%s: a noul question takes no options, min or max", where)
			}
		case TypeChoice:
			if len(q.Options) < 2 || len(q.Options) > MaxOptions {
				return fmt.Errorf("%s.options must hold 2 to %d options", where, MaxOptions)
			}
			opts := map[string]bool{}
			for _, o := range q.Options {
				if o == "" || opts[o] {
					return fmt.Errorf("%s.options must be distinct and not empty", where)
				}
				opts[o] = true
			}
		case TypeScore:
			if q.Min == nil || q.Max == nil || *q.Min >= *q.Max || *q.Max-*q.Min > MaxScoreRange {
				return fmt.Errorf("%s: a score needs integers min < max, at most %d apart", where, MaxScoreRange)
			}
		default:
			return fmt.Errorf("%s.type %q is not noul, choice or score", where, q.Type)
		}
	}
	return nil
}

// Check verifies that a response answers every question of a request with
// a complete set of probabilities summing to 1.
func Check(req *Request, resp *Response) error {
	byID := map[string]Answer{}
	for _, a := range resp.Answers {
		byID[a.ID] = a
	}
	for _, q := range req.Questions {
		a, ok := byID[q.ID]
		if !ok {
			return fmt.Errorf("question %q has no answer", q.ID)
		}
		sum := 0.0
		for _, l := range q.Labels() {
			p, ok := a.Probabilities[l]
			if !ok {
				return fmt.Errorf("answer %q lacks the probability of %q", q.ID, l)
			}
			if p < 0 || p > 1 || math.IsNaN(p) {
				return fmt.Errorf("answer %q: probability of %q is %v", q.ID, l, p)
			}
			sum += p
		}
		if len(a.Probabilities) != len(q.Labels()) {
			return fmt.Errorf("answer %q has labels the question does not have", q.ID)
		}
		if math.Abs(sum-1) > SumTolerance {
			return fmt.Errorf("answer %q: probabilities sum to %.4f, not 1", q.ID, sum)
		}
	}
	return nil
}

// Expected returns the probability-weighted mean of a score answer.
func Expected(q Question, probs map[string]float64) float64 {
	e := 0.0
	for _, l := range q.Labels() {
		v, _ := strconv.Atoi(l)
		e += float64(v) * probs[l]
	}
	return e
}

// ReadinessRequest is the fixed decision that proves a decision model
// ready: it must come back with a complete set of probabilities.
func ReadinessRequest(model string) *Request {
	return &Request{
		Model: model,
		State: "The sky over the harbour is clear and blue.",
		Questions: []Question{
			{ID: "ready", Type: TypeNoul, Text: "Is the sky described as blue?"},
		},
	}
}

// Peek reads the model of a decision request without validating the rest
// (the router decides api_mismatch from the model name alone).
func Peek(body []byte) (string, error) {
	var head struct {
		Model string `json:"model"`
	}
	if err := json.Unmarshal(body, &head); err != nil {
		return "", err
	}
	return head.Model, nil
}
