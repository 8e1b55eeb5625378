// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package engineapi

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"
)

const (
	// DefaultMaxBody bounds a response body the helpers read into memory.
	DefaultMaxBody = 16 << 20
	// DefaultAttemptTimeout bounds one request of WaitHTTP: an engine that
	// accepts connections but does not answer yet is asked again.
	DefaultAttemptTimeout = 10 * time.Second

	// Poll's schedule: an engine that needs 30 ms is seen within 4 ms of
	// it, one that needs a minute within a quarter second; a wait that
	// finds the port closed costs tens of microseconds.
	pollFirst  = time.Millisecond
	pollMax    = 250 * time.Millisecond
	pollGrowth = 1.25
)

// EngineClient talks to one engine on its loopback port with pooled
// keep-alive connections, setting the engine's auth header on every
// request. It is safe for concurrent use.
type EngineClient struct {
	// MaxBody bounds the bodies GetJSON, PostJSON and WaitHTTP read
	// (DefaultMaxBody when 0).
	MaxBody int64
	// AttemptTimeout bounds one request of WaitHTTP (DefaultAttemptTimeout
	// when 0).
	AttemptTimeout time.Duration

	baseURL    string
	authHeader string
	authValue  string
	http       *http.Client
}

// NewEngineClient returns a client for the engine at baseURL
// ("http://127.0.0.1:8000", UnixBaseURL of its socket, or NetnsBaseURL of
// an engine in a network namespace of its own). authHeader and
// authValue ("Authorization", "Bearer <key>") are set on every request; an
// empty authHeader sets none.
func NewEngineClient(baseURL, authHeader, authValue string) *EngineClient {
	dialer := &net.Dialer{
		Timeout:   5 * time.Second,
		KeepAlive: 30 * time.Second,
	}
	dial := dialer.DialContext
	if sock, ok := UnixSocket(baseURL); ok {
		// Every connection goes to the socket, whatever the URL's host.
		baseURL = "http://" + UnixHost
		dial = func(ctx context.Context, _, _ string) (net.Conn, error) {
			return dialer.DialContext(ctx, "unix", sock)
		}
	} else if ns, ok := NetnsFromURL(baseURL); ok {
		// Every connection is made in the engine's network namespace.
		baseURL = "http://127.0.0.1:" + strconv.Itoa(ns.Port)
		dial = func(ctx context.Context, _, _ string) (net.Conn, error) {
			ctx, cancel := context.WithTimeout(ctx, dialer.Timeout)
			defer cancel()
			return DialNetns(ctx, ns)
		}
	}
	tr := &http.Transport{
		// IMPORTANT: never a proxy: the engine is on loopback, and an
		// operator's HTTP_PROXY must not see the engine key.
		Proxy:               nil,
		DialContext:         dial,
		MaxIdleConns:        64,
		MaxIdleConnsPerHost: 64,
		IdleConnTimeout:     90 * time.Second,
		// Compression only adds latency to streamed chunks on loopback.
		DisableCompression: true,
		ForceAttemptHTTP2:  false,
	}
	return &EngineClient{
		baseURL:    strings.TrimRight(baseURL, "/"),
		authHeader: authHeader,
		authValue:  authValue,
		// No client timeout: every call is bounded by its context, and a
		// streamed answer may legitimately last minutes.
		http: &http.Client{Transport: tr},
	}
}

// BaseURL returns the base of the client's request URLs (the engine's base
// URL, or "http://localhost" for an engine on a Unix socket).
func (c *EngineClient) BaseURL() string { return c.baseURL }

// HTTPClient returns the pooled client, for callers that stream.
func (c *EngineClient) HTTPClient() *http.Client { return c.http }

// CloseIdleConnections closes the pool's idle connections (when the engine
// is stopped).
func (c *EngineClient) CloseIdleConnections() { c.http.CloseIdleConnections() }

// NewRequest builds a request for path (which may carry a query) with the
// auth header set.
func (c *EngineClient) NewRequest(ctx context.Context, method, path string, body io.Reader) (*http.Request, error) {
	if !strings.HasPrefix(path, "/") {
		path = "/" + path
	}
	req, err := http.NewRequestWithContext(ctx, method, c.baseURL+path, body)
	if err != nil {
		return nil, fmt.Errorf("engine request %s %s: %w", method, path, err)
	}
	if c.authHeader != "" {
		req.Header.Set(c.authHeader, c.authValue)
	}
	return req, nil
}

