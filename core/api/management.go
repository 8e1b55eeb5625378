// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package api

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/gorilla/mux"

	"github.com/capyctl/capyctl/core/api/dashboard"
	"github.com/capyctl/capyctl/core/api/wire"
	"github.com/capyctl/capyctl/core/jobspec"
	"github.com/capyctl/capyctl/core/lifecycle"
	"github.com/capyctl/capyctl/core/structs"
)

// maxManagementBody bounds a management request body.
const maxManagementBody = 1 << 20

// Route is one route of the management API (the reference page is
// generated from ManagementRoutes).
type Route struct {
	Method string
	// Path is under wire.Prefix ("/deployments/{name}").
	Path string
	// Summary says what the route does, for the reference.
	Summary string
	// Idempotent is true for a mutation that takes an Idempotency-Key.
	Idempotent bool
	handle     func(b *Backend) http.HandlerFunc
}

// ManagementRoutes returns every management route, in reference order.
func ManagementRoutes() []Route {
	return []Route{
		{http.MethodGet, "/snapshot", "the whole state (role, deployments, engines, hosts) and the event cursor it was taken at", false, func(b *Backend) http.HandlerFunc { return b.snapshot }},
		{http.MethodGet, "/events", "the event stream (SSE) after a cursor: Last-Event-ID or ?after=; heartbeats; 410 cursor_expired with resnapshot_required", false, func(b *Backend) http.HandlerFunc { return b.events }},
		{http.MethodGet, "/deployments", "every deployment's status", false, func(b *Backend) http.HandlerFunc { return b.listDeployments }},
		{http.MethodPost, "/deployments", "create a deployment: {deployment, activate}; 201", true, func(b *Backend) http.HandlerFunc { return b.createDeployment }},
		{http.MethodGet, "/deployments/{name}", "one deployment's status and instances", false, func(b *Backend) http.HandlerFunc { return b.getDeployment }},
		{http.MethodPut, "/deployments/{name}", "apply a spec: {deployment, expected_revision, activate}; the spec it has already is a no-op (unchanged: true), another one a new revision (replacing expected_revision when named: a compare-and-set), a missing deployment is created; 200, 201 when created", true, func(b *Backend) http.HandlerFunc { return b.updateDeployment }},
		{http.MethodDelete, "/deployments/{name}", "stop every instance, prove the processes gone, delete", true, func(b *Backend) http.HandlerFunc { return b.deleteDeployment }},
		{http.MethodPost, "/deployments/{name}/actions", "start (evict), stop, park or delete: {action, wait, evict, expected_revision}; 202, or 200 when done", true, func(b *Backend) http.HandlerFunc { return b.deploymentAction }},
		{http.MethodPost, "/deployments/{name}/instances/{index}/actions", "start (evict), stop or park one instance", true, func(b *Backend) http.HandlerFunc { return b.instanceAction }},
		{http.MethodGet, "/deployments/{name}/effective-config", "the completed spec, each field's provenance and each instance's rendered launch, secrets redacted", false, func(b *Backend) http.HandlerFunc { return b.effectiveConfig }},
		{http.MethodGet, "/deployments/{name}/engine-log", "the redacted tail of an instance's engine output: ?instance=N&kib=1..256 (64)", false, func(b *Backend) http.HandlerFunc { return b.engineLog }},
		{http.MethodGet, "/config", "the role's settings, each value's source, secrets redacted", false, func(b *Backend) http.HandlerFunc { return b.roleConfig }},
		{http.MethodGet, "/engines", "the registered engines (a hint when there is none)", false, func(b *Backend) http.HandlerFunc { return b.listEngines }},
		{http.MethodPost, "/engines", "detect (dry_run) or register an engine installation", false, func(b *Backend) http.HandlerFunc { return b.addEngine }},
		{http.MethodDelete, "/engines/{name}", "remove a registration (engine_in_use while a deployment uses it)", false, func(b *Backend) http.HandlerFunc { return b.removeEngine }},
		{http.MethodGet, "/engine-flags/{family}", "a family's flag policy: owned, reserved, gated, passed, and why", false, func(b *Backend) http.HandlerFunc { return b.engineFlags }},
		{http.MethodGet, "/hosts", "the machines that run engines", false, func(b *Backend) http.HandlerFunc { return b.listHosts }},
		{http.MethodGet, "/hosts/{name}", "one host: its record, link and instances (server: as its last journal said)", false, func(b *Backend) http.HandlerFunc { return b.getHost }},
		{http.MethodPost, "/hosts/{name}/actions", "drain (no new placements; running ones stay) or resume: {action}", false, func(b *Backend) http.HandlerFunc { return b.hostAction }},
		{http.MethodDelete, "/hosts/{name}", "remove a host: revoke its certificate at once, close its link, forget it (server)", false, func(b *Backend) http.HandlerFunc { return b.removeHost }},
		{http.MethodPost, "/join-tokens", "a one-time join token for a host, or with role server for a server: {ttl, host_name, role}; 201 (server)", false, func(b *Backend) http.HandlerFunc { return b.createJoinToken }},
		{http.MethodGet, "/servers", "the server cluster: each server's raft state, term, last index and the leader, as each server answers (server)", false, func(b *Backend) http.HandlerFunc { return b.listServers }},
		{http.MethodDelete, "/servers/{name}", "remove a server from the cluster's raft configuration (server; the leader commits it)", false, func(b *Backend) http.HandlerFunc { return b.removeServer }},
		{http.MethodGet, "/cluster/snapshot", "the server state (hosts, placements) with a header (format, CA fingerprint, raft index and term) and its SHA-256, for capyctl snapshot save (server)", false, func(b *Backend) http.HandlerFunc { return b.clusterSnapshot }},
		{http.MethodPost, "/cluster/restore", "verify a state snapshot {snapshot, force} and replace the state with it through the leader; snapshot_invalid, snapshot_ca_mismatch, conflict (server)", false, func(b *Backend) http.HandlerFunc { return b.clusterRestore }},
		{http.MethodGet, "/hosts/{name}/ledger", "a host's GPUs and memory ledger: domains, limits, charges per owner", false, func(b *Backend) http.HandlerFunc { return b.hostLedger }},
		{http.MethodGet, ViewLoad, "live load per deployment and instance (running, waiting, limits)", false, LoadView},
		{http.MethodGet, ViewLatency, "latency distributions (router and engine)", false, LatencyView},
		{http.MethodGet, "/api-keys", "the inference API's named keys: name, models, limits, weight, created, expiry, first and last use; never a key", false, func(b *Backend) http.HandlerFunc { return b.listAPIKeys }},
		{http.MethodPost, "/api-keys", "create a named key: {name, models, limits {rpm, tpm, concurrency, monthly_tokens}, weight, expires}; 201 with the key in clear, this once (api_key_exists)", false, func(b *Backend) http.HandlerFunc { return b.createAPIKey }},
		{http.MethodGet, "/api-keys/{name}", "one named key", false, func(b *Backend) http.HandlerFunc { return b.getAPIKey }},
		{http.MethodPatch, "/api-keys/{name}", "change a key's models, limits, weight or expiry: each field present replaces the key's", false, func(b *Backend) http.HandlerFunc { return b.updateAPIKey }},
		{http.MethodDelete, "/api-keys/{name}", "revoke a key: its next request is 401", false, func(b *Backend) http.HandlerFunc { return b.revokeAPIKey }},
		{http.MethodGet, "/usage", "the keys' usage per key, model and hour: ?key=&model=&since= (a duration back, or an RFC 3339 time; 24h by default); requests, errors by code, prompt, completion and cached tokens, request time", false, func(b *Backend) http.HandlerFunc { return b.usageView }},
		{http.MethodGet, ViewRequests, "the request log's newest records, newest first (?deployment=&limit=1..500, 50 by default): each request's route (chat, responses, messages, ...), outcome, status, timings and tokens; never its text (on a server: the hosts keep them)", false, RequestsView},
	}
}

