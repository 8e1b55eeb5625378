// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package engineapi

import (
	"errors"
	"io"
	"strings"
	"testing"
)

// ev is an event in a compact form for the tables.
type ev struct {
	field   string
	data    string
	comment bool
	typ     string
	id      string
}

// readAll returns the events of in, and the error that ended them.
func readAll(r *SSEReader) ([]ev, error) {
	var out []ev
	for {
		e, err := r.Next()
		if err != nil {
			if errors.Is(err, io.EOF) {
				return out, nil
			}
			return out, err
		}
		out = append(out, ev{field: e.Field, data: string(e.Data), comment: e.Comment, typ: e.Type, id: e.ID})
	}
}

func TestSSEReader_Next(t *testing.T) {
	cases := []struct {
		name  string
		input string
		want  []ev
	}{
		{
			name:  "openai stream",
			input: "data: {\"a\":1}\n\ndata: {\"a\":2}\n\ndata: [DONE]\n\n",
			want:  []ev{{field: "data", data: `{"a":1}`}, {field: "data", data: `{"a":2}`}, {field: "data", data: "[DONE]"}},
		},
		{
			name:  "crlf",
			input: "data: one\r\n\r\ndata: two\r\n\r\n",
			want:  []ev{{field: "data", data: "one"}, {field: "data", data: "two"}},
		},
		{
			name:  "lone cr",
			input: "data: one\r\rdata: two\r\r",
			want:  []ev{{field: "data", data: "one"}, {field: "data", data: "two"}},
		},
		{
			name:  "comments",
			input: ": ping\n\ndata: x\n\n:no space\n",
			want:  []ev{{comment: true, data: "ping"}, {field: "data", data: "x"}, {comment: true, data: "no space"}},
		},
		{
			name:  "multi-line data",
			input: "data: first\ndata: second\ndata:third\n\n",
			want:  []ev{{field: "data", data: "first\nsecond\nthird"}},
		},
		{
			name:  "llama.cpp raw error line",
			input: "data: {\"tok\":1}\n\nerror: {\"code\":400,\"message\":\"the request exceeds\"}\ndata: [DONE]\n\n",
			want: []ev{
				{field: "data", data: `{"tok":1}`},
				{field: "error", data: `{"code":400,"message":"the request exceeds"}`},
				{field: "data", data: "[DONE]"},
			},
		},
		{
			name:  "event type and id",
			input: "event: message_start\nid: 7\ndata: {}\n\n",
			want:  []ev{{field: "data", data: "{}", typ: "message_start", id: "7"}},
		},
		{
			name:  "no final blank line",
			input: "data: a\n\ndata: cut",
			want:  []ev{{field: "data", data: "a"}, {field: "data", data: "cut"}},
		},
		{
			name:  "event without data is dropped",
			input: "event: ping\n\nretry: 100\n\ndata: y\n\n",
			want:  []ev{{field: "data", data: "y"}},
		},
		{
			name:  "field without colon",
			input: "data\n\n",
			want:  []ev{{field: "data", data: ""}},
		},
		{
			name:  "byte order mark",
			input: "\xef\xbb\xbfdata: z\n\n",
			want:  []ev{{field: "data", data: "z"}},
		},
		{
			name:  "value keeps further spaces",
			input: "data:   spaced\n\n",
			want:  []ev{{field: "data", data: "  spaced"}},
		},
		{name: "empty", input: "", want: nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, err := readAll(NewSSEReader(strings.NewReader(c.input)))
			if err != nil {
				t.Fatalf("error %v after %+v", err, got)
			}
			if len(got) != len(c.want) {
				t.Fatalf("got %+v, want %+v", got, c.want)
			}
			for i := range got {
				if got[i] != c.want[i] {
					t.Errorf("event %d = %+v, want %+v", i, got[i], c.want[i])
				}
			}
		})
	}
}

func TestSSEReader_MaxEventSize(t *testing.T) {
	cases := []struct {
		name  string
		input string
	}{
		{name: "one long line", input: "data: " + strings.Repeat("x", 200) + "\n\n"},
		{name: "many lines", input: strings.Repeat("data: "+strings.Repeat("y", 30)+"\n", 10) + "\n"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := NewSSEReader(strings.NewReader("data: small\n\n" + c.input + "data: after\n\n"))
			r.MaxEventSize = 100
			e, err := r.Next()
			if err != nil || string(e.Data) != "small" {
				t.Fatalf("first event %+v, %v", e, err)
			}
			if _, err := r.Next(); !errors.Is(err, ErrEventTooLarge) {
				t.Fatalf("err = %v, want ErrEventTooLarge", err)
			}
			if _, err := r.Next(); !errors.Is(err, ErrEventTooLarge) {
				t.Errorf("the error is not sticky: %v", err)
			}
		})
	}
}

func TestEvent_Done(t *testing.T) {
	cases := []struct {
		name string
		e    Event
		want bool
	}{
		{name: "done", e: Event{Field: "data", Data: []byte("[DONE]")}, want: true},
		{name: "done with blanks", e: Event{Field: "data", Data: []byte(" [DONE] ")}, want: true},
		{name: "chunk", e: Event{Field: "data", Data: []byte("{}")}, want: false},
		{name: "error field", e: Event{Field: "error", Data: []byte("[DONE]")}, want: false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := c.e.Done(); got != c.want {
				t.Errorf("Done = %v", got)
			}
		})
	}
}

func FuzzSSEReader(f *testing.F) {
	for _, seed := range []string{
		"data: {\"a\":1}\n\ndata: [DONE]\n\n",
		": ping\r\n\r\nevent: x\r\ndata: y\r\n\r\n",
		"error: {}\ndata: [DONE]\n\n",
		"data\rdata:\r\r",
		"\xef\xbb\xbf:",
		"",
	} {
		f.Add(seed, 64)
	}
	f.Fuzz(func(t *testing.T, in string, limit int) {
		r := NewSSEReader(strings.NewReader(in))
		r.MaxEventSize = limit%4096 + 1
		for i := 0; i <= len(in)+1; i++ {
			e, err := r.Next()
			if err != nil {
				return
			}
			if !e.Comment && len(e.Data) > r.MaxEventSize {
				t.Fatalf("event of %d bytes passed a limit of %d", len(e.Data), r.MaxEventSize)
			}
		}
		t.Fatalf("more events than input bytes from %q", in)
	})
}
