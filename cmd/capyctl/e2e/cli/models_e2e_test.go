// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package cli_test

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/capyctl/capyctl/plugins-testkit/harness"
)

const hubCommit = "89abcdef0123456789abcdef0123456789abcdef"

// miniHub is a local Hugging Face hub serving one repository, org/tiny,
// that cuts the first transfer of its weights half way.
type miniHub struct {
	srv   *httptest.Server
	files map[string][]byte
	mu    sync.Mutex
	cut   bool
}

func newMiniHub(t *testing.T) *miniHub {
	h := &miniHub{files: map[string][]byte{
		"config.json":       []byte(`{"model_type":"llama"}`),
		"model.safetensors": make([]byte, 1<<20),
	}, cut: true}
	for i := range h.files["model.safetensors"] {
		h.files["model.safetensors"][i] = byte(i * 7)
	}
	h.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasPrefix(r.URL.Path, "/api/models/org/tiny/revision/") {
			var sib []map[string]any
			for n, b := range h.files {
				sum := sha256.Sum256(b)
				sib = append(sib, map[string]any{"rfilename": n, "size": len(b), "lfs": map[string]any{"sha256": hex.EncodeToString(sum[:]), "size": len(b)}})
			}
			json.NewEncoder(w).Encode(map[string]any{"sha": hubCommit, "siblings": sib})
			return
		}
		name := strings.TrimPrefix(r.URL.Path, "/org/tiny/resolve/"+hubCommit+"/")
		b, ok := h.files[name]
		if !ok {
			http.NotFound(w, r)
			return
		}
		start := 0
		if rg := r.Header.Get("Range"); rg != "" {
			start, _ = strconv.Atoi(strings.TrimSuffix(strings.TrimPrefix(rg, "bytes="), "-"))
			w.Header().Set("Content-Range", fmt.Sprintf("bytes %d-%d/%d", start, len(b)-1, len(b)))
			w.Header().Set("Content-Length", strconv.Itoa(len(b)-start))
			w.WriteHeader(http.StatusPartialContent)
		} else {
			w.Header().Set("Content-Length", strconv.Itoa(len(b)))
		}
		h.mu.Lock()
		cut := h.cut && name == "model.safetensors"
		h.cut = h.cut && !cut
		h.mu.Unlock()
		if cut {
			w.Write(b[start : len(b)/2])
			w.(http.Flusher).Flush()
			panic(http.ErrAbortHandler)
		}
		w.Write(b[start:])
	}))
	t.Cleanup(h.srv.Close)
	return h
}

func TestModelPull_ResumesAfterACutAndShowsProgress(t *testing.T) {
	hub := newMiniHub(t)
	bin, _ := harness.Binaries(t)
	root := t.TempDir()
	out, errOut, code := harness.RunCLI(t, bin, []string{"model", "pull", "org/tiny", "--models-root", root}, []string{"HF_ENDPOINT=" + hub.srv.URL})
	if code != 0 {
		t.Fatalf("model pull: exit %d\n%s%s", code, out, errOut)
	}
	if !strings.Contains(errOut, "fetching model.safetensors (1MiB)") || !strings.Contains(errOut, "resuming model.safetensors at 512KiB") {
		t.Fatalf("progress lines missing:\n%s", errOut)
	}
	if !strings.Contains(out, "Downloaded org/tiny at "+hubCommit[:12]+" (2 files") {
		t.Fatalf("summary: %s", out)
	}
	got, err := os.ReadFile(filepath.Join(root, "sources/huggingface/org/tiny", hubCommit, "model.safetensors"))
	if err != nil || string(got) != string(hub.files["model.safetensors"]) {
		t.Fatalf("downloaded weights differ: %v", err)
	}
	// Bad arguments are exit 2.
	if _, _, code := harness.RunCLI(t, bin, []string{"model", "pull"}, nil); code != 2 {
		t.Fatalf("no repository: exit %d", code)
	}
}

// TestModelHF_DownloadsOnFirstStartAndChecksFingerprint: a deployment
// naming a Hugging Face repository downloads it on its first start; a
// declared content_fingerprint that does not match is refused with both
// digests.
func TestModelHF_DownloadsOnFirstStartAndChecksFingerprint(t *testing.T) {
	hub := newMiniHub(t)
	r := harness.StartStandalone(t, harness.Options{Env: []string{"HF_ENDPOINT=" + hub.srv.URL}})
	r.AddFakeEngine("fake")
	spec := `deployment "tiny" {
  engine = "fake"
  model {
    hf = "org/tiny"
  }
}
`
	r.MustDeploy("tiny", spec)
	dir := filepath.Join(r.StateDir, "models/sources/huggingface/org/tiny", hubCommit)
	if _, err := os.Stat(filepath.Join(dir, "model.safetensors")); err != nil {
		t.Fatalf("first start did not download: %v", err)
	}
	bad := strings.Replace(spec, `hf = "org/tiny"`, `hf = "org/tiny"
    content_fingerprint = "sha256:`+strings.Repeat("0", 64)+`"`, 1)
	out, errOut, code := r.Deploy("tiny", bad, "--revision", "1", "--activate", "--wait")
	if code != 2 || !strings.Contains(errOut, "checkpoint_mismatch") || !strings.Contains(errOut, "declared sha256:000") || !strings.Contains(errOut, "measured sha256:") {
		t.Fatalf("mismatch: exit %d\n%s%s", code, out, errOut)
	}
}
