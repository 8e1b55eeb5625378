// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package proc

import (
	"os"
	"strings"
	"testing"
	"time"
)

// TestCopyGathered_ReadsOutputInGathers: an engine that writes its log a
// piece at a time, 50 pieces a millisecond or so apart, is read in a few
// gathers (one every logGather), not once per piece; every byte arrives,
// in order, and the copy ends with the pipe.
func TestCopyGathered_ReadsOutputInGathers(t *testing.T) {
	pr, pw, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	var w writeCounter
	done := make(chan struct{})
	go func() { defer close(done); copyGathered(&w, pr) }()
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
