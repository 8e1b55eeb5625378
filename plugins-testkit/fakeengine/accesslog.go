// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package fakeengine

import (
	"fmt"
	"net/http"
	"strings"
	"sync/atomic"
)

// AccessLogger is a flavour whose engine logs the HTTP requests it
// answers, as the real engines do by default (uvicorn's access log in vLLM
// and SGLang, llama-server's slot and request lines): the fake is never
// quieter than the engine it stands for, so that what CapyCTL spends on an
// engine's log (the shim reads and redacts it) is measured. Lines are
// written each in a write of its own, without the newline here.
type AccessLogger interface {
	// AccessStart is what the engine logs when a request arrives (nil:
	// nothing).
	AccessStart(r *http.Request, task int64) []string
	// AccessEnd is what it logs once the request is answered.
	AccessEnd(r *http.Request, status int, task int64) []string
}

// accessLog wraps h so that every request but the fake's own (/fake/...)
// is logged as al says.
func (e *Engine) accessLog(al AccessLogger, h http.Handler) http.Handler {
	var tasks atomic.Int64
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasPrefix(r.URL.Path, "/fake/") {
			h.ServeHTTP(w, r)
			return
		}
		task := tasks.Add(1) - 1
		for _, l := range al.AccessStart(r, task) {
			e.writeLog(LevelInfo, l)
		}
		sw := &statusWriter{ResponseWriter: w, status: http.StatusOK}
		h.ServeHTTP(sw, r)
		for _, l := range al.AccessEnd(r, sw.status, task) {
			e.writeLog(LevelInfo, l)
		}
	})
}

// statusWriter notes the status an answer was given; Unwrap lets
// http.ResponseController flush and hijack through it.
type statusWriter struct {
	http.ResponseWriter
	status int
	wrote  bool
}

func (s *statusWriter) WriteHeader(code int) {
	if !s.wrote {
		s.status, s.wrote = code, true
	}
	s.ResponseWriter.WriteHeader(code)
}

func (s *statusWriter) Write(p []byte) (int, error) {
	s.wrote = true
	return s.ResponseWriter.Write(p)
}

func (s *statusWriter) Flush() {
	if f, ok := s.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

func (s *statusWriter) Unwrap() http.ResponseWriter { return s.ResponseWriter }

// uvicornAccess is uvicorn's access line (its default format, on in vLLM
// and SGLang unless turned off): `INFO:     127.0.0.1:54321 - "POST
// /v1/chat/completions HTTP/1.1" 200 OK`.
func uvicornAccess(r *http.Request, status int) []string {
	return []string{fmt.Sprintf(`INFO:     %s - "%s %s HTTP/%d.%d" %d %s`,
		r.RemoteAddr, r.Method, r.URL.RequestURI(), r.ProtoMajor, r.ProtoMinor, status, http.StatusText(status))}
}

// AccessStart is nothing: uvicorn logs a request once answered.
func (OpenAI) AccessStart(*http.Request, int64) []string { return nil }

// AccessEnd is uvicorn's access line.
func (OpenAI) AccessEnd(r *http.Request, status int, _ int64) []string {
	return uvicornAccess(r, status)
}

// AccessStart is nothing: uvicorn logs a request once answered.
func (*VLLM) AccessStart(*http.Request, int64) []string { return nil }

// AccessEnd is uvicorn's access line.
func (*VLLM) AccessEnd(r *http.Request, status int, _ int64) []string {
	return uvicornAccess(r, status)
}

// AccessStart is nothing: uvicorn logs a request once answered.
func (*SGLang) AccessStart(*http.Request, int64) []string { return nil }

// AccessEnd is uvicorn's access line.
func (*SGLang) AccessEnd(r *http.Request, status int, _ int64) []string {
	return uvicornAccess(r, status)
}

// llamaGenerates reports whether a llama-server request runs in a slot
// (and is logged by it).
func llamaGenerates(r *http.Request) bool {
	return r.Method == http.MethodPost && (strings.HasSuffix(r.URL.Path, "/completions") || r.URL.Path == "/completion")
}

// AccessStart is what llama-server (b4748) logs when a generation starts
// in a slot, as observed serving stories260K (task IDs advance by the
// answer's tokens and one).
func (l *LlamaCpp) AccessStart(r *http.Request, task int64) []string {
	if !llamaGenerates(r) {
		return nil
	}
	id := task * 65
	return []string{
		"srv  params_from_: Chat format: Content-only",
		fmt.Sprintf("slot launch_slot_: id  0 | task %d | processing task", id),
		fmt.Sprintf("slot update_slots: id  0 | task %d | new prompt, n_ctx_slot = 1024, n_keep = 0, n_prompt_tokens = 46", id),
		fmt.Sprintf("slot update_slots: id  0 | task %d | kv cache rm [0, end)", id),
		fmt.Sprintf("slot update_slots: id  0 | task %d | prompt processing progress, n_past = 46, n_tokens = 46, progress = 1.000000", id),
		fmt.Sprintf("slot update_slots: id  0 | task %d | prompt done, n_past = 46, n_tokens = 46", id),
	}
}

// AccessEnd is what llama-server logs when the slot is released and the
// request answered; every other request gets its request line.
func (l *LlamaCpp) AccessEnd(r *http.Request, status int, task int64) []string {
	done := fmt.Sprintf("srv  log_server_r: request: %s %s %s %d", r.Method, r.URL.Path, strings.Split(r.RemoteAddr, ":")[0], status)
	if !llamaGenerates(r) {
		return []string{done}
	}
	id := task * 65
	return []string{
		fmt.Sprintf("slot      release: id  0 | task %d | stop processing: n_past = 109, truncated = 0", id),
		fmt.Sprintf("slot print_timing: id  0 | task %d | ", id),
		"prompt eval time =       3.15 ms /    46 tokens (    0.07 ms per token, 14603.17 tokens per second)",
		"       eval time =     416.59 ms /    64 tokens (    6.51 ms per token,   153.63 tokens per second)",
		"      total time =     421.61 ms /   110 tokens",
		"srv  update_slots: all slots are idle",
		done,
	}
}
