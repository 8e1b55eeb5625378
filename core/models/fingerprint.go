// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package models

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"syscall"

	"github.com/capyctl/capyctl/core/structs"
)

// fingerprintVersion is the format of the manifest and of the recorded
// measurements; a change re-measures every model.
const fingerprintVersion = 1

// FileIdentity is what says a file has not changed since it was hashed.
type FileIdentity struct {
	Dev     uint64 `json:"dev"`
	Ino     uint64 `json:"ino"`
	Size    int64  `json:"size"`
	MtimeNs int64  `json:"mtime_ns"`
}

// ManifestEntry is one file of a model directory.
type ManifestEntry struct {
	// Path is relative to the model directory, with "/" separators.
	Path     string       `json:"path"`
	SHA256   string       `json:"sha256"`
	Identity FileIdentity `json:"identity"`
}

// Fingerprint is the measurement of a model directory.
type Fingerprint struct {
	// Digest is "sha256:<hex>" over the sorted manifest.
	Digest string
	// Files are the manifest, sorted by path.
	Files []ManifestEntry
	// Hashed and Reused count the files read and those whose recorded
	// digest was reused.
	Hashed, Reused int
}

// record is what the state directory keeps of one model directory.
type record struct {
	Version int                      `json:"version"`
	Dir     string                   `json:"dir"`
	Digest  string                   `json:"digest"`
	Files   map[string]ManifestEntry `json:"files"`
}

// Manifest renders the manifest the digest is taken over: one line per
// file, sorted by path, "<path> NUL <size> NUL <sha256 hex> LF".
func Manifest(files []ManifestEntry) []byte {
	sorted := append([]ManifestEntry(nil), files...)
	sort.Slice(sorted, func(i, j int) bool { return sorted[i].Path < sorted[j].Path })
	var out []byte
	for _, f := range sorted {
		out = append(out, f.Path...)
		out = append(out, 0)
		out = strconv.AppendInt(out, f.Identity.Size, 10)
		out = append(out, 0)
		out = append(out, f.SHA256...)
		out = append(out, '\n')
	}
	return out
}

// Fingerprint measures dir: a sha256 over the sorted manifest of every
// file (path, size, sha256 of its content), symlinks followed only inside
// within. A file whose identity (device, inode, size, modification time)
// matches the recorded measurement is not read again.
func (s *Store) Fingerprint(dir, within string) (*Fingerprint, error) {
	realWithin, err := filepath.EvalSymlinks(within)
	if err != nil {
		return nil, structs.Errf(structs.CodeCheckpointUnusable, "measure model %s: %v", dir, pathErr(err))
	}
	files, err := listFiles(dir, realWithin)
	if err != nil {
		return nil, structs.Errf(structs.CodeCheckpointUnusable, "measure model %s: %v", dir, err)
	}
	if len(files) == 0 {
		return nil, structs.Errf(structs.CodeCheckpointUnusable, "model directory %s holds no file", dir)
	}
	prev := s.loadRecord(dir)
	fp := &Fingerprint{}
	for _, f := range files {
		if old, ok := prev.Files[f.rel]; ok && old.Identity == f.id && old.SHA256 != "" {
			fp.Files = append(fp.Files, old)
			fp.Reused++
			continue
		}
		sum, id, err := hashFile(f.real)
		if err != nil {
			return nil, structs.Errf(structs.CodeCheckpointUnusable, "measure model %s: %s: %v", dir, f.rel, err)
		}
		fp.Files = append(fp.Files, ManifestEntry{Path: f.rel, SHA256: sum, Identity: id})
		fp.Hashed++
	}
	sort.Slice(fp.Files, func(i, j int) bool { return fp.Files[i].Path < fp.Files[j].Path })
	d := sha256.Sum256(Manifest(fp.Files))
	fp.Digest = "sha256:" + hex.EncodeToString(d[:])
	if fp.Hashed > 0 || len(prev.Files) != len(fp.Files) || prev.Digest != fp.Digest {
		s.saveRecord(dir, fp)
	}
	return fp, nil
}

// fileRef is one file found in a model directory.
type fileRef struct {
	rel  string
	real string
	id   FileIdentity
}

