// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package router

import (
	"errors"
	"io"
	"net"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/capyctl/capyctl/core/structs"
)

// Defaults of the body bounds (Config).
const (
	// DefaultMaxBodyBytesInFlight bounds the bytes of request bodies the
	// router holds, all requests together.
	DefaultMaxBodyBytesInFlight = 256 << 20
	// DefaultBodyReadTimeout bounds the time a whole body may take to
	// arrive.
	DefaultBodyReadTimeout = 60 * time.Second
	// firstBodyBuffer is the first buffer of a body; it doubles as bytes
	// arrive.
	firstBodyBuffer = 16 << 10
)

// errBodiesFull is readGrowing's refusal when the role's bodies are at
// their bound.
var errBodiesFull = errors.New("request bodies at their bound")

// bodyBudget bounds the bytes of request bodies held in memory, all
// requests together: a buffer's growth takes bytes from it before it is
// allocated, and the bytes go back once the engine has the body (or the
// request ended). A copy of a body made for the engine (engineBody) counts
// too, while it lives.
//
// A flood of large bodies must not stop every other request: bodies up to
// smallBody bytes (and no larger than the reserve) may also draw on a
// reserve of limit/smallShare bytes (16 MiB of the default 256 MiB) that
// large bodies never take, so chat requests of usual sizes keep flowing
// while the large ones are refused.
type bodyBudget struct {
	limit int64
	held  atomic.Int64
}

const (
	// smallBody is the largest body the reserve admits (a long chat
	// history is tens of KiB).
	smallBody = 1 << 20
	// smallShare is the reserve's share of the limit (one sixteenth).
	smallShare = 16
)

// reserve is the room only small bodies may use, on top of the limit.
func (b *bodyBudget) reserve() int64 { return b.limit / smallShare }

// fits reports whether a body announcing total bytes could be held now: a
// body that cannot is refused before any of it is read (a client that sent
// Expect: 100-continue then sends nothing).
func (b *bodyBudget) fits(total int64) bool {
	limit := b.limit
	if r := b.reserve(); total <= min(smallBody, r) {
		limit += r
	}
	return b.held.Load()+total <= limit
}

// take reserves n more bytes of a body that will hold total bytes; false
// when they would go over the limit (over the limit and the reserve for a
// small body).
func (b *bodyBudget) take(n int64) bool { return b.takeFor(n, n) }

// takeFor is take for a body whose buffer will hold total bytes.
func (b *bodyBudget) takeFor(n, total int64) bool {
	limit := b.limit
	if r := b.reserve(); total <= min(smallBody, r) {
		limit += r
	}
	for {
		cur := b.held.Load()
		if cur+n > limit {
			return false
		}
		if b.held.CompareAndSwap(cur, cur+n) {
			return true
		}
	}
}

// give returns n bytes.
func (b *bodyBudget) give(n int64) {
	if n != 0 {
		b.held.Add(-n)
	}
}

// BodyBytesInFlight returns the bytes of request bodies the router holds
// now (buffers being filled, and bodies waiting for a place or for the
// engine).
func (rt *Router) BodyBytesInFlight() int64 { return rt.bodies.held.Load() }

// readGrowing reads a body into a buffer that grows as bytes arrive, by
// doubling from firstBodyBuffer, never past the announced length (declared,
// -1 when unknown) nor past max+1 (one byte over tells a body over max).
// IMPORTANT: the buffer is never sized from Content-Length before the bytes
// are there: a client announcing 32 MiB and sending 10 bytes costs 16 KiB.
// Each growth takes its bytes from budget first; held is what the buffer
// took (the caller gives it back, on errors too).
func readGrowing(src io.Reader, declared, max int64, budget *bodyBudget) (buf []byte, held int64, err error) {
	limit := max + 1
	if declared >= 0 && declared < limit {
		limit = declared
	}
	for int64(len(buf)) < limit {
		if len(buf) == cap(buf) {
			n := min(2*int64(cap(buf)), limit)
			if n < firstBodyBuffer {
				n = min(firstBodyBuffer, limit)
			}
			if !budget.takeFor(n-held, n) {
				return nil, held, errBodiesFull
			}
			nb := make([]byte, len(buf), n)
			copy(nb, buf)
			buf, held = nb, n
		}
		m, rerr := src.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+m]
		if rerr == io.EOF {
			break
		}
		if rerr != nil {
			return nil, held, rerr
		}
	}
	return buf, held, nil
}

