// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package models

import (
	"bytes"
	"context"
	"crypto/sha1"
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
	"time"

	"github.com/capyctl/capyctl/core/structs"
)

const testCommit = "0123456789abcdef0123456789abcdef01234567"

// fakeHub is a local Hugging Face hub: the model info API and resolve URLs,
// with Range support and a switch that cuts a transfer half way.
type fakeHub struct {
	t     *testing.T
	srv   *httptest.Server
	files map[string][]byte
	lfs   map[string]bool

	mu sync.Mutex
	// cutAt, when > 0, makes the next transfer of cutFile stop after that
	// many bytes of the file and drop the connection; cuts counts down.
	cutFile string
	cutAt   int64
	cuts    int
	// block, when set, makes the next transfer of cutFile stop after cutAt
	// bytes and wait for the client to go away (an interrupted pull).
	block bool
	// ranges records the Range header of every resolve request.
	ranges []string
	// auth records the Authorization headers seen.
	auth []string
}

func newFakeHub(t *testing.T) *fakeHub {
	h := &fakeHub{t: t, files: map[string][]byte{}, lfs: map[string]bool{}}
	h.srv = httptest.NewServer(http.HandlerFunc(h.serve))
	t.Cleanup(h.srv.Close)
	return h
}

func (h *fakeHub) serve(w http.ResponseWriter, r *http.Request) {
	h.mu.Lock()
	h.auth = append(h.auth, r.Header.Get("Authorization"))
	h.mu.Unlock()
	const apiPrefix = "/api/models/org/tiny/revision/"
	switch {
	case strings.HasPrefix(r.URL.Path, apiPrefix):
		rev := strings.TrimPrefix(r.URL.Path, apiPrefix)
		if rev != "main" && rev != testCommit {
			http.Error(w, `{"error":"Revision Not Found"}`, http.StatusNotFound)
			return
		}
		var sib []map[string]any
		for name, b := range h.files {
			s := map[string]any{"rfilename": name, "size": len(b)}
			if h.lfs[name] {
				sum := sha256.Sum256(b)
				s["lfs"] = map[string]any{"sha256": hex.EncodeToString(sum[:]), "size": len(b), "pointerSize": 134}
				s["blobId"] = "ffffffffffffffffffffffffffffffffffffffff"
			} else {
				hh := sha1.New()
				fmt.Fprintf(hh, "blob %d\x00", len(b))
				hh.Write(b)
				s["blobId"] = hex.EncodeToString(hh.Sum(nil))
			}
			sib = append(sib, s)
		}
		json.NewEncoder(w).Encode(map[string]any{"id": "org/tiny", "sha": testCommit, "siblings": sib})
	case strings.HasPrefix(r.URL.Path, "/org/tiny/resolve/"+testCommit+"/"):
		name := strings.TrimPrefix(r.URL.Path, "/org/tiny/resolve/"+testCommit+"/")
		b, ok := h.files[name]
		if !ok {
			http.NotFound(w, r)
			return
		}
		h.mu.Lock()
		h.ranges = append(h.ranges, r.Header.Get("Range"))
		cut := name == h.cutFile && (h.cuts > 0 || h.block)
		block := h.block && name == h.cutFile
		if cut && !block {
			h.cuts--
		}
		if block {
			h.block = false
		}
		cutAt := h.cutAt
		h.mu.Unlock()
		start := int64(0)
		if rg := r.Header.Get("Range"); rg != "" {
			n, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimPrefix(rg, "bytes="), "-"), 10, 64)
			if err != nil || n > int64(len(b)) {
				w.WriteHeader(http.StatusRequestedRangeNotSatisfiable)
				return
			}
			start = n
			w.Header().Set("Content-Range", fmt.Sprintf("bytes %d-%d/%d", n, len(b)-1, len(b)))
			w.Header().Set("Content-Length", strconv.Itoa(len(b)-int(n)))
			w.WriteHeader(http.StatusPartialContent)
		} else {
			w.Header().Set("Content-Length", strconv.Itoa(len(b)))
			w.WriteHeader(http.StatusOK)
		}
		body := b[start:]
		if cut && cutAt > start {
			w.Write(body[:cutAt-start])
			w.(http.Flusher).Flush()
			if block {
				<-r.Context().Done()
				return
			}
			// Drop the connection mid-body, as a network cut would.
			panic(http.ErrAbortHandler)
		}
		w.Write(body)
	default:
		http.NotFound(w, r)
	}
}

