// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package models

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/capyctl/capyctl/core/structs"
)

// write creates files (path → content) under dir.
func write(t *testing.T, dir string, files map[string]string) {
	t.Helper()
	for p, c := range files {
		full := filepath.Join(dir, p)
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(full, []byte(c), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

func newStore(t *testing.T, root string) *Store {
	home := t.TempDir()
	return NewStore(Options{Root: root, StateDir: t.TempDir(), Getenv: func(k string) string {
		if k == "HOME" {
			return home
		}
		return ""
	}})
}

func TestStore_LocalDir(t *testing.T) {
	root := t.TempDir()
	outside := t.TempDir()
	write(t, root, map[string]string{"m/config.json": "{}"})
	write(t, outside, map[string]string{"elsewhere/config.json": "{}", "hub/models--org--m/snapshots/abc/config.json": "{}"})
	if err := os.Symlink(filepath.Join(outside, "elsewhere"), filepath.Join(root, "escape")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(root, "m"), filepath.Join(root, "alias")); err != nil {
		t.Fatal(err)
	}
	s := newStore(t, root)
	realRoot, _ := filepath.EvalSymlinks(root)
	realOutside, _ := filepath.EvalSymlinks(outside)
	cases := []struct {
		name, path, dir, within string
		code                    structs.Code
	}{
		{name: "relative", path: "m", dir: filepath.Join(root, "m"), within: realRoot},
		{name: "link inside the root", path: "alias", dir: filepath.Join(root, "alias"), within: realRoot},
		{name: "absolute inside the root", path: filepath.Join(root, "m"), dir: filepath.Join(root, "m"), within: realRoot},
		{name: "absolute outside", path: filepath.Join(outside, "elsewhere"), dir: filepath.Join(outside, "elsewhere"), within: filepath.Join(realOutside, "elsewhere")},
		{name: "hf cache snapshot", path: filepath.Join(outside, "hub/models--org--m/snapshots/abc"), dir: filepath.Join(outside, "hub/models--org--m/snapshots/abc"), within: filepath.Join(realOutside, "hub/models--org--m")},
		{name: "dot dot", path: "../x", code: structs.CodeCheckpointUnusable},
		{name: "link out of the root", path: "escape", code: structs.CodeCheckpointUnusable},
		{name: "missing", path: "nope", code: structs.CodeCheckpointUnusable},
		{name: "a file", path: "m/config.json", code: structs.CodeCheckpointUnusable},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dir, within, err := s.LocalDir(c.path)
			if c.code != "" {
				if !structs.HasCode(err, c.code) {
					t.Fatalf("err = %v, want %s", err, c.code)
				}
				return
			}
			if err != nil || dir != c.dir || within != c.within {
				t.Fatalf("got %q within %q (%v), want %q within %q", dir, within, err, c.dir, c.within)
			}
		})
	}
	t.Run("home", func(t *testing.T) {
		home := s.opts.Getenv("HOME")
		write(t, home, map[string]string{"models/h/a": "a"})
		dir, _, err := s.LocalDir("~/models/h")
		if err != nil || dir != filepath.Join(home, "models/h") {
			t.Fatalf("got %q, %v", dir, err)
		}
	})
}

// TestFingerprint_ByHand checks the digest against the manifest written
// out by hand: "<path>\0<size>\0<sha256>\n" per file, sorted by path.
func TestFingerprint_ByHand(t *testing.T) {
	root := t.TempDir()
	write(t, root, map[string]string{"m/b.txt": "bee", "m/a/x.bin": "xx"})
	s := newStore(t, root)
	r, err := s.Resolve(context.Background(), structs.ModelSpec{Path: "m", ContentFingerprint: FingerprintMeasured})
	if err != nil {
		t.Fatal(err)
	}
	hexOf := func(s string) string { h := sha256.Sum256([]byte(s)); return hex.EncodeToString(h[:]) }
	manifest := "a/x.bin\x002\x00" + hexOf("xx") + "\n" + "b.txt\x003\x00" + hexOf("bee") + "\n"
	if want := "sha256:" + hexOf(manifest); r.Fingerprint != want {
		t.Fatalf("fingerprint %s, want %s", r.Fingerprint, want)
	}
}

func TestFingerprint_RecheckedByIdentity(t *testing.T) {
	root := t.TempDir()
	write(t, root, map[string]string{"m/config.json": "{}", "m/w.bin": "0123456789", "m/sub/tok.json": "[]"})
	s := newStore(t, root)
	ctx := context.Background()
	spec := structs.ModelSpec{Path: "m", ContentFingerprint: FingerprintMeasured}
	first, err := s.Resolve(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	if first.Hashed != 3 || first.Reused != 0 {
		t.Fatalf("first measurement hashed %d reused %d", first.Hashed, first.Reused)
	}
	// A later start reads no file: every identity is unchanged.
	spec.ContentFingerprint = first.Fingerprint
	second, err := s.Resolve(ctx, spec)
	if err != nil || second.Hashed != 0 || second.Reused != 3 || second.Fingerprint != first.Fingerprint {
		t.Fatalf("second %+v, %v", second, err)
	}
	// Same size, other content, a new modification time: only that file is
	// read, and the digest no longer matches the declaration.
	p := filepath.Join(root, "m/w.bin")
	if err := os.WriteFile(p, []byte("9876543210"), 0o644); err != nil {
		t.Fatal(err)
	}
	later := time.Now().Add(time.Hour)
	if err := os.Chtimes(p, later, later); err != nil {
		t.Fatal(err)
	}
	_, err = s.Resolve(ctx, spec)
	if !structs.HasCode(err, structs.CodeCheckpointMismatch) {
		t.Fatalf("err = %v, want checkpoint_mismatch", err)
	}
	e := structs.AsError(err)
	if e.Details["declared"] != first.Fingerprint || !strings.HasPrefix(fmt.Sprint(e.Details["measured"]), "sha256:") || e.Details["measured"] == first.Fingerprint {
		t.Fatalf("details %v", e.Details)
	}
	if !strings.Contains(e.Message, first.Fingerprint) || !strings.Contains(e.Message, fmt.Sprint(e.Details["measured"])) {
		t.Fatalf("message does not show both digests: %s", e.Message)
	}
	third, err := s.Fingerprint(filepath.Join(root, "m"), root)
	if err != nil || third.Hashed != 0 || third.Reused != 3 {
		t.Fatalf("after the mismatch the new measurement is kept: %+v %v", third, err)
	}
	// A removed file changes the digest too.
	os.Remove(filepath.Join(root, "m/sub/tok.json"))
	fourth, _ := s.Fingerprint(filepath.Join(root, "m"), root)
	if fourth.Digest == third.Digest || len(fourth.Files) != 2 {
		t.Fatalf("removing a file kept the digest")
	}
}

func TestFingerprint_Symlinks(t *testing.T) {
	t.Run("hf cache layout links twice into blobs", func(t *testing.T) {
		hub := t.TempDir()
		repo := filepath.Join(hub, "models--org--m")
		write(t, repo, map[string]string{"blobs/aaa": "weights", "snapshots/rev/.keep": ""})
		snap := filepath.Join(repo, "snapshots/rev")
		for _, n := range []string{"model.safetensors", "copy.safetensors"} {
			if err := os.Symlink("../../blobs/aaa", filepath.Join(snap, n)); err != nil {
				t.Fatal(err)
			}
		}
		s := newStore(t, t.TempDir())
		r, err := s.Resolve(context.Background(), structs.ModelSpec{Path: snap, ContentFingerprint: FingerprintMeasured})
		if err != nil || r.Hashed != 3 {
			t.Fatalf("%+v, %v", r, err)
		}
	})
	t.Run("a link that leaves the root", func(t *testing.T) {
		root, outside := t.TempDir(), t.TempDir()
		write(t, root, map[string]string{"m/config.json": "{}"})
		write(t, outside, map[string]string{"secret": "x"})
		os.Symlink(filepath.Join(outside, "secret"), filepath.Join(root, "m/secret"))
		s := newStore(t, root)
		_, err := s.Resolve(context.Background(), structs.ModelSpec{Path: "m", ContentFingerprint: FingerprintMeasured})
		if !structs.HasCode(err, structs.CodeCheckpointUnusable) || !strings.Contains(err.Error(), "outside") {
			t.Fatalf("err = %v", err)
		}
	})
	t.Run("a loop", func(t *testing.T) {
		root := t.TempDir()
		write(t, root, map[string]string{"m/a/f": "f"})
		os.Symlink("..", filepath.Join(root, "m/a/up"))
		s := newStore(t, root)
		_, err := s.Resolve(context.Background(), structs.ModelSpec{Path: "m", ContentFingerprint: FingerprintMeasured})
		if !structs.HasCode(err, structs.CodeCheckpointUnusable) || !strings.Contains(err.Error(), "loop") {
			t.Fatalf("err = %v", err)
		}
	})
	t.Run("empty", func(t *testing.T) {
		root := t.TempDir()
		os.Mkdir(filepath.Join(root, "m"), 0o755)
		s := newStore(t, root)
		if _, err := s.Resolve(context.Background(), structs.ModelSpec{Path: "m", ContentFingerprint: FingerprintMeasured}); !structs.HasCode(err, structs.CodeCheckpointUnusable) {
			t.Fatalf("err = %v", err)
		}
	})
}

func TestResolve_NoFingerprintAsked(t *testing.T) {
	root := t.TempDir()
	write(t, root, map[string]string{"m/a": "a"})
	s := newStore(t, root)
	r, err := s.Resolve(context.Background(), structs.ModelSpec{Path: "m"})
	if err != nil || r.Fingerprint != "" || r.Hashed != 0 {
		t.Fatalf("%+v %v", r, err)
	}
	if r, err := s.Resolve(context.Background(), structs.ModelSpec{}); err != nil || r.Dir != "" {
		t.Fatalf("no model: %+v %v", r, err)
	}
}
