// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package proc

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// shimEnvMarker is the only variable in the shim's environment. Start
// refuses to run in a process that has it: that is an executable which was
// started as a shim but did not call MaybeRunShim, and would otherwise
// launch itself again and again.
const shimEnvMarker = "CAPYCTL_ENGINE_SHIM"

// Descriptors the shim inherits from Start.
const (
	shimSpecFD   = 3 // the launch spec, JSON, read to EOF
	shimReportFD = 4 // one shimReport, JSON
)

// shimSpec is what Start sends the shim over its spec pipe.
type shimSpec struct {
	LaunchSpec
	// Program is the resolved absolute path of Argv[0].
	Program string `json:"program"`
	// Dir is the resolved working directory.
	WorkDir string `json:"work_dir"`
	// RotateBytes and LingerMS are knobs for tests (0: the defaults).
	RotateBytes int64 `json:"rotate_bytes,omitempty"`
	LingerMS    int64 `json:"linger_ms,omitempty"`
}

// shimReport is what the shim tells Start once the engine runs (or could
// not be started).
type shimReport struct {
	EnginePID   int    `json:"engine_pid,omitempty"`
	EngineTicks uint64 `json:"engine_ticks,omitempty"`
	// ShimTicks is the shim's own start time, read by the shim itself so
	// that Start knows it even when the shim has already exited.
	ShimTicks uint64 `json:"shim_ticks,omitempty"`
	Error     string `json:"error,omitempty"`
}

// MaybeRunShim runs the shim and exits when the process was started as one
// (os.Args[1] == ShimArg); otherwise it returns at once. Every binary that
// calls Start must call it first thing in main, before flags are parsed or
// anything else starts; a test binary calls it in TestMain.
func MaybeRunShim() {
	if len(os.Args) < 2 || os.Args[1] != ShimArg {
		return
	}
	code := runShim()
	// The shim has no exit hooks to run; syscall.Exit also spares a
	// race-enabled build (tests) the race runtime's one-second exit sleep.
	syscall.Exit(code)
}

// shim is the supervisor's state.
type shim struct {
	spec   shimSpec
	ring   *Ring
	pgid   int
	linger time.Duration

	mu      sync.Mutex
	status  Status
	byeSeen bool
	bye     chan struct{}
}

