// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package fakeengine_test

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/capyctl/capyctl/plugins-testkit/fakeengine"
)

// scriptedWorker is rank 1 of a 2-rank group played by the test over the
// group protocol, so that the test decides its answers.
type scriptedWorker struct {
	conn net.Conn
	rd   *bufio.Reader
}

// joinScripted joins the head's rendezvous at addr as rank 1 and plays the
// start until "serving".
func joinScripted(t *testing.T, addr string) *scriptedWorker {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	w := &scriptedWorker{conn: c, rd: bufio.NewReader(c)}
	w.send(t, fakeengine.GroupProtocol+" hello engine=vllm rank=1 nnodes=2")
	w.expect(t, "ok")
	w.expect(t, "load")
	w.send(t, "loaded")
	w.expect(t, "serving")
	return w
}

func (w *scriptedWorker) send(t *testing.T, line string) {
	t.Helper()
	if _, err := fmt.Fprintf(w.conn, "%s\n", line); err != nil {
		t.Fatal(err)
	}
}

func (w *scriptedWorker) expect(t *testing.T, want string) {
	t.Helper()
	_ = w.conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	line, err := w.rd.ReadString('\n')
	if err != nil || strings.TrimSpace(line) != want {
		t.Fatalf("the head sent %q (%v), want %q", line, err, want)
	}
}

// postAsync posts body (JSON) from a goroutine of its own: status 0 when
// the request fails.
func postAsync(url, body string) (int, []byte) {
	resp, err := http.Post(url, "application/json", strings.NewReader(body))
	if err != nil {
		return 0, []byte(err.Error())
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, data
}

// startGroupHead runs a vLLM head of a 2-rank group with a scripted worker.
func startGroupHead(t *testing.T) (*testEngine, *scriptedWorker) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	te := startEngine(t, fakeengine.Config{
		Flavour: fakeengine.NewVLLM(fakeengine.VLLMOptions{DevMode: true, SleepMode: true}),
		Group:   &fakeengine.GroupConfig{Engine: "vllm", Rank: 0, Size: 2, Listener: ln},
	}, false)
	w := joinScripted(t, ln.Addr().String())
	select {
	case <-te.Ready():
	case <-time.After(10 * time.Second):
		t.Fatal("the head is not ready")
	}
	return te, w
}

// TestGroupHead_CommandsWaitForEveryRank: the head sends each command to
// its workers and answers the API call only with their answers: a
// worker's "error" fails the call with vLLM's 500 and leaves the head as
// it was (awake, or asleep for a wake), the group alive.
func TestGroupHead_CommandsWaitForEveryRank(t *testing.T) {
	te, w := startGroupHead(t)
	isSleeping := func(want bool) {
		t.Helper()
		status, body, _ := do(t, http.MethodGet, te.url+"/is_sleeping", "", nil)
		if status != 200 || strings.TrimSpace(string(body)) != fmt.Sprintf(`{"is_sleeping":%v}`, want) {
			t.Fatalf("is_sleeping: %d %s, want %v", status, body, want)
		}
	}
	steps := []struct {
		path, body string
		cmd        string // what the worker must receive
		answer     string // what it answers
		status     int
		sleeping   bool
	}{
		{"/sleep?level=2", "", "sleep 2 weights kv_cache", "error out of luck", 500, false},
		{"/sleep?level=2", "", "sleep 2 weights kv_cache", "slept", 200, true},
		{"/wake_up?tags=weights", "", "wake weights", "error no room", 500, true},
		{"/wake_up?tags=weights", "", "wake weights", "woke", 200, true},
		{"/collective_rpc", `{"method":"reload_weights"}`, "reload", "error not today", 500, true},
		{"/collective_rpc", `{"method":"reload_weights"}`, "reload", "reloaded", 200, true},
		{"/wake_up", "", "wake weights kv_cache", "woke", 200, false},
	}
	for _, s := range steps {
		type result struct {
			status int
			body   []byte
		}
		got := make(chan result, 1)
		go func() {
			status, body := postAsync(te.url+s.path, s.body)
			got <- result{status, body}
		}()
		w.expect(t, s.cmd)
		w.send(t, s.answer)
		r := <-got
		if r.status != s.status {
			t.Fatalf("POST %s with the worker answering %q: %d %s, want %d", s.path, s.answer, r.status, r.body, s.status)
		}
		if s.status != 200 && !strings.Contains(string(r.body), strings.TrimPrefix(s.answer, "error ")) {
			t.Fatalf("POST %s: %s does not carry the worker's error", s.path, r.body)
		}
		isSleeping(s.sleeping)
	}
	select {
	case err := <-te.runErr:
		t.Fatalf("the head ended: %v", err)
	default:
	}
}

// TestGroupHead_WorkerGoneDuringACommand: a worker gone while the head
// waits for its answer fails the call (500) and the group (exit 1).
func TestGroupHead_WorkerGoneDuringACommand(t *testing.T) {
	te, w := startGroupHead(t)
	got := make(chan int, 1)
	go func() {
		status, _ := postAsync(te.url+"/sleep?level=1", "")
		got <- status
	}()
	w.expect(t, "sleep 1 weights kv_cache")
	w.conn.Close()
	if status := <-got; status != 500 {
		t.Fatalf("sleep with the worker gone: %d, want 500", status)
	}
	var err error
	select {
	case err = <-te.runErr:
		te.runErr <- err // for the cleanup
	case <-time.After(10 * time.Second):
		t.Fatal("the head did not end")
	}
	var x *fakeengine.ExitError
	if !errors.As(err, &x) || x.Code != 1 || !strings.Contains(x.Reason, "group rank 1 is gone") {
		t.Fatalf("the head ended with %v, want exit 1 for rank 1 gone", err)
	}
}
