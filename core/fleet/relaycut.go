// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package fleet

import (
	"sync"

	"github.com/capyctl/capyctl/core/router"
	"github.com/capyctl/capyctl/core/structs"
)

// A host's streamed answer can break off mid-way: the host agent dies, or
// its link to the server drops. The server is still there to say so, and
// ends the client's stream as the router ends its own when an engine's
// answer breaks off: with a coded event (host_unreachable) in the
// endpoint's shape, then the stream's proper end — never a connection cut
// in the middle of an event, which a client reads as a broken stream with
// no reason. For that the relay writes the host's stream in whole events:
// what a read ends mid-event with waits for the rest (a host writes whole
// events, so this is rare and short), and a cut drops it.

// maxPartialEvent bounds what a relayed stream holds back of one event
// whose end has not arrived; past it the bytes go on as they are (the
// stream is not in events).
const maxPartialEvent = 1 << 20

// sseRelay keeps a relayed stream at event boundaries. What waits for its
// event's end, and a read joined to it, are in pooled buffers, held only
// while bytes wait: an open stream whose host writes whole events holds
// none, and a burst that ends mid-event allocates nothing.
type sseRelay struct {
	pending *[]byte // what waits for its event's end (nil: nothing)
	joined  *[]byte // the last result, when it was pending and a read joined
}

// partialBufs are sseRelay's buffers.
var partialBufs = sync.Pool{New: func() any { b := make([]byte, 0, 4<<10); return &b }}

// maxPooledPartial is the largest buffer partialBufs takes back.
const maxPooledPartial = 64 << 10

func putPartial(bp *[]byte) {
	if cap(*bp) <= maxPooledPartial {
		*bp = (*bp)[:0]
		partialBufs.Put(bp)
	}
}

// lastEventEnd is the end of the last whole event in b (just past its
// blank line, in any of SSE's line endings), 0 when b holds none.
//
// It scans back from the end: a read from a host almost always ends with an
// event, so the answer is found in its last bytes (bytes.LastIndex of each
// separator searched the whole read three times, about a tenth of the
// server's CPU per relayed stream).
func lastEventEnd(b []byte) int {
	for e := len(b); e >= 2; e-- {
		switch c := b[e-1]; {
		case c != '\n' && c != '\r':
		case b[e-2] == c: // "\n\n" or "\r\r"
			return e
		case c == '\n' && e >= 4 && b[e-2] == '\r' && b[e-3] == '\n' && b[e-4] == '\r':
			return e
		}
	}
	return 0
}

// whole returns what of a read b (after what was pending) to write now:
// everything through its last event end; the rest waits. The result is
// valid until the next call (it may be b itself).
func (s *sseRelay) whole(b []byte) []byte {
	if s.joined != nil {
		putPartial(s.joined)
		s.joined = nil
	}
	all := b
	if s.pending != nil {
		*s.pending = append(*s.pending, b...)
		s.joined, s.pending = s.pending, nil
		all = *s.joined
	}
	end := lastEventEnd(all)
	if end == 0 && len(all) >= maxPartialEvent {
		end = len(all)
	}
	if end < len(all) {
		s.pending = partialBufs.Get().(*[]byte)
		*s.pending = append(*s.pending, all[end:]...)
	}
	return all[:end]
}

// rest is what waits at the stream's proper end (written as it is); valid
// until the next call.
func (s *sseRelay) rest() []byte {
	if s.joined != nil {
		putPartial(s.joined)
		s.joined = nil
	}
	if s.pending == nil {
		return nil
	}
	s.joined, s.pending = s.pending, nil
	return *s.joined
}

// brokeOff is the ending of a relayed stream (rl) whose host's answer
// broke off with err, for the endpoint path: host_unreachable, or
// shutting_down when the server stopping cut it (as a standalone role's
// drain timeout does); nil when the client hung up (the relayed stream's
// context ended: nothing is owed) or the endpoint has no such ending
// (StreamFailure): the stream is then cut.
func brokeOff(rl hostReply, path string, err error) []byte {
	if rl.ctx.Err() != nil {
		return nil
	}
	e := structs.Errf(structs.CodeHostUnreachable, "the answer from host %s broke off: %v", rl.host, err).WithDetail("host", rl.host)
	e.RetryAfter = 1
	select {
	case <-rl.stopping:
		e = structs.Errf(structs.CodeShuttingDown, "the server is shutting down and its drain timeout ended before the answer")
	default:
	}
	return router.StreamFailure(path, e)
}