func runShim() int {
	// IMPORTANT: catch (not ignore) these signals. An ignored disposition is
	// inherited by the engine through exec; a caught one is reset to the
	// default, so the engine gets a clean signal table.
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP)
	dropTerminal()
	// Quick to wake when the spec comes; the engine gets the default back
	// (engineSlice, before the fork).
	_ = AskShortSlice()
	// The spec and report pipes must not leak into the engine.
	syscall.CloseOnExec(shimSpecFD)
	syscall.CloseOnExec(shimReportFD)
	reportFile := os.NewFile(shimReportFD, "shim-report")
	report := func(r shimReport) {
		if reportFile == nil {
			return
		}
		_ = json.NewEncoder(reportFile).Encode(r)
		reportFile.Close()
		reportFile = nil
	}

	specFile := os.NewFile(shimSpecFD, "shim-spec")
	var spec shimSpec
	err := json.NewDecoder(specFile).Decode(&spec)
	specFile.Close()
	if err != nil {
		report(shimReport{Error: fmt.Sprintf("read launch spec: %v", err)})
		return 2
	}
	s := &shim{
		spec:   spec,
		ring:   NewRing(RingSize),
		pgid:   syscall.Getpgrp(),
		linger: MemoryLinger,
		bye:    make(chan struct{}),
		status: Status{ExitCode: -1},
	}
	if spec.LingerMS > 0 {
		s.linger = time.Duration(spec.LingerMS) * time.Millisecond
	}

	// The sink: the ring always, the rotated file in file mode.
	var file *rotatingFile
	if spec.LogMode != LogModeMemory {
		file, err = openRotatingFile(spec.LaunchDir, spec.RotateBytes, LogFiles)
		if err != nil {
			report(shimReport{Error: err.Error()})
			return 2
		}
		defer file.Close()
	}
	redacting := NewRedactingWriter(&sink{ring: s.ring, file: file}, NewRedactor(spec.Secrets))
	out := redacting

	// Listen before the engine starts, so that the socket answers as soon
	// as Start returns.
	ln, err := listenShim(spec.LaunchDir)
	if err != nil {
		report(shimReport{Error: err.Error()})
		return 2
	}
	defer os.Remove(filepath.Join(spec.LaunchDir, SocketName))
	defer ln.Close()

	pr, pw, bigPipe, err := outputPipe()
	if err != nil {
		report(shimReport{Error: fmt.Sprintf("output pipe: %v", err)})
		return 2
	}
	cmd := &exec.Cmd{
		Path:   spec.Program,
		Args:   spec.Argv,
		Env:    envList(spec.Env),
		Dir:    spec.WorkDir,
		Stdin:  nil, // /dev/null
		Stdout: pw,
		Stderr: pw,
	}
	if spec.NoCoreDumps {
		// The limit set here is inherited by the engine and its children;
		// the hard limit too, so the engine cannot raise it again.
		_ = syscall.Setrlimit(syscall.RLIMIT_CORE, &syscall.Rlimit{Cur: 0, Max: 0})
	}
	if spec.NetNamespace {
		// IMPORTANT: this goroutine stays locked to its thread for the
		// shim's life: the thread enters the new namespace and the engine
		// is forked from it (a fork takes the calling thread's
		// namespaces); no other goroutine may run on it. The runtime
		// starts new threads from a template thread, not from a locked one.
		runtime.LockOSThread()
		if err := enterNewNetns(); err != nil {
			pr.Close()
			pw.Close()
			report(shimReport{Error: err.Error()})
			return 2
		}
	}
	if id := spec.JoinNetns; id.PID != 0 && !spec.NetNamespace {
		// IMPORTANT: locked for the shim's life, as above.
		runtime.LockOSThread()
		if err := joinNetns(id); err != nil {
			pr.Close()
			pw.Close()
			report(shimReport{Error: err.Error()})
			return 2
		}
	}
	// IMPORTANT: the engine is forked from this thread and inherits its
	// slice: the kernel's default, not the shim's short one.
	runtime.LockOSThread()
	restore := engineSlice()
	err = cmd.Start()
	restore()
	runtime.UnlockOSThread()
	pw.Close()
	if err != nil {
		pr.Close()
		report(shimReport{Error: fmt.Sprintf("start %s: %v", spec.Program, err)})
		return 127
	}
	pid := cmd.Process.Pid
	ticks, _ := ReadStartTicks(pid)
	selfTicks, _ := ReadStartTicks(os.Getpid())
	s.setStatus(Status{EnginePID: pid, Running: true, ExitCode: -1})
	// The identities go on disk before anyone learns them: a supervisor
	// that dies before recording them can still find this launch.
	writeLaunchedFile(spec.LaunchDir, Launched{
		Pgid: os.Getpid(), Shim: Identity{PID: os.Getpid(), StartTicks: selfTicks},
		Engine: Identity{PID: pid, StartTicks: ticks}, LaunchDir: spec.LaunchDir,
	})
	report(shimReport{EnginePID: pid, EngineTicks: ticks, ShimTicks: selfTicks})

	go s.serve(ln)

	copied, exited := make(chan struct{}), make(chan struct{})
	pauses := smallPipePauses
	if bigPipe {
		pauses = enginePauses
	}
	go func() {
		defer close(copied)
		copyGathered(out, pr, exited, pauses)
	}()
	waited := make(chan *os.ProcessState, 1)
	go func() {
		_ = cmd.Wait()
		close(exited)
		waited <- cmd.ProcessState
	}()

	termSeen := false
	var state *os.ProcessState
	for state == nil {
		select {
		case sig := <-sigs:
			// The engine gets the group's signal itself; the shim only
			// notes that it was asked to stop.
			if sig == syscall.SIGTERM {
				termSeen = true
			}
		case state = <-waited:
		}
	}

	// Take what the engine wrote before it exited. Other members of the
	// group may hold the pipe open, so the wait for end of file is short.
	waitFor(copied, 250*time.Millisecond)
	code, sigName := exitStatus(state)
	s.setStatus(Status{EnginePID: pid, Exited: true, ExitCode: code, Signal: sigName})
	_ = writeExitRecord(spec.LaunchDir, exitRecord{Code: code, Signal: sigName, At: time.Now().UnixMilli(), PID: pid})
	// IMPORTANT: the shim anchors the group's identity (its PID is the
	// group's ID) as long as any other process is left in the group, so
	// that Stop can still prove whose group it signals. It keeps copying
	// their output meanwhile.
	s.waitGroupEmpty(sigs, &termSeen)
	waitFor(copied, 250*time.Millisecond)
	_ = redacting.Close()
	if file != nil {
		_ = file.Close()
	}

	if spec.LogMode == LogModeMemory && !termSeen {
		s.lingerForTail(sigs)
	}
	return 0
}

// waitGroupEmpty returns once the shim is the only live process of its
// group, polling finely at first.
func (s *shim) waitGroupEmpty(sigs <-chan os.Signal, termSeen *bool) {
	interval := 5 * time.Millisecond
	self := os.Getpid()
	for {
		others := 0
		for _, p := range GroupPIDs(s.pgid) {
			if p != self {
				others++
			}
		}
		if others == 0 {
			return
		}
		t := time.NewTimer(interval)
		select {
		case sig := <-sigs:
			if sig == syscall.SIGTERM {
				*termSeen = true
			}
		case <-t.C:
		}
		t.Stop()
		interval = min(interval*3/2, 200*time.Millisecond)
	}
}

