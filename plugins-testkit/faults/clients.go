// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package faults

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// IdleConnections opens IdleConns connections to the inference listener
// that send nothing, from four loopback addresses (127.0.0.2 to .5) so
// that each address stays under the default cap of unauthenticated
// connections per address (512) and the role really holds them all; they
// are held Hold, then counted (closed by the role or not) and closed.
func IdleConnections() Fault {
	return Fault{Name: "idle connections to the inference listener", Inject: func(e *Env) {
		addr := e.Role.Info.Inference
		conns := make([]net.Conn, 0, e.Scale.IdleConns)
		failed := map[string]int{}
		for i := 0; i < e.Scale.IdleConns; i++ {
			src := &net.TCPAddr{IP: net.IPv4(127, 0, 0, byte(2+i%4))}
			d := net.Dialer{LocalAddr: src, Timeout: 2 * time.Second}
			c, err := d.Dial("tcp", addr)
			if err != nil {
				failed[shortErr(err)]++
				continue
			}
			conns = append(conns, c)
		}
		defer func() {
			for _, c := range conns {
				c.Close()
			}
		}()
		opened := time.Now()
		e.Note("%d connections opened%s", len(conns), countsSuffix(" not opened: ", failed))
		if len(conns) != e.Scale.IdleConns {
			e.Miss("%d of %d connections opened, want all (under the per-address cap)", len(conns), e.Scale.IdleConns)
		}
		out, code, took := e.CLI(30*time.Second, "status")
		e.Note("capyctl status while they are open: exit %d in %.1f s%s", code, took.Seconds(), firstLineIfFailed(code, out))
		if code != 0 {
			e.Miss("capyctl status while they are open: exit %d, want 0", code)
		}
		// The fault lasts a window of traffic.
		time.Sleep(e.Scale.Hold)
		// The role closes every one once listener.read_header_timeout
		// passes (10 s, the default the suite keeps).
		closed := make([]bool, len(conns))
		count := func() int {
			n := 0
			for i, c := range conns {
				if !closed[i] && closedByPeer(c) {
					closed[i] = true
				}
				if closed[i] {
					n++
				}
			}
			return n
		}
		bound := max(readHeaderTimeout+within-time.Since(opened), 0)
		if waitUntil(bound, func() bool { return count() == len(conns) }) {
			e.Note("%d closed by the role after %.0f s", len(conns), time.Since(opened).Seconds())
		} else {
			e.Miss("%d of %d closed by the role %.0f s after they opened, want all within listener.read_header_timeout (%s)",
				count(), len(conns), time.Since(opened).Seconds(), readHeaderTimeout)
		}
	}, Expect: expect(allEnginesSurvive, nothingFails)}
}

// readHeaderTimeout is listener.read_header_timeout's default.
const readHeaderTimeout = 10 * time.Second

// closedByPeer reports whether the role closed or reset a connection: a
// non-blocking peek reads its end (or a reset), not a timeout.
func closedByPeer(c net.Conn) bool {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return false
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return false
	}
	closed := false
	_ = raw.Control(func(fd uintptr) {
		var b [1]byte
		n, _, err := syscall.Recvfrom(int(fd), b[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		closed = (n == 0 && err == nil) || err == syscall.ECONNRESET
	})
	return closed
}

// SlowBody sends chat requests whose bodies drip one byte every 500 ms:
// SlowClients with the API key (the role gives up after
// listener.body_read_timeout, lowered for this row) and as many without
// it (answered 401 without reading the body).
func SlowBody() Fault {
	return Fault{
		Name: "slow-body clients",
		Settings: func(s Scale) []string {
			return []string{fmt.Sprintf("listener.body_read_timeout=%s", s.BodyReadTimeout)}
		},
		Inject: func(e *Env) {
			var mu sync.Mutex
			results := map[string]int{}
			var misses []string
			var wg sync.WaitGroup
			for i := 0; i < 2*e.Scale.SlowClients; i++ {
				authed := i%2 == 0
				wg.Add(1)
				go func() {
					defer wg.Done()
					res, took := drip(e.Role.Info.Inference, e.Role.Creds.APIKey, authed, e.Scale.BodyReadTimeout+20*time.Second)
					who, want, bound := "without key", "401 unauthorized", within
					if authed {
						// 408 once listener.body_read_timeout passes.
						who, want, bound = "with key", "408 body_read_timeout", e.Scale.BodyReadTimeout+within
					}
					mu.Lock()
					defer mu.Unlock()
					results[fmt.Sprintf("%s: %s after %.0f s", who, res, took.Seconds())]++
					if res != want || took > bound {
						misses = append(misses, fmt.Sprintf("%s: %s after %.1f s, want %s within %s", who, res, took.Seconds(), want, bound))
					}
				}()
			}
			wg.Wait()
			e.Note("drippers: %s", countsList(results))
			for _, m := range misses {
				e.Miss("a slow body %s", m)
			}
		},
		Expect: expect(allEnginesSurvive, nothingFails),
	}
}

// drip sends one request whose 4 KiB body arrives a byte every 500 ms,
// and returns "<status> <code>" of the answer or what ended it, and how
// long after the head it came.
func drip(addr, key string, authed bool, bound time.Duration) (string, time.Duration) {
	c, err := net.DialTimeout("tcp", addr, 2*time.Second)
	if err != nil {
		return shortErr(err), 0
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(bound))
	head := "POST /v1/chat/completions HTTP/1.1\r\nHost: " + addr + "\r\nContent-Type: application/json\r\nContent-Length: 4096\r\n"
	if authed {
		head += "Authorization: Bearer " + key + "\r\n"
	}
	start := time.Now()
	if _, err := io.WriteString(c, head+"\r\n{"); err != nil {
		return shortErr(err), time.Since(start)
	}
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		t := time.NewTicker(500 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-t.C:
				if _, err := c.Write([]byte(" ")); err != nil {
					return
				}
			}
		}
	}()
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		return shortErr(err), time.Since(start)
	}
	defer resp.Body.Close()
	took := time.Since(start)
	return statusOutcome(resp), took
}

