// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package models

import (
	"context"
	"crypto/sha1"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"io"
	"net/http"
	"net/url"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/capyctl/capyctl/core/structs"
)

// hfSourceDir is where downloads live under the models root.
const hfSourceDir = "sources/huggingface"

var (
	repoRE   = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,95}/[A-Za-z0-9][A-Za-z0-9._-]{0,95}$`)
	commitRE = regexp.MustCompile(`^[0-9a-f]{40}$`)
	revRE    = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._/-]{0,127}$`)
)

// RepoFile is one file of a Hugging Face repository revision.
type RepoFile struct {
	// Path is relative to the repository ("model-00001-of-00002.safetensors").
	Path string
	// Size is in bytes, -1 when the hub did not say.
	Size int64
	// SHA256 is the content digest of an LFS file, "" for others.
	SHA256 string
	// BlobID is the git blob id (sha1 of "blob <size>\0<content>") of a
	// file kept in git, "" when unknown.
	BlobID string
}

// RepoInfo is one revision of a repository.
type RepoInfo struct {
	Repo   string
	Commit string
	Files  []RepoFile
}

// Total is the sum of the known file sizes.
func (r *RepoInfo) Total() int64 {
	var n int64
	for _, f := range r.Files {
		if f.Size > 0 {
			n += f.Size
		}
	}
	return n
}

// Progress is what a pull reports as it goes.
type Progress struct {
	Repo   string
	Commit string
	// File is the file being downloaded, "" once the pull is done.
	File string
	// FileDone and FileSize are the current file's bytes (FileSize -1 when
	// unknown).
	FileDone, FileSize int64
	// Done and Total are the whole pull's bytes (files already on the host
	// count as done).
	Done, Total int64
	// FilesDone and Files count files.
	FilesDone, Files int
	// Resumed is true when the current file continues a partial download.
	Resumed bool
}

// repoDir is where a repository's revisions are kept.
func (s *Store) repoDir(repo string) string {
	return filepath.Join(s.root, hfSourceDir, filepath.FromSlash(repo))
}

// HFDir returns the model directory of a downloaded revision when a
// complete copy is on the host: revision "" means main, a branch or tag is
// read from refs/ (what the last pull resolved it to).
func (s *Store) HFDir(repo, revision string) (string, bool) {
	if !repoRE.MatchString(repo) {
		return "", false
	}
	if revision == "" {
		revision = "main"
	}
	commit := revision
	if !commitRE.MatchString(revision) {
		if !revRE.MatchString(revision) || strings.Contains(revision, "..") {
			return "", false
		}
		b, err := os.ReadFile(filepath.Join(s.repoDir(repo), "refs", filepath.FromSlash(revision)))
		if err != nil {
			return "", false
		}
		commit = strings.TrimSpace(string(b))
		if !commitRE.MatchString(commit) {
			return "", false
		}
	}
	if _, err := os.Stat(filepath.Join(s.repoDir(repo), ".complete", commit)); err != nil {
		return "", false
	}
	return filepath.Join(s.repoDir(repo), commit), true
}

// EnsureHF returns the model directory of a repository revision, pulling
// it when no complete copy is on the host.
func (s *Store) EnsureHF(ctx context.Context, repo, revision string, progress func(Progress)) (string, error) {
	if dir, ok := s.HFDir(repo, revision); ok {
		return dir, nil
	}
	return s.Pull(ctx, repo, revision, progress)
}

