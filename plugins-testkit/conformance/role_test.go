// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package conformance_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/capyctl/capyctl/plugins-testkit/conformance"
	"github.com/capyctl/capyctl/plugins-testkit/harness"
)

// TestRole_EngineAddAndServe registers a vLLM and an SGLang venv through
// `capyctl engine add <venv>` (the family and version detected from the
// dist-info), deploys a model on each, and serves a request through the
// core's router to each fake engine.
func TestRole_EngineAddAndServe(t *testing.T) {
	r := harness.StartStandalone(t, harness.Options{})
	for _, e := range []struct {
		family, dist, version string
	}{{"vllm", "vllm", "0.32.0"}, {"sglang", "sglang", "0.5.21"}} {
		venv := conformance.FakeVenv(t, t.TempDir(), map[string]string{e.dist: e.version}, nil)
		out, errOut, code := r.CLI("engine", "add", venv, "--yes", "--json")
		if code != 0 {
			t.Fatalf("engine add %s: exit %d\n%s%s", e.family, code, out, errOut)
		}
		var det struct {
			Engine struct {
				Name, Family, Version string
				Verified              bool
			} `json:"engine"`
			Registered bool `json:"registered"`
		}
		if err := json.Unmarshal([]byte(out), &det); err != nil {
			t.Fatalf("engine add --json: %v\n%s", err, out)
		}
		if !det.Registered || det.Engine.Family != e.family || det.Engine.Version != e.version || !det.Engine.Verified {
			t.Fatalf("engine add %s registered %+v", e.family, det)
		}
		spec := harness.SimpleSpec("m-"+e.family, e.family)
		if out, errOut, code := r.Deploy("m-"+e.family, spec, "--activate", "--wait"); code != 0 {
			t.Fatalf("deploy on %s: exit %d\n%s%s\nrole:\n%s", e.family, code, out, errOut, r.Output())
		}
		resp, err := r.Chat(context.Background(), harness.ChatBody("m-"+e.family, false, "hello"), nil)
		if err != nil {
			t.Fatal(err)
		}
		if body := harness.ReadAll(resp); resp.StatusCode != http.StatusOK || !strings.Contains(body, `"content"`) {
			t.Fatalf("chat through the router to %s: %d %s", e.family, resp.StatusCode, body)
		}
	}
	out, _, code := r.CLI("engine", "list")
	if code != 0 || !strings.Contains(out, "vllm") || !strings.Contains(out, "0.5.21") || !strings.Contains(out, "verified") {
		t.Fatalf("engine list:\n%s", out)
	}
	out, _, code = r.CLI("engine", "flags", "sglang", "--json")
	if code != 0 || !strings.Contains(out, "--debug-tensor-dump-*") || !strings.Contains(out, "SGLANG_PLUGINS") {
		t.Fatalf("engine flags sglang:\n%s", out)
	}
	// A reserved option is refused when the deployment is written.
	bad := `deployment "bad" {
  engine = "vllm"
  model {
    path = "bad"
  }
  engine_config {
    accept_extra_args = true
    extra_args        = ["--api-key", "x"]
  }
}
`
	out, errOut, code := r.Deploy("bad", bad)
	if code == 0 || !strings.Contains(out+errOut, "engine_option_reserved:--api-key") {
		t.Fatalf("deploy with a reserved option: exit %d\n%s%s", code, out, errOut)
	}
}

