// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package router

import (
	"errors"
	"net"
	"net/http"
	"time"

	"github.com/capyctl/capyctl/core/structs"
)

// BodyLimiter applies the router's bounds on request bodies to a handler
// that is not the router: the server role's relay reads each body whole
// (to find the model and to send it again to another host when the first
// was out of reach) and must hold no more of them at once than
// limits.max_body_bytes_in_flight, as a standalone role's router does
// (bodyBudget: the same reserve for small bodies, the same refusal before
// a byte is read when the announced length does not fit, the same buffer
// that grows only as bytes arrive).
type BodyLimiter struct {
	max    int64
	budget bodyBudget
}

// NewBodyLimiter bounds each body to maxBody bytes and all bodies held at
// once to maxInFlight (0: the defaults, 64 MiB and
// DefaultMaxBodyBytesInFlight).
func NewBodyLimiter(maxBody, maxInFlight int64) *BodyLimiter {
	if maxBody <= 0 {
		maxBody = 64 << 20
	}
	if maxInFlight <= 0 {
		maxInFlight = DefaultMaxBodyBytesInFlight
	}
	return &BodyLimiter{max: maxBody, budget: bodyBudget{limit: maxInFlight}}
}

// InFlight returns the bytes of bodies held now.
func (l *BodyLimiter) InFlight() int64 { return l.budget.held.Load() }

// Read reads r's whole body within the bounds and returns it with the
// function that gives its bytes back (call it once the body was sent; it
// is never nil). A refusal is a catalogue error (request_too_large,
// bodies_in_flight_full, body_read_timeout, invalid_request): answer it
// with RefuseBody.
func (l *BodyLimiter) Read(r *http.Request) (body []byte, release func(), err error) {
	release = func() {}
	if r.ContentLength > l.max {
		return nil, release, structs.Errf(structs.CodeRequestTooLarge, "the request body is over %d bytes", l.max)
	}
	if r.ContentLength == 0 || r.Body == nil || r.Body == http.NoBody {
		return nil, release, nil
	}
	var held int64
	if r.ContentLength > 0 && !l.budget.fits(r.ContentLength) {
		err = errBodiesFull // refused before a byte of it is read
	} else {
		body, held, err = readGrowing(r.Body, r.ContentLength, l.max, &l.budget)
	}
	if err == nil && int64(len(body)) > l.max {
		err = structs.Errf(structs.CodeRequestTooLarge, "the request body is over %d bytes", l.max)
	}
	if err != nil {
		l.budget.give(held)
		var ne net.Error
		switch {
		case errors.Is(err, errBodiesFull):
			err = structs.Errf(structs.CodeBodiesInFlightFull,
				"the server holds %d bytes of request bodies, its bound (limits.max_body_bytes_in_flight); retry shortly", l.budget.limit)
		case structs.AsError(err).Code == structs.CodeRequestTooLarge:
		case errors.As(err, &ne) && ne.Timeout():
			err = structs.Errf(structs.CodeBodyReadTimeout, "the request body did not arrive in time")
		default:
			err = structs.Errf(structs.CodeInvalidRequest, "read the request body: %v", err)
		}
		return nil, func() {}, err
	}
	return body, func() { l.budget.give(held) }, nil
}

// RefuseBody answers a body refused before it was read whole and closes
// the connection after the answer: net/http would otherwise read what is
// left of the body (up to 256 KiB, as slowly as the client sends it)
// before it answers.
func RefuseBody(w http.ResponseWriter, err error) {
	CloseUnread(w)
	WriteError(w, err)
}

// CloseUnread makes the answer about to be written close the connection
// without reading what is left of the request's body. Call it before
// writing.
func CloseUnread(w http.ResponseWriter) {
	w.Header().Set("Connection", "close")
	// A deadline in the past: whatever net/http still reads of the body
	// fails at once.
	_ = http.NewResponseController(w).SetReadDeadline(time.Unix(1, 0))
}