// listFiles walks dir, following symlinks that stay inside within,
// refusing those that leave it and anything that is not a regular file or
// a directory.
func listFiles(dir, within string) ([]fileRef, error) {
	var out []fileRef
	visited := map[[2]uint64]bool{}
	var walk func(real, rel string) error
	walk = func(real, rel string) error {
		st, err := os.Stat(real)
		if err != nil {
			return err
		}
		key := statKey(st)
		if visited[key] {
			return fmt.Errorf("%s: a directory loop", displayRel(rel))
		}
		visited[key] = true
		defer delete(visited, key)
		entries, err := os.ReadDir(real)
		if err != nil {
			return err
		}
		for _, e := range entries {
			childRel := e.Name()
			if rel != "" {
				childRel = rel + "/" + e.Name()
			}
			p := filepath.Join(real, e.Name())
			if e.Type()&os.ModeSymlink != 0 {
				target, err := filepath.EvalSymlinks(p)
				if err != nil {
					return fmt.Errorf("%s: %v", childRel, pathErr(err))
				}
				if !inside(target, within) {
					return &errEscape{link: childRel, target: target, within: within}
				}
				p = target
			}
			st, err := os.Stat(p)
			if err != nil {
				return fmt.Errorf("%s: %v", childRel, pathErr(err))
			}
			switch {
			case st.IsDir():
				if err := walk(p, childRel); err != nil {
					return err
				}
			case st.Mode().IsRegular():
				out = append(out, fileRef{rel: childRel, real: p, id: identity(st)})
			default:
				return fmt.Errorf("%s is neither a file nor a directory (%s)", childRel, st.Mode().Type())
			}
		}
		return nil
	}
	real, err := filepath.EvalSymlinks(dir)
	if err != nil {
		return nil, pathErr(err)
	}
	if err := walk(real, ""); err != nil {
		return nil, err
	}
	return out, nil
}

func displayRel(rel string) string {
	if rel == "" {
		return "."
	}
	return rel
}

// statKey identifies a file by device and inode.
func statKey(st os.FileInfo) [2]uint64 {
	if sys, ok := st.Sys().(*syscall.Stat_t); ok {
		return [2]uint64{uint64(sys.Dev), sys.Ino}
	}
	return [2]uint64{}
}

// identity reads a file's identity.
func identity(st os.FileInfo) FileIdentity {
	id := FileIdentity{Size: st.Size(), MtimeNs: st.ModTime().UnixNano()}
	if sys, ok := st.Sys().(*syscall.Stat_t); ok {
		id.Dev, id.Ino = uint64(sys.Dev), sys.Ino
	}
	return id
}

// hashFile hashes a file and returns its identity as of the open file.
func hashFile(p string) (string, FileIdentity, error) {
	f, err := os.Open(p)
	if err != nil {
		return "", FileIdentity{}, pathErr(err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return "", FileIdentity{}, err
	}
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", FileIdentity{}, err
	}
	return hex.EncodeToString(h.Sum(nil)), identity(st), nil
}

// recordPath is where the measurement of dir is kept.
func (s *Store) recordPath(dir string) string {
	if s.opts.StateDir == "" {
		return ""
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		abs = dir
	}
	sum := sha256.Sum256([]byte(abs))
	return filepath.Join(s.opts.StateDir, "models", "fingerprints", hex.EncodeToString(sum[:16])+".json")
}

// loadRecord reads the recorded measurement of dir (empty when none or
// unreadable: the directory is measured again).
func (s *Store) loadRecord(dir string) record {
	p := s.recordPath(dir)
	if p == "" {
		return record{}
	}
	b, err := os.ReadFile(p)
	if err != nil {
		return record{}
	}
	var r record
	if json.Unmarshal(b, &r) != nil || r.Version != fingerprintVersion {
		return record{}
	}
	return r
}

// saveRecord keeps a measurement; a failure only costs a re-measurement.
func (s *Store) saveRecord(dir string, fp *Fingerprint) {
	p := s.recordPath(dir)
	if p == "" {
		return
	}
	r := record{Version: fingerprintVersion, Dir: dir, Digest: fp.Digest, Files: map[string]ManifestEntry{}}
	for _, f := range fp.Files {
		r.Files[f.Path] = f
	}
	b, err := json.Marshal(r)
	if err != nil {
		return
	}
	_ = writeFileAtomic(p, b)
}

// writeFileAtomic writes through a temporary file and a rename.
func writeFileAtomic(p string, b []byte) error {
	if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
		return err
	}
	tmp, err := os.CreateTemp(filepath.Dir(p), ".tmp-*")
	if err != nil {
		return err
	}
	if _, err := tmp.Write(b); err != nil {
		tmp.Close()
		os.Remove(tmp.Name())
		return err
	}
	if err := tmp.Close(); err != nil {
		os.Remove(tmp.Name())
		return err
	}
	return os.Rename(tmp.Name(), p)
}
