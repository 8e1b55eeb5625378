// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

// Package models owns model sources on a host: a local directory under the
// models root (`model { path = "..." }`), a Hugging Face repository
// downloaded into the root's sources/ (`model { hf = "org/name" }`, resumed
// after an interruption, with progress), and the content fingerprint, a
// digest over every file of a model directory that is measured once and
// re-checked cheaply by file identity on later starts.
//
// The models root holds:
//
//	<root>/
//	├── <model dirs an operator put there>
//	└── sources/huggingface/<org>/<name>/
//	    ├── <40-hex commit>/          the model directory of one revision
//	    ├── refs/<revision>           the commit a branch or tag resolved to
//	    ├── .complete/<commit>        present once every file is verified
//	    ├── .partial/<commit>/...     files being downloaded (resumable)
//	    └── .lock                     one download at a time
//
// Fingerprint measurements are kept under <state_dir>/models/fingerprints,
// never in the model directory (which may be read-only).
package models

import (
	"context"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/capyctl/capyctl/core/structs"
)

// Default Hugging Face endpoint when HF_ENDPOINT is unset.
const DefaultHFEndpoint = "https://huggingface.co"

// FingerprintMeasured is the content_fingerprint that asks for a
// measurement without an expectation.
const FingerprintMeasured = "measured"

// Options configure a Store.
type Options struct {
	// Root is the models root ("~/models" is expanded).
	Root string
	// StateDir keeps fingerprint measurements; empty keeps none (every
	// check hashes every file).
	StateDir string
	// HFEndpoint is the Hugging Face endpoint (default $HF_ENDPOINT, then
	// DefaultHFEndpoint).
	HFEndpoint string
	// HFToken authenticates downloads (default $HF_TOKEN); never logged.
	HFToken string
	// HTTP is the client downloads use (a default one when nil).
	HTTP *http.Client
	// Retries bounds how often a cut download is resumed within one pull
	// (default 5).
	Retries int
	// RetryWait is the first pause before a resume, doubled each time
	// (default 500ms; tests set a tiny one).
	RetryWait time.Duration
	// Getenv reads the environment (os.Getenv when nil).
	Getenv func(string) string
}

// Store resolves model specs on one host.
type Store struct {
	opts Options
	root string
}

// NewStore returns a Store.
func NewStore(opts Options) *Store {
	if opts.Getenv == nil {
		opts.Getenv = os.Getenv
	}
	if opts.HFEndpoint == "" {
		opts.HFEndpoint = opts.Getenv("HF_ENDPOINT")
	}
	if opts.HFEndpoint == "" {
		opts.HFEndpoint = DefaultHFEndpoint
	}
	opts.HFEndpoint = strings.TrimRight(opts.HFEndpoint, "/")
	if opts.HFToken == "" {
		opts.HFToken = opts.Getenv("HF_TOKEN")
	}
	if opts.HTTP == nil {
		opts.HTTP = &http.Client{Transport: &http.Transport{Proxy: http.ProxyFromEnvironment, ResponseHeaderTimeout: time.Minute}}
	}
	if opts.Retries == 0 {
		opts.Retries = 5
	}
	if opts.RetryWait == 0 {
		opts.RetryWait = 500 * time.Millisecond
	}
	return &Store{opts: opts, root: expandHome(opts.Root, opts.Getenv)}
}

// Root is the models root, "~" expanded.
func (s *Store) Root() string { return s.root }

// Resolved is a model directory ready for an engine.
type Resolved struct {
	// Dir is the model directory.
	Dir string
	// Fingerprint is "sha256:<hex>" when measured, "" when the spec asked
	// for none.
	Fingerprint string
	// Hashed and Reused count the files hashed and the files whose
	// recorded digest was reused (their identity had not changed).
	Hashed, Reused int
}

// Resolve returns the model directory of a spec on this host: a local
// directory (under the models root, absolute, or ~/...), or a Hugging Face
// repository, downloaded first if no complete copy is on the host. When the
// spec asks for a content fingerprint the directory is measured (or its
// recorded measurement re-checked) and a declared digest must match
// (checkpoint_mismatch otherwise, naming both). A spec without a model
// resolves to "".
func (s *Store) Resolve(ctx context.Context, m structs.ModelSpec) (*Resolved, error) {
	var dir, within string
	switch {
	case m.HF != "":
		d, err := s.EnsureHF(ctx, m.HF, m.Revision, nil)
		if err != nil {
			return nil, err
		}
		dir, within = d, s.root
	case m.Path != "":
		d, w, err := s.LocalDir(m.Path)
		if err != nil {
			return nil, err
		}
		dir, within = d, w
	default:
		return &Resolved{}, nil
	}
	out := &Resolved{Dir: dir}
	if m.ContentFingerprint == "" {
		return out, nil
	}
	fp, err := s.Fingerprint(dir, within)
	if err != nil {
		return nil, err
	}
	out.Fingerprint, out.Hashed, out.Reused = fp.Digest, fp.Hashed, fp.Reused
	if m.ContentFingerprint != FingerprintMeasured && m.ContentFingerprint != fp.Digest {
		return nil, structs.Errf(structs.CodeCheckpointMismatch,
			"model %s does not match its declared content_fingerprint: declared %s, measured %s (content_fingerprint is CapyCTL's sha256 over every file of the model directory; fix the files or declare the measured digest)",
			dir, m.ContentFingerprint, fp.Digest).
			WithDetail("declared", m.ContentFingerprint).WithDetail("measured", fp.Digest).WithDetail("model_dir", dir)
	}
	return out, nil
}

// expandHome expands a leading "~/".
func expandHome(p string, getenv func(string) string) string {
	if p == "~" || strings.HasPrefix(p, "~/") {
		home := getenv("HOME")
		if home == "" {
			home, _ = os.UserHomeDir()
		}
		return filepath.Join(home, strings.TrimPrefix(strings.TrimPrefix(p, "~"), "/"))
	}
	return p
}
