// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

// Package client is the Go client of CapyCTL's management API. The CLI uses
// it, and so can a controller program: it imports only the API's wire types
// (core/api/wire) and core/structs' pure types.
package client

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/capyctl/capyctl/core/api/wire"
	"github.com/capyctl/capyctl/core/structs"
)

// Client talks to one role's management API.
type Client struct {
	base  string
	token string
	http  *http.Client
}

// New returns a client for a management address ("127.0.0.1:7443" or a URL)
// and admin token.
func New(addr, token string) *Client {
	base := addr
	if !(len(base) > 7 && (base[:7] == "http://" || base[:8] == "https://")) {
		base = "http://" + base
	}
	return &Client{base: base, token: token, http: &http.Client{Transport: &http.Transport{Proxy: nil}}}
}

// Base returns the management base URL.
func (c *Client) Base() string { return c.base }

// Error is a management API error answer.
type Error struct {
	Status int
	Body   wire.ErrorBody
}

// Error implements error.
func (e *Error) Error() string { return e.Body.Message }

// Code returns the error's catalogue code.
func (e *Error) Code() structs.Code { return structs.Code(e.Body.Code) }

// AsStructs converts the API error to a product error.
func (e *Error) AsStructs() *structs.Error {
	return &structs.Error{Code: structs.Code(e.Body.Code), Message: e.Body.Message, Details: e.Body.Details}
}

// do sends a request; out may be nil. Headers may be nil.
func (c *Client) do(ctx context.Context, method, path string, in, out any, headers map[string]string) error {
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return fmt.Errorf("encode request: %w", err)
		}
		body = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.base+wire.Prefix+path, body)
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+c.token)
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	for k, v := range headers {
		req.Header.Set(k, v)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return structs.Wrap(structs.CodeRoleNotRunning, err, "reach the management API at %s", c.base)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return fmt.Errorf("read answer: %w", err)
	}
	if resp.StatusCode >= 400 {
		var env wire.ErrorEnvelope
		if json.Unmarshal(data, &env) == nil && env.Error.Code != "" {
			return (&Error{Status: resp.StatusCode, Body: env.Error}).AsStructs()
		}
		return structs.Errf(structs.CodeInternal, "management API answered %d: %s", resp.StatusCode, bytes.TrimSpace(data))
	}
	if out != nil && len(data) > 0 {
		if err := json.Unmarshal(data, out); err != nil {
			return fmt.Errorf("decode answer: %w", err)
		}
	}
	return nil
}

// Deploy creates or updates a deployment. idempotencyKey may be "".
func (c *Client) Deploy(ctx context.Context, req wire.DeployRequest, idempotencyKey string) (*wire.DeployAccepted, error) {
	var out wire.DeployAccepted
	h := map[string]string{}
	if idempotencyKey != "" {
		h["Idempotency-Key"] = idempotencyKey
	}
	method, path := http.MethodPost, "/deployments"
	if req.ExpectedRevision > 0 {
		method, path = http.MethodPut, "/deployments/"+url.PathEscape(req.Deployment.Name)
	}
	if err := c.do(ctx, method, path, req, &out, h); err != nil {
		return nil, err
	}
	return &out, nil
}

// Deployments lists every deployment.
func (c *Client) Deployments(ctx context.Context) ([]wire.DeploymentStatus, error) {
	var out wire.DeploymentList
	if err := c.do(ctx, http.MethodGet, "/deployments", nil, &out, nil); err != nil {
		return nil, err
	}
	return out.Deployments, nil
}

// Deployment returns one deployment's status.
func (c *Client) Deployment(ctx context.Context, name string) (*wire.DeploymentStatus, error) {
	var out wire.DeploymentStatus
	if err := c.do(ctx, http.MethodGet, "/deployments/"+url.PathEscape(name), nil, &out, nil); err != nil {
		return nil, err
	}
	return &out, nil
}

// Action performs start, stop, park or delete on a deployment.
func (c *Client) Action(ctx context.Context, name string, req wire.ActionRequest) (*wire.ActionAccepted, error) {
	var out wire.ActionAccepted
	if err := c.do(ctx, http.MethodPost, "/deployments/"+url.PathEscape(name)+"/actions", req, &out, nil); err != nil {
		return nil, err
	}
	return &out, nil
}

