// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"path/filepath"
	"testing"

	"github.com/capyctl/capyctl/core/api/wire"
	"github.com/capyctl/capyctl/plugins-testkit/conformance"
	"github.com/capyctl/capyctl/plugins-testkit/harness"
)

// StartWithDemo starts a role with the fake engine and one ready deployment.
func StartWithDemo(t *testing.T) *harness.Role {
	t.Helper()
	r := harness.StartStandalone(t, harness.Options{})
	r.AddFakeEngine("fake")
	r.MustDeploy("demo", harness.SimpleSpec("demo", "fake"))
	return r
}

// Status is `status deployment <name> --json` on the role.
func Status(t *testing.T, r *harness.Role, name string) wire.DeploymentStatus {
	t.Helper()
	out, errOut, code := r.CLI("status", "deployment", name, "--json")
	if code != 0 {
		t.Fatalf("status: exit %d: %s", code, errOut)
	}
	var st wire.DeploymentStatus
	if err := json.Unmarshal([]byte(out), &st); err != nil {
		t.Fatalf("status json: %v\n%s", err, out)
	}
	return st
}

// ChatOK sends a non-streamed request and requires a 200 answer.
func ChatOK(t *testing.T, r *harness.Role, model string) {
	t.Helper()
	resp, err := r.Chat(context.Background(), harness.ChatBody(model, false, "hello"), nil)
	if err != nil {
		t.Fatalf("chat: %v", err)
	}
	body := harness.ReadAll(resp)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("chat: %d %s", resp.StatusCode, body)
	}
}

// MemoryOf decodes a status's memory object.
func MemoryOf(t *testing.T, st wire.DeploymentStatus) wire.MemoryView {
	t.Helper()
	var mv wire.MemoryView
	data, _ := json.Marshal(st.Memory)
	if err := json.Unmarshal(data, &mv); err != nil {
		t.Fatalf("memory view: %v\n%s", err, data)
	}
	return mv
}

// SwitchMemory is each model's declared memory on SwitchRole's card. The
// card is 24 GiB (22.1 GiB managed). Each model is declared at 14 GiB
// ready and startup, and the fake engine holds 8 GiB of weights on the
// simulated card: one model fits, two do not, and one ready model beside
// the other's parked residue does.
const SwitchMemory = `  engine_config {
    memory {
      request = "14GiB"
      startup = "14GiB"
    }
  }
`

// SwitchRole starts a role on one simulated 24 GiB card with fake vLLM
// engines registered (name → extra `engine add` arguments) and deployments
// (name → engine, extra spec lines).
func SwitchRole(t *testing.T, engines map[string][]string, deps map[string][2]string) *harness.Role {
	t.Helper()
	r := harness.StartSimulated(t, harness.SimGPU{DeviceMemory: "24GiB", SystemLimit: "16GiB", SystemReserve: "1GiB"}, harness.Options{})
	for name, extra := range engines {
		venv := conformance.FakeVenv(t, t.TempDir(), map[string]string{"vllm": "0.32.0"}, nil)
		args := append([]string{"engine", "add", venv, "--name", name, "--yes", "--env", "CAPYCTL_FAKE_SIM_WEIGHTS=8GiB"}, extra...)
		if out, errOut, code := r.CLI(args...); code != 0 {
			t.Fatalf("engine add %s: exit %d\n%s%s", name, code, out, errOut)
		}
	}
	for name, d := range deps {
		conformance.FakeModel(t, filepath.Join(r.StateDir, "models", name), 1<<20)
		spec := fmt.Sprintf("deployment %q {\n  engine = %q\n  model {\n    path = \"%s/model\"\n  }\n%s%s}\n", name, d[0], name, SwitchMemory, d[1])
		f := r.WriteFile("specs/"+name+".hcl", spec)
		if out, errOut, code := r.CLI("deploy", "--file", f); code != 0 {
			t.Fatalf("deploy %s: exit %d\n%s%s", name, code, out, errOut)
		}
	}
	return r
}
