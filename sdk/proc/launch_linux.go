// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package proc

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// startTimeout bounds how long Start waits for the shim's report.
const startTimeout = 30 * time.Second

// Knobs the package's tests turn down (they travel to the shim in the spec).
var (
	testRotateBytes int64
	testLingerMS    int64
)

// Start launches spec: it starts the shim as the leader of a new process
// group (in the caller's session, see newShim), and the shim starts the
// engine as its child in that group. It returns once the engine process exists (not when it is ready),
// or an error naming the program when it cannot be executed.
//
// The spec, which holds the engine's environment and secrets, reaches the
// shim as JSON over an inherited pipe: never on a command line or on disk.
// The engine's stdin is /dev/null; its stdout and stderr go to the shim.
func Start(spec LaunchSpec) (*Launched, error) {
	if os.Getenv(shimEnvMarker) != "" {
		return nil, errors.New("start engine: this process was started as a shim but did not call proc.MaybeRunShim first in main")
	}
	if len(spec.Argv) == 0 || spec.Argv[0] == "" {
		return nil, errors.New("start engine: empty argv")
	}
	if spec.LaunchDir == "" {
		return nil, errors.New("start engine: no launch directory")
	}
	switch spec.LogMode {
	case "":
		spec.LogMode = LogModeFile
	case LogModeFile, LogModeMemory:
	default:
		return nil, fmt.Errorf("start engine: unknown log mode %q", spec.LogMode)
	}
	dir, err := filepath.Abs(spec.LaunchDir)
	if err != nil {
		return nil, fmt.Errorf("start engine: launch directory: %w", err)
	}
	spec.LaunchDir = dir
	if err := prepareLaunchDir(dir); err != nil {
		return nil, err
	}
	workDir := spec.Dir
	if workDir == "" {
		workDir = dir
	}
	program, err := resolveProgram(spec.Argv[0], spec.Env["PATH"], workDir)
	if err != nil {
		return nil, fmt.Errorf("start engine: %w", err)
	}
	exe := spec.Executable
	if exe == "" {
		if exe, err = os.Executable(); err != nil {
			return nil, fmt.Errorf("start engine: find own executable: %w", err)
		}
	}
	payload, err := json.Marshal(shimSpec{
		LaunchSpec:  spec,
		Program:     program,
		WorkDir:     workDir,
		RotateBytes: testRotateBytes,
		LingerMS:    testLingerMS,
	})
	if err != nil {
		return nil, fmt.Errorf("start engine: encode spec: %w", err)
	}
	return startShim(exe, dir, program, payload)
}

// startShim hands the launch to a shim and waits for its report: the spare
// one started ahead for exe (see spare) when there is one, else a new one.
// Either way a new spare is started for the next launch, refillDelay later:
// exec'ing it competes for the CPU with the engine that just started.
func startShim(exe, dir, program string, payload []byte) (*Launched, error) {
	sh := takeSpare(exe)
	if sh == nil {
		var err error
		if sh, err = newShim(exe); err != nil {
			return nil, err
		}
	}
	time.AfterFunc(refillDelay, func() { refillSpare(exe) })
	l, err := sh.launch(dir, program, payload)
	if err != nil && sh.spare && errors.Is(err, errShimGone) {
		// The spare died while it waited (killed by someone): a new one.
		if sh, err = newShim(exe); err != nil {
			return nil, err
		}
		return sh.launch(dir, program, payload)
	}
	return l, err
}

// shimProc is a started shim waiting for its launch spec.
type shimProc struct {
	cmd    *exec.Cmd
	specW  *os.File
	repR   *os.File
	waited chan struct{}
	spare  bool
}

// errShimGone marks a shim that exited before it read its spec.
var errShimGone = errors.New("the shim exited before its launch")