func (h *fakeHub) store(t *testing.T) *Store {
	return NewStore(Options{
		Root: t.TempDir(), StateDir: t.TempDir(), HFEndpoint: h.srv.URL, HFToken: "hf_secret",
		RetryWait: time.Millisecond, Getenv: func(string) string { return "" },
	})
}

// payload is deterministic, incompressible-looking content.
func payload(n int) []byte {
	b := make([]byte, n)
	x := uint32(2463534242)
	for i := range b {
		x ^= x << 13
		x ^= x >> 17
		x ^= x << 5
		b[i] = byte(x)
	}
	return b
}

func TestPull_ResumesACutTransfer(t *testing.T) {
	hub := newFakeHub(t)
	weights := payload(3 << 20)
	hub.files["config.json"] = []byte(`{"model_type":"llama"}`)
	hub.files["model.safetensors"] = weights
	hub.lfs["model.safetensors"] = true
	hub.cutFile, hub.cutAt, hub.cuts = "model.safetensors", 1<<20+123, 1
	s := hub.store(t)

	var mu sync.Mutex
	var reports []Progress
	dir, err := s.Pull(context.Background(), "org/tiny", "", func(p Progress) {
		mu.Lock()
		reports = append(reports, p)
		mu.Unlock()
	})
	if err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(filepath.Join(dir, "model.safetensors"))
	if err != nil || !bytes.Equal(got, weights) {
		t.Fatalf("downloaded weights differ (%d bytes, %v)", len(got), err)
	}
	if !strings.HasSuffix(dir, filepath.Join("sources", "huggingface", "org", "tiny", testCommit)) {
		t.Fatalf("dir %s", dir)
	}
	// The second request for the weights resumed exactly where the cut was.
	var weightRanges []string
	hub.mu.Lock()
	for _, r := range hub.ranges {
		if r != "" {
			weightRanges = append(weightRanges, r)
		}
	}
	hub.mu.Unlock()
	if len(weightRanges) != 1 || weightRanges[0] != fmt.Sprintf("bytes=%d-", 1<<20+123) {
		t.Fatalf("range requests %v, want one resuming at the cut", weightRanges)
	}
	total := int64(len(weights) + len(hub.files["config.json"]))
	last := reports[len(reports)-1]
	if last.Done != total || last.Total != total || last.FilesDone != 2 || last.File != "" {
		t.Fatalf("last progress %+v, want all %d bytes of 2 files", last, total)
	}
	resumed := false
	for i, p := range reports {
		if i > 0 && p.Done < reports[i-1].Done {
			t.Fatalf("progress went back: %+v after %+v", p, reports[i-1])
		}
		resumed = resumed || p.Resumed
	}
	if !resumed {
		t.Fatal("no progress report says the file was resumed")
	}
	// The token went to the hub.
	hub.mu.Lock()
	defer hub.mu.Unlock()
	for _, a := range hub.auth {
		if a != "Bearer hf_secret" {
			t.Fatalf("authorization %q", a)
		}
	}
	// refs/main and the completion mark let a start find it offline.
	if d, ok := s.HFDir("org/tiny", ""); !ok || d != dir {
		t.Fatalf("HFDir = %q, %v", d, ok)
	}
}

