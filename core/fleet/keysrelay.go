// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package fleet

import (
	"bytes"
	"io"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/capyctl/capyctl/core/router"
	"github.com/capyctl/capyctl/core/structs"
)

// A server counts what each relayed request used against its key (the
// key's limits and usage, core/apikeys and core/usage, as a standalone
// role's router does): the model it asked for, the refusal's code, and
// the tokens the engine reported. The host's router writes those tokens
// at the end of every answer it sends (capyctl.metrics: the JSON answer's
// member, a stream's comment before [DONE]), so the server reads them
// from the last bytes it relays, never parsing the answer as it goes.

// tailSize is how much of an answer's end a relay keeps: the metrics are
// a few hundred bytes, the last thing before the end.
const tailSize = 4 << 10

// tailReader keeps the last tailSize bytes read through it.
type tailReader struct {
	io.ReadCloser
	mu   sync.Mutex
	buf  [tailSize]byte
	n    int // bytes in buf, at most tailSize
	next int // where the next byte goes (a ring)
}

func (t *tailReader) Read(p []byte) (int, error) {
	n, err := t.ReadCloser.Read(p)
	if n > 0 {
		t.mu.Lock()
		b := p[:n]
		if len(b) > tailSize {
			b = b[len(b)-tailSize:]
		}
		for len(b) > 0 {
			c := copy(t.buf[t.next:], b)
			b = b[c:]
			t.next = (t.next + c) % tailSize
			t.n = min(t.n+c, tailSize)
		}
		t.mu.Unlock()
	}
	return n, err
}

// bytes returns the tail, oldest first, in the reader's own buffer (the
// ring is turned in place: no copy per answer); valid until the next Read.
func (t *tailReader) bytes() []byte {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.n == tailSize && t.next != 0 {
		slices.Reverse(t.buf[:t.next])
		slices.Reverse(t.buf[t.next:])
		slices.Reverse(t.buf[:])
		t.next = 0
	}
	return t.buf[:t.n]
}

// relayMeter settles a relayed request against its key once.
type relayMeter struct {
	m     router.Meter
	start time.Time
	model string // set once the model is one the key may use
	code  string
	tail  *tailReader
	state int // the answer's status (0: none relayed)
	once  sync.Once
}

// meterFor takes the request's meter (its key's share of the limits).
func meterFor(r *http.Request) *relayMeter {
	rm := &relayMeter{m: router.CallerOf(r.Context()).Meter, start: time.Now()}
	if rm.m != nil {
		rm.m.Take()
	}
	return rm
}

// refused records the server's own refusal of the request.
func (rm *relayMeter) refused(err error) {
	if rm.code == "" {
		rm.code = string(structs.CodeOf(err))
	}
}

// watch keeps the end of a host's answer.
func (rm *relayMeter) watch(resp *http.Response) {
	rm.tail = &tailReader{ReadCloser: resp.Body}
	resp.Body = rm.tail
	rm.state = resp.StatusCode
}

// end settles the request: what the host's answer said it used, or the
// refusal.
func (rm *relayMeter) end() {
	rm.once.Do(func() {
		if rm.m == nil {
			return
		}
		u := structs.RequestUsage{Model: rm.model, Code: rm.code, Duration: time.Since(rm.start)}
		if rm.tail != nil {
			tail := rm.tail.bytes()
			u.UsageKnown, u.PromptTokens, u.CompletionTokens, u.CachedTokens = answerUsage(tail)
			if u.Code == "" && rm.state >= 400 {
				u.Code = answerCode(tail, rm.state)
			}
		}
		rm.m.Settle(u)
	})
}

// metric reads one figure of capyctl.metrics ({"value":N,"source":...})
// from the last place it appears in b.
func metric(b []byte, name string) (int64, bool) {
	key := []byte(`"` + name + `":{"value":`)
	i := bytes.LastIndex(b, key)
	if i < 0 {
		return 0, false
	}
	rest := b[i+len(key):]
	j := 0
	for j < len(rest) && (rest[j] >= '0' && rest[j] <= '9' || rest[j] == '.') {
		j++
	}
	v, err := strconv.ParseFloat(string(rest[:j]), 64)
	if err != nil {
		return 0, false
	}
	return int64(v), true
}

// answerUsage reads the tokens an answer reported from its end.
func answerUsage(tail []byte) (known bool, prompt, completion, cached int64) {
	p, okP := metric(tail, "input_tokens")
	c, okC := metric(tail, "output_tokens")
	if !okP || !okC {
		return false, 0, 0, 0
	}
	cached, _ = metric(tail, "cached_tokens")
	return true, p, c, cached
}

// answerCode reads a refused or failed answer's code ("code":"...") from
// its end; "http_<status>" when it names none.
func answerCode(tail []byte, status int) string {
	key := []byte(`"code":"`)
	if i := bytes.LastIndex(tail, key); i >= 0 {
		rest := tail[i+len(key):]
		if j := bytes.IndexByte(rest, '"'); j > 0 && j <= 64 {
			return string(rest[:j])
		}
	}
	return "http_" + strconv.Itoa(status)
}