// readBody reads the whole body: the model must be found, and a body kept
// in memory can be sent again when a stale engine connection fails before
// the engine read it (and Go issue 40747 cuts answers of proxies that
// stream the request body). The body must arrive within the body read
// timeout; its buffer grows as it arrives and counts against the role's
// bytes of bodies in flight (q.bodyHeld, given back by serve).
func (q *request) readBody() bool {
	max := q.rt.cfg.MaxBodyBytes
	r := q.r
	if r.ContentLength > max {
		q.refuseBody(structs.Errf(structs.CodeRequestTooLarge, "the request body is over %s", structs.FormatBytes(max)))
		return false
	}
	if r.ContentLength == 0 {
		return true
	}
	// IMPORTANT: only a request with a body gets a read deadline, and it is
	// cleared as soon as the body is in: net/http reads the connection
	// after the body (to see a hang-up), and a deadline left there would
	// cancel the request mid-answer. A request without a body has that
	// read running already. Streams taken over later (hijack.go) set their
	// own deadlines.
	timeout := q.rt.cfg.BodyReadTimeout
	if q.rc == nil {
		q.rc = http.NewResponseController(q.w)
	}
	_ = q.rc.SetReadDeadline(time.Now().Add(timeout))
	var body []byte
	var held int64
	var err error
	if r.ContentLength > 0 && !q.rt.bodies.fits(r.ContentLength) {
		err = errBodiesFull // refused before a byte of it is read
	} else {
		body, held, err = readGrowing(r.Body, r.ContentLength, max, &q.rt.bodies)
	}
	q.bodyHeld = held
	if err != nil {
		var ne net.Error
		switch {
		case errors.Is(err, errBodiesFull):
			q.refuseBody(structs.Errf(structs.CodeBodiesInFlightFull,
				"the role holds %s of request bodies, its bound (limits.max_body_bytes_in_flight); retry shortly", structs.FormatBytes(q.rt.cfg.MaxBodyBytesInFlight)))
		case errors.As(err, &ne) && ne.Timeout():
			q.refuseBody(structs.Errf(structs.CodeBodyReadTimeout, "the request body did not arrive within %s", timeout))
		case r.Context().Err() != nil:
			q.gone()
		default:
			q.refuseBody(structs.Errf(structs.CodeInvalidRequest, "read the request body: %v", err))
		}
		q.releaseBody()
		return false
	}
	_ = q.rc.SetReadDeadline(time.Time{})
	if int64(len(body)) > max {
		q.refuseBody(structs.Errf(structs.CodeRequestTooLarge, "the request body is over %s", structs.FormatBytes(max)))
		q.releaseBody()
		return false
	}
	q.body, q.bodyN = body, len(body)
	return true
}

// releaseBody gives back the bytes of a body refused while it was read
// (serve gives back those of a body read whole).
func (q *request) releaseBody() {
	q.rt.bodies.give(q.bodyHeld)
	q.bodyHeld = 0
}

// refuseBody answers before the body was read whole, and closes the
// connection: net/http would otherwise read what is left of the body
// before it answers (up to 256 KiB, as slowly as the client sends it).
func (q *request) refuseBody(err error) {
	q.w.Header().Set("Connection", "close")
	if q.rc == nil {
		q.rc = http.NewResponseController(q.w)
	}
	// A deadline in the past: whatever net/http still reads of the body
	// fails at once, and the connection closes after the answer.
	_ = q.rc.SetReadDeadline(time.Unix(1, 0))
	q.fail(err)
}