// Info asks the hub which files a revision holds
// (GET <endpoint>/api/models/<repo>/revision/<revision>?blobs=true).
func (s *Store) Info(ctx context.Context, repo, revision string) (*RepoInfo, error) {
	if !repoRE.MatchString(repo) || strings.Contains(repo, "..") {
		return nil, structs.Errf(structs.CodeInvalidRequest, "%q is not a Hugging Face repository (org/name)", repo)
	}
	if revision == "" {
		revision = "main"
	}
	if !revRE.MatchString(revision) || strings.Contains(revision, "..") {
		return nil, structs.Errf(structs.CodeInvalidRequest, "%q is not a revision", revision)
	}
	u := s.opts.HFEndpoint + "/api/models/" + repo + "/revision/" + url.PathEscape(revision) + "?blobs=true"
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, structs.Wrap(structs.CodeDownloadFailed, err, "ask %s about %s", s.opts.HFEndpoint, repo)
	}
	s.authorize(req)
	resp, err := s.opts.HTTP.Do(req)
	if err != nil {
		return nil, structs.Wrap(structs.CodeDownloadFailed, err, "ask %s about %s", s.opts.HFEndpoint, repo)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 32<<20))
	switch {
	case resp.StatusCode == http.StatusNotFound || resp.StatusCode == http.StatusUnauthorized:
		return nil, structs.Errf(structs.CodeCheckpointUnusable, "%s has no repository %s at revision %s (HTTP %d; a gated or private repository needs HF_TOKEN)", s.opts.HFEndpoint, repo, revision, resp.StatusCode)
	case resp.StatusCode != http.StatusOK:
		return nil, structs.Errf(structs.CodeDownloadFailed, "%s answered HTTP %d about %s", s.opts.HFEndpoint, resp.StatusCode, repo)
	}
	var doc struct {
		SHA      string `json:"sha"`
		Siblings []struct {
			RFilename string `json:"rfilename"`
			Size      *int64 `json:"size"`
			BlobID    string `json:"blobId"`
			LFS       *struct {
				SHA256 string `json:"sha256"`
				Size   int64  `json:"size"`
			} `json:"lfs"`
		} `json:"siblings"`
	}
	if err := json.Unmarshal(body, &doc); err != nil {
		return nil, structs.Wrap(structs.CodeDownloadFailed, err, "read %s's answer about %s", s.opts.HFEndpoint, repo)
	}
	if !commitRE.MatchString(doc.SHA) {
		return nil, structs.Errf(structs.CodeDownloadFailed, "%s named no commit for %s at %s", s.opts.HFEndpoint, repo, revision)
	}
	info := &RepoInfo{Repo: repo, Commit: doc.SHA}
	for _, sb := range doc.Siblings {
		if err := checkRepoPath(sb.RFilename); err != nil {
			return nil, structs.Errf(structs.CodeDownloadFailed, "%s lists %q: %v", repo, sb.RFilename, err)
		}
		f := RepoFile{Path: sb.RFilename, Size: -1, BlobID: strings.ToLower(sb.BlobID)}
		if sb.Size != nil {
			f.Size = *sb.Size
		}
		if sb.LFS != nil {
			f.SHA256 = strings.ToLower(sb.LFS.SHA256)
			f.Size = sb.LFS.Size
			f.BlobID = ""
		}
		info.Files = append(info.Files, f)
	}
	if len(info.Files) == 0 {
		return nil, structs.Errf(structs.CodeCheckpointUnusable, "%s at %s holds no file", repo, revision)
	}
	return info, nil
}