// lingerForTail keeps a memory-mode shim serving its ring for a while after
// the engine is gone, so that a driver can read the last lines of a failed
// start. SIGTERM or a "bye" command ends it at once.
func (s *shim) lingerForTail(sigs <-chan os.Signal) {
	t := time.NewTimer(s.linger)
	defer t.Stop()
	for {
		select {
		case sig := <-sigs:
			if sig == syscall.SIGTERM {
				return
			}
		case <-s.bye:
			return
		case <-t.C:
			return
		}
	}
}

func (s *shim) setStatus(st Status) {
	s.mu.Lock()
	s.status = st
	s.mu.Unlock()
}

func (s *shim) getStatus() Status {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.status
}

// serve answers commands on the shim socket until the listener closes.
func (s *shim) serve(ln *net.UnixListener) {
	for {
		conn, err := ln.AcceptUnix()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			time.Sleep(10 * time.Millisecond) // EMFILE and the like: back off
			continue
		}
		go s.handle(conn)
	}
}

// handle answers one command: "status", "tail N" or "bye".
func (s *shim) handle(conn *net.UnixConn) {
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(shimRequestTimeout))
	line, err := bufio.NewReaderSize(conn, 256).ReadString('\n')
	if err != nil {
		return
	}
	fields := strings.Fields(line)
	var result any
	var failure string
	switch {
	case len(fields) == 1 && fields[0] == "status":
		result = s.getStatus()
	case len(fields) == 2 && fields[0] == "tail":
		n, err := strconv.Atoi(fields[1])
		if err != nil {
			failure = "bad tail size"
			break
		}
		text, truncated := s.ring.Tail(n)
		result = tailResult{Text: text, Truncated: truncated}
	case len(fields) == 1 && fields[0] == "bye":
		// IMPORTANT: answer before letting the shim go. Closing s.bye first
		// lets the shim exit before the answer is written, and the caller
		// reads EOF instead of its acknowledgement.
		defer s.sayBye()
		result = true
	default:
		failure = "unknown command"
	}
	var resp shimResponse
	if failure != "" {
		resp.Error = failure
	} else if b, err := json.Marshal(result); err != nil {
		resp.Error = err.Error()
	} else {
		resp.Result = b
	}
	_ = json.NewEncoder(conn).Encode(resp)
}

// sayBye ends the shim's linger (once).
func (s *shim) sayBye() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.byeSeen {
		s.byeSeen = true
		close(s.bye)
	}
}

// sink writes redacted output to the ring and, in file mode, the log file.
// A failing file (disk full) never stops the copy: the ring still gets it.
type sink struct {
	ring *Ring
	file *rotatingFile
}

func (k *sink) Write(p []byte) (int, error) {
	_, _ = k.ring.Write(p)
	if k.file != nil {
		_, _ = k.file.Write(p)
	}
	return len(p), nil
}

// copyGathered copies the engine's output to w until r ends, letting it
// gather between reads: an engine writes its log a piece at a time
// (llama-server a dozen lines per answer, each in a write of its own), and
// the shim reads it all at once instead of waking for each piece. The
// first read after a quiet spell is followed by a pause of p.min; while
// the output keeps coming (the read after a pause finds it waiting) the
// pause doubles up to p.max, so that an engine logging a line every few
// milliseconds under load wakes the shim four times a second, not fifty. A
// read that waited p.min or more for output starts again at p.min. The pipe
// holds what the engine writes meanwhile (outputPipe enlarges it); a read
// that fills the buffer is followed by the next at once, so an engine
// writing faster than that is not held in write(2). Once exited is closed
// (the engine ended) there are no pauses: what is left is read at once.
func copyGathered(w io.Writer, r io.Reader, exited <-chan struct{}, p gatherPauses) {
	t := time.NewTimer(time.Hour)
	t.Stop()
	copyGatheredWith(w, r, p, func(d time.Duration) bool {
		t.Reset(d)
		select {
		case <-t.C:
			return true
		case <-exited:
			t.Stop()
			return false
		}
	})
}

// copyGatheredWith is copyGathered with its pause given: pause(d) waits d
// and reports false once there are to be no more pauses (the engine
// exited). A test holds the pause while it writes instead of racing a
// clock.
func copyGatheredWith(w io.Writer, r io.Reader, p gatherPauses, pause func(time.Duration) bool) {
	buf := make([]byte, 64<<10)
	var last time.Duration
	pausing := true
	for {
		began := time.Now()
		n, err := r.Read(buf)
		if n > 0 {
			_, _ = w.Write(buf[:n])
		}
		if err != nil {
			return
		}
		if n == len(buf) || !pausing {
			continue
		}
		last = p.next(last, time.Since(began))
		pausing = pause(last)
	}
}

