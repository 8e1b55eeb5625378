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
	"errors"
	"fmt"
	"io"
	"net"
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

// NewOnSocket returns a client that reaches the management API through its
// Unix socket (RunInfo.ManagementSocket); addr names the role in errors
// and in the requests' Host.
func NewOnSocket(socket, addr, token string) *Client {
	c := New(addr, token)
	var d net.Dialer
	c.http.Transport = &http.Transport{Proxy: nil, DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return d.DialContext(ctx, "unix", socket)
	}}
	return c
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
		if ctx.Err() != nil {
			// The caller's deadline or cancel, not an absent role.
			return fmt.Errorf("%s %s: %w", method, path, ctx.Err())
		}
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
		// A deployment answered 201 was created, whichever role answered
		// (a server's answer is the deployment's status).
		if o, ok := out.(*wire.DeployAccepted); ok && resp.StatusCode == http.StatusCreated {
			o.Created = true
		}
		if resp.Header.Get(wire.HeaderReplayed) == "true" {
			switch o := out.(type) {
			case *wire.DeployAccepted:
				o.Replayed = true
			case *wire.ActionAccepted:
				o.Replayed = true
			}
		}
	}
	return nil
}

// Deploy creates a deployment (POST; ExpectedRevision 0) or writes a new
// revision replacing ExpectedRevision (PUT). idempotencyKey may be "".
func (c *Client) Deploy(ctx context.Context, req wire.DeployRequest, idempotencyKey string) (*wire.DeployAccepted, error) {
	var out wire.DeployAccepted
	h := headers([]CallOption{WithIdempotencyKey(idempotencyKey)})
	method, path := http.MethodPost, "/deployments"
	if req.ExpectedRevision > 0 {
		method, path = http.MethodPut, "/deployments/"+url.PathEscape(req.Deployment.Name)
	}
	if err := c.do(ctx, method, path, req, &out, h); err != nil {
		return nil, err
	}
	return &out, nil
}

// Apply converges a deployment to req.Deployment, as capyctl deploy
// --file does, against a standalone role or a server alike: a deployment
// that does not exist is created; one whose spec is already this one is
// left alone (Unchanged: nothing written, nothing restarted; with Activate
// it is started when it was not running); any other is replaced by a new
// revision, a compare-and-set on the revision read (revision_conflict when
// another writer got there first). req.ExpectedRevision, when set, is the
// revision to replace instead of the one read. idempotencyKey may be "".
func (c *Client) Apply(ctx context.Context, req wire.DeployRequest, idempotencyKey string) (*wire.DeployAccepted, error) {
	cur, err := c.Deployment(ctx, req.Deployment.Name)
	if structs.HasCode(err, structs.CodeNotFound) && req.ExpectedRevision == 0 {
		return c.Deploy(ctx, req, idempotencyKey)
	}
	if err != nil {
		return nil, err
	}
	expected := req.ExpectedRevision
	if expected == 0 {
		expected = cur.Revision
	}
	if expected == cur.Revision && structs.SameSpec(cur.Spec, &req.Deployment) {
		acc := &wire.DeployAccepted{APIVersion: wire.APIVersion, Name: cur.Name, Revision: cur.Revision, Unchanged: true, Desired: cur.Desired}
		if req.Activate && cur.Desired != structs.DesiredRunning {
			if _, err := c.Action(ctx, cur.Name, wire.ActionRequest{Action: wire.ActionStart}); err != nil {
				return nil, err
			}
			acc.Desired = structs.DesiredRunning
		}
		return acc, nil
	}
	req.ExpectedRevision = expected
	acc, err := c.Deploy(ctx, req, idempotencyKey)
	if err == nil && !acc.Created && acc.Revision == expected {
		// The role found nothing to change (a server compares each host's
		// share of the spec, which this client cannot see).
		acc.Unchanged = true
	}
	return acc, err
}