// NewManagementHandler returns the management API under /management/v1
// (ManagementRoutes), behind the admin token. Listen on loopback only.
func NewManagementHandler(b *Backend, adminToken string) http.Handler {
	r := mux.NewRouter()
	for _, rt := range ManagementRoutes() {
		h := rt.handle(b)
		if o := b.Override[rt.Method+" "+rt.Path]; o != nil {
			h = o
		}
		if b.Forward != nil && rt.Method != http.MethodGet {
			h = b.Forward(h)
		}
		r.HandleFunc(wire.Prefix+rt.Path, h).Methods(rt.Method)
	}
	// The core's Prometheus metrics, outside the prefix, behind the token.
	if o := b.Override["GET /metrics"]; o != nil {
		r.Handle("/metrics", o).Methods(http.MethodGet)
	} else {
		r.Handle("/metrics", MetricsView(b)).Methods(http.MethodGet)
	}
	notFound := http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		writeMgmtError(w, structs.Errf(structs.CodeNotFound, "no route %s %s", req.Method, req.URL.Path))
	})
	notAllowed := http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		writeMgmtError(w, structs.Errf(structs.CodeMethodNotAllowed, "%s is not allowed on %s", req.Method, req.URL.Path))
	})
	r.NotFoundHandler = notFound
	r.MethodNotAllowedHandler = notAllowed
	// The dashboard's page and login, outside the token: the page asks for
	// the token once and the API then takes its session cookie.
	dash := dashboard.New(dashboard.Options{AdminToken: adminToken, TokenEqual: tokenEqual, Logger: b.logger().Named("dashboard"),
		Inference: b.Inference, Keys: b.InferenceKeys})
	api := managementAuth(r, adminToken, dash)
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if req.URL.Path == strings.TrimSuffix(dashboard.Prefix, "/") || strings.HasPrefix(req.URL.Path, dashboard.Prefix) {
			dash.ServeHTTP(w, req)
			return
		}
		api.ServeHTTP(w, req)
	})
}

