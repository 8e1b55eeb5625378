// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

//go:build unix

package router

import (
	"net"
	"syscall"
	"testing"
	"time"
)

// hiddenConn hides a connection's syscall.Conn, as a listener's wrapper
// would.
type hiddenConn struct{ net.Conn }

func TestClientConn_Watch(t *testing.T) {
	cases := []struct {
		name     string
		raw      bool
		peer     func(c net.Conn) // what the client does
		closeOwn bool             // the relay closes the connection instead
		gone     bool
		next     bool // the watcher saw the client's bytes
	}{
		{name: "raw: hang-up", raw: true, peer: func(c net.Conn) { c.Close() }, gone: true},
		{name: "raw: the next request, left for net/http", raw: true, peer: func(c net.Conn) { c.Write([]byte("POST / HTTP/1.1\r\n\r\n")) }, next: true},
		{name: "raw: the relay closes", raw: true, closeOwn: true},
		{name: "plain: hang-up", peer: func(c net.Conn) { c.Close() }, gone: true},
		{name: "plain: a pipelined request, then a hang-up", peer: func(c net.Conn) { c.Write([]byte("POST / HTTP/1.1\r\n\r\n")); c.Close() }, gone: true},
		{name: "plain: the relay closes", closeOwn: true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			defer ln.Close()
			client, err := net.Dial("tcp", ln.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			defer client.Close()
			server, err := ln.Accept()
			if err != nil {
				t.Fatal(err)
			}
			cc := &clientConn{q: &request{}, watching: true}
			done := make(chan struct{})
			if c.raw {
				cc.setConn(server)
				cc.raw, _ = server.(syscall.Conn).SyscallConn()
				go func() { cc.watch(); close(done) }()
			} else {
				cc.setConn(hiddenConn{server})
				go func() { cc.watchPlain(); close(done) }()
			}
			if c.closeOwn {
				cc.closeNow()
			} else {
				c.peer(client)
			}
			select {
			case <-done:
			case <-time.After(10 * time.Second):
				t.Fatal("the watcher did not end")
			}
			cause := cc.q.cutter.err()
			if cc.gone.Load() != c.gone || (cause == errClientGone) != c.gone || cc.next != c.next {
				t.Fatalf("gone %v, cut %v, next %v; want gone %v, next %v", cc.gone.Load(), cause, cc.next, c.gone, c.next)
			}
			if c.next {
				// Nothing was read: the request is there for net/http.
				b := make([]byte, 64)
				if n, err := server.Read(b); err != nil || string(b[:n]) != "POST / HTTP/1.1\r\n\r\n" {
					t.Fatalf("after the watcher: %q, %v", b[:n], err)
				}
			}
			cc.closeNow()
		})
	}
}
