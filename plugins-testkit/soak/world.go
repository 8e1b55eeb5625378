// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package soak

import (
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/capyctl/capyctl/plugins-testkit/conformance"
	"github.com/capyctl/capyctl/plugins-testkit/harness"
)

// The simulated machine: one 24 GiB card and a bounded share of host RAM.
// The pool's models take 5 to 9 GiB each on the card, so at most three or
// four fit at once and a request for another one switches.
var simGPU = harness.SimGPU{Devices: 1, DeviceMemory: "24GiB", SystemLimit: "6GiB", SystemReserve: "512MiB"}

// families are the driver families the soak runs, as the role names
// their drivers (capyctl driver <family>).
var families = []string{"custom", "vllm", "sglang", "llamacpp", "tensorfold"}

// depSpec is one deployment of the pool: its name, engine registration,
// family and the job spec body (without the name) of each revision.
type depSpec struct {
	name   string
	engine string
	family string
	// lmcache: the instance runs a private LMCache server.
	lmcache bool
	// parks: its residency parks (deep or host_backed) instead of
	// stopping.
	parks bool
	// body renders the spec's blocks for a revision variant.
	body func(variant int) string
}

// requestDeadline bounds every request of the pool until its first output
// (the deployments' request_deadline); a request's whole bound adds the
// answer's length and a margin (requestBound).
const requestDeadline = "20s"

// common are the blocks every deployment of the pool carries: bounded
// timeouts, so that the transitional-state bounds are short, and the
// request deadline. variant changes max_concurrent_requests, so that an
// update is a real new revision.
func common(variant int, idle bool) string {
	s := fmt.Sprintf(`  request_deadline = %q
  timeouts {
    initialize = "30s"
    wake       = "30s"
    stop       = "20s"
  }
`, requestDeadline)
	if idle {
		s += `  lifecycle {
    ready_idle_timeout  = "3s"
    parked_idle_timeout = "5s"
  }
`
	}
	return s
}

// pool are the deployments the soak draws from.
func pool() []depSpec {
	mcr := func(variant, base int) int { return base - variant%3 }
	return []depSpec{
		{name: "cu-a", engine: "fake", family: "custom", body: func(v int) string {
			return fmt.Sprintf(`  engine = "fake"
  model {
    path = "cu-a"
  }
  resources {
    gpu = "6GiB"
    ram = "256MiB"
  }
  engine_config {
    max_concurrent_requests = %d
  }
%s`, mcr(v, 16), common(v, true))
		}},
		{name: "cu-b", engine: "fake", family: "custom", body: func(v int) string {
			return fmt.Sprintf(`  engine = "fake"
  model {
    path = "cu-b"
  }
  resources {
    gpu = "8GiB"
    ram = "256MiB"
  }
  engine_config {
    max_concurrent_requests = %d
  }
%s`, mcr(v, 8), common(v, false))
		}},
		{name: "vl-deep", engine: "vllm", family: "vllm", parks: true, body: func(v int) string {
			return fmt.Sprintf(`  engine    = "vllm"
  residency = "deep"
  lmcache   = "off"
  model {
    path = "vl-deep/model"
  }
  engine_config {
    max_concurrent_requests = %d
    memory {
      request = "7GiB"
      startup = "7GiB"
    }
  }
%s`, mcr(v, 16), common(v, true))
		}},
		{name: "vl-cache", engine: "vllm", family: "vllm", lmcache: true, body: func(v int) string {
			return fmt.Sprintf(`  engine       = "vllm"
  residency    = "restart_only"
  lmcache      = "required"
  lmcache_pool = "1GiB"
  model {
    path = "vl-cache/model"
  }
  engine_config {
    max_concurrent_requests = %d
    memory {
      request = "5GiB"
      startup = "5GiB"
    }
  }
%s`, mcr(v, 16), common(v, false))
		}},
		{name: "sg-deep", engine: "sglang", family: "sglang", parks: true, body: func(v int) string {
			return fmt.Sprintf(`  engine    = "sglang"
  residency = "deep"
  lmcache   = "off"
  model {
    path = "sg-deep/model"
  }
  engine_config {
    max_concurrent_requests = %d
    memory {
      request = "7GiB"
      startup = "7GiB"
    }
  }
%s`, mcr(v, 16), common(v, false))
		}},
		{name: "ll-stories", engine: "llamacpp", family: "llamacpp", body: func(v int) string {
			return fmt.Sprintf(`  engine = "llamacpp"
  model {
    path = "ll-stories"
  }
  engine_config {
    max_concurrent_requests = %d
  }
%s`, 4-v%2, common(v, true))
		}},
		{name: "tf-fold", engine: "tensorfold", family: "tensorfold", body: func(v int) string {
			return fmt.Sprintf(`  engine = "tensorfold"
  model {
    path = "tf-fold"
  }
  resources {
    gpu = "5GiB"
    ram = "512MiB"
  }
  engine_config {
    context_length = %d
  }
%s`, 4096>>(v%2), common(v, false))
		}},
	}
}