// Paths of the read-only views (views.go).
const (
	ViewLoad    = "/metrics/load"
	ViewLatency = "/metrics/latency"
	// ViewRequests is the request log's newest records.
	ViewRequests = "/requests"
)

// managementAuth lets through a request with the admin token, or one with
// the dashboard's session cookie from the dashboard's own page (dash may be
// nil: token only).
func managementAuth(next http.Handler, token string, dash *dashboard.Dashboard) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Cache-Control", "no-store")
		w.Header().Set("X-Content-Type-Options", "nosniff")
		ok := tokenEqual(bearer(r), token)
		if !ok && dash != nil {
			err := dash.Authorize(r)
			if err != nil && !errors.Is(err, dashboard.ErrNoSession) {
				closeUnread(w)
				writeMgmtError(w, err)
				return
			}
			ok = err == nil
		}
		if !ok {
			closeUnread(w) // the body is never read; the connection closes
			writeMgmtError(w, structs.Errf(structs.CodeUnauthorized, "missing or wrong admin token"))
			return
		}
		markAuthenticated(r)
		next.ServeHTTP(w, r)
	})
}

// readBody reads a bounded JSON body.
func readBody(r *http.Request) ([]byte, error) {
	if ct := r.Header.Get("Content-Type"); ct != "" && ct != "application/json" && !hasPrefix(ct, "application/json;") {
		return nil, structs.Errf(structs.CodeUnsupportedMediaType, "send Content-Type: application/json, not %s", ct)
	}
	data, err := io.ReadAll(io.LimitReader(r.Body, maxManagementBody+1))
	if err != nil {
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			return nil, structs.Errf(structs.CodeBodyReadTimeout, "the request body did not arrive in time")
		}
		return nil, structs.Errf(structs.CodeInvalidRequest, "read body: %v", err)
	}
	if len(data) > maxManagementBody {
		return nil, structs.Errf(structs.CodeRequestTooLarge, "the body is over %s", structs.FormatBytes(maxManagementBody))
	}
	return data, nil
}

func hasPrefix(s, p string) bool { return len(s) >= len(p) && s[:len(p)] == p }

func decodeStrict(data []byte, v any) error {
	dec := json.NewDecoder(bytesReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return structs.Errf(structs.CodeInvalidRequest, "body does not parse: %v", err)
	}
	return nil
}

// ---------------------------------------------------------------- deployments

// Status converts a lifecycle view for the API.
func Status(v *lifecycle.DeploymentView) wire.DeploymentStatus {
	spec := v.Record.Spec.Redacted()
	st := wire.DeploymentStatus{
		Name: v.Record.Name, Engine: spec.Engine, API: spec.API, Routes: spec.Routes, Revision: v.Record.Revision,
		Desired: v.Record.Desired, Spec: &spec, UpdatedAt: v.Record.UpdatedAt,
	}
	for i := range v.Instances {
		r := &v.Instances[i]
		if r.State == structs.StateReady {
			st.ReadyN++
		}
		st.Instances = append(st.Instances, InstanceStatus(r))
	}
	st.State = aggregate(st.Instances, v.Record.Desired)
	return st
}