// gatherPauses are copyGathered's shortest and longest pauses.
type gatherPauses struct{ min, max time.Duration }

// next is the pause after a read that waited for output: min after a
// quiet spell (the first read, or one that waited min or more), else twice
// the last one, at most max.
func (p gatherPauses) next(last, waited time.Duration) time.Duration {
	if last == 0 || waited >= p.min {
		return p.min
	}
	return min(2*last, p.max)
}

// outputPipe is the engine's output pipe, both ends in blocking mode and
// outside the runtime's poller: the shim's reads (copyGathered) wait in
// read(2), and the engine's writes while the shim gathers wake nobody (a
// polled pipe wakes the poller's thread at every write). The pipe is
// enlarged to pipeBytes where the system allows (big reports whether it
// was), so that it holds what an engine writes during the longest pause.
func outputPipe() (r, w *os.File, big bool, err error) {
	var p [2]int
	if err := syscall.Pipe2(p[:], syscall.O_CLOEXEC); err != nil {
		return nil, nil, false, err
	}
	got, _, errno := syscall.Syscall(syscall.SYS_FCNTL, uintptr(p[1]), syscall.F_SETPIPE_SZ, pipeBytes)
	big = errno == 0 && int(got) >= pipeBytes
	return os.NewFile(uintptr(p[0]), "|0"), os.NewFile(uintptr(p[1]), "|1"), big, nil
}

// The shim's pauses between reads of the engine's output (copyGathered):
// 20 ms to 250 ms with a pipe of pipeBytes (1 MiB, the most Linux allows an
// unprivileged process by default, fs.pipe-max-size: 4 MiB/s of log at the
// longest pause); 20 ms with the pipe's default 64 KiB.
var (
	enginePauses    = gatherPauses{min: 20 * time.Millisecond, max: 250 * time.Millisecond}
	smallPipePauses = gatherPauses{min: 20 * time.Millisecond, max: 20 * time.Millisecond}
)

const pipeBytes = 1 << 20

// waitFor waits until ch is closed or d has passed.
func waitFor(ch <-chan struct{}, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ch:
	case <-t.C:
	}
}

// exitStatus turns a process state into an exit code (128+signal when a
// signal ended it) and the signal's name.
func exitStatus(st *os.ProcessState) (int, string) {
	if st == nil {
		return -1, ""
	}
	if ws, ok := st.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return 128 + int(ws.Signal()), signalName(ws.Signal())
	}
	return st.ExitCode(), ""
}

// signalName returns "SIGKILL" and the like.
func signalName(sig syscall.Signal) string {
	if n := unix.SignalName(sig); n != "" {
		return n
	}
	return "signal " + strconv.Itoa(int(sig))
}

// writeExitRecord writes dir/exit.json atomically (0600).
func writeExitRecord(dir string, rec exitRecord) error {
	b, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	tmp := filepath.Join(dir, "."+ExitFileName+".tmp")
	if err := os.WriteFile(tmp, append(b, '\n'), 0o600); err != nil {
		return fmt.Errorf("write exit record: %w", err)
	}
	if err := os.Rename(tmp, filepath.Join(dir, ExitFileName)); err != nil {
		return fmt.Errorf("write exit record: %w", err)
	}
	return nil
}

// readExitRecord reads dir/exit.json.
func readExitRecord(dir string) (exitRecord, error) {
	var rec exitRecord
	b, err := os.ReadFile(filepath.Join(dir, ExitFileName))
	if err != nil {
		return rec, err
	}
	if err := json.Unmarshal(b, &rec); err != nil {
		return rec, fmt.Errorf("decode exit record: %w", err)
	}
	return rec, nil
}

// envList turns an environment map into a sorted, never nil, KEY=VALUE list
// (an empty list, not nil, so that nothing is inherited).
func envList(env map[string]string) []string {
	out := make([]string, 0, len(env))
	for k, v := range env {
		out = append(out, k+"="+v)
	}
	sort.Strings(out)
	return out
}

// dropTerminal gives up the controlling terminal the shim inherited from
// its driver's session, if it has one. The shim shares that session (a
// session of its own is a scheduling group of its own: see newShim), so
// without this an engine that reads /dev/tty would be stopped by the
// terminal (SIGTTIN) instead of failing, and a stopped engine would get
// SIGHUP when its driver exits. Its children inherit no terminal.
func dropTerminal() {
	fd, err := syscall.Open("/dev/tty", syscall.O_RDWR|syscall.O_NOCTTY|syscall.O_CLOEXEC, 0)
	if err != nil {
		return // no controlling terminal
	}
	_, _, _ = syscall.Syscall(syscall.SYS_IOCTL, uintptr(fd), syscall.TIOCNOTTY, 0)
	_ = syscall.Close(fd)
}
