// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package api

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"net/http"
	"strconv"
	"time"

	"github.com/gorilla/mux"

	"github.com/capyctl/capyctl/core/api/wire"
	"github.com/capyctl/capyctl/core/jobspec"
	"github.com/capyctl/capyctl/core/lifecycle"
	"github.com/capyctl/capyctl/core/store"
	"github.com/capyctl/capyctl/core/structs"
)

// maxManagementBody bounds a management request body.
const maxManagementBody = 1 << 20

// NewManagementHandler returns the management API under /management/v1,
// behind the admin token. Listen on loopback only.
func NewManagementHandler(b *Backend, adminToken string) http.Handler {
	r := mux.NewRouter()
	s := r.PathPrefix(wire.Prefix).Subrouter()
	s.HandleFunc("/snapshot", b.snapshot).Methods(http.MethodGet)
	s.HandleFunc("/events", b.events).Methods(http.MethodGet)
	s.HandleFunc("/deployments", b.listDeployments).Methods(http.MethodGet)
	s.HandleFunc("/deployments", b.createDeployment).Methods(http.MethodPost)
	s.HandleFunc("/deployments/{name}", b.getDeployment).Methods(http.MethodGet)
	s.HandleFunc("/deployments/{name}", b.updateDeployment).Methods(http.MethodPut)
	s.HandleFunc("/deployments/{name}", b.deleteDeployment).Methods(http.MethodDelete)
	s.HandleFunc("/deployments/{name}/actions", b.deploymentAction).Methods(http.MethodPost)
	s.HandleFunc("/deployments/{name}/engine-log", b.engineLog).Methods(http.MethodGet)
	s.HandleFunc("/engines", b.listEngines).Methods(http.MethodGet)
	s.HandleFunc("/engines", b.addEngine).Methods(http.MethodPost)
	s.HandleFunc("/engines/{name}", b.removeEngine).Methods(http.MethodDelete)
	s.HandleFunc("/engine-flags/{family}", b.engineFlags).Methods(http.MethodGet)
	s.HandleFunc("/hosts", b.listHosts).Methods(http.MethodGet)
	s.HandleFunc("/metrics/load", LoadView(b)).Methods(http.MethodGet)
	s.HandleFunc("/metrics/latency", LatencyView(b)).Methods(http.MethodGet)
	r.Handle("/metrics", MetricsView(b)).Methods(http.MethodGet)
	r.NotFoundHandler = http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		writeMgmtError(w, structs.Errf(structs.CodeNotFound, "no route %s %s", req.Method, req.URL.Path))
	})
	r.MethodNotAllowedHandler = http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		writeMgmtError(w, structs.Errf(structs.CodeMethodNotAllowed, "%s is not allowed on %s", req.Method, req.URL.Path))
	})
	return managementAuth(r, adminToken)
}

