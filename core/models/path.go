// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package models

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/capyctl/capyctl/core/structs"
)

// LocalDir resolves `model { path = p }`: a relative path lies under the
// models root (and may not leave it, by ".." or by a symlink), "~/" is the
// home directory, an absolute path is taken as is. It returns the model
// directory and the directory its symlinks must stay inside: the models
// root for a model in it; for a model outside it, the repository directory
// of a Hugging Face cache snapshot (models--org--name, whose snapshots
// link into its blobs), else the model directory itself.
func (s *Store) LocalDir(p string) (dir, within string, err error) {
	if p == "" {
		return "", "", structs.Errf(structs.CodeCheckpointUnusable, "the model names no path")
	}
	p = expandHome(p, s.opts.Getenv)
	relative := !filepath.IsAbs(p)
	if relative {
		if s.root == "" {
			return "", "", structs.Errf(structs.CodeCheckpointUnusable, "model path %s is relative and no models root is set", p)
		}
		clean := filepath.Clean(p)
		if clean == ".." || strings.HasPrefix(clean, "../") {
			return "", "", structs.Errf(structs.CodeCheckpointUnusable, "model path %s leaves the models root %s", p, s.root)
		}
		p = filepath.Join(s.root, clean)
	}
	p = filepath.Clean(p)
	st, err := os.Stat(p)
	if err != nil {
		return "", "", structs.Errf(structs.CodeCheckpointUnusable, "model path %s: %v", p, pathErr(err))
	}
	if !st.IsDir() {
		return "", "", structs.Errf(structs.CodeCheckpointUnusable, "model path %s is not a directory", p)
	}
	real, err := filepath.EvalSymlinks(p)
	if err != nil {
		return "", "", structs.Errf(structs.CodeCheckpointUnusable, "model path %s: %v", p, pathErr(err))
	}
	root := ""
	if s.root != "" {
		if r, err := filepath.EvalSymlinks(s.root); err == nil {
			root = r
		}
	}
	switch {
	case root != "" && inside(real, root):
		within = root
	case relative:
		return "", "", structs.Errf(structs.CodeCheckpointUnusable,
			"model path %s links to %s, outside the models root %s: symlinks are followed only inside it", p, real, s.root)
	default:
		within = ownRoot(real)
	}
	return p, within, nil
}

// ownRoot is the directory a model outside the models root is measured
// inside: a Hugging Face cache snapshot's repository directory (its files
// link to ../../blobs), else the model directory.
func ownRoot(dir string) string {
	parent := filepath.Dir(dir)
	if filepath.Base(parent) == "snapshots" {
		repo := filepath.Dir(parent)
		if strings.HasPrefix(filepath.Base(repo), "models--") {
			return repo
		}
	}
	return dir
}

// inside reports whether p is dir or lies under it (both cleaned, real).
func inside(p, dir string) bool {
	if p == dir {
		return true
	}
	return strings.HasPrefix(p, strings.TrimSuffix(dir, string(filepath.Separator))+string(filepath.Separator))
}

// pathErr drops the path from an *os.PathError (the caller names it).
func pathErr(err error) error {
	var pe *os.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}

// errEscape is a symlink that leads outside the allowed directory.
type errEscape struct{ link, target, within string }

func (e *errEscape) Error() string {
	return fmt.Sprintf("%s links to %s, outside %s: symlinks are followed only inside it", e.link, e.target, e.within)
}
