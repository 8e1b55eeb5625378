// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package fleet

import (
	"bytes"

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

// sseRelay keeps a relayed stream at event boundaries.
type sseRelay struct {
	pending []byte
}

// lastEventEnd is the end of the last whole event in b (just past its
// blank line, in any of SSE's line endings), 0 when b holds none.
func lastEventEnd(b []byte) int {
	end := 0
	for _, sep := range [][]byte{[]byte("\n\n"), []byte("\r\n\r\n"), []byte("\r\r")} {
		if i := bytes.LastIndex(b, sep); i >= 0 && i+len(sep) > end {
			end = i + len(sep)
		}
	}
	return end
}

// whole returns what of a read b (after what was pending) to write now:
// everything through its last event end; the rest waits. The result is
// valid until the next call (it may be b itself).
func (s *sseRelay) whole(b []byte) []byte {
	all := b
	if len(s.pending) > 0 {
		all = append(s.pending, b...)
	}
	end := lastEventEnd(all)
	if end == 0 && len(all) >= maxPartialEvent {
		end = len(all)
	}
	var rest []byte
	if end < len(all) {
		rest = append(rest, all[end:]...)
	}
	s.pending = rest
	return all[:end]
}

// rest is what waits at the stream's proper end (written as it is).
func (s *sseRelay) rest() []byte {
	p := s.pending
	s.pending = nil
	return p
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
