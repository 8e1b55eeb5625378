// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

//go:build unix

package fleet

import (
	"errors"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"syscall"
)

// A relayed stream that stayed on net/http would hold, for as long as it is
// open, net/http's 4 KiB reader and 4 KiB writer of the connection, the
// response's 2 KiB writer, the handler's deep stack and net/http's goroutine
// that notices a hang-up: about 35 KiB per stream on the server, measured
// (BenchmarkFleet_MemoryPerOpenStream). As core/router does for a
// standalone role, the server takes such a stream's client connection over
// once the host's answer head has arrived: it writes the head itself (the
// chunked coding net/http would use, and Connection: close, so the
// connection is not handed back), lets the handler return, relays the
// chunks on a goroutine of its own that starts small, and watches the
// client socket for a hang-up with a goroutine that holds no buffer. A
// hang-up cancels the relayed stream at once, and the host cancels the
// engine's work.

// takeOver hands a streamed answer's client connection to relayTaken and
// reports whether it did; false leaves the answer to net/http (a TLS or
// HTTP/2 client, a writer that cannot hand its connection over).
func takeOver(w http.ResponseWriter, r *http.Request, resp *http.Response, cancel func(), done func()) bool {
	if r.ProtoMajor != 1 || r.ProtoMinor != 1 || r.TLS != nil {
		return false
	}
	conn, brw, err := http.NewResponseController(w).Hijack()
	if err != nil {
		return false
	}
	sc, ok := conn.(syscall.Conn)
	var raw syscall.RawConn
	if ok {
		raw, _ = sc.SyscallConn()
	}
	if raw == nil {
		// No file descriptor to watch: finish on this goroutine, noticing
		// a hang-up only when a write fails.
		go relayTaken(conn, nil, head(w.Header(), resp), resp, cancel, done)
		return true
	}
	// Bytes net/http read past the request would be a pipelined request:
	// this connection closes after the answer, so they are dropped.
	_ = brw
	go relayTaken(conn, raw, head(w.Header(), resp), resp, cancel, done)
	return true
}

// head is the answer's status line and headers in HTTP/1.1, chunked,
// closing the connection after the answer.
func head(set http.Header, resp *http.Response) []byte {
	h := set.Clone()
	copyHeaders(h, resp.Header, relayAnswerHeaders)
	h.Set("Transfer-Encoding", "chunked")
	h.Set("Connection", "close")
	var b strings.Builder
	b.WriteString("HTTP/1.1 ")
	b.WriteString(strconv.Itoa(resp.StatusCode))
	b.WriteByte(' ')
	b.WriteString(http.StatusText(resp.StatusCode))
	b.WriteString("\r\n")
	_ = h.Write(&b)
	b.WriteString("\r\n")
	return []byte(b.String())
}

// relayTaken relays a taken-over stream until the host's answer ends, the
// client hangs up or a write fails, then closes the connection and ends
// the relayed stream.
func relayTaken(conn net.Conn, raw syscall.RawConn, head []byte, resp *http.Response, cancel func(), done func()) {
	defer done()
	defer cancel()
	defer resp.Body.Close()
	defer conn.Close()
	if _, err := conn.Write(head); err != nil {
		return
	}
	if raw != nil {
		go watchHangUp(raw, cancel)
	}
	var rb relayBuf
	var size [8]byte
	for {
		buf := rb.get()
		n, rerr := resp.Body.Read(buf)
		if n > 0 {
			line := append(strconv.AppendInt(size[:0], int64(n), 16), '\r', '\n')
			bufs := net.Buffers{line, buf[:n], crlf}
			_, werr := bufs.WriteTo(conn)
			if werr != nil {
				rb.put(n)
				return
			}
		}
		rb.put(n)
		if rerr != nil {
			if errors.Is(rerr, io.EOF) {
				_, _ = conn.Write([]byte("0\r\n\r\n"))
			}
			return
		}
	}
}

var crlf = []byte("\r\n")

// watchHangUp waits, holding no buffer, until the client socket is
// readable: end of file or an error is a hang-up and cancels the stream;
// a closed connection (the answer ended) ends the watch.
func watchHangUp(raw syscall.RawConn, cancel func()) {
	hungUp := false
	err := raw.Read(func(fd uintptr) bool {
		var b [1]byte
		for {
			n, _, err := syscall.Recvfrom(int(fd), b[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
			switch {
			case err == syscall.EINTR:
				continue
			case err == syscall.EAGAIN:
				return false // nothing yet: wait for readability
			case err != nil || n == 0:
				hungUp = true
				return true
			default:
				// The client sent bytes on a connection that closes after
				// this answer: not a hang-up; they are never read.
				return false
			}
		}
	})
	if hungUp || err == nil {
		cancel()
	}
}