func managementAuth(next http.Handler, token string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Cache-Control", "no-store")
		w.Header().Set("X-Content-Type-Options", "nosniff")
		if !tokenEqual(bearer(r), token) {
			writeMgmtError(w, structs.Errf(structs.CodeUnauthorized, "missing or wrong admin token"))
			return
		}
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
		return nil, structs.Errf(structs.CodeInvalidRequest, "read body: %v", err)
	}
	if len(data) > maxManagementBody {
		return nil, structs.Errf(structs.CodeRequestTooLarge, "body over %d bytes", maxManagementBody)
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
	spec := v.Record.Spec
	st := wire.DeploymentStatus{
		Name: v.Record.Name, Engine: spec.Engine, API: spec.API, Routes: spec.Routes, Revision: v.Record.Revision,
		Desired: v.Record.Desired, Spec: &spec, UpdatedAt: v.Record.UpdatedAt,
	}
	for _, r := range v.Instances {
		is := wire.InstanceStatus{
			ID: r.ID(), Index: r.Index, State: string(r.State), Since: r.Since, Revision: r.Revision, Generation: r.Generation,
			Engine: r.Engine, Driver: r.Driver, Residency: r.Residency, LastTransition: r.LastTransition, LastError: r.LastError,
			Released: r.Released, Charges: r.Charges, Phase: r.Phase,
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
		}
		if r.State == structs.StateReady {
			st.ReadyN++
		}
		st.Instances = append(st.Instances, is)
	}
	st.State = aggregate(st.Instances, v.Record.Desired)
	return st
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

// deploy handles create (name "") and update, with idempotency keys: an
// exact retry replays the original answer, the same key with another body
// is a conflict.
func (b *Backend) deploy(w http.ResponseWriter, r *http.Request, name string) {
	data, err := readBody(r)
	if err != nil {
		writeMgmtError(w, err)
		return
	}
	key := r.Header.Get("Idempotency-Key")
	sum := sha256.Sum256(append([]byte(r.Method+" "+r.URL.Path+"\n"), data...))
	hash := hex.EncodeToString(sum[:])
	if key != "" {
		if len(key) > 128 {
			writeMgmtError(w, structs.Errf(structs.CodeInvalidRequest, "Idempotency-Key is longer than 128 characters"))
			return
		}
		if rec, err := b.Store.GetIdempotency(key); err == nil && rec != nil {
			if rec.BodyHash != hash {
				writeMgmtError(w, structs.Errf(structs.CodeIdempotencyConflict,
					"Idempotency-Key %q was used with another request body", key))
				return
			}
			w.Header().Set("Content-Type", "application/json")
			w.Header().Set("Idempotent-Replayed", "true")
			w.WriteHeader(rec.Status)
			_, _ = w.Write(rec.Response)
			return
		}
	}
	var req struct {
		Deployment       json.RawMessage `json:"deployment"`
		Activate         bool            `json:"activate"`
		ExpectedRevision uint64          `json:"expected_revision"`
	}
	if err := decodeStrict(data, &req); err != nil {
		writeMgmtError(w, err)
		return
	}
	if len(req.Deployment) == 0 {
		writeMgmtError(w, structs.Errf(structs.CodeInvalidRequest, "the body has no deployment"))
		return
	}
	parsed, err := jobspec.FromJSON(req.Deployment)
	if err != nil {
		writeMgmtError(w, err)
		return
	}
	spec := *parsed
	if name != "" && spec.Name != name {
		writeMgmtError(w, structs.Errf(structs.CodeInvalidRequest, "the body names deployment %q, the path %q", spec.Name, name))
		return
	}
	if name != "" && req.ExpectedRevision == 0 {
		writeMgmtError(w, structs.Errf(structs.CodeInvalidRequest, "an update must name the revision it replaces (expected_revision)"))
		return
	}
	if name == "" {
		if _, err := b.Lifecycle.Deployment(spec.Name); err == nil && req.ExpectedRevision == 0 {
			writeMgmtError(w, structs.Errf(structs.CodeConflict,
				"deployment %s exists: update it with its current revision (capyctl deploy --revision N)", spec.Name))
			return
		}
	}
	ctx, cancel := context.WithTimeout(r.Context(), 2*time.Minute)
	defer cancel()
	rec, created, err := b.Lifecycle.Deploy(ctx, &spec, lifecycle.DeployOptions{
		Activate: req.Activate, ExpectedRevision: req.ExpectedRevision, Validate: b.Lifecycle.ValidateDeployment,
	})
	if err != nil {
		writeMgmtError(w, err)
		return
	}
	status := http.StatusOK
	if created {
		status = http.StatusCreated
	}
	out := wire.DeployAccepted{APIVersion: wire.APIVersion, Name: rec.Name, Revision: rec.Revision, Created: created, Desired: rec.Desired}
	resp, _ := json.Marshal(out)
	if key != "" {
		_ = b.Store.PutIdempotency(key, store.IdempotencyRecord{BodyHash: hash, Status: status, Response: resp, At: time.Now().UTC()})
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(resp)
}

func (b *Backend) deleteDeployment(w http.ResponseWriter, r *http.Request) {
	name := mux.Vars(r)["name"]
	if err := b.Lifecycle.DeleteDeployment(r.Context(), name); err != nil {
		writeMgmtError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, wire.ActionAccepted{APIVersion: wire.APIVersion, Deployment: name, Action: "delete", AcceptedAt: time.Now().UTC(), Done: true})
}

func (b *Backend) deploymentAction(w http.ResponseWriter, r *http.Request) {
	name := mux.Vars(r)["name"]
	data, err := readBody(r)
	if err != nil {
		writeMgmtError(w, err)
		return
	}
	var req wire.ActionRequest
	if err := decodeStrict(data, &req); err != nil {
		writeMgmtError(w, err)
		return
	}
	v, err := b.Lifecycle.Deployment(name)
	if err != nil {
		writeMgmtError(w, err)
		return
	}
	if req.ExpectedRevision != 0 && req.ExpectedRevision != v.Record.Revision {
		writeMgmtError(w, structs.Errf(structs.CodeRevisionConflict, "deployment %s is at revision %d, not %d", name, v.Record.Revision, req.ExpectedRevision))
		return
	}
	accepted := time.Now().UTC()
	ctx := r.Context()
	switch req.Action {
	case "start":
		err = b.Lifecycle.StartDeployment(ctx, name, req.Wait)
	case "stop":
		err = b.Lifecycle.StopDeployment(ctx, name, req.Wait)
	case "delete":
		err = b.Lifecycle.DeleteDeployment(ctx, name)
	case "park":
		if p, ok := any(b.Lifecycle).(interface {
			ParkDeployment(context.Context, string, bool) error
		}); ok {
			err = p.ParkDeployment(ctx, name, req.Wait)
		} else {
			err = structs.Errf(structs.CodeUnsupported, "park is not available yet")
		}
	default:
		err = structs.Errf(structs.CodeInvalidRequest, "unknown action %q (start, stop, park, delete)", req.Action)
	}
	if err != nil {
		writeMgmtError(w, err)
		return
	}
	status := http.StatusAccepted
	if req.Wait || req.Action == "delete" {
		status = http.StatusOK
	}
	writeJSON(w, status, wire.ActionAccepted{
		APIVersion: wire.APIVersion, Deployment: name, Action: req.Action, Revision: v.Record.Revision,
		AcceptedAt: accepted, Done: status == http.StatusOK,
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
	list, err := b.Engines.List()
	if err != nil {
		writeMgmtError(w, err)
		return
	}
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
	out, err := b.Engines.Add(r.Context(), req)
	if err != nil {
		writeMgmtError(w, err)
		return
	}
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
	writeJSON(w, http.StatusOK, map[string]any{"api_version": wire.APIVersion, "removed": name})
}

func (b *Backend) engineFlags(w http.ResponseWriter, r *http.Request) {
	out, err := b.Engines.Flags(r.Context(), mux.Vars(r)["family"])
	if err != nil {
		writeMgmtError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, out)
}

func (b *Backend) listHosts(w http.ResponseWriter, r *http.Request) {
	var hosts []wire.Host
	if b.Hosts != nil {
		hosts = b.Hosts()
	}
	writeJSON(w, http.StatusOK, map[string]any{"api_version": wire.APIVersion, "hosts": hosts})
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
	if list, err := b.Engines.List(); err == nil {
		snap.Engines = list
	}
	if b.Hosts != nil {
		snap.Hosts = b.Hosts()
	}
	writeJSON(w, http.StatusOK, snap)
}
