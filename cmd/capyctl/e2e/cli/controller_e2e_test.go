// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package cli_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/capyctl/capyctl/core/api/client"
	"github.com/capyctl/capyctl/core/api/wire"
	"github.com/capyctl/capyctl/core/structs"
	"github.com/capyctl/capyctl/plugins-testkit/conformance"
	"github.com/capyctl/capyctl/plugins-testkit/harness"
)

func codeOf(err error) structs.Code {
	var se *structs.Error
	if errors.As(err, &se) {
		return se.Code
	}
	return ""
}

// nextEvents reads events until one of kind for instance (or deployment
// when instance is "") arrives, returning every event read.
func nextEvents(t *testing.T, s *client.EventStream, kind, instance string) []*wire.Event {
	t.Helper()
	var out []*wire.Event
	for {
		ev, err := s.Next()
		if err != nil {
			t.Fatalf("waiting for %s: %v (read %d events)", kind, err, len(out))
		}
		out = append(out, ev)
		if ev.Kind == kind && (instance == "" || ev.Instance == instance) {
			return out
		}
	}
}

// TestController_WholeLifecycleThroughTheAPI is a controller program's view:
// everything goes through the management API's Go client.
func TestController_WholeLifecycleThroughTheAPI(t *testing.T) {
	// A simulated card and a fake vLLM, so the model really parks.
	r := harness.StartSimulated(t, harness.SimGPU{SystemLimit: "16GiB", SystemReserve: "1GiB"}, harness.Options{})
	cl := r.Mgmt
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	// An engine, registered the way the CLI does it: detect, then pin the
	// digest the operator confirmed.
	venv := conformance.FakeVenv(t, t.TempDir(), map[string]string{"vllm": "0.32.0"}, nil)
	add := wire.EngineAddRequest{Name: "fake", Family: structs.FamilyVLLM, Path: venv,
		Approvals: structs.Approvals{Env: []string{"HF_TOKEN"}}}
	addConfirmed(ctx, t, cl, add)
	conformance.FakeModel(t, r.StateDir+"/models/ctl", 1<<20)

	// The snapshot gives the state and the cursor to follow from.
	snap, err := cl.Snapshot(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if snap.Role.Role != "standalone" || len(snap.Engines) != 1 || len(snap.Deployments) != 0 || !strings.Contains(snap.Cursor, ":") {
		t.Fatalf("snapshot %+v", snap)
	}
	stream, err := cl.Events(ctx, snap.Cursor)
	if err != nil {
		t.Fatal(err)
	}

	// Create with an idempotency key; an exact retry replays the answer.
	doc := json.RawMessage(`{"name":"ctl","engine":"fake","model":{"path":"ctl/model"},"engine_config":{"env":{"HF_TOKEN":"hf_secretsecretsecret"}}}`)
	k1 := client.NewIdempotencyKey()
	created, err := cl.DeployDocument(ctx, doc, false, 0, k1)
	if err != nil {
		t.Fatal(err)
	}
	if !created.Created || created.Revision != 1 || created.Replayed {
		t.Fatalf("create %+v", created)
	}
	again, err := cl.DeployDocument(ctx, doc, false, 0, k1)
	if err != nil {
		t.Fatal(err)
	}
	if !again.Replayed || again.Revision != 1 || !again.Created {
		t.Fatalf("retry of the create: %+v", again)
	}
	// The same key with another body is a conflict; a create of an
	// existing deployment without its revision is a conflict too.
	if _, err := cl.DeployDocument(ctx, doc, true, 0, k1); codeOf(err) != structs.CodeIdempotencyConflict {
		t.Fatalf("same key, other body: %v", err)
	}
	if _, err := cl.DeployDocument(ctx, doc, false, 0, client.NewIdempotencyKey()); codeOf(err) != structs.CodeConflict {
		t.Fatalf("second create: %v", err)
	}
	evs := nextEvents(t, stream, "deployment_created", "")
	if evs[len(evs)-1].Deployment != "ctl" {
		t.Fatalf("created event %+v", evs)
	}

	// An update names the revision it replaces.
	doc2 := json.RawMessage(`{"name":"ctl","engine":"fake","model":{"path":"ctl/model"},"request_deadline":"90s","engine_config":{"env":{"HF_TOKEN":"hf_secretsecretsecret"}}}`)
	up, err := cl.DeployDocument(ctx, doc2, false, 1, client.NewIdempotencyKey())
	if err != nil {
		t.Fatal(err)
	}
	if up.Created || up.Revision != 2 {
		t.Fatalf("update %+v", up)
	}
	if _, err := cl.DeployDocument(ctx, doc2, false, 1, client.NewIdempotencyKey()); codeOf(err) != structs.CodeRevisionConflict {
		t.Fatalf("update of a replaced revision: %v", err)
	}
	nextEvents(t, stream, "deployment_revised", "")

	// Start and wait; the retry of the start replays without acting.
	k3 := client.NewIdempotencyKey()
	acc, err := cl.Action(ctx, "ctl", wire.ActionRequest{Action: wire.ActionStart, Wait: true, ExpectedRevision: 2}, client.WithIdempotencyKey(k3))
	if err != nil {
		t.Fatalf("start: %v\n%s", err, r.Output())
	}
	if !acc.Done || acc.Revision != 2 || acc.Replayed {
		t.Fatalf("start %+v", acc)
	}
	nextEvents(t, stream, "instance_ready", "ctl/0")
	if acc, err := cl.Action(ctx, "ctl", wire.ActionRequest{Action: wire.ActionStart, Wait: true, ExpectedRevision: 2}, client.WithIdempotencyKey(k3)); err != nil || !acc.Replayed {
		t.Fatalf("retry of the start: %+v %v", acc, err)
	}
	if _, err := cl.Action(ctx, "ctl", wire.ActionRequest{Action: wire.ActionStop, ExpectedRevision: 1}); codeOf(err) != structs.CodeRevisionConflict {
		t.Fatalf("action on an old revision: %v", err)
	}
	if _, err := cl.Action(ctx, "ctl", wire.ActionRequest{Action: wire.ActionStop, Evict: true}); codeOf(err) != structs.CodeInvalidRequest {
		t.Fatalf("evict with stop: %v", err)
	}

	// The effective configuration: completed spec, provenance, the
	// rendered launch; secrets redacted.
	eff, err := cl.EffectiveConfig(ctx, "ctl")
	if err != nil {
		t.Fatal(err)
	}
	if eff.Revision != 2 || eff.Provenance["request_deadline"] != "file" || eff.Provenance["instances"] != "default" {
		t.Fatalf("effective config %+v", eff)
	}
	if eff.Spec.EngineConfig.Env["HF_TOKEN"] != wire.Redacted || len(eff.Instances) != 1 || len(eff.Instances[0].Argv) == 0 {
		t.Fatalf("effective config spec/launch %+v", eff)
	}
	if raw, _ := json.Marshal(eff); strings.Contains(string(raw), "hf_secret") {
		t.Fatalf("a secret leaked: %s", raw)
	}
	rc, err := cl.RoleConfig(ctx)
	if err != nil {
		t.Fatal(err)
	}
	sources := map[string]string{}
	for _, s := range rc.Settings {
		sources[s.Path] = s.From
	}
	if rc.Role != "standalone" || sources["listen"] != "flag" || sources["log_level"] != "default" {
		t.Fatalf("role config %+v", rc)
	}
	if log, err := cl.EngineLog(ctx, "ctl", 0, 4); err != nil || log.Deployment != "ctl" {
		t.Fatalf("engine log %+v %v", log, err)
	}
	if hosts, err := cl.Hosts(ctx); err != nil || len(hosts) != 1 || !hosts[0].Online {
		t.Fatalf("hosts %+v %v", hosts, err)
	}

	// Disconnect; what happens meanwhile is delivered after a reconnect
	// with the last cursor, in order, nothing repeated.
	last := stream.Cursor
	lastSeq := evs[len(evs)-1].Seq
	stream.Close()
	// Park: the fake vLLM sleeps and frees its memory; its process stays.
	if acc, err := cl.Action(ctx, "ctl", wire.ActionRequest{Action: wire.ActionPark, Wait: true}); err != nil || !acc.Done {
		t.Fatalf("park: %+v %v", acc, err)
	}
	if st, err := cl.Deployment(ctx, "ctl"); err != nil || st.Instances[0].State != "parked" || st.Instances[0].Residency != structs.ResidencyDeep {
		t.Fatalf("after park: %+v %v", st, err)
	}
	parkedTo := "instance_parked"
	if _, err := cl.Action(ctx, "ctl", wire.ActionRequest{Action: wire.ActionStop, Wait: true}); err != nil {
		t.Fatalf("stop: %v", err)
	}
	stream, err = cl.Events(ctx, last)
	if err != nil {
		t.Fatal(err)
	}
	defer stream.Close()
	resumed := nextEvents(t, stream, parkedTo, "ctl/0")
	resumed = append(resumed, nextEvents(t, stream, "deployment_desired", "")...)
	prev := lastSeq
	for _, ev := range resumed {
		if ev.Seq <= prev {
			t.Fatalf("event %d after %d: repeated or out of order", ev.Seq, prev)
		}
		prev = ev.Seq
	}
	st, err := cl.Deployment(ctx, "ctl")
	if err != nil || st.State != "stopped" || st.Desired != structs.DesiredStopped {
		t.Fatalf("after stop: %+v %v", st, err)
	}

	// Instance actions.
	if acc, err := cl.InstanceAction(ctx, "ctl", 0, wire.ActionRequest{Action: wire.ActionStart, Wait: true}); err != nil || !acc.Done || acc.Instance == nil || *acc.Instance != 0 {
		t.Fatalf("instance start: %+v %v", acc, err)
	}
	if st, err := cl.Deployment(ctx, "ctl"); err != nil || st.Instances[0].State != "ready" {
		t.Fatalf("after instance start: %+v %v", st, err)
	}
	if _, err := cl.InstanceAction(ctx, "ctl", 5, wire.ActionRequest{Action: wire.ActionStop}); codeOf(err) != structs.CodeNotFound {
		t.Fatalf("instance 5: %v", err)
	}
	if _, err := cl.Action(ctx, "ctl", wire.ActionRequest{Action: wire.ActionStop, Wait: true}); err != nil {
		t.Fatalf("stop: %v", err)
	}

	// Delete under a key; its retry replays even though the deployment is
	// gone.
	k4 := client.NewIdempotencyKey()
	if err := cl.Delete(ctx, "ctl", client.WithIdempotencyKey(k4)); err != nil {
		t.Fatal(err)
	}
	if err := cl.Delete(ctx, "ctl", client.WithIdempotencyKey(k4)); err != nil {
		t.Fatalf("retry of the delete: %v", err)
	}
	if err := cl.Delete(ctx, "ctl"); codeOf(err) != structs.CodeNotFound {
		t.Fatalf("delete without the key: %v", err)
	}
	nextEvents(t, stream, "deployment_deleted", "")
	if snap, err := cl.Snapshot(ctx); err != nil || len(snap.Deployments) != 0 {
		t.Fatalf("snapshot after delete: %+v %v", snap, err)
	}
	if left := harness.EnginePIDs(r.StateDir); len(left) != 0 {
		t.Fatalf("engines left: %v", left)
	}
	// Retryable errors are the catalogue's.
	if client.Retryable(structs.Errf(structs.CodeIdempotencyConflict, "x")) || !client.Retryable(structs.Errf(structs.CodeCapacityBlocked, "x")) {
		t.Fatal("Retryable disagrees with the catalogue")
	}
}

// addConfirmed registers an engine as a controller does: a dry run shows
// the digest, and the add confirms it.
func addConfirmed(ctx context.Context, t *testing.T, cl *client.Client, add wire.EngineAddRequest) {
	t.Helper()
	dry := add
	dry.DryRun = true
	det, err := cl.AddEngine(ctx, dry)
	if err != nil {
		t.Fatal(err)
	}
	add.ExpectDigest = det.Engine.Digest
	if _, err := cl.AddEngine(ctx, add); err != nil {
		t.Fatal(err)
	}
}
