// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package router

import (
	"errors"
	"io"
	"os"
	"strconv"
	"time"

	"github.com/capyctl/capyctl/core/structs"
)

// sseState is what the relay has learned of a streamed answer.
type sseState struct {
	sr        *sseReader
	call      *engineCall
	agg       *aggregate // the answer so far, for a client that asked for no stream
	rw        rewriter
	cutErr    error  // why the router cut the answer
	engineErr []byte // the engine's error event
	sawDone   bool   // [DONE] arrived
	finished  bool   // the aggregate saw a finish reason
	wrote     bool   // bytes were written since the last flush
	trailer   bool   // the answer's end was written to the client
}

// relaySSE relays (or aggregates) a chat answer streamed by the engine.
// A stream that goes on after its first flush is taken over from net/http
// (hijack.go) and handed off: the handler returns, and relayOn relays the
// rest on a goroutine of its own.
func (q *request) relaySSE(sr *sseReader, call *engineCall) {
	st := &sseState{sr: sr, call: call, rw: rewriter{newID: q.id, public: q.model, served: q.target.Endpoint.ServedName}}
	switch {
	case q.stream:
		q.setWriteDeadline()
	default:
		sr.timed = true
		if q.dl == nil {
			st.agg = newAggregate() // dialect: the dialect builds its own answer
		}
	}
	if q.sseLoop(st) {
		q.st, q.handedOff = st, true
		return
	}
	q.sseEnd(st)
	sr.release()
}

// sseLoop relays the engine's events until its stream ends or is cut. It
// returns true, on the handler's goroutine only, once the stream was taken
// over and must be handed off.
//
// IMPORTANT: every open stream pays for the stack of the goroutine this
// loop waits on. Keep the loop's frame small and rare work out of line
// (sseEvent, sseEnd), and decode JSON one level at a time (decodeChunk).
func (q *request) sseLoop(st *sseState) bool {
	sr := st.sr
	for {
		ev, err := sr.next()
		if err != nil {
			q.sseReadErr(st, err)
			return false
		}
		q.sseEvent(st, sr, ev)
		if st.cutErr != nil {
			return false
		}
		if (st.sawDone || st.engineErr != nil) && !st.trailer {
			if q.sseComplete(st, sr); st.cutErr != nil {
				return false
			}
		}
		if !sr.buffered() {
			q.stampContent()
			if st.wrote && q.stream {
				st.wrote = false
				if q.wantsTakeOver(st) {
					q.takeOverOrWait()
				}
				if err := q.flush(); err != nil {
					st.cutErr = q.clientErr()
					return false
				}
			}
			if !q.firstContent.IsZero() && !st.trailer {
				sr.readWithin(q.b.streamIdle)
				if !q.stream && !sr.low {
					q.gather(st.call, sr)
				}
			}
			if q.cc != nil && !q.handedOff {
				return true
			}
		}
	}
}

// gather spaces the reads of an answer assembled for a client that asked
// for no stream: nobody sees its chunks arrive. From an engine seen
// closing its connection after a stream (llama-server), the rest is read
// with a low-water mark (sseReader.lowWater): the kernel wakes the relay
// for the engine's close at the end, not for its events. Otherwise, an
// engine that sends its chunks faster than gatherWindow has the next ones
// ready together after it, read at once: one wake-up for several chunks,
// not one each. The window ends on the clock's next multiple of it, the
// same instant for every answer gathering: the runtime wakes them
// together. Either way a hang-up still cuts the engine at once (the
// cutter closes its connection).
func (q *request) gather(call *engineCall, sr *sseReader) {
	if call.closesAfterStream() && sr.lowWater() {
		sr.readWithin(q.b.streamIdle)
		return
	}
	if sr.waited < gatherWindow {
		time.Sleep(gatherWindow - time.Duration(time.Now().UnixNano()%int64(gatherWindow)))
	}
}

