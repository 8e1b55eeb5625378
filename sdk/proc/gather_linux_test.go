// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package proc

import (
	"io"
	"os"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// copyEvent is one step of copyGatheredWith as a test sees it: a write of
// n bytes to the sink, or (n < 0) a pause of d between reads.
type copyEvent struct {
	n    int
	data string
	d    time.Duration
}

// stepCopy runs copyGatheredWith over r with enginePauses on a goroutine
// and reports each of its writes and pauses on the returned channel; each
// pause holds until the test calls resume (resume(false): the engine
// exited). done closes when the copy returns. (After tidy5's stepping
// tests of the fixed gather.)
func stepCopy(t *testing.T, r io.Reader) (events <-chan copyEvent, resume func(bool), done <-chan struct{}) {
	t.Helper()
	ev := make(chan copyEvent, 128)
	res := make(chan bool)
	d := make(chan struct{})
	w := writerFunc(func(p []byte) (int, error) {
		ev <- copyEvent{n: len(p), data: string(p)}
		return len(p), nil
	})
	go func() {
		defer close(d)
		copyGatheredWith(w, r, enginePauses, func(p time.Duration) bool {
			ev <- copyEvent{n: -1, d: p}
			more, ok := <-res
			return more && ok
		})
	}()
	t.Cleanup(func() {
		close(res) // a failed test leaves no copy held in a pause
		<-d
	})
	return ev, func(more bool) { res <- more }, d
}

// next is the copy's next step (a test that waits long fails: the copy is
// stuck in a read that nothing will end).
func next(t *testing.T, events <-chan copyEvent) copyEvent {
	t.Helper()
	select {
	case e := <-events:
		return e
	case <-time.After(10 * time.Second):
		t.Fatal("the copy took no further step: it is blocked in a read")
		return copyEvent{}
	}
}

// TestCopyGathered_ReadsOutputInGathers: after a read, the copy pauses
// before it reads again, and the pieces an engine wrote meanwhile, one
// write each, come in one read: 50 pieces are read in 2 reads, not 50.
// Every byte arrives, in order, and the copy ends with the pipe. The test
// writes while the copy is held in its pause, so no clock decides the
// count.
func TestCopyGathered_ReadsOutputInGathers(t *testing.T) {
	pr, pw, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer pr.Close()
	events, resume, done := stepCopy(t, pr)
	const piece = "srv  log_server_r: request: POST /v1/chat/completions 127.0.0.1 200\n"
	if _, err := pw.WriteString(piece); err != nil {
		t.Fatal(err)
	}
	if e := next(t, events); e.data != piece {
		t.Fatalf("first step %+v, want the first piece", e)
	}
	if e := next(t, events); e.n >= 0 || e.d < enginePauses.min {
		t.Fatalf("after a read the copy took step %+v instead of a pause: it reads without gathering", e)
	}
	var rest strings.Builder
	for i := 1; i < 50; i++ {
		rest.WriteString(piece)
		if _, err := pw.WriteString(piece); err != nil {
			t.Fatal(err)
		}
	}
	resume(true)
	if e := next(t, events); e.data != rest.String() {
		t.Fatalf("after the pause the copy wrote %d bytes, want the other 49 pieces (%d bytes) in one read", e.n, rest.Len())
	}
	if e := next(t, events); e.n >= 0 {
		t.Fatalf("the copy wrote %d bytes more, want a pause", e.n)
	}
	pw.Close()
	resume(true)
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("the copy did not end with the pipe")
	}
}

// TestCopyGathered_FullReadReadsAgainAtOnce: a read that filled the
// copy's buffer (64 KiB) is followed by the next read at once, without a
// pause: an engine writing more than a pipe holds per pause is not held in
// write(2).
func TestCopyGathered_FullReadReadsAgainAtOnce(t *testing.T) {
	pr, pw, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer pr.Close()
	defer pw.Close()
	// The write must return before any read: the pipe must hold it. A new
	// pipe holds 64 KiB, unless its user has spent the pipe budget
	// (fs.pipe-user-pages-soft), which leaves one page: then the write
	// would wait forever for a read.
	full := strings.Repeat("x", 64<<10)
	if n := pipeSize(t, pw); n < len(full) {
		t.Fatalf("a new pipe holds %d bytes, not the %d the test writes before the copy reads "+
			"(this user's pipe budget, fs.pipe-user-pages-soft, is spent: too many pipes open)", n, len(full))
	}
	if _, err := pw.WriteString(full); err != nil {
		t.Fatal(err)
	}
	events, resume, done := stepCopy(t, pr)
	if e := next(t, events); e.n != len(full) {
		t.Fatalf("first step %+v, want one read of %d bytes", e.n, len(full))
	}
	if _, err := pw.WriteString("tail\n"); err != nil {
		t.Fatal(err)
	}
	if e := next(t, events); e.data != "tail\n" {
		t.Fatalf("after a full read the copy took step %+v, want the next read at once", e)
	}
	if e := next(t, events); e.n >= 0 {
		t.Fatalf("the copy wrote %d bytes more, want a pause", e.n)
	}
	pw.Close()
	resume(true)
	<-done
}

// TestCopyGathered_NoPausesOnceExited: once a pause reports that the
// engine exited, the copy reads on without pauses until the pipe ends.
func TestCopyGathered_NoPausesOnceExited(t *testing.T) {
	pr, pw, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer pr.Close()
	events, resume, done := stepCopy(t, pr)
	_, _ = pw.WriteString("a\n")
	next(t, events)
	if e := next(t, events); e.n >= 0 {
		t.Fatalf("step %+v, want a pause", e)
	}
	resume(false) // the engine exited
	_, _ = pw.WriteString("b\n")
	if e := next(t, events); e.data != "b\n" {
		t.Fatalf("step %+v, want the read of b", e)
	}
	_, _ = pw.WriteString("c\n")
	if e := next(t, events); e.data != "c\n" {
		t.Fatalf("step %+v after the exit, want the next read without a pause", e)
	}
	pw.Close()
	<-done
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
	if n := pipeSize(t, pw); !big || n < pipeBytes {
		// The kernel refuses a larger pipe to a user whose pipes already
		// hold fs.pipe-user-pages-soft pages (one 1 MiB pipe per engine
		// counts 256 of its 16384 by default). A pipe of this test's own
		// refused too says so; one it is given says outputPipe did not ask.
		if errno := enlargeNewPipe(t); errno == syscall.EPERM {
			t.Skipf("the kernel refuses a %d-byte pipe to this user (EPERM: its pipe budget, fs.pipe-user-pages-soft, is spent); outputPipe's pipe holds %d bytes", pipeBytes, n)
		}
		t.Fatalf("pipe of %d bytes (big %v), want %d", n, big, pipeBytes)
	}
}

// pipeSize is F_GETPIPE_SZ of a pipe's end.
func pipeSize(t *testing.T, f *os.File) int {
	t.Helper()
	n, _, errno := syscall.Syscall(syscall.SYS_FCNTL, f.Fd(), syscall.F_GETPIPE_SZ, 0)
	if errno != 0 {
		t.Fatal(errno)
	}
	return int(n)
}

// enlargeNewPipe asks for a pipe of pipeBytes and returns the kernel's
// answer (0: granted).
func enlargeNewPipe(t *testing.T) syscall.Errno {
	t.Helper()
	pr, pw, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer pr.Close()
	defer pw.Close()
	_, _, errno := syscall.Syscall(syscall.SYS_FCNTL, pw.Fd(), syscall.F_SETPIPE_SZ, pipeBytes)
	return errno
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