// newShim execs exe as a shim: the leader of a new process group, with no
// environment but the marker, no stdio and "/" as its working directory;
// it waits for its spec on fd 3 and reports on fd 4.
//
// IMPORTANT: a new process group, not a new session. The group is what
// makes the launch outlive its driver and the role (no signal sent to
// theirs reaches it) and what Stop proves gone. A new session adds nothing
// to that, and costs a cold start dearly where the kernel groups the
// scheduling by session (autogroup: a role whose processes sit in the root
// CPU cgroup): each session is a scheduling group of its own, and a new
// one woken on a busy machine waited 50-100 ms (median, load 10-16) to
// fork and exec the engine, against 2 ms for a shim in the driver's
// session; the engine's own start was slowed the same way. A terminal's
// signals (hang-up, interrupt) go to its foreground group only, never to
// this one, and the shim gives up the session's terminal before it starts
// the engine (dropTerminal): an engine that opens /dev/tty fails instead
// of being stopped by it. The engine's stdin is /dev/null and its output
// a pipe.
func newShim(exe string) (*shimProc, error) {
	specR, specW, err := os.Pipe()
	if err != nil {
		return nil, fmt.Errorf("start engine: spec pipe: %w", err)
	}
	repR, repW, err := os.Pipe()
	if err != nil {
		specR.Close()
		specW.Close()
		return nil, fmt.Errorf("start engine: report pipe: %w", err)
	}
	cmd := &exec.Cmd{
		Path: exe,
		Args: []string{exe, ShimArg},
		// IMPORTANT: the shim inherits nothing from the driver: no
		// environment (the marker only), no stdio (/dev/null: a pipe to the
		// driver would break when the driver dies), cwd "/". That is what
		// makes a shim started ahead of its launch the same as one started
		// for it.
		Env:         []string{shimEnvMarker + "=1"},
		Dir:         "/",
		ExtraFiles:  []*os.File{specR, repW}, // fds 3 and 4
		SysProcAttr: &syscall.SysProcAttr{Setpgid: true},
	}
	err = cmd.Start()
	specR.Close()
	repW.Close()
	if err != nil {
		specW.Close()
		repR.Close()
		return nil, fmt.Errorf("start engine: start shim %s: %w", exe, err)
	}
	sh := &shimProc{cmd: cmd, specW: specW, repR: repR, waited: make(chan struct{})}
	// Reap the shim whenever it ends while this process lives.
	go func() {
		_ = cmd.Wait()
		close(sh.waited)
	}()
	return sh, nil
}

// launch sends the spec and reads the shim's report.
func (sh *shimProc) launch(dir, program string, payload []byte) (*Launched, error) {
	defer sh.repR.Close()
	cmd, waited := sh.cmd, sh.waited
	_, werr := sh.specW.Write(payload)
	sh.specW.Close()

	_ = sh.repR.SetReadDeadline(time.Now().Add(startTimeout))
	var rep shimReport
	derr := json.NewDecoder(sh.repR).Decode(&rep)
	switch {
	case derr != nil && (errors.Is(derr, io.EOF) || errors.Is(derr, io.ErrUnexpectedEOF)):
		if werr != nil {
			return nil, fmt.Errorf("start engine %s: %w", program, errShimGone)
		}
		return nil, fmt.Errorf("start engine %s: the shim exited without a report (does %s call proc.MaybeRunShim first in main?)", program, cmd.Path)
	case derr != nil:
		_ = cmd.Process.Kill()
		return nil, fmt.Errorf("start engine %s: no report from the shim: %w", program, derr)
	case rep.Error != "":
		waitFor(waited, 5*time.Second)
		return nil, fmt.Errorf("start engine: %s", rep.Error)
	case werr != nil:
		return nil, fmt.Errorf("start engine %s: send spec to shim: %w", program, werr)
	}
	shimPID := cmd.Process.Pid
	ticks := rep.ShimTicks
	if ticks == 0 {
		t, err := ReadStartTicks(shimPID)
		if err != nil {
			return nil, fmt.Errorf("start engine %s: read shim identity: %w", program, err)
		}
		ticks = t
	}
	return &Launched{
		Pgid:      shimPID,
		Shim:      Identity{PID: shimPID, StartTicks: ticks},
		Engine:    Identity{PID: rep.EnginePID, StartTicks: rep.EngineTicks},
		LaunchDir: dir,
	}, nil
}

// prepareLaunchDir creates dir (0700), refuses one a live shim serves, and
// removes a previous launch's exit record and socket.
func prepareLaunchDir(dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("start engine: create launch directory: %w", err)
	}
	if err := os.Chmod(dir, 0o700); err != nil {
		return fmt.Errorf("start engine: launch directory: %w", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	var st Status
	if err := shimRequest(ctx, dir, "status", &st); err == nil {
		if !st.Exited {
			return fmt.Errorf("start engine: launch directory %s is in use by a running engine (pid %d)", dir, st.EnginePID)
		}
		// A previous launch's shim lingers to serve its tail: let it go.
		_ = shimRequest(ctx, dir, "bye", nil)
	}
	for _, name := range []string{ExitFileName, SocketName} {
		if err := os.Remove(filepath.Join(dir, name)); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("start engine: clean launch directory: %w", err)
		}
	}
	return nil
}

