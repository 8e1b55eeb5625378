// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package fleet

import (
	"net/http"

	"github.com/capyctl/capyctl/core/router"
)

// The relay carries headers by name, both ways, from short lists: a
// client's headers reach a host only where the host's router reads them,
// and a host's answer reaches the client only with the headers CapyCTL's
// own router writes. A client's Proxy-Authorization, X-Forwarded-For or
// cookies never reach a host (a host is trusted with the requests placed
// on it, not with who sends them, nor their other credentials), and a
// compromised host cannot set a cookie on the server's origin, open it to
// other origins (Access-Control-*), or add anything else to its answers.

// relayRequestHeaders are the headers a request to a host may carry: what
// the host's router and management API read.
// The key's name and weight are the server's own (relayBody sets them
// over any a client sent).
var relayRequestHeaders = []string{"Content-Type", "Accept", router.HeaderClientRequestID, "Idempotency-Key",
	router.HeaderKeyName, router.HeaderKeyWeight}

// relayAnswerHeaders are the headers of a host's answer the client gets:
// what CapyCTL's router writes (core/router: the request IDs, the answer's
// type, Retry-After on a refusal, the stream's no-cache and no-buffering).
var relayAnswerHeaders = []string{"Content-Type", "Retry-After", router.HeaderRequestID, router.HeaderClientRequestID,
	"Cache-Control", "X-Accel-Buffering"}

// copyHeaders copies the names of src's headers that allow lists into dst
// (each name's every value; a name not in src is left as dst has it).
func copyHeaders(dst, src http.Header, allow []string) {
	for _, k := range allow {
		if v := src.Values(k); len(v) > 0 {
			dst[http.CanonicalHeaderKey(k)] = append([]string(nil), v...)
		}
	}
}