// checkRepoPath refuses a file name that could leave the download
// directory.
func checkRepoPath(p string) error {
	if p == "" || strings.HasPrefix(p, "/") || strings.Contains(p, `\`) || strings.ContainsRune(p, 0) {
		return errors.New("not a relative path")
	}
	if path.Clean(p) != p {
		return errors.New("not a clean path")
	}
	for _, seg := range strings.Split(p, "/") {
		if seg == ".." || seg == "." || seg == "" {
			return errors.New("a path segment is . or ..")
		}
	}
	return nil
}

// authorize adds the token, when there is one.
func (s *Store) authorize(req *http.Request) {
	if s.opts.HFToken != "" {
		req.Header.Set("Authorization", "Bearer "+s.opts.HFToken)
	}
}

// Pull downloads a repository revision into the models root and returns
// its model directory. Files already complete are kept; a partial file
// resumes where it stopped (HTTP Range), whether the last attempt was cut
// in this pull (retried up to Options.Retries times) or in an earlier one.
// Every file is verified against the hub's size and digest before it is
// moved into place. progress, when set, is called as bytes arrive.
func (s *Store) Pull(ctx context.Context, repo, revision string, progress func(Progress)) (string, error) {
	if s.root == "" {
		return "", structs.Errf(structs.CodeInvalidConfig, "no models root to download %s into", repo)
	}
	info, err := s.Info(ctx, repo, revision)
	if err != nil {
		return "", err
	}
	rd := s.repoDir(repo)
	if err := os.MkdirAll(rd, 0o755); err != nil {
		return "", structs.Wrap(structs.CodeDownloadFailed, err, "create %s", rd)
	}
	unlock, err := lockDir(ctx, rd)
	if err != nil {
		return "", structs.Wrap(structs.CodeDownloadFailed, err, "lock %s", rd)
	}
	defer unlock()

	dest := filepath.Join(rd, info.Commit)
	partial := filepath.Join(rd, ".partial", info.Commit)
	p := Progress{Repo: repo, Commit: info.Commit, Total: info.Total(), Files: len(info.Files)}
	report := func() {
		if progress != nil {
			progress(p)
		}
	}
	for _, f := range info.Files {
		final := filepath.Join(dest, filepath.FromSlash(f.Path))
		if st, err := os.Stat(final); err == nil && st.Mode().IsRegular() && (f.Size < 0 || st.Size() == f.Size) {
			p.FilesDone++
			p.Done += max(f.Size, 0)
			continue
		}
		p.File, p.FileSize, p.FileDone, p.Resumed = f.Path, f.Size, 0, false
		if err := s.pullFile(ctx, info, f, filepath.Join(partial, filepath.FromSlash(f.Path)), final, &p, report); err != nil {
			return "", err
		}
		p.FilesDone++
	}
	p.File, p.FileDone, p.FileSize, p.Resumed = "", 0, 0, false
	report()
	if err := os.MkdirAll(filepath.Join(rd, ".complete"), 0o755); err != nil {
		return "", structs.Wrap(structs.CodeDownloadFailed, err, "mark %s complete", dest)
	}
	if err := writeFileAtomic(filepath.Join(rd, ".complete", info.Commit), []byte(time.Now().UTC().Format(time.RFC3339)+"\n")); err != nil {
		return "", structs.Wrap(structs.CodeDownloadFailed, err, "mark %s complete", dest)
	}
	if revision == "" {
		revision = "main"
	}
	if !commitRE.MatchString(revision) {
		if err := writeFileAtomic(filepath.Join(rd, "refs", filepath.FromSlash(revision)), []byte(info.Commit+"\n")); err != nil {
			return "", structs.Wrap(structs.CodeDownloadFailed, err, "record %s of %s", revision, repo)
		}
	}
	_ = os.RemoveAll(partial)
	return dest, nil
}

// pullFile downloads one file into its partial path, resuming it, retrying
// a cut transfer, then verifies it and moves it into place.
func (s *Store) pullFile(ctx context.Context, info *RepoInfo, f RepoFile, part, final string, p *Progress, report func()) error {
	if err := os.MkdirAll(filepath.Dir(part), 0o755); err != nil {
		return structs.Wrap(structs.CodeDownloadFailed, err, "download %s", f.Path)
	}
	wait := s.opts.RetryWait
	var lastErr error
	for attempt := 0; attempt <= s.opts.Retries; attempt++ {
		if attempt > 0 {
			select {
			case <-ctx.Done():
				return structs.Wrap(structs.CodeDownloadFailed, ctx.Err(), "download %s of %s (the partial file is kept; pull again to resume)", f.Path, info.Repo)
			case <-time.After(wait):
			}
			wait *= 2
		}
		err := s.fetch(ctx, info, f, part, p, report)
		if err == nil {
			break
		}
		lastErr = err
		var fatal *fatalErr
		if errors.As(err, &fatal) || ctx.Err() != nil {
			return structs.Wrap(structs.CodeDownloadFailed, err, "download %s of %s (the partial file is kept; pull again to resume)", f.Path, info.Repo)
		}
	}
	if lastErr != nil {
		if st, err := os.Stat(part); err != nil || (f.Size >= 0 && st.Size() != f.Size) {
			return structs.Wrap(structs.CodeDownloadFailed, lastErr, "download %s of %s after %d attempts (the partial file is kept; pull again to resume)", f.Path, info.Repo, s.opts.Retries+1)
		}
	}
	if err := verify(part, f); err != nil {
		_ = os.Remove(part)
		return structs.Wrap(structs.CodeDownloadFailed, err, "verify %s of %s (the file was discarded)", f.Path, info.Repo)
	}
	if err := os.MkdirAll(filepath.Dir(final), 0o755); err != nil {
		return structs.Wrap(structs.CodeDownloadFailed, err, "place %s", f.Path)
	}
	if err := os.Rename(part, final); err != nil {
		return structs.Wrap(structs.CodeDownloadFailed, err, "place %s", f.Path)
	}
	return nil
}

// fatalErr is a download failure a retry cannot fix.
type fatalErr struct{ err error }

func (e *fatalErr) Error() string { return e.err.Error() }
func (e *fatalErr) Unwrap() error { return e.err }

// fetch makes one attempt: it asks for the bytes after what the partial
// file holds and appends them.
func (s *Store) fetch(ctx context.Context, info *RepoInfo, f RepoFile, part string, p *Progress, report func()) error {
	have := int64(0)
	if st, err := os.Stat(part); err == nil {
		have = st.Size()
	}
	if f.Size >= 0 && have == f.Size {
		p.Done += have - p.FileDone
		p.FileDone = have
		report()
		return nil
	}
	if f.Size >= 0 && have > f.Size {
		_ = os.Remove(part)
		have = 0
	}
	segs := strings.Split(f.Path, "/")
	for i := range segs {
		segs[i] = url.PathEscape(segs[i])
	}
	u := s.opts.HFEndpoint + "/" + info.Repo + "/resolve/" + info.Commit + "/" + strings.Join(segs, "/")
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return &fatalErr{err}
	}
	s.authorize(req)
	if have > 0 {
		req.Header.Set("Range", "bytes="+strconv.FormatInt(have, 10)+"-")
	}
	resp, err := s.opts.HTTP.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	flags := os.O_CREATE | os.O_WRONLY
	switch resp.StatusCode {
	case http.StatusPartialContent:
		if start, ok := rangeStart(resp.Header.Get("Content-Range")); !ok || start != have {
			return fmt.Errorf("the hub resumed at %q, not at byte %d", resp.Header.Get("Content-Range"), have)
		}
		flags |= os.O_APPEND
		p.Resumed = true
	case http.StatusOK:
		flags |= os.O_TRUNC
		have = 0
	case http.StatusRequestedRangeNotSatisfiable:
		_ = os.Remove(part)
		return errors.New("the hub refused to resume; starting the file again")
	case http.StatusNotFound, http.StatusUnauthorized, http.StatusForbidden:
		return &fatalErr{fmt.Errorf("the hub answered HTTP %d", resp.StatusCode)}
	default:
		return fmt.Errorf("the hub answered HTTP %d", resp.StatusCode)
	}
	// The bytes already counted for this file in an earlier attempt.
	p.Done += have - p.FileDone
	p.FileDone = have
	report()
	out, err := os.OpenFile(part, flags, 0o644)
	if err != nil {
		return &fatalErr{err}
	}
	buf := make([]byte, 256<<10)
	var werr error
	for {
		n, rerr := resp.Body.Read(buf)
		if n > 0 {
			if _, err := out.Write(buf[:n]); err != nil {
				werr = &fatalErr{err}
				break
			}
			p.FileDone += int64(n)
			p.Done += int64(n)
			report()
		}
		if rerr == io.EOF {
			break
		}
		if rerr != nil {
			werr = rerr
			break
		}
	}
	if err := out.Close(); err != nil && werr == nil {
		werr = &fatalErr{err}
	}
	if werr != nil {
		return werr
	}
	if f.Size >= 0 && p.FileDone != f.Size {
		return fmt.Errorf("the transfer ended at byte %d of %d", p.FileDone, f.Size)
	}
	return nil
}

// rangeStart reads the first byte of "bytes <start>-<end>/<size>".
func rangeStart(cr string) (int64, bool) {
	rest, ok := strings.CutPrefix(cr, "bytes ")
	if !ok {
		return 0, false
	}
	start, _, ok := strings.Cut(rest, "-")
	if !ok {
		return 0, false
	}
	n, err := strconv.ParseInt(start, 10, 64)
	return n, err == nil
}

// verify checks a downloaded file against the hub's size and digest.
func verify(p string, f RepoFile) error {
	st, err := os.Stat(p)
	if err != nil {
		return err
	}
	if f.Size >= 0 && st.Size() != f.Size {
		return fmt.Errorf("%d bytes, the hub says %d", st.Size(), f.Size)
	}
	var h hash.Hash
	var want string
	switch {
	case f.SHA256 != "":
		h, want = sha256.New(), f.SHA256
	case f.BlobID != "":
		h, want = sha1.New(), f.BlobID
		fmt.Fprintf(h, "blob %d\x00", st.Size())
	default:
		return nil
	}
	file, err := os.Open(p)
	if err != nil {
		return err
	}
	defer file.Close()
	if _, err := io.Copy(h, file); err != nil {
		return err
	}
	if got := hex.EncodeToString(h.Sum(nil)); got != want {
		return fmt.Errorf("digest %s, the hub says %s", got, want)
	}
	return nil
}

// lockDir takes an exclusive lock on dir/.lock, waiting for another pull of
// the same repository to finish.
func lockDir(ctx context.Context, dir string) (func(), error) {
	f, err := os.OpenFile(filepath.Join(dir, ".lock"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, err
	}
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			return func() { _ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN); f.Close() }, nil
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) {
			f.Close()
			return nil, err
		}
		select {
		case <-ctx.Done():
			f.Close()
			return nil, ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}
