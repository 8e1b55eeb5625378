// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package router

import (
	"strings"
	"testing"
)

func TestOutBuf_Frame(t *testing.T) {
	cases := []struct {
		name  string
		data  string
		last  bool
		frame string
	}{
		{"empty", "", false, ""},
		{"empty, last", "", true, "0\r\n\r\n"},
		{"one chunk", "data: x\n\n", false, "9\r\ndata: x\n\n\r\n"},
		{"one chunk, last", "data: x\n\n", true, "9\r\ndata: x\n\n\r\n0\r\n\r\n"},
		{"hex size", strings.Repeat("a", 300), false, "12c\r\n" + strings.Repeat("a", 300) + "\r\n"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var o outBuf
			if len(c.data) > 0 {
				if n := o.add([]byte(c.data)); n != len(c.data) {
					t.Fatalf("add took %d of %d", n, len(c.data))
				}
			}
			if got := string(o.frame(c.last)); got != c.frame {
				t.Fatalf("frame %q, want %q", got, c.frame)
			}
			o.release()
			if o.buf != nil {
				t.Fatal("release kept the buffer")
			}
		})
	}
}

func TestOutBuf_FillsToItsRoom(t *testing.T) {
	var o outBuf
	big := []byte(strings.Repeat("x", 3*eventBufSize))
	n := o.add(big)
	if !o.full() || n != eventBufSize-chunkRoom-chunkTail {
		t.Fatalf("added %d, full %v", n, o.full())
	}
	// The chunk and the last chunk still fit without growing the buffer.
	f := o.frame(true)
	if cap(f) > eventBufSize || !strings.HasSuffix(string(f), "\r\n0\r\n\r\n") {
		t.Fatalf("frame of %d bytes (cap %d)", len(f), cap(f))
	}
	o.release()
}
