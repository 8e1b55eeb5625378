// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package fleet

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
)

// oneByte reads one byte at a time: the tap must find an event cut
// anywhere.
type oneByte struct{ r io.Reader }

func (o oneByte) Read(p []byte) (int, error) { return o.r.Read(p[:1]) }

// TestFinalTap_StoresBeforeTheClientHasTheEnd: the final response object
// is handed over before the bytes that end it are read on, for a stream
// and for a whole answer; a failed or cut answer hands nothing.
func TestFinalTap_StoresBeforeTheClientHasTheEnd(t *testing.T) {
	final := `{"id":"resp_1","object":"response","status":"completed","output":[]}`
	stream := "event: response.created\ndata: {\"type\":\"response.created\",\"response\":{\"id\":\"resp_1\",\"status\":\"in_progress\"}}\n\n" +
		": x-capyctl-metrics {}\n\n" +
		"event: response.completed\ndata: {\"type\":\"response.completed\",\"sequence_number\":5,\"response\":" + final + "}\n\n"
	cases := []struct {
		name   string
		ctype  string
		length int64
		body   string
		want   string // the object handed over ("" for none)
		// late: handed over at the end of the body only (an answer
		// without a length; the router always sends one).
		late bool
	}{
		{name: "stream", ctype: "text/event-stream", length: -1, body: stream, want: final},
		{name: "whole answer", ctype: "application/json", length: int64(len(final) + 1), body: final + "\n", want: final},
		{name: "whole answer without a length", ctype: "application/json", length: -1, body: final, want: final, late: true},
		{name: "a failed stream", ctype: "text/event-stream", length: -1, want: "",
			body: "event: response.failed\ndata: {\"type\":\"response.failed\",\"response\":{\"status\":\"failed\"}}\n\n"},
		{name: "a stream cut short", ctype: "text/event-stream", length: -1, body: stream[:len(stream)-20], want: ""},
		{name: "not a response", ctype: "application/json", length: 2, body: "{}", want: ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			resp := &http.Response{Header: http.Header{"Content-Type": {c.ctype}}, ContentLength: c.length,
				Body: io.NopCloser(oneByte{strings.NewReader(c.body)})}
			var got string
			read := 0
			tap := newFinalTap(resp, func(obj json.RawMessage) {
				got = string(obj)
				// IMPORTANT: the client has not read the answer's end yet.
				if read >= len(c.body) && !c.late {
					t.Errorf("handed over after the client read %d of %d bytes", read, len(c.body))
				}
			})
			buf := make([]byte, 8)
			for {
				n, err := tap.Read(buf)
				read += n
				if err != nil {
					break
				}
			}
			if got != c.want {
				t.Fatalf("handed over %q, want %q", got, c.want)
			}
		})
	}
}