// gatherWindow is how long the relay of an assembled answer waits between
// reads of an engine that sends its chunks faster than that (sseLoop).
const gatherWindow = 5 * time.Millisecond

// sseReadErr records why the engine's stream ended.
func (q *request) sseReadErr(st *sseState, err error) {
	switch {
	case errors.Is(err, io.EOF):
	case errors.Is(err, errTooLarge):
		q.cutter.cut(errChunk)
		st.cutErr = errChunk
	default:
		if st.sawDone || (st.finished && st.engineErr == nil) {
			return // the answer is complete; only the end of the body is missing
		}
		if c := q.cause(err); c != nil {
			st.cutErr = c
		} else {
			st.cutErr = err
		}
	}
}

// sseEvent handles one event of the engine's stream.
func (q *request) sseEvent(st *sseState, sr *sseReader, ev []byte) {
	kind, payload := classify(ev)
	switch kind {
	case evComment:
	case evDone:
		st.sawDone = true
	case evError:
		if st.engineErr == nil && !st.sawDone {
			st.engineErr = append([]byte(nil), payload...)
		}
	case evData:
		if st.sawDone || st.engineErr != nil {
			return
		}
		if q.dl != nil {
			q.dialectData(st, sr, payload)
			return
		}
		relay := true
		if st.agg != nil {
			relay = false
			st.agg.add(payload, q)
			if st.agg.finished {
				st.finished = true
			}
		} else {
			relay = q.scan(payload, &st.rw)
		}
		if q.firstContent.IsZero() && q.contentN > 0 {
			// From the first output on, the stream idle bound replaces the
			// request deadline.
			q.firstContent = time.Now()
			sr.readWithin(q.b.streamIdle)
		}
		if relay {
			if !q.headersSent {
				q.sseHeaders()
			}
			if err := q.writeEvent(payload, &st.rw); err != nil {
				st.cutErr = q.clientErr()
			}
			st.wrote = true
		}
	}
}

// stampContent records when the output read last arrived: once per read
// from the engine, not once per chunk (its chunks arrived together).
func (q *request) stampContent() {
	if q.contentSeen {
		q.lastContent = time.Now()
		q.contentSeen = false
	}
}

// sseComplete writes the end of a complete answer: it reaches the client
// now, before the engine's body is drained (for a second at most). Where
// the engine's body has ended already (its last chunk read with the last
// event, as almost always) nothing is left to wait for: the end goes with
// the answer's own end (net/http's last chunk, or the taken-over
// connection's), in one write instead of two, once the request is
// recorded.
func (q *request) sseComplete(st *sseState, sr *sseReader) {
	st.trailer = true
	q.stampContent()
	if st.engineErr == nil {
		q.endAt = time.Now()
		flush := !sr.done || q.dl != nil
		if err := q.writeAnswer(st.agg, flush); err != nil {
			st.cutErr = q.clientErr()
			return
		}
		if !flush {
			st.wrote = false
		}
	}
	sr.readWithin(time.Second)
}

// sseEnd settles and answers the request once the engine's stream ended.
func (q *request) sseEnd(st *sseState) {
	sr, call := st.sr, st.call
	q.stampContent()
	if q.endAt.IsZero() {
		q.endAt = time.Now()
	}
	switch {
	case st.cutErr != nil:
		call.finish(false)
		q.cutEnd(st.cutErr)
	case st.engineErr != nil:
		call.finish(sr.reusable())
		if q.place != nil {
			q.place.Failed()
			q.place = nil
		}
		code := structs.CodeEngineError
		q.outcome = OutcomeEngineError
		if c := engineErrorCode(st.engineErr); (c == 400 || c == 413 || c == 422) && q.firstContent.IsZero() {
			code = structs.CodeEngineRejected
			q.outcome = OutcomeEngineRejected
		}
		q.fail(structs.Errf(code, "%s", engineMessage(st.engineErr, 0)))
	case !st.sawDone && !st.finished && !q.sawFinish:
		call.finish(false)
		if q.place != nil {
			q.place.Failed()
			q.place = nil
		}
		q.outcome = OutcomeEngineError
		q.fail(structs.Errf(structs.CodeEngineError, "the engine ended its answer without finishing it"))
	default:
		reusable := sr.reusable()
		if !q.stream {
			reusable = call.learnClose(sr)
		}
		call.finish(reusable)
		q.done()
		if !st.trailer {
			q.endAt = time.Now()
			if err := q.writeAnswer(st.agg, true); err != nil {
				q.outcome = OutcomeCancelled
			}
		}
	}
}

