// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package faults

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/capyctl/capyctl/core/api/client"
)

// FullDisk puts the state directory on a small filesystem, fills it to
// the last byte while traffic runs, tries a deploy that must write
// records, then frees the space.
func FullDisk() Fault {
	return Fault{
		Name:     "full disk under the state directory",
		StateDir: smallFS,
		Inject: func(e *Env) {
			probe := prepareProbe(e)
			filler := filepath.Join(e.Role.StateDir, "filler")
			n, err := fill(filler)
			freed := false
			free := func() {
				if !freed {
					freed = true
					if err := os.Remove(filler); err != nil {
						e.T.Errorf("free the disk: %v", err)
					}
				}
			}
			defer free()
			if err != nil {
				e.T.Fatalf("fill the disk: %v", err)
			}
			e.Note("disk filled (%d MiB written)", n>>20)
			code, out := probeDeploy(e, probe, "on the full disk")
			refusedStoreUnavailable(e, "a deploy on the full disk", code, out)
			// The fault lasts a window of traffic.
			time.Sleep(e.Scale.Hold)
			out, code, _ = e.CLI(30*time.Second, "status")
			req := requestsLine(out)
			e.Note("capyctl status on the full disk: exit %d%s", code, req)
			if code != 0 || !strings.Contains(req, "dropped") {
				e.Miss("capyctl status on the full disk: exit %d%s, want 0 and the request ledger's dropped records", code, req)
			}
			free()
			if code, out := probeDeploy(e, probe, "once the disk is freed"); code != 0 {
				e.Miss("a deploy once the disk is freed: exit %d (%s), want 0", code, firstLine(lastError(out)))
			}
		},
		// The hot path writes nothing it waits for.
		Expect: expect(allEnginesSurvive, nothingFails),
	}
}

// requestsLine is the "Requests:" line of capyctl status, if any.
func requestsLine(out string) string {
	for _, l := range strings.Split(out, "\n") {
		if strings.HasPrefix(l, "Requests:") {
			return ", " + strings.TrimSpace(l)
		}
	}
	return ""
}