// BigBodies sends BigClients×BigBodies chat requests of 64 MiB each
// (limits.max_body_bytes, the default), all clients at once: the role
// bounds the bytes of bodies in flight (limits.max_body_bytes_in_flight,
// 256 MiB) and refuses the rest 429. The role's resident memory is read
// before and after.
func BigBodies() Fault {
	return Fault{Name: "flood of 64 MiB bodies", Inject: func(e *Env) {
		body := bigBody(trafficDep, 64<<20)
		rssBefore := rss(e.Role.PID(), "VmRSS")
		var mu sync.Mutex
		results := map[string]int{}
		var wg sync.WaitGroup
		tr := &http.Transport{MaxIdleConnsPerHost: e.Scale.BigClients}
		defer tr.CloseIdleConnections()
		hc := &http.Client{Transport: tr}
		for i := 0; i < e.Scale.BigClients; i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for j := 0; j < e.Scale.BigBodies; j++ {
					res := sendBig(hc, e.Role.InferenceURL(), e.Role.Creds.APIKey, body)
					mu.Lock()
					results[res]++
					mu.Unlock()
				}
			}()
		}
		wg.Wait()
		e.Note("%d bodies of 64 MiB: %s", e.Scale.BigClients*e.Scale.BigBodies, countsList(results))
		e.Note("role resident memory %d MiB before, %d MiB peak (VmHWM), %d MiB just after",
			rssBefore>>20, rss(e.Role.PID(), "VmHWM")>>20, rss(e.Role.PID(), "VmRSS")>>20)
		// Each body is answered: forwarded (the fake engine takes up to
		// 32 MiB, so 400 engine_rejected, or 503 when it hangs up before
		// the body is sent), or refused 429 with Retry-After beyond
		// limits.max_body_bytes_in_flight. Clients sending more at once
		// than the bound holds see the refusal.
		answered := codedAs("bodies_in_flight_full", "engine_rejected", "unavailable")
		for res, n := range results {
			if res != "200" && !answered(res) {
				e.Miss("%d bodies answered %s, want 200, 400 engine_rejected, 503 unavailable or 429 bodies_in_flight_full with Retry-After", n, res)
			}
		}
		if int64(e.Scale.BigClients)*64<<20 > bodiesInFlight && results["429 bodies_in_flight_full"] == 0 {
			e.Miss("%d clients sent 64 MiB at once and none was refused 429 bodies_in_flight_full (bound %d MiB)", e.Scale.BigClients, bodiesInFlight>>20)
		}
	}, After: func(e *Env) {
		e.Note("%d MiB at the end of the settle window", rss(e.Role.PID(), "VmRSS")>>20)
	},
		// The bound keeps room for small requests: the traffic goes on.
		Expect: expect(allEnginesSurvive, nothingFails),
	}
}

// bodiesInFlight is limits.max_body_bytes_in_flight's default.
const bodiesInFlight = 256 << 20

func sendBig(hc *http.Client, base, key string, body []byte) string {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/chat/completions", bytes.NewReader(body))
	if err != nil {
		return err.Error()
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+key)
	resp, err := hc.Do(req)
	if err != nil {
		return transportOutcome(ctx, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode == http.StatusTooManyRequests && resp.Header.Get("Retry-After") == "" {
		return statusOutcome(resp) + " without Retry-After"
	}
	if resp.StatusCode != http.StatusOK {
		return statusOutcome(resp)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	return "200"
}

// bigBody is a valid non-streamed chat request of exactly size bytes.
func bigBody(model string, size int) []byte {
	head := fmt.Sprintf(`{"model":%q,"max_tokens":1,"messages":[{"role":"user","content":"`, model)
	tail := `"}]}`
	b := make([]byte, size)
	copy(b, head)
	for i := len(head); i < size-len(tail); i++ {
		b[i] = 'a' + byte(i%26)
	}
	copy(b[size-len(tail):], tail)
	return b
}

// rss reads a memory figure of /proc/<pid>/status in bytes.
func rss(pid int, field string) int64 {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return 0
	}
	for _, l := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(l, field+":") {
			f := strings.Fields(strings.TrimPrefix(l, field+":"))
			if len(f) > 0 {
				kb, _ := strconv.ParseInt(f[0], 10, 64)
				return kb << 10
			}
		}
	}
	return 0
}

func isTimeout(err error) bool {
	ne, ok := err.(net.Error)
	return ok && ne.Timeout()
}

// shortErr names a connection error without addresses.
func shortErr(err error) string {
	switch {
	case isTimeout(err):
		return "timeout"
	case err == io.EOF || err == io.ErrUnexpectedEOF:
		return "connection closed"
	}
	s := err.Error()
	if i := strings.LastIndex(s, ": "); i >= 0 {
		s = s[i+2:]
	}
	return s
}

func countsList(m map[string]int) string {
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

func countsSuffix(prefix string, m map[string]int) string {
	if len(m) == 0 {
		return ""
	}
	return prefix + countsList(m)
}