// InstanceStatus converts one instance record for the API (a host also
// sends it in the instance's journal, for the server's status).
func InstanceStatus(r *structs.InstanceRecord) wire.InstanceStatus {
	is := wire.InstanceStatus{
		ID: r.ID(), Index: r.Index, State: string(r.State), Since: r.Since, Revision: r.Revision, Generation: r.Generation,
		Engine: r.Engine, Driver: r.Driver, Residency: r.Residency, LastTransition: r.LastTransition, Reason: string(r.Reason), LastError: r.LastError,
		Released: r.Released, Charges: r.Charges, Phase: r.Phase, Parsers: r.Parsers,
		ParkTier: r.ParkTier, ParkDetail: r.ParkDetail, Timings: r.Timings,
	}
	if r.Launch != nil && r.State != structs.StateStopped && r.State != structs.StateFailed {
		is.Port = r.Launch.Port
		for _, p := range r.Launch.Processes {
			if p.Role == "engine" {
				is.PID = p.PID
			}
		}
	}
	if r.Endpoint != nil {
		is.Endpoint = r.Endpoint.BaseURL
		if r.State != structs.StateStopped && r.State != structs.StateFailed {
			is.Exposure = r.Endpoint.Exposure
		}
	}
	return is
}

// aggregate summarises instance states.
func aggregate(insts []wire.InstanceStatus, desired string) string {
	if len(insts) == 0 {
		return "stopped"
	}
	counts := map[string]int{}
	for _, in := range insts {
		counts[in.State]++
	}
	n := len(insts)
	switch {
	case counts["ready"] == n:
		return "ready"
	case counts["ready"] > 0:
		return "degraded"
	case counts["starting"] > 0:
		return "starting"
	case counts["waking"] > 0:
		return "waking"
	case counts["reconciling"] > 0:
		return "reconciling"
	case counts["stopping"] > 0 || counts["draining"] > 0:
		return "stopping"
	case counts["parking"] > 0:
		return "parking"
	case counts["parked"] > 0:
		return "parked"
	case counts["failed"] == n:
		return "failed"
	}
	return "stopped"
}

func (b *Backend) status(v *lifecycle.DeploymentView) wire.DeploymentStatus {
	st := Status(v)
	if b.DeploymentExtras != nil {
		b.DeploymentExtras(&st)
	}
	return st
}

func (b *Backend) listDeployments(w http.ResponseWriter, r *http.Request) {
	out := wire.DeploymentList{APIVersion: wire.APIVersion, Deployments: []wire.DeploymentStatus{}}
	for _, v := range b.Lifecycle.Deployments() {
		out.Deployments = append(out.Deployments, b.status(v))
	}
	writeJSON(w, http.StatusOK, out)
}

func (b *Backend) getDeployment(w http.ResponseWriter, r *http.Request) {
	v, err := b.Lifecycle.Deployment(mux.Vars(r)["name"])
	if err != nil {
		writeMgmtError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, b.status(v))
}

func (b *Backend) createDeployment(w http.ResponseWriter, r *http.Request) {
	b.deploy(w, r, "")
}

func (b *Backend) updateDeployment(w http.ResponseWriter, r *http.Request) {
	b.deploy(w, r, mux.Vars(r)["name"])
}

