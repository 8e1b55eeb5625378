// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package attack

import (
	"errors"
	"fmt"
	"io"
	"net"
	"sort"
	"strings"
	"sync"
	"time"
)

// FloodOptions shape a flood.
type FloodOptions struct {
	// Target is the address flooded (host:port).
	Target string
	// PerSource is the number of connections opened from each source.
	PerSource int
	// Sources are the local addresses the connections come from; nil: one
	// source, the kernel's choice. Loopback(2, 40) gives 127.0.0.2 to
	// 127.0.0.41: on Linux every 127/8 address is the loopback interface,
	// so one machine plays many network peers.
	Sources []net.IP
	// Send is written on each connection once it is open (nil: nothing,
	// an idle connection).
	Send []byte
	// DialTimeout bounds each connect (0: 2 s).
	DialTimeout time.Duration
}

// Flood is a set of connections held open against a target.
type Flood struct {
	o FloodOptions

	mu     sync.Mutex
	conns  []net.Conn
	failed map[string]int
}

// Loopback returns n loopback addresses from 127.0.0.first.
func Loopback(first, n int) []net.IP {
	out := make([]net.IP, 0, n)
	for i := 0; i < n; i++ {
		v := first + i
		out = append(out, net.IPv4(127, byte(v>>16), byte(v>>8), byte(v)))
	}
	return out
}

// OpenFlood opens the connections (from all sources at once, one
// connection after the other per source) and returns when every connect
// ended, opened or not.
func OpenFlood(o FloodOptions) *Flood {
	if o.DialTimeout <= 0 {
		o.DialTimeout = 2 * time.Second
	}
	f := &Flood{o: o, failed: map[string]int{}}
	sources := o.Sources
	if len(sources) == 0 {
		sources = []net.IP{nil}
	}
	var wg sync.WaitGroup
	for _, src := range sources {
		wg.Add(1)
		go func() {
			defer wg.Done()
			d := net.Dialer{Timeout: o.DialTimeout}
			if src != nil {
				d.LocalAddr = &net.TCPAddr{IP: src}
			}
			for i := 0; i < o.PerSource; i++ {
				c, err := d.Dial("tcp", o.Target)
				if err == nil && len(o.Send) > 0 {
					_, err = c.Write(o.Send)
				}
				f.mu.Lock()
				if err != nil {
					f.failed[ShortErr(err)]++
				} else {
					f.conns = append(f.conns, c)
				}
				f.mu.Unlock()
			}
		}()
	}
	wg.Wait()
	return f
}

// Opened returns the connections that were opened.
func (f *Flood) Opened() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.conns)
}

// Failed counts the connects that failed, by what ended them.
func (f *Flood) Failed() map[string]int {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make(map[string]int, len(f.failed))
	for k, v := range f.failed {
		out[k] = v
	}
	return out
}

// ClosedByPeer counts the opened connections the target has closed (a
// read ends with EOF or a reset rather than waiting).
func (f *Flood) ClosedByPeer() int {
	f.mu.Lock()
	conns := append([]net.Conn(nil), f.conns...)
	f.mu.Unlock()
	closed := 0
	buf := make([]byte, 512)
	for _, c := range conns {
		_ = c.SetReadDeadline(time.Now().Add(time.Millisecond))
		for {
			_, err := c.Read(buf)
			if err == nil {
				continue // an answer (a 408, an alert): read on to its end
			}
			var ne net.Error
			if !(errors.As(err, &ne) && ne.Timeout()) {
				closed++
			}
			break
		}
	}
	return closed
}

// Close closes every connection.
func (f *Flood) Close() {
	f.mu.Lock()
	conns := f.conns
	f.conns = nil
	f.mu.Unlock()
	for _, c := range conns {
		c.Close()
	}
}

// ShortErr names a connection error without addresses.
func ShortErr(err error) string {
	var ne net.Error
	switch {
	case errors.As(err, &ne) && ne.Timeout():
		return "timeout"
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return "connection closed"
	}
	s := err.Error()
	if i := strings.LastIndex(s, ": "); i >= 0 {
		s = s[i+2:]
	}
	return s
}

// Counts renders counts as "3× reason, 1× other", the largest first.
func Counts(m map[string]int) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool { return m[keys[i]] > m[keys[j]] || (m[keys[i]] == m[keys[j]] && keys[i] < keys[j]) })
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%d× %s", m[k], k)
	}
	return strings.Join(parts, ", ")
}