// resolveProgram finds the file Argv[0] names: a path (relative ones from
// the working directory) or a name looked up in the engine's own PATH,
// never the caller's. The errors name the program.
func resolveProgram(name, pathEnv, workDir string) (string, error) {
	if strings.Contains(name, "/") {
		p := name
		if !filepath.IsAbs(p) {
			p = filepath.Join(workDir, p)
		}
		if err := checkExecutable(p); err != nil {
			return "", err
		}
		return p, nil
	}
	for _, d := range filepath.SplitList(pathEnv) {
		if d == "" || !filepath.IsAbs(d) {
			continue // never the current directory
		}
		p := filepath.Join(d, name)
		if checkExecutable(p) == nil {
			return p, nil
		}
	}
	return "", fmt.Errorf("program %s: not found in the engine's PATH %q", name, pathEnv)
}

// checkExecutable reports why p cannot be executed, naming p.
func checkExecutable(p string) error {
	st, err := os.Stat(p)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("program %s: no such file", p)
		}
		return fmt.Errorf("program %s: %w", p, err)
	}
	if st.IsDir() {
		return fmt.Errorf("program %s: is a directory", p)
	}
	if st.Mode()&0o111 == 0 {
		return fmt.Errorf("program %s: not executable", p)
	}
	if err := syscall.Access(p, 1 /* X_OK */); err != nil {
		return fmt.Errorf("program %s: not executable: %w", p, err)
	}
	return nil
}

// ReadStatus returns the engine's status: from the shim when it answers,
// else from the exit record. ErrNoStatus means neither exists (the shim was
// killed before the engine ended, or the directory is not a launch's).
func ReadStatus(launchDir string) (Status, error) {
	ctx, cancel := context.WithTimeout(context.Background(), shimRequestTimeout)
	defer cancel()
	var st Status
	if err := shimRequest(ctx, launchDir, "status", &st); err == nil {
		return st, nil
	}
	rec, err := readExitRecord(launchDir)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return Status{ExitCode: -1}, ErrNoStatus
		}
		return Status{ExitCode: -1}, fmt.Errorf("read engine status: %w", err)
	}
	return Status{EnginePID: rec.PID, Exited: true, ExitCode: rec.Code, Signal: rec.Signal}, nil
}

// WaitExitStatus returns the status of an engine whose process is gone.
// The shim records the exit a moment after the process dies (once it has
// copied the engine's last output), so until then ReadStatus still says
// running: the status is read again until it says exited, the shim is gone
// without a record (ErrNoStatus), or wait has passed (Exited is false
// then).
func WaitExitStatus(launchDir string, wait time.Duration) (Status, error) {
	var st Status
	var err error
	poll(wait, func() bool {
		st, err = ReadStatus(launchDir)
		return (err == nil && st.Exited) || errors.Is(err, ErrNoStatus)
	})
	return st, err
}

// Tail returns the last maxBytes (at least 1; a negative value means all
// that is kept) of the engine's redacted output: from the shim's ring when
// the shim answers and the ring can hold that much, else from the log files
// in file mode. truncated is true when older output was cut; the text then
// starts at a line boundary. ErrNoLogs means nothing holds the output any
// more (memory mode after the shim left).
func Tail(launchDir string, maxBytes int) (text string, truncated bool, err error) {
	if maxBytes == 0 {
		maxBytes = 1
	}
	var b []byte
	got := false
	if maxBytes > 0 && maxBytes <= RingSize {
		ctx, cancel := context.WithTimeout(context.Background(), shimRequestTimeout)
		var res tailResult
		if shimRequest(ctx, launchDir, "tail "+strconv.Itoa(maxBytes), &res) == nil {
			b, truncated, got = res.Text, res.Truncated, true
		}
		cancel()
	}
	if !got {
		b, truncated, err = tailFiles(launchDir, maxBytes)
		if err != nil {
			if errors.Is(err, ErrNoLogs) {
				// The shim may still answer a request too large for its
				// ring (memory mode): give what it has.
				ctx, cancel := context.WithTimeout(context.Background(), shimRequestTimeout)
				defer cancel()
				var res tailResult
				if shimRequest(ctx, launchDir, "tail "+strconv.Itoa(maxBytes), &res) == nil {
					return string(alignTail(res.Text, res.Truncated)), res.Truncated, nil
				}
			}
			return "", false, err
		}
	}
	return string(alignTail(b, truncated)), truncated, nil
}

