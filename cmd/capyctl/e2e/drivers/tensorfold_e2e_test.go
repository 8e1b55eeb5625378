// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package drivers_test

import (
	"context"
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/capyctl/capyctl/cmd/capyctl/internal/e2e"
	"github.com/capyctl/capyctl/plugins-testkit/harness"
)

// foldSpec deploys a TensorFold model with its declared memory.
const foldSpec = `deployment "fold" {
  engine = "tensorfold"
  model {
    path = "fold"
  }
  resources {
    gpu = "2GiB"
    ram = "1GiB"
  }
  engine_config {
    context_length = 4096
  }
}
`

// TestTensorFold_WholeRole registers a fake TensorFold venv (refused while
// its build tools are missing), deploys a model whose first request builds
// kernels, and checks the engine is capped at its declared 2 GiB.
func TestTensorFold_WholeRole(t *testing.T) {
	r := harness.StartSimulated(t, harness.SimGPU{}, harness.Options{})
	bare := r.FakeTensorFoldVenv("tf-bare", "0.6.6", false)
	out, errOut, code := r.CLI("engine", "add", bare, "--name", "tf-bare", "--yes")
	if code != 26 || !strings.Contains(errOut, "toolchain_missing") || !strings.Contains(errOut, "ninja") || !strings.Contains(errOut, "nvcc") {
		t.Fatalf("engine add without build tools: exit %d\n%s%s", code, out, errOut)
	}
	built := filepath.Join(r.StateDir, "kernels-built")
	venv := r.FakeTensorFoldVenv("tensorfold", "0.6.6", true)
	if out, errOut, code := r.CLI("engine", "add", venv, "--name", "tensorfold", "--yes", "--env", "CAPYCTL_FAKE_KERNEL_BUILD_FILE="+built); code != 0 {
		t.Fatalf("engine add: exit %d\n%s%s", code, out, errOut)
	}

	// A checkpoint of 1 MiB of weights.
	dir := filepath.Join(r.StateDir, "models", "fold")
	os.MkdirAll(dir, 0o755)
	hdr := fmt.Sprintf(`{"w":{"dtype":"U8","shape":[%d],"data_offsets":[0,%d]}}`, 1<<20, 1<<20)
	b := make([]byte, 8+len(hdr)+1<<20)
	binary.LittleEndian.PutUint64(b, uint64(len(hdr)))
	copy(b[8:], hdr)
	os.WriteFile(filepath.Join(dir, "model.safetensors"), b, 0o644)

	// Without resources, refused when written.
	noResources := strings.Replace(foldSpec, "  resources {\n    gpu = \"2GiB\"\n    ram = \"1GiB\"\n  }\n", "", 1)
	if _, errOut, code := r.DeployFile("fold", noResources); code != 2 || !strings.Contains(errOut, "resources") {
		t.Fatalf("no resources: exit %d %s", code, errOut)
	}

	// The first request builds the kernels: the start waits for it.
	if out, errOut, code := r.DeployFile("fold", foldSpec, "--activate"); code != 0 {
		t.Fatalf("deploy: exit %d\n%s%s", code, out, errOut)
	}
	harness.Eventually(t, 30*time.Second, "the kernel build", func() bool {
		log, err := r.Mgmt.EngineLog(context.Background(), "fold", 0, 64)
		return err == nil && strings.Contains(log.Text, "building CUDA kernels")
	})
	if s := e2e.Status(t, r, "fold").State; s != "starting" {
		t.Fatalf("state %s while the first request builds kernels, want starting", s)
	}
	if err := os.WriteFile(built, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	harness.Eventually(t, 60*time.Second, "ready", func() bool { return e2e.Status(t, r, "fold").State == "ready" })

	st := e2e.Status(t, r, "fold")
	if st.Instances[0].Driver != "tensorfold" || st.Instances[0].Residency != "restart_only" {
		t.Fatalf("status %+v", st.Instances[0])
	}
	// The engine holds exactly its cap: the weights and a KV cache that
	// fills the rest.
	var held int64
	for _, a := range r.SimState().Allocations {
		held += a.Bytes
	}
	if held != 2<<30 {
		t.Fatalf("TensorFold holds %d bytes on the card, want its 2 GiB cap", held)
	}
	e2e.ChatOK(t, r, "fold")
	out, _, code = r.CLI("engine", "flags", "tensorfold", "--format", "json")
	if code != 0 || !strings.Contains(out, `"name":"TENSORFOLD_API_KEY"`) || !strings.Contains(out, `"class":"reserved"`) {
		t.Fatalf("engine flags: %d %s", code, out)
	}
}