// InstanceAction performs an action on one instance.
func (c *Client) InstanceAction(ctx context.Context, name string, index int, req wire.ActionRequest) (*wire.ActionAccepted, error) {
	var out wire.ActionAccepted
	path := "/deployments/" + url.PathEscape(name) + "/instances/" + strconv.Itoa(index) + "/actions"
	if err := c.do(ctx, http.MethodPost, path, req, &out, nil); err != nil {
		return nil, err
	}
	return &out, nil
}

// EngineLog returns the tail of an instance's engine log.
func (c *Client) EngineLog(ctx context.Context, name string, instance, kib int) (*wire.EngineLog, error) {
	var out wire.EngineLog
	q := url.Values{"instance": {strconv.Itoa(instance)}, "kib": {strconv.Itoa(kib)}}
	if err := c.do(ctx, http.MethodGet, "/deployments/"+url.PathEscape(name)+"/engine-log?"+q.Encode(), nil, &out, nil); err != nil {
		return nil, err
	}
	return &out, nil
}

// Engines lists the registered engines.
func (c *Client) Engines(ctx context.Context) (*wire.EngineList, error) {
	var out wire.EngineList
	if err := c.do(ctx, http.MethodGet, "/engines", nil, &out, nil); err != nil {
		return nil, err
	}
	return &out, nil
}

// AddEngine detects (DryRun) or registers an engine.
func (c *Client) AddEngine(ctx context.Context, req wire.EngineAddRequest) (*wire.EngineDetected, error) {
	var out wire.EngineDetected
	if err := c.do(ctx, http.MethodPost, "/engines", req, &out, nil); err != nil {
		return nil, err
	}
	return &out, nil
}

// RemoveEngine removes an engine registration.
func (c *Client) RemoveEngine(ctx context.Context, name string) error {
	return c.do(ctx, http.MethodDelete, "/engines/"+url.PathEscape(name), nil, nil, nil)
}

// Flags returns a family's flag-policy table.
func (c *Client) Flags(ctx context.Context, family string) (*wire.FlagTable, error) {
	var out wire.FlagTable
	if err := c.do(ctx, http.MethodGet, "/engine-flags/"+url.PathEscape(family), nil, &out, nil); err != nil {
		return nil, err
	}
	return &out, nil
}

// Snapshot returns the whole state.
func (c *Client) Snapshot(ctx context.Context) (*wire.Snapshot, error) {
	var out wire.Snapshot
	if err := c.do(ctx, http.MethodGet, "/snapshot", nil, &out, nil); err != nil {
		return nil, err
	}
	return &out, nil
}

// WaitReady polls a deployment until every instance is ready (nil), one
// failed after since (its error), or ctx ends. progress, when set, is
// called with each new aggregate state.
func (c *Client) WaitReady(ctx context.Context, name string, since time.Time, progress func(*wire.DeploymentStatus)) (*wire.DeploymentStatus, error) {
	interval := 20 * time.Millisecond
	last := ""
	for {
		st, err := c.Deployment(ctx, name)
		if err != nil {
			return nil, err
		}
		if progress != nil && st.State != last {
			progress(st)
			last = st.State
		}
		ready := len(st.Instances) > 0
		for _, in := range st.Instances {
			if in.State != string(structs.StateReady) {
				ready = false
			}
			if (in.State == string(structs.StateFailed) || in.State == string(structs.StateStopped)) &&
				in.LastError != nil && !in.LastError.At.Before(since) {
				return st, &structs.Error{Code: in.LastError.Code, Message: in.LastError.Message}
			}
		}
		if ready {
			return st, nil
		}
		select {
		case <-ctx.Done():
			return st, structs.Errf(structs.CodeActivationTimeout, "deployment %s was not ready in time (state %s)", name, st.State)
		case <-time.After(interval):
		}
		if interval < 500*time.Millisecond {
			interval = interval * 3 / 2
		}
	}
}

// Delete stops and deletes a deployment.
func (c *Client) Delete(ctx context.Context, name string) error {
	return c.do(ctx, http.MethodDelete, "/deployments/"+url.PathEscape(name), nil, nil, nil)
}
