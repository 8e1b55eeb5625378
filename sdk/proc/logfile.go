// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package proc

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
)

// droppedMark is an empty file that says rotation dropped older output.
const droppedMark = LogFileName + ".dropped"

// rotatingFile writes to dir/engine.log (0600) and rotates it when a write
// would take it past maxBytes: engine.log.(files-2) is dropped, each
// engine.log.N becomes engine.log.N+1 and engine.log becomes engine.log.1.
// It is used by one goroutine only (the shim's copier).
type rotatingFile struct {
	dir      string
	maxBytes int64
	files    int
	f        *os.File
	size     int64
}

// openRotatingFile opens (appending to) dir/engine.log.
func openRotatingFile(dir string, maxBytes int64, files int) (*rotatingFile, error) {
	if maxBytes <= 0 {
		maxBytes = LogRotateBytes
	}
	if files < 1 {
		files = 1
	}
	r := &rotatingFile{dir: dir, maxBytes: maxBytes, files: files}
	if err := r.open(); err != nil {
		return nil, err
	}
	return r, nil
}

func (r *rotatingFile) open() error {
	f, err := os.OpenFile(logPath(r.dir, 0), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return fmt.Errorf("open engine log: %w", err)
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return fmt.Errorf("stat engine log: %w", err)
	}
	r.f, r.size = f, st.Size()
	return nil
}

// logPath returns the path of log file i (0: the current one).
func logPath(dir string, i int) string {
	p := filepath.Join(dir, LogFileName)
	if i > 0 {
		p += "." + strconv.Itoa(i)
	}
	return p
}

// Write implements io.Writer. The redacting writer hands it whole lines
// (at most MaxLineBytes), so a line is never split across files.
func (r *rotatingFile) Write(p []byte) (int, error) {
	if r.f == nil {
		return 0, errors.New("engine log closed")
	}
	if r.size > 0 && r.size+int64(len(p)) > r.maxBytes {
		if err := r.rotate(); err != nil {
			return 0, err
		}
	}
	n, err := r.f.Write(p)
	r.size += int64(n)
	return n, err
}

func (r *rotatingFile) rotate() error {
	if err := r.f.Close(); err != nil {
		return fmt.Errorf("close engine log: %w", err)
	}
	r.f = nil
	// The oldest file is about to be dropped: leave a mark, so that a tail
	// read from the files knows that older output was cut.
	if _, err := os.Stat(logPath(r.dir, r.files-1)); err == nil {
		if m, err := os.OpenFile(filepath.Join(r.dir, droppedMark), os.O_WRONLY|os.O_CREATE, 0o600); err == nil {
			m.Close()
		}
	}
	if r.files == 1 {
		_ = os.Remove(logPath(r.dir, 0))
	}
	for i := r.files - 1; i >= 1; i-- {
		err := os.Rename(logPath(r.dir, i-1), logPath(r.dir, i))
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("rotate engine log: %w", err)
		}
	}
	return r.open()
}

// Close closes the current file.
func (r *rotatingFile) Close() error {
	if r.f == nil {
		return nil
	}
	err := r.f.Close()
	r.f = nil
	return err
}

// tailFiles returns the last maxBytes of the log files of dir, oldest file
// first. truncated is true when older output exists than returned.
func tailFiles(dir string, maxBytes int) (text []byte, truncated bool, err error) {
	type part struct {
		path string
		size int64
	}
	var parts []part // newest first
	for i := 0; i < LogFiles; i++ {
		st, err := os.Stat(logPath(dir, i))
		if err != nil {
			if errors.Is(err, os.ErrNotExist) {
				if i == 0 {
					return nil, false, ErrNoLogs
				}
				break
			}
			return nil, false, fmt.Errorf("tail engine log: %w", err)
		}
		parts = append(parts, part{logPath(dir, i), st.Size()})
	}
	var total int64
	for _, p := range parts {
		total += p.size
	}
	want := int64(maxBytes)
	if maxBytes < 0 || want > total {
		want = total
	}
	out := make([]byte, 0, want)
	// Walk from the oldest part that the tail reaches to the newest.
	skip := total - want
	for i := len(parts) - 1; i >= 0; i-- {
		p := parts[i]
		if skip >= p.size {
			skip -= p.size
			continue
		}
		f, err := os.Open(p.path)
		if err != nil {
			if errors.Is(err, os.ErrNotExist) {
				continue // rotated away meanwhile
			}
			return nil, false, fmt.Errorf("tail engine log: %w", err)
		}
		b, err := readRange(f, skip, int64(cap(out)-len(out)))
		f.Close()
		if err != nil {
			return nil, false, fmt.Errorf("tail engine log: %w", err)
		}
		out = append(out, b...)
		skip = 0
	}
	_, err = os.Stat(filepath.Join(dir, droppedMark))
	return out, err == nil || total > int64(len(out)), nil
}

// readRange reads up to n bytes of f from offset off.
func readRange(f *os.File, off, n int64) ([]byte, error) {
	if n <= 0 {
		return nil, nil
	}
	b, err := io.ReadAll(io.NewSectionReader(f, off, n))
	return b, err
}