// smallFS mounts a filesystem of s.DiskSize bytes for a role's state
// directory: ext4 on a loop device (what a state directory really sits
// on), else tmpfs. Both need root; without it the fault is skipped.
func smallFS(t testing.TB, s Scale) (string, string) {
	if os.Geteuid() != 0 {
		return "", "mounting a small filesystem needs root"
	}
	root := t.TempDir()
	dir := filepath.Join(root, "state")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	img := filepath.Join(root, "disk.img")
	kind := "ext4 on a loop device"
	err := makeExt4(img, s.DiskSize)
	if err == nil {
		err = run("mount", "-o", "loop", img, dir)
	}
	if err != nil {
		kind = "tmpfs"
		if err2 := run("mount", "-t", "tmpfs", "-o", fmt.Sprintf("size=%d,mode=0700", s.DiskSize), "tmpfs", dir); err2 != nil {
			return "", fmt.Sprintf("no small filesystem: ext4 on a loop device: %v; tmpfs: %v", err, err2)
		}
	}
	t.Cleanup(func() {
		// After the role's own clean-up (registered later, run earlier).
		if err := run("umount", dir); err != nil {
			_ = run("umount", "-l", dir)
		}
	})
	if err := os.Chmod(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	t.Logf("state directory on %s of %d MiB", kind, s.DiskSize>>20)
	return dir, ""
}

func makeExt4(img string, size int64) error {
	f, err := os.Create(img)
	if err != nil {
		return err
	}
	if err := f.Truncate(size); err != nil {
		f.Close()
		return err
	}
	f.Close()
	// -m 0: no blocks reserved for root, so the role (root here) meets
	// the same full disk as anyone.
	return run("mkfs.ext4", "-q", "-F", "-m", "0", img)
}

func run(name string, args ...string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, name, args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s %s: %v: %s", name, strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// fill writes a file until the filesystem has no byte left, in smaller
// and smaller pieces, and returns how much it wrote.
func fill(path string) (int64, error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY, 0o600)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	buf := make([]byte, 1<<20)
	var n int64
	var last error
	for chunk := len(buf); chunk >= 512; chunk /= 8 {
		for {
			w, err := f.Write(buf[:chunk])
			n += int64(w)
			if err != nil {
				last = err
				break
			}
		}
	}
	_ = f.Sync()
	if errors.Is(last, syscall.ENOSPC) {
		last = nil
	}
	return n, last
}

// ReadOnlyStore makes capyctl.db read-only while the role runs, stops
// the role and tries to start it on the read-only file, then restores the
// file and starts it. Root ignores file modes, so as root the file is
// also made immutable (chattr +i): on ext4 that fails every write, even
// through the descriptor the role already holds (a remount read-only is
// refused while the role holds the file open for writing, and a
// read-only bind mount changes nothing for an open descriptor).
func ReadOnlyStore() Fault {
	return Fault{
		Name:     "store file made read-only",
		Settings: func(Scale) []string { return []string{"shutdown.drain_timeout=2s"} },
		Inject: func(e *Env) {
			db := filepath.Join(e.Role.StateDir, "capyctl.db")
			probe := prepareProbe(e)
			how := "chmod 0400"
			if err := os.Chmod(db, 0o400); err != nil {
				e.T.Fatal(err)
			}
			// Whether the file really refuses the role's writes: a file
			// mode does not stop root.
			readOnly := os.Geteuid() != 0
			if os.Geteuid() == 0 {
				if err := run("chattr", "+i", db); err != nil {
					e.Note("chattr +i failed (%v): root still writes the file, the refusals are not checked", err)
				} else {
					how += " and chattr +i"
					readOnly = true
				}
			}
			restore := func() {
				if os.Geteuid() == 0 {
					_ = run("chattr", "-i", db)
				}
				_ = os.Chmod(db, 0o600)
			}
			defer restore()
			e.Note("capyctl.db made read-only with %s while the role runs", how)
			code, out := probeDeploy(e, probe, "while the file is read-only")
			if readOnly && code == 0 {
				e.Miss("a deploy while capyctl.db is read-only was carried out")
			}
			refusedStoreUnavailable(e, "a deploy while capyctl.db is read-only", code, out)
			// The fault lasts a window of traffic.
			time.Sleep(e.Scale.Hold)
			out, code, _ = e.CLI(30*time.Second, "status")
			e.Note("capyctl status: exit %d%s", code, requestsLine(out))
			if code != 0 {
				e.Miss("capyctl status while capyctl.db is read-only: exit %d, want 0", code)
			}
			e.Role.Stop()
			code, msg := tryStart(e)
			if code == 0 {
				e.Note("a start on the read-only store came up (and was stopped)")
				if readOnly {
					e.Miss("a role started on a read-only capyctl.db")
				}
			} else {
				e.Note("a start on the read-only store: exit %d: %s", code, msg)
				if code != exitStoreUnavailable || !strings.Contains(msg, "store_unavailable") {
					e.Miss("a start on the read-only store: exit %d (%s), want %d store_unavailable", code, msg, exitStoreUnavailable)
				}
			}
			restore()
			e.Role.Restart()
			e.Retarget()
			if code, out := probeDeploy(e, probe, "after the file is restored and the role restarted"); code != 0 {
				e.Miss("a deploy after the file is restored: exit %d (%s), want 0", code, firstLine(lastError(out)))
			}
		},
		Expect: expect(
			// The engines ran on through the role's stop and were
			// re-attached.
			allEnginesSurvive,
			// Clients saw the role drain (shutting_down) and go, and
			// nothing else.
			failOnly("lost connections and shutting_down", anyOf(connectionLost, codedAs("shutting_down"))),
		),
	}
}

// tryStart starts the role once more on its state directory and returns
// its exit code and last line; a role that comes up is stopped (code 0).
func tryStart(e *Env) (int, string) {
	r := e.Role
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	args := append([]string{"start", "standalone", "--state-dir", r.StateDir,
		"--listen", "127.0.0.1:0", "--management-listen", "127.0.0.1:0",
		"--models-root", filepath.Join(r.StateDir, "models")}, r.Args...)
	cmd := exec.CommandContext(ctx, r.Bin, args...)
	cmd.Env = []string{"PATH=/usr/bin:/bin", "HOME=" + r.StateDir, "TMPDIR=" + os.TempDir()}
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		e.T.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	for {
		select {
		case err := <-done:
			code := 0
			var ee *exec.ExitError
			if errors.As(err, &ee) {
				code = ee.ExitCode()
			}
			return code, firstLine(lastError(out.String()))
		case <-time.After(100 * time.Millisecond):
		}
		if ri, err := client.ReadRunInfo(r.StateDir); err == nil && ri.PID == cmd.Process.Pid {
			_ = cmd.Process.Signal(syscall.SIGTERM)
			<-done
			return 0, ""
		}
	}
}
