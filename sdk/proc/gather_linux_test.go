// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package proc

import (
	"io"
	"os"
	"strings"
	"testing"
	"time"
)

// copyEvent is one step of copyGatheredWith as a test sees it: a write
// of n bytes to the sink, or (n < 0) a wait between reads.
type copyEvent struct {
	n    int
	data string
}

// stepCopy runs copyGatheredWith over r on a goroutine and reports each of
// its writes and waits on the returned channel; each wait holds until the
// test calls resume. done closes when the copy returns.
func stepCopy(t *testing.T, r io.Reader) (events <-chan copyEvent, resume func(), done <-chan struct{}) {
	t.Helper()
	ev := make(chan copyEvent, 128)
	res := make(chan struct{})
	d := make(chan struct{})
	w := writerFunc(func(p []byte) (int, error) {
		ev <- copyEvent{n: len(p), data: string(p)}
		return len(p), nil
	})
	go func() {
		defer close(d)
		copyGatheredWith(w, r, func() {
			ev <- copyEvent{n: -1}
			<-res
		})
	}()
	t.Cleanup(func() {
		close(res) // a failed test leaves no copy held in a wait
		<-d
	})
	return ev, func() { res <- struct{}{} }, d
}

// next is the copy's next step (a test that waits long fails: the copy
// is stuck in a read that nothing will end).
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

// TestCopyGathered_ReadsOutputInGathers: after a read, the copy waits (a
// gather) before it reads again, and the pieces an engine wrote meanwhile,
// one write each, come in one read: 50 pieces are read in 2 reads, not 50.
// Every byte arrives, in order, and the copy ends with the pipe. The test
// writes while the copy is held in its wait, so no clock decides the
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
	if e := next(t, events); e.n >= 0 {
		t.Fatalf("after a read the copy wrote %d bytes instead of waiting: it reads without gathering", e.n)
	}
	var rest strings.Builder
	for i := 1; i < 50; i++ {
		rest.WriteString(piece)
		if _, err := pw.WriteString(piece); err != nil {
			t.Fatal(err)
		}
	}
	resume()
	if e := next(t, events); e.data != rest.String() {
		t.Fatalf("after the wait the copy wrote %d bytes, want the other 49 pieces (%d bytes) in one read", e.n, rest.Len())
	}
	if e := next(t, events); e.n >= 0 {
		t.Fatalf("the copy wrote %d bytes more, want a wait", e.n)
	}
	pw.Close()
	resume()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("the copy did not end with the pipe")
	}
}

// TestCopyGathered_FullReadReadsAgainAtOnce: a read that filled the
// copy's buffer (64 KiB) is followed by the next read at once, without a
// wait: an engine writing more than a pipe holds per gather is not held
// in write(2).
func TestCopyGathered_FullReadReadsAgainAtOnce(t *testing.T) {
	pr, pw, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer pr.Close()
	// A pipe holds at least 64 KiB: this write returns before any read.
	full := strings.Repeat("x", 64<<10)
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
		t.Fatalf("the copy wrote %d bytes more, want a wait", e.n)
	}
	pw.Close()
	resume()
	<-done
}

// TestOutputPipe_OutsideThePoller: the engine's output pipe is read with
// plain blocking reads, outside the runtime's poller (a file in the poller
// takes a deadline, one outside it does not), so that the engine's writes
// wake nothing while the shim gathers; it carries the bytes as a pipe does.
func TestOutputPipe_OutsideThePoller(t *testing.T) {
	pr, pw, err := outputPipe()
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
	copyGathered(&w, pr)
	if got := strings.Join(w.writes, ""); got != "line\n" {
		t.Fatalf("copied %q", got)
	}
}
