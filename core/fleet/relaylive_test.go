// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package fleet

import (
	"bufio"
	"context"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/capyctl/capyctl/core/hostlink/proto/hostv1"
	"github.com/capyctl/capyctl/plugins-testkit/poll"
)

// TestWatchLost_AHostWhoseRelayAnswersIsNotLost: a host whose heartbeats
// stop while its relay delivers a stream's chunks is not taken for lost
// (under a burst of opens on a loaded machine a heartbeat came late while
// the relay worked, and the server closed the relay with every stream on
// it); once its relay is silent too, it is lost.
func TestWatchLost_AHostWhoseRelayAnswersIsNotLost(t *testing.T) {
	const beat = 100 * time.Millisecond // lost after 3 silent beats
	s, stopBeats, chunk, cancel := relayWithoutBeats(t, beat)
	stopBeats() // the host's heartbeats stop; its relay goes on
	// Three times the silence that makes a host lost (and well within
	// linkWedgedBeats), counted in the relay's chunks (10 ms each) rather
	// than by the clock.
	for i := 0; i < 3*lostAfterBeats*10; i++ {
		if c := chunk(); strings.Contains(c, "error") {
			t.Fatalf("the stream ended with %s: its host was taken for lost while its relay answered", c)
		}
	}
	if !linked(s, "gpu-a") {
		t.Fatal("the host was taken for lost while its relay answered")
	}
	// The stream ends: link and relay are silent, and the host is lost.
	cancel()
	poll.Until(t, 10*time.Second, "the silent host lost", func() bool { return !linked(s, "gpu-a") })
}

// relayWithoutBeats links host gpu-a, whose relay streams a chunk every
// 10 ms, opens one stream through the server and reads its first chunk;
// stopBeats ends the host's heartbeats (each 50 ms until then), chunk reads
// the stream's next chunk, cancel ends the stream.
func relayWithoutBeats(t *testing.T, beat time.Duration) (s *Server, stopBeats func(), chunk func() string, cancel context.CancelFunc) {
	t.Helper()
	s = testServer(t, ServerOptions{Heartbeat: beat})
	bad := compromisedHost(t, s, "gpu-a")
	l := evilLink(t, bad, nil)
	beating := make(chan struct{})
	go func() {
		t := time.NewTicker(beat / 2)
		defer t.Stop()
		for {
			select {
			case <-beating:
				return
			case <-t.C:
			}
			if l.Send(&hostv1.HostMessage{Body: &hostv1.HostMessage_Heartbeat{Heartbeat: &hostv1.Heartbeat{}}}) != nil {
				return
			}
		}
	}()
	// The host's engine: a chunk every 10 ms until the request ends.
	stop, err := bad.ServeRelay(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		rc := http.NewResponseController(w)
		tick := time.NewTicker(10 * time.Millisecond)
		defer tick.Stop()
		for {
			if _, err := w.Write([]byte("data: {\"choices\":[{\"delta\":{\"content\":\"x\"}}]}\n\n")); err != nil {
				return
			}
			_ = rc.Flush()
			select {
			case <-r.Context().Done():
				return
			case <-tick.C:
			}
		}
	}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stop)
	waitReady(t, s, "gpu-a")
	place(t, s, "demo", "gpu-a")

	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	resp, err := relayClient(t, s)(ctx, `{"model":"demo","stream":true,"messages":[]}`)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { resp.Body.Close() })
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d, want 200", resp.StatusCode)
	}
	br := bufio.NewReader(resp.Body)
	chunk = func() string {
		for {
			line, err := br.ReadString('\n')
			if err != nil {
				t.Fatalf("the stream broke off: %v (the host linked: %v)", err, linked(s, "gpu-a"))
			}
			if strings.HasPrefix(line, "data: ") {
				return line
			}
		}
	}
	chunk()
	var once sync.Once
	stopBeats = func() { once.Do(func() { close(beating) }) }
	t.Cleanup(stopBeats)
	return s, stopBeats, chunk, cancel
}

// TestWatchLost_AWedgedLinkIsLostWhileItsRelayAnswers: the relay keeps a
// host whose heartbeats are late, but not for ever: a link silent for
// linkWedgedBeats intervals (its heartbeat goroutine stuck, its connection
// half-open) is ended even while the relay delivers chunks, so commands
// sent on it are not lost without a word.
func TestWatchLost_AWedgedLinkIsLostWhileItsRelayAnswers(t *testing.T) {
	const beat = 100 * time.Millisecond
	s, stopBeats, chunk, _ := relayWithoutBeats(t, beat)
	stopBeats()
	// Counted in the relay's chunks (10 ms each): past lostAfterBeats the
	// relay keeps the host; at linkWedgedBeats the link ends, and with it
	// the relay (the stream ends with its host_unreachable event). Four
	// times linkWedgedBeats' worth of chunks without that is a failure.
	for i := 0; i < 4*linkWedgedBeats*10; i++ {
		if c := chunk(); strings.Contains(c, "error") {
			if i < lostAfterBeats*10 {
				t.Fatalf("the stream ended after %d chunks, before the host could be lost", i)
			}
			return
		}
		if !linked(s, "gpu-a") {
			return
		}
	}
	t.Fatalf("a host silent on its link for 4×%d heartbeat intervals is still linked: its relay kept it", linkWedgedBeats)
}