// TestPull_ResumesAfterAnInterruptedPull: a pull whose context ends mid-file
// keeps the partial file; the next pull continues it.
func TestPull_ResumesAfterAnInterruptedPull(t *testing.T) {
	hub := newFakeHub(t)
	weights := payload(2 << 20)
	hub.files["model.safetensors"] = weights
	hub.lfs["model.safetensors"] = true
	hub.cutFile, hub.cutAt, hub.block = "model.safetensors", 700_000, true
	s := hub.store(t)

	ctx, cancel := context.WithCancel(context.Background())
	_, err := s.Pull(ctx, "org/tiny", testCommit, func(p Progress) {
		if p.FileDone >= 700_000 {
			cancel() // the operator presses ^C half way
		}
	})
	if !structs.HasCode(err, structs.CodeDownloadFailed) || !strings.Contains(err.Error(), "pull again to resume") {
		t.Fatalf("interrupted pull: %v", err)
	}
	if _, ok := s.HFDir("org/tiny", testCommit); ok {
		t.Fatal("an interrupted pull is marked complete")
	}
	var resumedFrom int64 = -1
	dir, err := s.Pull(context.Background(), "org/tiny", testCommit, func(p Progress) {
		if p.Resumed && resumedFrom < 0 {
			resumedFrom = p.FileDone
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	if resumedFrom != 700_000 {
		t.Fatalf("second pull resumed from %d, want 700000", resumedFrom)
	}
	got, _ := os.ReadFile(filepath.Join(dir, "model.safetensors"))
	if !bytes.Equal(got, weights) {
		t.Fatal("resumed file differs")
	}
	if _, err := os.Stat(filepath.Join(s.repoDir("org/tiny"), ".partial", testCommit)); !os.IsNotExist(err) {
		t.Fatalf("partial directory left behind: %v", err)
	}
}

func TestPull_Refusals(t *testing.T) {
	hub := newFakeHub(t)
	hub.files["config.json"] = []byte(`{}`)
	s := hub.store(t)
	cases := []struct {
		name, repo, rev string
		code            structs.Code
	}{
		{"bad repo", "../etc", "", structs.CodeInvalidRequest},
		{"unknown revision", "org/tiny", "v9", structs.CodeCheckpointUnusable},
		{"unknown repo", "org/other", "", structs.CodeCheckpointUnusable},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if _, err := s.Pull(context.Background(), c.repo, c.rev, nil); !structs.HasCode(err, c.code) {
				t.Fatalf("err = %v, want %s", err, c.code)
			}
		})
	}
	t.Run("hostile file name", func(t *testing.T) {
		hub.files["../../escape"] = []byte("x")
		defer delete(hub.files, "../../escape")
		if _, err := s.Pull(context.Background(), "org/tiny", "", nil); !structs.HasCode(err, structs.CodeDownloadFailed) {
			t.Fatalf("err = %v", err)
		}
	})
	t.Run("corrupt transfer", func(t *testing.T) {
		// The hub's listing promises other content than it sends.
		hub.files["w.bin"] = payload(1000)
		hub.lfs["w.bin"] = true
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if strings.HasSuffix(r.URL.Path, "/w.bin") {
				w.Write(make([]byte, 1000))
				return
			}
			hub.serve(w, r)
		}))
		defer srv.Close()
		s2 := NewStore(Options{Root: t.TempDir(), HFEndpoint: srv.URL, RetryWait: time.Millisecond, Getenv: func(string) string { return "" }})
		_, err := s2.Pull(context.Background(), "org/tiny", "", nil)
		if !structs.HasCode(err, structs.CodeDownloadFailed) || !strings.Contains(err.Error(), "digest") {
			t.Fatalf("err = %v", err)
		}
	})
}

func TestResolve_HFDownloadsOnFirstUse(t *testing.T) {
	hub := newFakeHub(t)
	hub.files["model.gguf"] = payload(4096)
	s := hub.store(t)
	r, err := s.Resolve(context.Background(), structs.ModelSpec{HF: "org/tiny", ContentFingerprint: FingerprintMeasured})
	if err != nil {
		t.Fatal(err)
	}
	if r.Fingerprint == "" || r.Hashed != 1 {
		t.Fatalf("resolved %+v", r)
	}
	// A second resolve needs no hub at all.
	hub.srv.Close()
	r2, err := s.Resolve(context.Background(), structs.ModelSpec{HF: "org/tiny", ContentFingerprint: r.Fingerprint})
	if err != nil || r2.Dir != r.Dir || r2.Reused != 1 || r2.Hashed != 0 {
		t.Fatalf("second resolve %+v, %v", r2, err)
	}
}
