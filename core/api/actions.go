// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package api

import (
	"context"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/gorilla/mux"

	"github.com/capyctl/capyctl/core/api/wire"
	"github.com/capyctl/capyctl/core/lifecycle"
	"github.com/capyctl/capyctl/core/structs"
)

// readAction reads and checks an action body: the action must be one of
// allowed, evict goes with start only, and expected_revision, when set,
// must be the deployment's current revision.
func (b *Backend) readAction(data []byte, name string, allowed ...string) (*wire.ActionRequest, *lifecycle.DeploymentView, error) {
	var req wire.ActionRequest
	if err := decodeStrict(data, &req); err != nil {
		return nil, nil, err
	}
	ok := false
	for _, a := range allowed {
		ok = ok || req.Action == a
	}
	if !ok {
		return nil, nil, structs.Errf(structs.CodeInvalidRequest, "unknown action %q (one of %s)", req.Action, strings.Join(allowed, ", "))
	}
	if req.Evict && req.Action != wire.ActionStart {
		return nil, nil, structs.Errf(structs.CodeInvalidRequest, "evict goes with start only, not %s", req.Action)
	}
	v, err := b.Lifecycle.Deployment(name)
	if err != nil {
		return nil, nil, err
	}
	if req.ExpectedRevision != 0 && req.ExpectedRevision != v.Record.Revision {
		return nil, nil, structs.Errf(structs.CodeRevisionConflict, "deployment %s is at revision %d, not %d",
			name, v.Record.Revision, req.ExpectedRevision).WithDetail("current_revision", v.Record.Revision)
	}
	return &req, v, nil
}

// actionContext is the context an action runs under: the request's while
// the client waits for the outcome; without wait the action goes on after
// the answer, so it must not end with the request.
func actionContext(r *http.Request, req *wire.ActionRequest) context.Context {
	if req.Wait {
		return r.Context()
	}
	return context.WithoutCancel(r.Context())
}

// accepted is an action's answer: 200 when it completed (wait, delete),
// 202 when it was accepted and goes on.
func accepted(req *wire.ActionRequest, name string, instance *int, rev uint64, at time.Time) (int, any) {
	done := req.Wait || req.Action == wire.ActionDelete
	status := http.StatusAccepted
	if done {
		status = http.StatusOK
	}
	return status, wire.ActionAccepted{APIVersion: wire.APIVersion, Deployment: name, Instance: instance,
		Action: req.Action, Revision: rev, AcceptedAt: at, Done: done}
}

func (b *Backend) deploymentAction(w http.ResponseWriter, r *http.Request) {
	name := mux.Vars(r)["name"]
	data, err := readBody(r)
	if err != nil {
		writeMgmtError(w, err)
		return
	}
	b.idempotent(w, r, data, func() (int, any, error) {
		req, v, err := b.readAction(data, name, wire.ActionStart, wire.ActionStop, wire.ActionPark, wire.ActionDelete)
		if err != nil {
			return 0, nil, err
		}
		at := time.Now().UTC()
		ctx := actionContext(r, req)
		switch req.Action {
		case wire.ActionStart:
			err = b.Lifecycle.StartDeployment(ctx, name, lifecycle.StartOptions{Wait: req.Wait, Evict: req.Evict})
		case wire.ActionStop:
			err = b.Lifecycle.StopDeployment(ctx, name, req.Wait)
		case wire.ActionDelete:
			err = b.Lifecycle.DeleteDeployment(ctx, name)
		case wire.ActionPark:
			err = b.Lifecycle.ParkDeployment(ctx, name, req.Wait)
		}
		if err != nil {
			return 0, nil, err
		}
		status, out := accepted(req, name, nil, v.Record.Revision, at)
		return status, out, nil
	})
}

func (b *Backend) instanceAction(w http.ResponseWriter, r *http.Request) {
	name := mux.Vars(r)["name"]
	idx, err := strconv.Atoi(mux.Vars(r)["index"])
	if err != nil || idx < 0 {
		writeMgmtError(w, structs.Errf(structs.CodeInvalidRequest, "instance index %q is not a non-negative integer", mux.Vars(r)["index"]))
		return
	}
	data, err := readBody(r)
	if err != nil {
		writeMgmtError(w, err)
		return
	}
	b.idempotent(w, r, data, func() (int, any, error) {
		req, v, err := b.readAction(data, name, wire.ActionStart, wire.ActionStop, wire.ActionPark)
		if err != nil {
			return 0, nil, err
		}
		found := false
		for _, in := range v.Instances {
			found = found || in.Index == idx
		}
		if !found {
			return 0, nil, structs.Errf(structs.CodeNotFound, "deployment %s has no instance %d (it has %d)", name, idx, len(v.Instances))
		}
		at := time.Now().UTC()
		ctx := actionContext(r, req)
		switch req.Action {
		case wire.ActionStart:
			err = b.Lifecycle.StartInstance(ctx, name, idx, lifecycle.StartOptions{Wait: req.Wait, Evict: req.Evict})
		case wire.ActionStop:
			err = b.Lifecycle.StopInstance(ctx, name, idx, req.Wait)
		case wire.ActionPark:
			err = b.Lifecycle.ParkInstance(ctx, name, idx, req.Wait)
		}
		if err != nil {
			return 0, nil, err
		}
		status, out := accepted(req, name, &idx, v.Record.Revision, at)
		return status, out, nil
	})
}