// clientErr ends the engine work after a failed write to the client: the
// client went away, or read nothing within the client read bound.
func (q *request) clientErr() error {
	// IMPORTANT: net/http cancels the request's context on any failed
	// write, a write deadline included: look at the error first.
	if !errors.Is(q.writeErr, os.ErrDeadlineExceeded) && q.clientWent() {
		q.cutter.cut(errClientGone)
		return errClientGone
	}
	q.cutter.cut(errClientIdle)
	return errClientIdle
}

// cutEnd settles and answers a request the router cut.
func (q *request) cutEnd(cause error) {
	q.cut(true)
	switch cause {
	case errClientGone:
		q.gone()
	case errClientIdle:
		q.outcome = OutcomeClientIdle
		q.code = OutcomeClientIdle
	case errDeadline:
		q.outcome = OutcomeDeadline
		q.fail(structs.Errf(structs.CodeDeadlineExceeded, "model %q gave no output within the request deadline (%s)", q.model, q.b.deadline))
	case errStreamIdle:
		q.outcome = OutcomeStreamIdle
		q.fail(structs.Errf(structs.CodeStreamStalled, "model %q sent nothing for %s (limits.stream_idle)", q.model, q.b.streamIdle))
	case errChunk:
		q.outcome = OutcomeChunkTooLarge
		q.fail(structs.Errf(structs.CodeChunkTooLarge, "the engine sent one piece of the answer larger than %s (limits.max_chunk_bytes)", structs.FormatBytes(int64(q.b.maxChunk))))
	case errShutdown:
		q.outcome = OutcomeShutdown
		q.fail(structs.Errf(structs.CodeShuttingDown, "the role is shutting down and its drain timeout ended before the answer"))
	default:
		q.outcome = OutcomeEngineError
		q.fail(structs.Errf(structs.CodeEngineError, "the engine's answer broke off: %v", cause))
	}
}

// writeEvent relays one chunk with CapyCTL's request ID and the public
// model name.
func (q *request) writeEvent(payload []byte, rw *rewriter) error {
	if err := q.write(dataPrefix); err != nil {
		return err
	}
	if err := rw.write(q, payload); err != nil {
		return err
	}
	return q.write(eventEnd)
}

var (
	dataPrefix = []byte("data: ")
	eventEnd   = []byte("\n\n")
	doneEvent  = []byte("data: [DONE]\n\n")
)

// writeAnswer ends a complete answer: the metrics comment and [DONE] for a
// stream (flushed now, or left to the answer's end), the aggregated JSON
// for a client that asked for none.
func (q *request) writeAnswer(agg *aggregate, flush bool) error {
	if q.dl != nil {
		return q.dl.finish(q) // dialect: the end in the API's shape
	}
	q.setWriteDeadline()
	if agg == nil {
		if !q.headersSent {
			q.sseHeaders()
		}
		b := make([]byte, 0, 512)
		b = append(b, ": x-capyctl-metrics "...)
		b = q.appendMetrics(b)
		b = append(b, "\n\n"...)
		b = append(b, doneEvent...)
		if err := q.write(b); err != nil || !flush {
			return err
		}
		return q.flush()
	}
	out := agg.json(q)
	h := q.w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Content-Length", strconv.Itoa(len(out)))
	q.w.WriteHeader(200)
	q.status = 200
	q.headersSent = true
	return q.write(out)
}