// TestRole_ParkWakeOnSimulatedGPU deploys a model on each engine of a role
// with a simulated GPU, parks it through the CLI (the card keeps only the
// residue), and wakes it with a request.
func TestRole_ParkWakeOnSimulatedGPU(t *testing.T) {
	for _, e := range []struct{ family, version string }{{"vllm", "0.31.0"}, {"sglang", "0.5.22"}} {
		t.Run(e.family, func(t *testing.T) {
			r := harness.StartSimulated(t, harness.SimGPU{DeviceMemory: "40GiB", SystemLimit: "12GiB"}, harness.Options{})
			venv := conformance.FakeVenv(t, t.TempDir(), map[string]string{e.family: e.version}, nil)
			if out, errOut, code := r.CLI("engine", "add", venv, "--yes"); code != 0 {
				t.Fatalf("engine add: exit %d\n%s%s", code, out, errOut)
			}
			// Small weights: the role measures the model by reading it all.
			conformance.FakeModel(t, filepath.Join(r.StateDir, "models", "m"), 128<<20)
			spec := fmt.Sprintf(`deployment "m" {
  engine = %q
  model {
    path = "m/model"
  }
  engine_config {
    memory {
      kv_cache = "1GiB"
    }
  }
}
`, e.family)
			r.MustDeployFile("m", spec)
			held := func() int64 {
				var n int64
				for _, a := range r.SimState().Allocations {
					n += a.Bytes
				}
				return n
			}
			ready := held()
			if ready < 1<<30 {
				t.Fatalf("the ready engine holds %d bytes, less than its weights", ready)
			}
			if out, errOut, code := r.CLI("park", "deployment", "m", "--wait"); code != 0 {
				t.Fatalf("park: exit %d\n%s%s\nrole:\n%s", code, out, errOut, r.Output())
			}
			if st := deploymentState(t, r, "m"); st != "parked" {
				t.Fatalf("after park the deployment is %s", st)
			}
			if parked := held(); parked <= 0 || parked >= ready {
				t.Fatalf("parked: %d bytes held, ready %d: want a residue", parked, ready)
			}
			// A crash of the role: the engine stays parked; the role that
			// comes back re-attaches to it parked and, the deployment being
			// wanted running, wakes it (the wake check against the answer
			// recorded at its first start).
			r.Kill9()
			r.Restart()
			harness.Eventually(t, 30*time.Second, "the re-attached deployment woken", func() bool { return deploymentState(t, r, "m") == "ready" })
			if n := held(); n != ready {
				t.Fatalf("re-attached and woken: %d bytes held, want %d", n, ready)
			}
			if out, errOut, code := r.CLI("park", "deployment", "m", "--wait"); code != 0 {
				t.Fatalf("park after the restart: exit %d\n%s%s", code, out, errOut)
			}
			resp, err := r.Chat(context.Background(), harness.ChatBody("m", false, "wake up"), nil)
			if err != nil {
				t.Fatal(err)
			}
			if body := harness.ReadAll(resp); resp.StatusCode != http.StatusOK {
				t.Fatalf("a request to the parked model: %d %s\nrole:\n%s", resp.StatusCode, body, r.Output())
			}
			if st := deploymentState(t, r, "m"); st != "ready" {
				t.Fatalf("after the wake the deployment is %s", st)
			}
			if n := held(); n != ready {
				t.Fatalf("woken: %d bytes held, want %d", n, ready)
			}
		})
	}
}

// deploymentState is the deployment's aggregated state from status --json.
func deploymentState(t *testing.T, r *harness.Role, name string) string {
	t.Helper()
	out, errOut, code := r.CLI("status", "deployment", name, "--json")
	if code != 0 {
		t.Fatalf("status: exit %d %s", code, errOut)
	}
	var st struct {
		State string `json:"state"`
	}
	if err := json.Unmarshal([]byte(out), &st); err != nil {
		t.Fatalf("status json: %v\n%s", err, out)
	}
	return st.State
}

// TestRole_SGLangDecisions deploys a decision model on SGLang 0.5.22: the
// driver proves it ready with the readiness decision and the router serves
// POST /v1/systemone to it.
func TestRole_SGLangDecisions(t *testing.T) {
	r := harness.StartStandalone(t, harness.Options{})
	venv := conformance.FakeVenv(t, t.TempDir(), map[string]string{"sglang": "0.5.22"}, nil)
	if out, errOut, code := r.CLI("engine", "add", venv, "--yes"); code != 0 {
		t.Fatalf("engine add: exit %d\n%s%s", code, out, errOut)
	}
	spec := `deployment "judge" {
  engine = "sglang"
  api    = "decisions"
  model {
    path = "judge"
  }
}
`
	if out, errOut, code := r.Deploy("judge", spec, "--activate", "--wait"); code != 0 {
		t.Fatalf("deploy: exit %d\n%s%s\nrole:\n%s", code, out, errOut, r.Output())
	}
	body := `{"model":"judge","state":"The kettle is boiling.","questions":[{"id":"q","type":"noul","text":"Is the water hot?"}]}`
	req, err := http.NewRequest(http.MethodPost, r.InferenceURL()+"/v1/systemone", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+r.Creds.APIKey)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if out := harness.ReadAll(resp); resp.StatusCode != http.StatusOK || !strings.Contains(out, `"probabilities"`) {
		t.Fatalf("decision through the router: %d %s", resp.StatusCode, out)
	}
}
