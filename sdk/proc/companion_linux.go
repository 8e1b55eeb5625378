// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package proc

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"time"
)

// companionStopGrace is how long a companion whose engine ended may take
// after SIGTERM before the shim kills it.
const companionStopGrace = 5 * time.Second

// companion is a launch's running companion process, seen from the shim.
// A nil *companion is a launch without one: its methods do nothing.
type companion struct {
	cmd    *exec.Cmd
	id     Identity
	waited chan struct{}
	copied chan struct{}
}

// lockedWriter serialises the engine's and the companion's output into the
// one redacting sink.
type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// startCompanion starts spec.Companion in the shim's group, its output
// prefixed with its role into out.
func startCompanion(spec shimSpec, out io.Writer) (*companion, error) {
	c := spec.Companion
	pr, pw, err := os.Pipe()
	if err != nil {
		return nil, fmt.Errorf("%s output pipe: %w", c.Role, err)
	}
	cmd := &exec.Cmd{
		Path:   spec.CompanionProgram,
		Args:   c.Argv,
		Env:    envList(c.Env),
		Dir:    spec.WorkDir,
		Stdout: pw,
		Stderr: pw,
	}
	err = cmd.Start()
	pw.Close()
	if err != nil {
		pr.Close()
		return nil, fmt.Errorf("start %s %s: %v", c.Role, spec.CompanionProgram, err)
	}
	ticks, _ := ReadStartTicks(cmd.Process.Pid)
	comp := &companion{cmd: cmd, id: Identity{PID: cmd.Process.Pid, StartTicks: ticks}, waited: make(chan struct{}), copied: make(chan struct{})}
	go func() {
		defer close(comp.copied)
		sc := bufio.NewScanner(pr)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			_, _ = fmt.Fprintf(out, "[%s] %s\n", c.Role, sc.Bytes())
		}
		pr.Close()
	}()
	go func() {
		_ = cmd.Wait()
		close(comp.waited)
	}()
	return comp, nil
}

// identity is the companion's identity, zero without one.
func (c *companion) identity() Identity {
	if c == nil {
		return Identity{}
	}
	return c.id
}

// gone is closed when the companion has exited; nil (never ready) without
// one.
func (c *companion) gone() <-chan struct{} {
	if c == nil {
		return nil
	}
	return c.waited
}

// end stops the companion (SIGTERM, SIGKILL after companionStopGrace) and
// waits for it; at once when it has already exited.
func (c *companion) end() {
	if c == nil {
		return
	}
	select {
	case <-c.waited:
	default:
		_ = c.cmd.Process.Signal(syscall.SIGTERM)
		t := time.NewTimer(companionStopGrace)
		select {
		case <-c.waited:
		case <-t.C:
			_ = c.cmd.Process.Kill()
			<-c.waited
		}
		t.Stop()
	}
	waitFor(c.copied, 250*time.Millisecond)
}
