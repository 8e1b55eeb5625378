// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package harness

import (
	"io"
	"net"
	"sync"
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
	// held counts the bytes from the target waiting in the proxy for the
	// client while cut (HeldFromTarget).
	held int
}

// HeldFromTarget is how many bytes the target sent that wait in the
// proxy for the client now (while cut, not dropped).
func (p *Partition) HeldFromTarget() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.held
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
		go p.pipe(c, up, false)
		go p.pipe(up, c, true)
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
	go p.pipe(c, up, false)
	go p.pipe(up, c, true)
}

// pipe copies src to dst, holding (or dropping) what it reads while cut;
// fromTarget counts what it holds (HeldFromTarget).
func (p *Partition) pipe(src, dst net.Conn, fromTarget bool) {
	defer dst.Close()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			p.mu.Lock()
			if p.cut && !p.drop && fromTarget {
				p.held += n
			}
			for p.cut && !p.drop {
				p.cond.Wait()
			}
			if fromTarget {
				p.held = 0
			}
			dropped := p.cut && p.drop
			p.mu.Unlock()
			if !dropped {
				if _, werr := dst.Write(buf[:n]); werr != nil {
					return
				}
			}
		}
		if err != nil {
			if err != io.EOF {
				return
			}
			return
		}
	}
}
