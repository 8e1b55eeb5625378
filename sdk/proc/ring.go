// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package proc

import "sync"

// Ring keeps the last size bytes written to it. It is safe for concurrent
// use.
type Ring struct {
	mu      sync.Mutex
	buf     []byte
	size    int // what buf grows to
	next    int // where the next byte goes
	full    bool
	written int64
}

// ringFirst is what a Ring holds room for until more is written.
const ringFirst = 64 << 10

// NewRing returns a Ring keeping the last size bytes (at least 1). Its
// buffer starts small and grows with what is written, up to size: a
// shim's 4 MiB allocated at once cost a cold start a garbage collection
// cycle before the engine's fork (0.5-3 ms under load), for output most
// launches never reach before they are ready.
func NewRing(size int) *Ring {
	if size < 1 {
		size = 1
	}
	return &Ring{buf: make([]byte, min(size, ringFirst)), size: size}
}

// grow makes room for more than need bytes, or size, while the ring has
// not wrapped (what it holds is buf[:next]): a buffer filled exactly would
// wrap and count as full.
func (r *Ring) grow(need int) {
	c := 2 * len(r.buf)
	for c <= need {
		c *= 2
	}
	b := make([]byte, min(c, r.size))
	copy(b, r.buf[:r.next])
	r.buf = b
}

// Write implements io.Writer; it never fails.
func (r *Ring) Write(p []byte) (int, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := len(p)
	r.written += int64(n)
	if len(r.buf) < r.size && r.next+n >= len(r.buf) {
		r.grow(r.next + n)
	}
	size := len(r.buf)
	if len(p) >= size {
		copy(r.buf, p[len(p)-size:])
		r.next, r.full = 0, true
		return n, nil
	}
	k := copy(r.buf[r.next:], p)
	if k < len(p) {
		copy(r.buf, p[k:])
		r.full = true
	}
	r.next = (r.next + len(p)) % size
	if r.next == 0 && len(p) > 0 {
		r.full = true
	}
	return n, nil
}

// Len returns how many bytes the ring holds.
func (r *Ring) Len() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.lenLocked()
}

func (r *Ring) lenLocked() int {
	if r.full {
		return len(r.buf)
	}
	return r.next
}

// Written returns how many bytes were ever written.
func (r *Ring) Written() int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.written
}

// Tail returns a copy of the last n bytes held (all of them when n < 0 or
// n exceeds what is held). truncated is true when older output exists that
// the result does not include (cut by the ring or by n).
func (r *Ring) Tail(n int) (tail []byte, truncated bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	held := r.lenLocked()
	if n < 0 || n > held {
		n = held
	}
	out := make([]byte, n)
	start := r.next - n
	if start >= 0 {
		copy(out, r.buf[start:r.next])
	} else {
		k := copy(out, r.buf[len(r.buf)+start:])
		copy(out[k:], r.buf[:r.next])
	}
	return out, r.written > int64(n)
}
