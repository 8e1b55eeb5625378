// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package fleet

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/capyctl/capyctl/core/fleet/fsm"
)

// abortingLocal is a host whose relay handler breaks off every request
// before its answer's head (the stream is reset, as when the host's
// router dies mid-request).
type abortingLocal struct{ *fakeLocal }

func (abortingLocal) RelayHandler() http.Handler {
	return http.HandlerFunc(func(http.ResponseWriter, *http.Request) { panic(http.ErrAbortHandler) })
}

// TestRelay_AHostThatBreaksOffBeforeAnsweringIsUnreachable: a request the
// host received but reset before answering is refused 503
// host_unreachable with Retry-After 1 (it is not sent twice).
func TestRelay_AHostThatBreaksOffBeforeAnsweringIsUnreachable(t *testing.T) {
	s := testServer(t, ServerOptions{})
	joinHost(t, s, "gpu-a", abortingLocal{newFakeLocal()})
	waitReady(t, s, "gpu-a")
	if err := s.apply(fsm.Placed{Placement: &Placement{Deployment: "demo", Routes: []string{"demo"},
		Hosts: []HostShare{{Host: "gpu-a", Instances: 1}}}}); err != nil {
		t.Fatal(err)
	}
	post := relayClient(t, s)
	for range 2 { // the server stays whole after the first
		resp, err := post(context.Background(), `{"model":"demo","messages":[]}`)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusServiceUnavailable || !strings.Contains(string(b), "host_unreachable") ||
			!strings.Contains(string(b), "gpu-a") || resp.Header.Get("Retry-After") != "1" {
			t.Fatalf("got %d (Retry-After %q) %s, want 503 host_unreachable naming gpu-a, Retry-After 1", resp.StatusCode, resp.Header.Get("Retry-After"), b)
		}
	}
}

// TestCopyHeaders_LeavesNamesTheSourceLacks: a name the source has no
// value for is neither added to the destination nor wipes what the
// destination has (an answer without Content-Type keeps net/http's
// sniffing; a header the server set stays).
func TestCopyHeaders_LeavesNamesTheSourceLacks(t *testing.T) {
	dst := http.Header{"Retry-After": {"3"}}
	src := http.Header{"Content-Type": {"text/event-stream"}, "X-Other": {"x"}}
	copyHeaders(dst, src, []string{"content-type", "Retry-After", "Cache-Control"})
	want := http.Header{"Content-Type": {"text/event-stream"}, "Retry-After": {"3"}}
	if len(dst) != len(want) || dst.Get("Content-Type") != "text/event-stream" || dst.Get("Retry-After") != "3" {
		t.Fatalf("copied %v, want %v", dst, want)
	}
}

// TestRelayTransport_PingsASilentHost: the relay's HTTP/2 client pings a
// connection that went silent and closes it when the ping is not
// answered; with either timeout 0 (x/net/http2: no health check) a host
// that vanished without closing its connection would hold its requests
// until the kernel gives up on the TCP connection.
func TestRelayTransport_PingsASilentHost(t *testing.T) {
	tr := relayTransport()
	if tr.ReadIdleTimeout <= 0 || tr.PingTimeout <= 0 || tr.PingTimeout > tr.ReadIdleTimeout {
		t.Fatalf("relay transport: ReadIdleTimeout %v, PingTimeout %v; want both set, the ping's wait no longer than the idle time", tr.ReadIdleTimeout, tr.PingTimeout)
	}
}