// Do sends req with the pooled client. The caller closes the body.
func (c *EngineClient) Do(req *http.Request) (*http.Response, error) {
	resp, err := c.http.Do(req)
	if err != nil {
		return nil, fmt.Errorf("engine %s %s: %w", req.Method, req.URL.Path, err)
	}
	return resp, nil
}

// Get sends GET path. The caller closes the body.
func (c *EngineClient) Get(ctx context.Context, path string) (*http.Response, error) {
	req, err := c.NewRequest(ctx, http.MethodGet, path, nil)
	if err != nil {
		return nil, err
	}
	return c.Do(req)
}

// GetJSON sends GET path and decodes a 2xx JSON answer into out (nil to
// discard it). Any other status is an *HTTPError carrying the engine's
// message; the status is returned whenever an answer arrived.
func (c *EngineClient) GetJSON(ctx context.Context, path string, out any) (int, error) {
	return c.doJSON(ctx, http.MethodGet, path, nil, out)
}

// PostJSON sends body as JSON (a []byte or json.RawMessage is sent as is;
// nil sends no body) to path and decodes a 2xx JSON answer into out (nil to
// discard it). Any other status is an *HTTPError carrying the engine's
// message.
func (c *EngineClient) PostJSON(ctx context.Context, path string, body, out any) (int, error) {
	return c.doJSON(ctx, http.MethodPost, path, body, out)
}

func (c *EngineClient) doJSON(ctx context.Context, method, path string, body, out any) (int, error) {
	var rd io.Reader
	switch b := body.(type) {
	case nil:
	case []byte:
		rd = bytes.NewReader(b)
	case json.RawMessage:
		rd = bytes.NewReader(b)
	default:
		enc, err := json.Marshal(body)
		if err != nil {
			return 0, fmt.Errorf("engine %s %s: encode body: %w", method, path, err)
		}
		rd = bytes.NewReader(enc)
	}
	req, err := c.NewRequest(ctx, method, path, rd)
	if err != nil {
		return 0, err
	}
	if rd != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	req.Header.Set("Accept", "application/json")
	resp, err := c.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	data, err := c.readBody(resp)
	if err != nil {
		return resp.StatusCode, fmt.Errorf("engine %s %s: %w", method, path, err)
	}
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return resp.StatusCode, &HTTPError{Method: method, Path: path, Status: resp.StatusCode, Message: EngineMessage(data)}
	}
	if out != nil && len(bytes.TrimSpace(data)) > 0 {
		if err := json.Unmarshal(data, out); err != nil {
			return resp.StatusCode, fmt.Errorf("engine %s %s: decode answer: %w", method, path, err)
		}
	}
	return resp.StatusCode, nil
}

// readBody reads a body up to MaxBody.
func (c *EngineClient) readBody(resp *http.Response) ([]byte, error) {
	limit := c.MaxBody
	if limit <= 0 {
		limit = DefaultMaxBody
	}
	data, err := io.ReadAll(io.LimitReader(resp.Body, limit+1))
	if err != nil {
		return nil, fmt.Errorf("read answer: %w", err)
	}
	if int64(len(data)) > limit {
		return nil, fmt.Errorf("answer exceeds %d bytes", limit)
	}
	return data, nil
}

// WaitHTTP polls GET path until want(status, body) is true, ctx ends, or
// ctx is cancelled (by a caller that saw the engine exit, for instance).
// It asks at once, then after 5 ms, waiting half as long again each time
// up to 250 ms. Failed connections (the engine not listening yet) are
// retried. On ctx's end the error says what was seen last.
func (c *EngineClient) WaitHTTP(ctx context.Context, path string, want func(status int, body []byte) bool) error {
	attempt := c.AttemptTimeout
	if attempt <= 0 {
		attempt = DefaultAttemptTimeout
	}
	last := "no answer yet"
	err := Poll(ctx, func(ctx context.Context) (bool, error) {
		actx, cancel := context.WithTimeout(ctx, attempt)
		defer cancel()
		resp, err := c.Get(actx, path)
		if err != nil {
			// An attempt cut by the end of the wait says nothing about the
			// engine: the error keeps what the attempts before it saw.
			if ctx.Err() == nil || last == "no answer yet" {
				last = err.Error()
			}
			return false, nil
		}
		defer resp.Body.Close()
		body, err := c.readBody(resp)
		if err != nil {
			last = fmt.Sprintf("status %d, %v", resp.StatusCode, err)
			return false, nil
		}
		if want(resp.StatusCode, body) {
			return true, nil
		}
		last = fmt.Sprintf("status %d", resp.StatusCode)
		if msg := EngineMessage(body); msg != "" {
			last += ": " + msg
		}
		return false, nil
	})
	if err != nil {
		return fmt.Errorf("wait for %s: %w (last: %s)", path, err, last)
	}
	return nil
}