// deploy handles create (name "") and update, under the request's
// Idempotency-Key: an exact retry replays the original answer, the same key
// with another body is a conflict. An update names the revision it
// replaces.
func (b *Backend) deploy(w http.ResponseWriter, r *http.Request, name string) {
	data, err := readBody(r)
	if err != nil {
		writeMgmtError(w, err)
		return
	}
	b.idempotent(w, r, data, func() (int, any, error) {
		var req struct {
			Deployment       json.RawMessage `json:"deployment"`
			Activate         bool            `json:"activate"`
			ExpectedRevision uint64          `json:"expected_revision"`
		}
		if err := decodeStrict(data, &req); err != nil {
			return 0, nil, err
		}
		if len(req.Deployment) == 0 {
			return 0, nil, structs.Errf(structs.CodeInvalidRequest, "the body has no deployment")
		}
		parsed, err := jobspec.FromJSON(req.Deployment)
		if err != nil {
			return 0, nil, err
		}
		spec := *parsed
		keepClientDefaults(&spec, req.Deployment)
		if name != "" && spec.Name != name {
			return 0, nil, structs.Errf(structs.CodeInvalidRequest, "the body names deployment %q, the path %q", spec.Name, name)
		}
		if name == "" {
			if v, err := b.Lifecycle.Deployment(spec.Name); err == nil && req.ExpectedRevision == 0 {
				return 0, nil, structs.Errf(structs.CodeConflict,
					"deployment %s exists at revision %d: apply the spec with PUT /deployments/%s (capyctl deploy --file), or name the revision it replaces (expected_revision, capyctl deploy --revision %d)",
					spec.Name, v.Record.Revision, spec.Name, v.Record.Revision).WithDetail("current_revision", v.Record.Revision)
			}
		}
		// A PUT converges: the spec the deployment has already is a no-op
		// (nothing written, nothing restarted), whether or not it names
		// the current revision; another revision named is a conflict below.
		if name != "" {
			if v, err := b.Lifecycle.Deployment(spec.Name); err == nil && structs.SameSpec(&v.Record.Spec, &spec) &&
				(req.ExpectedRevision == 0 || req.ExpectedRevision == v.Record.Revision) {
				desired := v.Record.Desired
				if req.Activate && desired != structs.DesiredRunning {
					if err := b.Lifecycle.StartDeployment(r.Context(), spec.Name, lifecycle.StartOptions{}); err != nil {
						return 0, nil, err
					}
					desired = structs.DesiredRunning
				}
				return http.StatusOK, wire.DeployAccepted{APIVersion: wire.APIVersion, Name: spec.Name, Revision: v.Record.Revision,
					Unchanged: true, Desired: desired}, nil
			}
		}
		ctx, cancel := context.WithTimeout(r.Context(), 2*time.Minute)
		defer cancel()
		rec, created, err := b.Lifecycle.Deploy(ctx, &spec, lifecycle.DeployOptions{
			Activate: req.Activate, ExpectedRevision: req.ExpectedRevision, Validate: b.Lifecycle.ValidateDeployment,
		})
		if err != nil {
			return 0, nil, err
		}
		status := http.StatusOK
		if created {
			status = http.StatusCreated
		}
		return status, wire.DeployAccepted{APIVersion: wire.APIVersion, Name: rec.Name, Revision: rec.Revision, Created: created, Desired: rec.Desired}, nil
	})
}

func (b *Backend) deleteDeployment(w http.ResponseWriter, r *http.Request) {
	name := mux.Vars(r)["name"]
	b.idempotent(w, r, nil, func() (int, any, error) {
		v, err := b.Lifecycle.Deployment(name)
		if err != nil {
			return 0, nil, err
		}
		if err := b.Lifecycle.DeleteDeployment(r.Context(), name); err != nil {
			return 0, nil, err
		}
		return http.StatusOK, wire.ActionAccepted{APIVersion: wire.APIVersion, Deployment: name, Action: wire.ActionDelete,
			Revision: v.Record.Revision, AcceptedAt: time.Now().UTC(), Done: true}, nil
	})
}

func (b *Backend) engineLog(w http.ResponseWriter, r *http.Request) {
	name := mux.Vars(r)["name"]
	idx, kib := 0, 64
	if s := r.URL.Query().Get("instance"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 0 {
			writeMgmtError(w, structs.Errf(structs.CodeInvalidRequest, "instance must be a non-negative integer"))
			return
		}
		idx = n
	}
	if s := r.URL.Query().Get("kib"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 || n > 256 {
			writeMgmtError(w, structs.Errf(structs.CodeInvalidRequest, "kib must be between 1 and 256"))
			return
		}
		kib = n
	}
	text, trunc, err := b.Lifecycle.Logs(r.Context(), name, idx, int64(kib)*1024)
	if err != nil {
		writeMgmtError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, wire.EngineLog{APIVersion: wire.APIVersion, Deployment: name, Instance: idx, Text: text, Truncated: trunc})
}

// ---------------------------------------------------------------- engines

func (b *Backend) listEngines(w http.ResponseWriter, r *http.Request) {
	regs, err := b.Engines.List()
	if err != nil {
		writeMgmtError(w, err)
		return
	}
	list := engineViews(regs)
	out := wire.EngineList{APIVersion: wire.APIVersion, Engines: list}
	if len(list) == 0 {
		out.Hint = "no engine is registered: add one with capyctl engine add <venv|llama-server> or capyctl engine add --custom <program> --name <name> --manifest <file>"
	}
	writeJSON(w, http.StatusOK, out)
}

