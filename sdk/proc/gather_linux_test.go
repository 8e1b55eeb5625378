// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package proc

import (
	"os"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// TestCopyGathered_ReadsOutputInGathers: an engine that writes its log a
// piece at a time, 50 pieces a millisecond or so apart, is read in a few
// gathers (a pause of 20 ms or more between reads), not once per piece;
// every byte arrives,
// in order, and the copy ends with the pipe.
func TestCopyGathered_ReadsOutputInGathers(t *testing.T) {
	pr, pw, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	var w writeCounter
	done := make(chan struct{})
	go func() { defer close(done); copyGathered(&w, pr, nil, smallPipePauses) }()
	var want strings.Builder
	for i := 0; i < 50; i++ {
		piece := "srv  log_server_r: request: POST /v1/chat/completions 127.0.0.1 200\n"
		want.WriteString(piece)
		if _, err := pw.WriteString(piece); err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Millisecond)
	}
	pw.Close()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("the copy did not end with the pipe")
	}
	pr.Close()
	if got := strings.Join(w.writes, ""); got != want.String() {
		t.Fatalf("copied %d bytes, want %d, in order", len(got), want.Len())
	}
	if len(w.writes) > 25 {
		t.Fatalf("%d reads for 50 pieces, want them gathered (at most 25)", len(w.writes))
	}
}

// TestOutputPipe_OutsideThePoller: the engine's output pipe is read with
// plain blocking reads, outside the runtime's poller (a file in the poller
// takes a deadline, one outside it does not), so that the engine's writes
// wake nothing while the shim gathers; it carries the bytes as a pipe does.
func TestOutputPipe_OutsideThePoller(t *testing.T) {
	pr, pw, _, err := outputPipe()
	if err != nil {
		t.Fatal(err)
	}
	defer pr.Close()
	if err := pr.SetReadDeadline(time.Now().Add(time.Second)); err == nil {
		t.Fatal("the read end is in the runtime's poller")
	}
	if _, err := pw.WriteString("line\n"); err != nil {
		t.Fatal(err)
	}
	pw.Close()
	var w writeCounter
	copyGathered(&w, pr, nil, smallPipePauses)
	if got := strings.Join(w.writes, ""); got != "line\n" {
		t.Fatalf("copied %q", got)
	}
}

// TestGatherPauses_GrowWhileOutputKeepsComing: the pause after a read is
// 20 ms after a quiet spell and doubles, up to 250 ms, while each read
// finds output waiting; a read that waited 20 ms or more starts again at
// 20 ms. With the pipe's default size the pause stays at 20 ms.
func TestGatherPauses_GrowWhileOutputKeepsComing(t *testing.T) {
	ms := time.Millisecond
	var got []int64
	last := time.Duration(0)
	for _, waited := range []time.Duration{time.Second, 0, 0, ms, 0, 0, 0, 25 * ms, 0} {
		last = enginePauses.next(last, waited)
		got = append(got, int64(last/ms))
	}
	want := []int64{20, 40, 80, 160, 250, 250, 250, 20, 40}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("pauses %v ms, want %v ms", got, want)
		}
	}
	if p := smallPipePauses.next(20*ms, 0); p != 20*ms {
		t.Fatalf("pause %v with the small pipe, want 20ms", p)
	}
}

// TestCopyGathered_NoPauseAfterExit: once the engine has exited, the copy
// reads what is left at once instead of finishing its pause (an hour here),
// so that the engine's last lines are in the log when its exit is
// reported.
func TestCopyGathered_NoPauseAfterExit(t *testing.T) {
	pr, pw, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer pr.Close()
	w := &syncWriter{wrote: make(chan struct{}, 8)}
	exited, done := make(chan struct{}), make(chan struct{})
	go func() { defer close(done); copyGathered(w, pr, exited, gatherPauses{min: time.Hour, max: time.Hour}) }()
	_, _ = pw.WriteString("first line\n")
	<-w.wrote // read; the copy now pauses for an hour
	_, _ = pw.WriteString("last line\n")
	pw.Close()
	close(exited)
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("the copy went on pausing after the engine exited")
	}
	if got := w.String(); got != "first line\nlast line\n" {
		t.Fatalf("copied %q", got)
	}
}

// TestOutputPipe_Enlarged: the engine's output pipe holds 1 MiB, so that
// an engine writing 4 MiB/s of log is not held in write(2) during the
// shim's longest pause.
func TestOutputPipe_Enlarged(t *testing.T) {
	pr, pw, big, err := outputPipe()
	if err != nil {
		t.Fatal(err)
	}
	defer pr.Close()
	defer pw.Close()
	n, _, errno := syscall.Syscall(syscall.SYS_FCNTL, pw.Fd(), syscall.F_GETPIPE_SZ, 0)
	if errno != 0 {
		t.Fatal(errno)
	}
	if !big || int(n) < pipeBytes {
		t.Fatalf("pipe of %d bytes (big %v), want %d", n, big, pipeBytes)
	}
}

// syncWriter collects writes and signals each.
type syncWriter struct {
	mu    sync.Mutex
	b     strings.Builder
	wrote chan struct{}
}

func (w *syncWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	w.b.Write(p)
	w.mu.Unlock()
	w.wrote <- struct{}{}
	return len(p), nil
}

func (w *syncWriter) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.String()
}