// pollFlat is how long Poll keeps its first, finest interval: most
// engines that start fast start within it, and are seen within a
// millisecond.
const pollFlat = 200 * time.Millisecond

// Poll calls cond until it reports done, returns an error, or ctx ends. It
// calls at once, then every millisecond for pollFlat, then waiting a
// quarter longer each time up to 250 ms (NextInterval), so that a
// condition that holds soon is seen soon. It returns cond's error, or
// ctx's.
func Poll(ctx context.Context, cond func(ctx context.Context) (done bool, err error)) error {
	interval := pollFirst
	start := time.Now()
	for {
		done, err := cond(ctx)
		if err != nil {
			return err
		}
		if done {
			return nil
		}
		t := time.NewTimer(interval)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
		if time.Since(start) >= pollFlat {
			interval = NextInterval(interval)
		}
	}
}

// NextInterval is Poll's schedule: the wait after one of interval.
func NextInterval(interval time.Duration) time.Duration {
	if interval <= 0 {
		return pollFirst
	}
	return min(time.Duration(float64(interval)*pollGrowth), pollMax)
}

// HTTPError is a non-2xx answer from the engine.
type HTTPError struct {
	Method string
	Path   string
	Status int
	// Message is the engine's error message, from its JSON error envelope
	// when it sent one, else the start of its body.
	Message string
}

// Error implements error.
func (e *HTTPError) Error() string {
	msg := fmt.Sprintf("engine answered %d to %s %s", e.Status, e.Method, e.Path)
	if e.Message != "" {
		msg += ": " + e.Message
	}
	return msg
}

// StatusOf returns the HTTP status carried by err (an *HTTPError), or 0.
func StatusOf(err error) int {
	var he *HTTPError
	if errors.As(err, &he) {
		return he.Status
	}
	return 0
}

// maxMessage bounds an error message taken from a body.
const maxMessage = 512

// EngineMessage extracts the message from an engine's error body: OpenAI
// and llama.cpp {"error":{"message":...}}, {"error":"..."}, {"message":...},
// FastAPI {"detail":"..."} or {"detail":[{"msg":...}]}, else the trimmed
// start of the body.
func EngineMessage(body []byte) string {
	body = bytes.TrimSpace(body)
	if len(body) == 0 {
		return ""
	}
	var env struct {
		Error   json.RawMessage `json:"error"`
		Message string          `json:"message"`
		Detail  json.RawMessage `json:"detail"`
	}
	if json.Unmarshal(body, &env) == nil {
		if len(env.Error) > 0 {
			var inner struct {
				Message string `json:"message"`
			}
			var s string
			switch {
			case json.Unmarshal(env.Error, &inner) == nil && inner.Message != "":
				return clipMessage(inner.Message)
			case json.Unmarshal(env.Error, &s) == nil && s != "":
				return clipMessage(s)
			}
		}
		if env.Message != "" {
			return clipMessage(env.Message)
		}
		if len(env.Detail) > 0 {
			var s string
			var list []struct {
				Msg string `json:"msg"`
			}
			switch {
			case json.Unmarshal(env.Detail, &s) == nil && s != "":
				return clipMessage(s)
			case json.Unmarshal(env.Detail, &list) == nil && len(list) > 0 && list[0].Msg != "":
				return clipMessage(list[0].Msg)
			}
		}
	}
	return clipMessage(string(body))
}

func clipMessage(s string) string {
	s = strings.TrimSpace(s)
	if len(s) > maxMessage {
		return s[:maxMessage] + "..."
	}
	return s
}
