// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package router

import (
	"bufio"
	"strings"
	"testing"
)

// TestEngineCall_ReleaseReader: a call gives its head's reader back to
// the pool once (emptied: it holds no connection), and a call that never
// had one, or gave it back already, has nothing to give (a failed write
// leaves none; the stream reader gives it back before finish does).
func TestEngineCall_ReleaseReader(t *testing.T) {
	br := readerPool.Get().(*bufio.Reader)
	br.Reset(strings.NewReader("HTTP/1.1 200 OK\r\n"))
	c := &engineCall{br: br}
	c.releaseReader()
	if c.br != nil {
		t.Fatal("the call kept its reader after giving it back")
	}
	if br.Buffered() != 0 || br.Size() == 0 {
		t.Fatalf("the pooled reader was not emptied: %d bytes buffered", br.Buffered())
	}
	c.releaseReader() // again: nothing to give
	(&engineCall{}).releaseReader()
}