// DeployDocument creates (expectedRevision 0) or updates a deployment
// from a JSON document in the job spec's shape ({"name": "demo", "engine":
// "vllm", "model": {"path": "demo"}}): fields left out take their
// defaults, as in an HCL file.
func (c *Client) DeployDocument(ctx context.Context, doc json.RawMessage, activate bool, expectedRevision uint64, idempotencyKey string) (*wire.DeployAccepted, error) {
	var head struct {
		Name string `json:"name"`
	}
	if err := json.Unmarshal(doc, &head); err != nil || head.Name == "" {
		return nil, structs.Errf(structs.CodeInvalidRequest, "the deployment document needs a name")
	}
	body := struct {
		Deployment       json.RawMessage `json:"deployment"`
		Activate         bool            `json:"activate,omitempty"`
		ExpectedRevision uint64          `json:"expected_revision,omitempty"`
	}{doc, activate, expectedRevision}
	method, path := http.MethodPost, "/deployments"
	if expectedRevision > 0 {
		method, path = http.MethodPut, "/deployments/"+url.PathEscape(head.Name)
	}
	var out wire.DeployAccepted
	if err := c.do(ctx, method, path, body, &out, headers([]CallOption{WithIdempotencyKey(idempotencyKey)})); err != nil {
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

// CallOption changes one call.
type CallOption func(h map[string]string)

// WithIdempotencyKey sends an Idempotency-Key with a mutation: a retry with
// the same key and the same request replays the first answer instead of
// acting twice; the same key with another request is
// idempotency_conflict. NewIdempotencyKey makes one.
func WithIdempotencyKey(key string) CallOption {
	return func(h map[string]string) {
		if key != "" {
			h[wire.HeaderIdempotencyKey] = key
		}
	}
}

func headers(opts []CallOption) map[string]string {
	h := map[string]string{}
	for _, o := range opts {
		o(h)
	}
	return h
}

// Action performs start, stop, park or delete on a deployment.
func (c *Client) Action(ctx context.Context, name string, req wire.ActionRequest, opts ...CallOption) (*wire.ActionAccepted, error) {
	var out wire.ActionAccepted
	if err := c.do(ctx, http.MethodPost, "/deployments/"+url.PathEscape(name)+"/actions", req, &out, headers(opts)); err != nil {
		return nil, err
	}
	return &out, nil
}

// InstanceAction performs start, stop or park on one instance.
func (c *Client) InstanceAction(ctx context.Context, name string, index int, req wire.ActionRequest, opts ...CallOption) (*wire.ActionAccepted, error) {
	var out wire.ActionAccepted
	path := "/deployments/" + url.PathEscape(name) + "/instances/" + strconv.Itoa(index) + "/actions"
	if err := c.do(ctx, http.MethodPost, path, req, &out, headers(opts)); err != nil {
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
	last, seen := "", ""
	for {
		st, err := c.Deployment(ctx, name)
		if err != nil && ctx.Err() != nil {
			// The deadline ran out during the read: a timeout, not a role
			// that went away.
			return nil, structs.Errf(structs.CodeActivationTimeout, "deployment %s was not ready in time (state %s)", name, orUnknown(seen))
		}
		if err != nil {
			return nil, err
		}
		seen = st.State
		if progress != nil && st.State != last {
			progress(st)
			last = st.State
		}
		if g := st.Group; g != nil && g.LastError != nil && !g.LastError.At.Before(since) {
			// The server stopped the whole group: its reason, not a member's.
			return st, &structs.Error{Code: g.LastError.Code, Message: g.LastError.Message}
		}
		ready := len(st.Instances) > 0
		for _, in := range st.Instances {
			if in.State != string(structs.StateReady) {
				ready = false
			}
			// A group's members are started in turn by the server, which
			// may retry one (after evicting another group): only the
			// group's own verdict above ends the wait.
			if st.Group == nil && (in.State == string(structs.StateFailed) || in.State == string(structs.StateStopped)) &&
				in.LastError != nil && !in.LastError.At.Before(since) {
				return st, &structs.Error{Code: in.LastError.Code, Message: in.LastError.Message}
			}
			// A server's instance whose host went out of reach: no verdict
			// will come until the host is back, so say so now.
			if in.State == "uncertain" {
				return st, structs.Errf(structs.CodeHostUnreachable, "instance %s of %s is uncertain: its host %s is out of reach of the server (capyctl list hosts)",
					in.ID, name, in.Host)
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
func (c *Client) Delete(ctx context.Context, name string, opts ...CallOption) error {
	return c.do(ctx, http.MethodDelete, "/deployments/"+url.PathEscape(name), nil, nil, headers(opts))
}

// EffectiveConfig returns a deployment's completed spec, where each field
// came from, and each instance's rendered launch, secrets redacted.
func (c *Client) EffectiveConfig(ctx context.Context, name string) (*wire.EffectiveConfig, error) {
	var out wire.EffectiveConfig
	if err := c.do(ctx, http.MethodGet, "/deployments/"+url.PathEscape(name)+"/effective-config", nil, &out, nil); err != nil {
		return nil, err
	}
	return &out, nil
}

// RoleConfig returns the running role's settings and their sources.
func (c *Client) RoleConfig(ctx context.Context) (*wire.RoleConfig, error) {
	var out wire.RoleConfig
	if err := c.do(ctx, http.MethodGet, "/config", nil, &out, nil); err != nil {
		return nil, err
	}
	return &out, nil
}

// Hosts lists the machines that run engines.
func (c *Client) Hosts(ctx context.Context) ([]wire.Host, error) {
	var out wire.HostList
	if err := c.do(ctx, http.MethodGet, "/hosts", nil, &out, nil); err != nil {
		return nil, err
	}
	return out.Hosts, nil
}

// Host returns one host's record: on a server, a joined host with its link
// and the instances its last journal reported; on a standalone role, the
// role itself (not_found for any other name).
func (c *Client) Host(ctx context.Context, name string) (*wire.HostDetail, error) {
	var out wire.HostDetail
	if err := c.do(ctx, http.MethodGet, "/hosts/"+url.PathEscape(name), nil, &out, nil); err != nil {
		return nil, err
	}
	return &out, nil
}

// CreateJoinToken makes a one-time join token (server role; a standalone
// role answers unsupported). The answer's Token is shown once: the server
// keeps only its digest.
func (c *Client) CreateJoinToken(ctx context.Context, req wire.JoinTokenRequest) (*wire.JoinToken, error) {
	var out wire.JoinToken
	if err := c.do(ctx, http.MethodPost, "/join-tokens", req, &out, nil); err != nil {
		return nil, err
	}
	return &out, nil
}

// Host actions for HostAction.
const (
	// HostActionDrain stops new placements on a host; running instances
	// stay.
	HostActionDrain = "drain"
	// HostActionResume lets a drained host take new placements again.
	HostActionResume = "resume"
)

// HostAction drains or resumes a host (HostActionDrain, HostActionResume)
// and returns its record after the change (server role).
func (c *Client) HostAction(ctx context.Context, name, action string) (*wire.HostDetail, error) {
	var out wire.HostDetail
	if err := c.do(ctx, http.MethodPost, "/hosts/"+url.PathEscape(name)+"/actions", wire.HostAction{Action: action}, &out, nil); err != nil {
		return nil, err
	}
	return &out, nil
}

// RemoveHost removes a joined host: the server revokes its certificate at
// once, closes its link and forgets it (server role). The host joins again
// only with a new token.
func (c *Client) RemoveHost(ctx context.Context, name string) error {
	return c.do(ctx, http.MethodDelete, "/hosts/"+url.PathEscape(name), nil, nil, nil)
}

// Servers lists the server cluster's members as the server answers
// (GET /servers).
func (c *Client) Servers(ctx context.Context) (*wire.ServerList, error) {
	var out wire.ServerList
	if err := c.do(ctx, http.MethodGet, "/servers", nil, &out, nil); err != nil {
		return nil, err
	}
	return &out, nil
}

// RemoveServer takes a server out of the cluster (DELETE /servers/{name}).
func (c *Client) RemoveServer(ctx context.Context, name string) error {
	return c.do(ctx, http.MethodDelete, "/servers/"+url.PathEscape(name), nil, nil, nil)
}

// StateSnapshot returns the server state with its header and checksum
// (GET /cluster/snapshot); the caller verifies it (wire.StateSnapshot.Verify).
func (c *Client) StateSnapshot(ctx context.Context) (*wire.StateSnapshot, error) {
	var out wire.StateSnapshot
	if err := c.do(ctx, http.MethodGet, "/cluster/snapshot", nil, &out, nil); err != nil {
		return nil, err
	}
	return &out, nil
}

// RestoreState replaces the server state with a snapshot's (POST
// /cluster/restore; the leader commits it).
func (c *Client) RestoreState(ctx context.Context, req wire.StateRestoreRequest) (*wire.StateRestored, error) {
	var out wire.StateRestored
	if err := c.do(ctx, http.MethodPost, "/cluster/restore", req, &out, nil); err != nil {
		return nil, err
	}
	return &out, nil
}

// Retryable reports whether an error from this client may be retried as is
// (the catalogue's retryable column: queue_full, capacity_blocked,
// unavailable, role_not_running, ...). Retry a mutation with the same
// Idempotency-Key.
func Retryable(err error) bool {
	var se *structs.Error
	if errors.As(err, &se) {
		return se.Info().Retryable
	}
	return false
}

// orUnknown is s, or "unknown" when empty.
func orUnknown(s string) string {
	if s == "" {
		return "unknown"
	}
	return s
}
