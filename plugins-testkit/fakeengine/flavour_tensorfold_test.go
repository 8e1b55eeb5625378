// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package fakeengine_test

import (
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/capyctl/capyctl/plugins-testkit/fakeengine"
)

// tfHealth reads TensorFold's /health.
type tfHealth struct {
	OK              bool   `json:"ok"`
	Status          string `json:"status"`
	RequestsRunning int    `json:"requests_running"`
	RequestsWaiting int    `json:"requests_waiting"`
	Busy            bool   `json:"busy"`
}

func (te *testEngine) tfHealth(t *testing.T, header map[string]string) (int, tfHealth) {
	t.Helper()
	status, data, _ := do(t, "GET", te.url+"/health", "", header)
	var h tfHealth
	json.Unmarshal(data, &h)
	return status, h
}

func TestTensorFold_LoadingAndModels(t *testing.T) {
	hold := filepath.Join(t.TempDir(), "go")
	te := startEngine(t, fakeengine.Config{ServedName: "fold", HoldStartupFile: hold, MaxRunning: 8,
		Flavour: fakeengine.NewTensorFold(fakeengine.TensorFoldOptions{Context: 8192})}, false)
	if status, h := te.tfHealth(t, nil); status != http.StatusServiceUnavailable || h.OK || h.Status != "loading" {
		t.Fatalf("health while loading: %d %+v", status, h)
	}
	os.WriteFile(hold, nil, 0o600)
	<-te.Ready()
	if status, h := te.tfHealth(t, nil); status != 200 || !h.OK || h.Busy || h.RequestsRunning != 0 {
		t.Fatalf("health: %d %+v", status, h)
	}
	_, data, _ := do(t, "GET", te.url+"/v1/models", "", nil)
	if !strings.Contains(string(data), `"owned_by":"tensorfold"`) || !strings.Contains(string(data), `"max_model_len":8192`) {
		t.Fatalf("models %s", data)
	}
	status, data := te.chat(t, chatBody("fold", "hi", nil))
	if status != 200 || !strings.Contains(string(data), `"tensorfold":{"prefill_ms":`) {
		t.Fatalf("chat %d %s", status, data)
	}
	if status, data := te.chat(t, chatBody("other", "hi", nil)); status != 404 {
		t.Fatalf("other model: %d %s", status, data)
	}
	m := te.metrics(t)
	for _, k := range []string{"tensorfold:requests_running", "tensorfold:requests_waiting", "tensorfold:kv_cache_usage_ratio"} {
		if _, ok := m[k]; !ok {
			t.Fatalf("metrics lack %s: %v", k, m)
		}
	}
}

// TestTensorFold_FirstRequestBuildsKernels: the first chat request waits
// for the kernel build while /health reports the engine busy; later
// requests do not build again.
func TestTensorFold_FirstRequestBuildsKernels(t *testing.T) {
	built := filepath.Join(t.TempDir(), "built")
	tf := fakeengine.NewTensorFold(fakeengine.TensorFoldOptions{KernelBuildFile: built})
	te := startEngine(t, fakeengine.Config{ServedName: "fold", Flavour: tf}, true)
	s, ready := startStream(t, te.url, chatBody("fold", "hi", map[string]any{"stream": true}), nil)
	waitFor(t, "busy during the build", func() bool {
		_, h := te.tfHealth(t, nil)
		return h.Busy && h.RequestsRunning == 1
	})
	select {
	case <-ready:
		t.Fatal("the first request was answered during the kernel build")
	default:
	}
	os.WriteFile(built, nil, 0o600)
	if err := <-ready; err != nil {
		t.Fatal(err)
	}
	s.next(t)
	s.cancel()
	waitFor(t, "idle", func() bool { _, h := te.tfHealth(t, nil); return !h.Busy })
	if status, _ := te.chat(t, chatBody("fold", "again", nil)); status != 200 || tf.KernelBuilds() != 1 {
		t.Fatalf("second request: %d, builds %d", status, tf.KernelBuilds())
	}
}

// TestTensorFold_KeyLocksEverything is why CapyCTL reserves
// TENSORFOLD_API_KEY: with a key, even /health and /metrics refuse.
func TestTensorFold_KeyLocksEverything(t *testing.T) {
	te := startEngine(t, fakeengine.Config{ServedName: "fold", APIKey: "k", Flavour: fakeengine.NewTensorFold(fakeengine.TensorFoldOptions{})}, true)
	for _, p := range []string{"/health", "/metrics", "/v1/models"} {
		if status, _, _ := do(t, "GET", te.url+p, "", nil); status != 401 {
			t.Fatalf("%s without the key: %d", p, status)
		}
	}
	if status, _ := te.tfHealth(t, map[string]string{"Authorization": "Bearer k"}); status != 200 {
		t.Fatalf("health with the key: %d", status)
	}
}
