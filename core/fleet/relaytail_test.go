// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package fleet

import (
	"bytes"
	"io"
	"strconv"
	"testing"
)

// TestRelay_TailKeepsTheAnswersLastBytes: the relay's meter reads an
// answer's figures from its last tailSize bytes, oldest first, whatever
// the reads' sizes and wherever the ring wrapped.
func TestRelay_TailKeepsTheAnswersLastBytes(t *testing.T) {
	var answer bytes.Buffer
	for i := 0; answer.Len() < 3*tailSize+17; i++ {
		answer.WriteString("data: {\"n\":" + strconv.Itoa(i) + "}\n\n")
	}
	full := answer.Bytes()
	for _, size := range []int{1, 7, 100, tailSize - 1, tailSize, tailSize + 5, len(full)} {
		for _, total := range []int{10, tailSize, tailSize + 1, len(full)} {
			tr := &tailReader{ReadCloser: io.NopCloser(bytes.NewReader(full[:total]))}
			buf := make([]byte, size)
			for {
				if _, err := tr.Read(buf); err != nil {
					break
				}
			}
			want := full[max(total-tailSize, 0):total]
			if got := tr.bytes(); !bytes.Equal(got, want) {
				t.Fatalf("reads of %d, answer of %d: the tail is %d bytes %q..., want %d bytes %q...", size, total, len(got), got[:min(20, len(got))], len(want), want[:min(20, len(want))])
			}
		}
	}
}