// alignTail drops the partial first line of a cut tail.
func alignTail(b []byte, truncated bool) []byte {
	if !truncated {
		return b
	}
	if i := bytes.IndexByte(b, '\n'); i >= 0 && i+1 < len(b) {
		return b[i+1:]
	}
	return b
}

// LastLines returns the last n non-empty lines of the engine's redacted
// output (fewer when there are fewer), nil when none is available. Drivers
// put them in a failed probe's answer.
func LastLines(launchDir string, n int) []string {
	if n <= 0 {
		return nil
	}
	text, _, err := Tail(launchDir, 64<<10)
	if err != nil {
		return nil
	}
	text = strings.ReplaceAll(text, "\r\n", "\n")
	var lines []string
	for _, l := range strings.FieldsFunc(text, func(r rune) bool { return r == '\n' || r == '\r' }) {
		if strings.TrimSpace(l) != "" {
			lines = append(lines, l)
		}
	}
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return lines
}

// Release tells a memory-mode shim that lingers after its engine ended to
// exit now. It is a no-op error (the dial fails) when no shim is there.
func Release(launchDir string) error {
	ctx, cancel := context.WithTimeout(context.Background(), shimRequestTimeout)
	defer cancel()
	if err := shimRequest(ctx, launchDir, "bye", nil); err != nil {
		return fmt.Errorf("release shim: %w", err)
	}
	return nil
}

// A spare shim: exec'ing the driver's executable as a shim costs about ten
// milliseconds of every cold start (a large Go binary's loading and
// initialisation), so a driver that launched once keeps one shim started
// ahead, waiting for its spec, and hands the next launch to it. A shim
// inherits nothing from the driver (newShim), so a spare is the same as a
// shim started for its launch; it exits when the driver does (its spec
// pipe closes).
var spares struct {
	mu     sync.Mutex
	by     map[string]*shimProc // executable -> its spare
	closed bool                 // CloseSpares ran: no more spares
}

// CloseSpares ends the spare shims and waits up to wait for them to exit;
// no spare is started after it. A driver calls it as it shuts down, so that
// no process of its outlives it (a spare would exit on its own once the
// driver's end closed its spec pipe, but after the driver, not before).
func CloseSpares(wait time.Duration) {
	spares.mu.Lock()
	spares.closed = true
	var all []*shimProc
	for exe, sh := range spares.by {
		all = append(all, sh)
		delete(spares.by, exe)
	}
	spares.mu.Unlock()
	deadline := time.NewTimer(wait)
	defer deadline.Stop()
	for _, sh := range all {
		sh.specW.Close() // the spare reads EOF and exits
		sh.repR.Close()
		select {
		case <-sh.waited:
		case <-deadline.C:
			_ = sh.cmd.Process.Kill()
			return
		}
	}
}

// NoSpareShim turns the spare shim off (a test that counts processes).
var NoSpareShim bool

// refillDelay is how long after a launch its successor's spare is started:
// past the fork of the engine just launched (its first milliseconds are
// the cold request's), short of the next launch of a burst (a switch,
// several deployments started at once, a restart). At 250 ms, 35-45 % of
// the benchmark's cold requests, one every ~150-300 ms, found no spare
// and paid a shim's exec (15-25 ms under load).
var refillDelay = 100 * time.Millisecond

// takeSpare returns exe's spare, nil when there is none or it died.
func takeSpare(exe string) *shimProc {
	spares.mu.Lock()
	sh := spares.by[exe]
	delete(spares.by, exe)
	spares.mu.Unlock()
	if sh == nil {
		return nil
	}
	select {
	case <-sh.waited:
		sh.specW.Close()
		sh.repR.Close()
		return nil
	default:
	}
	return sh
}

// refillSpare starts exe's next spare unless it has one.
func refillSpare(exe string) {
	if NoSpareShim {
		return
	}
	spares.mu.Lock()
	if spares.closed || spares.by[exe] != nil {
		spares.mu.Unlock()
		return
	}
	spares.mu.Unlock()
	sh, err := newShim(exe)
	if err != nil {
		return
	}
	sh.spare = true
	spares.mu.Lock()
	defer spares.mu.Unlock()
	if spares.by == nil {
		spares.by = map[string]*shimProc{}
	}
	if spares.closed || spares.by[exe] != nil {
		// Another refill won, or the driver is ending: this one reads EOF
		// and exits.
		sh.specW.Close()
		sh.repR.Close()
		return
	}
	spares.by[exe] = sh
}
