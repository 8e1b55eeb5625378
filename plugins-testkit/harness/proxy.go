// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package harness

import (
	"net"
	"sync"
	"sync/atomic"
	"testing"
)

// Partition is a TCP proxy that can stop carrying traffic without closing
// anything, the way a network partition looks to both ends: bytes sent
// during the partition wait in the proxy until Heal (or are dropped, with
// Drop).
type Partition struct {
	ln     net.Listener
	target string

	mu    sync.Mutex
	cond  *sync.Cond
	cut   bool
	drop  bool
	conns []net.Conn

	// lateTo and lateFrom count the bytes read during a cut and delivered
	// at Heal, towards the target and from it.
	lateTo, lateFrom atomic.Int64
}

// NewPartition proxies a loopback listener to target until the test ends.
func NewPartition(t testing.TB, target string) *Partition {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &Partition{ln: ln, target: target}
	p.cond = sync.NewCond(&p.mu)
	go p.serve()
	t.Cleanup(p.close)
	return p
}

// Addr is the proxy's address.
func (p *Partition) Addr() string { return p.ln.Addr().String() }

// Cut stops carrying traffic; drop says whether bytes sent meanwhile are
// lost (true) or delivered at Heal.
func (p *Partition) Cut(drop bool) {
	p.mu.Lock()
	p.cut, p.drop = true, drop
	p.mu.Unlock()
}

// Late reports the bytes that arrived during a cut and were delivered
// once it healed: towards the target (from the clients that dialed the
// proxy) and from the target. A test shows with it that something sent
// during the partition really arrived late.
func (p *Partition) Late() (toTarget, fromTarget int64) {
	return p.lateTo.Load(), p.lateFrom.Load()
}

// Heal carries traffic again.
func (p *Partition) Heal() {
	p.mu.Lock()
	p.cut = false
	p.cond.Broadcast()
	p.mu.Unlock()
}

func (p *Partition) close() {
	p.ln.Close()
	p.mu.Lock()
	for _, c := range p.conns {
		c.Close()
	}
	p.cut = false
	p.cond.Broadcast()
	p.mu.Unlock()
}

func (p *Partition) serve() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		cut := p.cut
		p.mu.Unlock()
		if cut {
			// A new connection during the partition never reaches the
			// other side: it hangs until healed or closed.
			go p.hold(c)
			continue
		}
		up, err := net.Dial("tcp", p.target)
		if err != nil {
			c.Close()
			continue
		}
		p.mu.Lock()
		p.conns = append(p.conns, c, up)
		p.mu.Unlock()
		go p.pipe(c, up, &p.lateTo)
		go p.pipe(up, c, &p.lateFrom)
	}
}

// hold keeps a connection made during the partition until healed, then
// connects it.
func (p *Partition) hold(c net.Conn) {
	p.mu.Lock()
	for p.cut {
		p.cond.Wait()
	}
	p.mu.Unlock()
	up, err := net.Dial("tcp", p.target)
	if err != nil {
		c.Close()
		return
	}
	p.mu.Lock()
	p.conns = append(p.conns, c, up)
	p.mu.Unlock()
	go p.pipe(c, up, &p.lateTo)
	go p.pipe(up, c, &p.lateFrom)
}

// pipe copies src to dst. What it reads while cut is held in the proxy
// (dropped, with Cut(true)) and written at Heal, so the proxy keeps reading
// during a cut: every byte sent during it is held here, not in the
// kernel's buffers, and late counts what it delivered.
func (p *Partition) pipe(src, dst net.Conn, late *atomic.Int64) {
	type chunk struct {
		b    []byte
		late bool
	}
	q := make(chan chunk, 1024)
	go func() {
		defer close(q)
		buf := make([]byte, 32<<10)
		for {
			n, err := src.Read(buf)
			if n > 0 {
				p.mu.Lock()
				cut, drop := p.cut, p.drop
				p.mu.Unlock()
				if !cut || !drop {
					q <- chunk{b: append([]byte(nil), buf[:n]...), late: cut}
				}
			}
			if err != nil {
				return
			}
		}
	}()
	defer dst.Close()
	for c := range q {
		p.mu.Lock()
		for p.cut {
			p.cond.Wait()
		}
		p.mu.Unlock()
		if _, err := dst.Write(c.b); err != nil {
			// Drain the reader so it ends with its source.
			go func() {
				for range q {
				}
			}()
			return
		}
		if c.late {
			late.Add(int64(len(c.b)))
		}
	}
}
