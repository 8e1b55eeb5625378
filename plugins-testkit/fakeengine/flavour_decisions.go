// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package fakeengine

import (
	"context"
	"encoding/json"
	"fmt"
	"hash/fnv"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/capyctl/capyctl/sdk/decisions"
)

// Decisions is a decision engine, for custom engines with api =
// "decisions" (the wire format is sdk/decisions):
//
//	GET  /health         503 {"status":"loading"} while loading, then 200 {"status":"ok"}
//	GET  /v1/models      the served model, owned_by "fake-decisions"
//	POST /v1/systemone   a decision: every question answered with a complete,
//	                     deterministic set of probabilities, usage and timings
//	GET  /metrics        fake:requests_running, fake:requests_waiting, counters
//	GET  /fake/stats     Engine.StatsHandler
//
// It serves no chat route. A decision takes a slot like a chat request and
// "generates" one token per question at the token rate, so the knobs
// (token-rate, stall-after-tokens, max-running, fail-requests,
// crash-after) and cancellation on hang-up or Abort (by the body's "rid",
// else X-Request-Id) work as they do for chat.
type Decisions struct{ OpenAI }

var _ Flavour = Decisions{}

func init() {
	RegisterFlavour("decisions", func() Flavour { return Decisions{} })
}

// Name is "decisions".
func (Decisions) Name() string { return "decisions" }

// Routes lists the decision engine's routes.
func (Decisions) Routes(e *Engine) []Route {
	return []Route{
		{Pattern: "GET /health", Handler: OpenAIHealthHandler(e)},
		{Pattern: "GET /v1/models", Handler: OpenAIModelsHandler(e, "fake-decisions")},
		{Pattern: "POST " + decisions.Path, Handler: DecisionHandler(e)},
		{Pattern: "GET /metrics", Handler: MetricsHandler(e, OpenAIMetrics)},
		{Pattern: "GET /fake/stats", Handler: e.StatsHandler()},
	}
}

// DecisionHandler answers POST /v1/systemone.
func DecisionHandler(e *Engine) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f := e.Flavour()
		if e.Phase() == PhaseLoading {
			f.WriteError(w, KindLoading, "model is loading")
			return
		}
		body, err := io.ReadAll(io.LimitReader(r.Body, maxBodyBytes+1))
		if err != nil {
			return
		}
		var req decisions.Request
		if err := json.Unmarshal(body, &req); err != nil {
			f.WriteError(w, KindInvalidJSON, "request body is not a valid decision request: "+err.Error())
			return
		}
		if err := req.Validate(); err != nil {
			f.WriteError(w, KindInvalidRequest, err.Error())
			return
		}
		if req.Model != e.ServedName() {
			f.WriteError(w, KindModelNotFound, fmt.Sprintf("The model `%s` does not exist.", req.Model))
			return
		}
		id := req.Rid
		if id == "" {
			id = r.Header.Get("X-Request-Id")
		}
		if id == "" {
			id = NewRequestID()
		}
		e.total.Add(1)
		defer e.finishRequest(r)
		prompt := len(strings.Fields(req.State))
		for _, q := range req.Questions {
			prompt += len(strings.Fields(q.Text)) + len(q.Options)
		}
		e.promptTokens.Add(uint64(prompt))
		if e.takeFailure() {
			e.failed.Add(1)
			f.WriteError(w, KindEngineFailure, "fake engine failure")
			return
		}
		ctx, cancel := context.WithCancelCause(r.Context())
		defer cancel(nil)
		stopOnEnd := context.AfterFunc(e.life, func() { cancel(errShutdown) })
		defer stopOnEnd()
		fl := &inflight{id: id, cancel: cancel}
		e.inflightMu.Lock()
		e.inflight[fl] = struct{}{}
		e.inflightMu.Unlock()
		defer func() {
			e.inflightMu.Lock()
			delete(e.inflight, fl)
			e.inflightMu.Unlock()
		}()
		started := time.Now()
		if err := e.slots.acquire(ctx); err != nil {
			e.noteCancel(time.Now())
			return
		}
		g := &generation{e: e, ctx: ctx}
		defer g.release()
		toks := make([]string, len(req.Questions))
		ok, at := g.run(toks, func(string) bool { return true })
		if !ok {
			g.cancelled(at)
			if g.aborted() {
				f.WriteError(w, KindEngineFailure, "request aborted")
			}
			return
		}
		g.release()
		e.completed.Add(1)
		resp := Decide(e.ServedName(), e.Config().Seed, &req)
		resp.ID = "dec-" + id
		resp.Created = time.Now().Unix()
		resp.Usage.PromptTokens = int64(prompt)
		resp.Usage.TotalTokens = resp.Usage.PromptTokens + resp.Usage.CompletionTokens
		resp.Timings = map[string]float64{"prompt_ms": float64(time.Since(started).Microseconds()) / 1000}
		WriteJSON(w, http.StatusOK, resp)
	})
}

// Decide answers a decision request deterministically: each label's
// probability comes from a hash of the model, the seed, the state, the
// question and the label, normalised to sum to 1.
func Decide(model string, seed uint64, req *decisions.Request) *decisions.Response {
	resp := &decisions.Response{Object: decisions.Object, Model: req.Model}
	for _, q := range req.Questions {
		labels := q.Labels()
		probs := make(map[string]float64, len(labels))
		sum := 0.0
		for _, l := range labels {
			h := fnv.New64a()
			fmt.Fprintf(h, "%s\x00%d\x00%s\x00%s\x00%s\x00%s", model, seed, req.State, q.ID, q.Text, l)
			v := float64(splitmix64(h.Sum64())%1000+1) / 1000
			probs[l] = v
			sum += v
		}
		for l := range probs {
			probs[l] /= sum
		}
		a := decisions.Answer{ID: q.ID, Type: q.Type, Probabilities: probs}
		if q.Type == decisions.TypeScore {
			x := decisions.Expected(q, probs)
			a.Expected = &x
		}
		resp.Answers = append(resp.Answers, a)
	}
	resp.Usage.CompletionTokens = int64(len(req.Questions))
	resp.Usage.TotalTokens = resp.Usage.PromptTokens + resp.Usage.CompletionTokens
	return resp
}
