// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package cli_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/capyctl/capyctl/core/api/client"
	"github.com/capyctl/capyctl/core/api/wire"
	"github.com/capyctl/capyctl/core/structs"
	"github.com/capyctl/capyctl/plugins-testkit/conformance"
	"github.com/capyctl/capyctl/plugins-testkit/harness"
)

// TestSecrets_RedactedInEveryOutput creates a deployment whose
// engine_config.env holds two secrets (one known by its name only, one by
// its look too) through the management API, starts it, and checks that
// neither value appears in any output: /deployments, /deployments/{name},
// /snapshot, the events stream, `capyctl status deployment --json` and the
// role's own log.
func TestSecrets_RedactedInEveryOutput(t *testing.T) {
	const byName, byLook = "plain-leakcheck-value", "hf_leakcheckleakcheck"
	r := harness.StartSimulated(t, harness.SimGPU{SystemLimit: "16GiB", SystemReserve: "1GiB"}, harness.Options{})
	cl := r.Mgmt
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	venv := conformance.FakeVenv(t, t.TempDir(), map[string]string{"vllm": "0.32.0"}, nil)
	add := wire.EngineAddRequest{Name: "fake", Family: structs.FamilyVLLM, Path: venv,
		Approvals: structs.Approvals{Env: []string{"HF_TOKEN", "MY_API_KEY"}}}
	addConfirmed(ctx, t, cl, add)
	conformance.FakeModel(t, r.StateDir+"/models/sec", 1<<20)
	snap, err := cl.Snapshot(ctx)
	if err != nil {
		t.Fatal(err)
	}
	stream, err := cl.Events(ctx, snap.Cursor)
	if err != nil {
		t.Fatal(err)
	}

	doc := json.RawMessage(`{"name":"sec","engine":"fake","model":{"path":"sec/model"},
	  "engine_config":{"env":{"MY_API_KEY":"` + byName + `","HF_TOKEN":"` + byLook + `"}}}`)
	if _, err := cl.DeployDocument(ctx, doc, false, 0, client.NewIdempotencyKey()); err != nil {
		t.Fatal(err)
	}
	if _, err := cl.Action(ctx, "sec", wire.ActionRequest{Action: wire.ActionStart, Wait: true}); err != nil {
		t.Fatalf("start: %v\n%s", err, r.Output())
	}
	var events strings.Builder
	for _, ev := range nextEvents(t, stream, "instance_ready", "sec/0") {
		b, _ := json.Marshal(ev)
		events.Write(b)
	}

	get := func(path string) string {
		t.Helper()
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+r.Info.Management+"/management/v1"+path, nil)
		req.Header.Set("Authorization", "Bearer "+r.Creds.AdminToken)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("GET %s: %d %s", path, resp.StatusCode, b)
		}
		return string(b)
	}
	statusJSON, stderr, code := r.CLI("status", "deployment", "sec", "--json")
	if code != 0 {
		t.Fatalf("status: %d %s", code, stderr)
	}
	outputs := map[string]string{
		"GET /deployments":                      get("/deployments"),
		"GET /deployments/sec":                  get("/deployments/sec"),
		"GET /snapshot":                         get("/snapshot"),
		"GET /deployments/sec/effective-config": get("/deployments/sec/effective-config"),
		"the events stream":                     events.String(),
		"capyctl status deployment --json":      statusJSON + stderr,
		"the role's log":                        r.Output(),
	}
	for what, out := range outputs {
		for _, secret := range []string{byName, byLook} {
			if strings.Contains(out, secret) {
				t.Errorf("%s shows the secret %q", what, secret)
			}
		}
	}
	// The redaction is there, not an absent spec.
	var st wire.DeploymentStatus
	if err := json.Unmarshal([]byte(outputs["GET /deployments/sec"]), &st); err != nil || st.Spec == nil || st.Spec.EngineConfig.Env["MY_API_KEY"] != wire.Redacted {
		t.Errorf("GET /deployments/sec does not show the redacted variable (%v): %s", err, outputs["GET /deployments/sec"])
	}
}