func (b *Backend) addEngine(w http.ResponseWriter, r *http.Request) {
	data, err := readBody(r)
	if err != nil {
		writeMgmtError(w, err)
		return
	}
	var req wire.EngineAddRequest
	if err := decodeStrict(data, &req); err != nil {
		writeMgmtError(w, err)
		return
	}
	added, err := b.Engines.Add(r.Context(), addRequest(req))
	if err != nil {
		writeMgmtError(w, err)
		return
	}
	out := engineDetected(added)
	status := http.StatusOK
	if out.Registered {
		status = http.StatusCreated
		b.Lifecycle.Journal("engine_added", "", map[string]any{"engine": out.Engine.Name, "family": out.Engine.Family, "digest": out.Engine.Digest})
	}
	writeJSON(w, status, out)
}

func (b *Backend) removeEngine(w http.ResponseWriter, r *http.Request) {
	name := mux.Vars(r)["name"]
	if err := b.Engines.Remove(name); err != nil {
		writeMgmtError(w, err)
		return
	}
	b.Lifecycle.Journal("engine_removed", "", map[string]any{"engine": name})
	writeJSON(w, http.StatusOK, wire.Removed{APIVersion: wire.APIVersion, Removed: name})
}

func (b *Backend) engineFlags(w http.ResponseWriter, r *http.Request) {
	family := mux.Vars(r)["family"]
	resp, err := b.Engines.Flags(r.Context(), family)
	if err != nil {
		writeMgmtError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, flagTable(family, resp))
}

func (b *Backend) listHosts(w http.ResponseWriter, r *http.Request) {
	var hosts []wire.Host
	if b.Hosts != nil {
		hosts = b.Hosts()
	}
	if hosts == nil {
		hosts = []wire.Host{}
	}
	writeJSON(w, http.StatusOK, wire.HostList{APIVersion: wire.APIVersion, Hosts: hosts})
}

// ---------------------------------------------------------------- snapshot

func (b *Backend) snapshot(w http.ResponseWriter, r *http.Request) {
	cursor, err := b.cursor()
	if err != nil {
		writeMgmtError(w, err)
		return
	}
	snap := wire.Snapshot{APIVersion: wire.APIVersion, Cursor: cursor, TakenAt: time.Now().UTC(), Role: b.Role,
		Deployments: []wire.DeploymentStatus{}, Engines: []wire.Engine{}, Hosts: []wire.Host{}}
	for _, v := range b.Lifecycle.Deployments() {
		snap.Deployments = append(snap.Deployments, b.status(v))
	}
	if regs, err := b.Engines.List(); err == nil {
		snap.Engines = engineViews(regs)
	}
	if b.Hosts != nil {
		snap.Hosts = b.Hosts()
	}
	if b.RequestLedger != nil {
		snap.RequestLedger = b.RequestLedger()
	}
	writeJSON(w, http.StatusOK, snap)
}

// keepClientDefaults keeps "default" for the fields a client marked so in
// the provenance it sent: capyctl deploy sends the spec it completed from
// the file, and a value it filled in is still a default, not the
// operator's choice. Fields the client did not mark keep the server's
// provenance ("file" for what the document carries).
// SpecFromJSON reads a deployment's job spec as a management request sends
// it (the JSON form), with the client's defaults kept as defaults: what a
// host runs from the cluster's desired state is read as its management
// API reads a deploy.
func SpecFromJSON(doc json.RawMessage) (*structs.Deployment, error) {
	spec, err := jobspec.FromJSON(doc)
	if err != nil {
		return nil, err
	}
	keepClientDefaults(spec, doc)
	return spec, nil
}

func keepClientDefaults(spec *structs.Deployment, doc json.RawMessage) {
	var sent struct {
		Provenance map[string]string `json:"provenance"`
	}
	if json.Unmarshal(doc, &sent) != nil {
		return
	}
	for k, v := range sent.Provenance {
		if cur, ok := spec.Provenance[k]; ok && cur == jobspec.FromFile && v == jobspec.FromDefault {
			spec.Provenance[k] = jobspec.FromDefault
		}
	}
}