// render is a deployment's whole job spec at a revision variant.
func (d depSpec) render(variant int) string {
	return fmt.Sprintf("deployment %q {\n%s}\n", d.name, d.body(variant))
}

// setupEngines registers the fake engines of every family on the role
// and writes the pool's model directories.
func setupEngines(r *harness.Role, t testing.TB) error {
	// custom: the testkit's fake engine under a manifest.
	r.AddFakeEngine("fake", "--token-rate", "400", "--sim-weights", "3GiB", "--sim-kv", "512MiB")
	// vLLM 0.32 with LMCache 0.5.6, and SGLang 0.5.22: venvs whose
	// interpreter is the fake engine.
	fakeEnv := []string{"--env", "CAPYCTL_FAKE_SIM_WEIGHTS=3GiB", "--env", "CAPYCTL_FAKE_TOKEN_RATE=400"}
	for _, e := range []struct{ name, dist, version string }{{"vllm", "vllm", "0.32.0"}, {"sglang", "sglang", "0.5.22"}} {
		venv := conformance.FakeVenv(t, filepath.Join(r.StateDir, "engines", e.name), map[string]string{e.dist: e.version, "lmcache": "0.5.6"}, nil)
		args := append([]string{"engine", "add", venv, "--yes", "--name", e.name}, fakeEnv...)
		if out, errOut, code := r.CLI(args...); code != 0 {
			return fmt.Errorf("engine add %s: exit %d\n%s%s", e.name, code, out, errOut)
		}
	}
	// llama.cpp: the fake installed as llama-server.
	r.AddLlamaServer("llamacpp", "--env", "CAPYCTL_FAKE_TOKEN_RATE=400")
	// TensorFold 0.6.6 with its build tools; its kernels count as built.
	built := filepath.Join(r.StateDir, "kernels-built")
	if err := os.WriteFile(built, nil, 0o644); err != nil {
		return err
	}
	venv := r.FakeTensorFoldVenv("tensorfold", "0.6.6", true)
	if out, errOut, code := r.CLI("engine", "add", venv, "--name", "tensorfold", "--yes",
		"--env", "CAPYCTL_FAKE_KERNEL_BUILD_FILE="+built, "--env", "CAPYCTL_FAKE_TOKEN_RATE=400"); code != 0 {
		return fmt.Errorf("engine add tensorfold: exit %d\n%s%s", code, out, errOut)
	}
	models := filepath.Join(r.StateDir, "models")
	for _, name := range []string{"cu-a", "cu-b"} {
		r.WriteFile("models/"+name+"/README", "fake model\n")
	}
	for _, name := range []string{"vl-deep", "vl-cache", "sg-deep"} {
		conformance.FakeModel(t, filepath.Join(models, name), 4<<20)
	}
	r.PutModel("ll-stories", map[string]string{"stories260K.gguf": harness.StoriesGGUF()})
	// A TensorFold checkpoint of 1 MiB of weights.
	hdr := fmt.Sprintf(`{"w":{"dtype":"U8","shape":[%d],"data_offsets":[0,%d]}}`, 1<<20, 1<<20)
	b := make([]byte, 8+len(hdr)+1<<20)
	binary.LittleEndian.PutUint64(b, uint64(len(hdr)))
	copy(b[8:], hdr)
	if err := os.MkdirAll(filepath.Join(models, "tf-fold"), 0o755); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(models, "tf-fold", "model.safetensors"), b, 0o644)
}

// familyOfEngine maps an engine registration to its driver family.
func familyOfEngine(engine string) string {
	if engine == "fake" {
		return "custom"
	}
	return strings.TrimSpace(engine)
}
