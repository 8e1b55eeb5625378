// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package router_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/capyctl/capyctl/core/router"
	"github.com/capyctl/capyctl/core/routes"
	"github.com/capyctl/capyctl/core/structs"
	"github.com/capyctl/capyctl/plugins-testkit/fakeengine"
	"github.com/capyctl/capyctl/plugins-testkit/poll"
)

// fakeLC is a lifecycle with one deployment on one in-process fake engine.
type fakeLC struct {
	board  routes.Board
	eng    atomic.Pointer[fakeengine.Engine]
	gen    atomic.Uint64
	state  atomic.Value // structs.InstanceState
	noIdle atomic.Bool
	// noReading makes every load reading fail: the router has no evidence
	// that the engine ended a cut request.
	noReading atomic.Bool
	// busy is added to the engine's waiting count in every reading, as an
	// engine that still holds cut requests in its queue reads; busyReadings
	// counts the readings given with busy > 0.
	busy         atomic.Int64
	busyReadings atomic.Int64
	// unknownReadings are the next readings given without an idle signal.
	unknownReadings atomic.Int64
	aborts          atomic.Int64
	restarts        atomic.Int64

	mu       sync.Mutex
	activate func(ctx context.Context, dep string) error
	abortIDs []string
	acts     atomic.Int64
	// estimate, when set, is the lifecycle's wait estimate (WaitEstimate).
	estimate atomic.Pointer[structs.WaitEstimate]
}

func (f *fakeLC) WaitEstimate(string) (structs.WaitEstimate, bool) {
	if e := f.estimate.Load(); e != nil {
		return *e, true
	}
	return structs.WaitEstimate{}, false
}

func (f *fakeLC) Board() *routes.Board { return &f.board }

func (f *fakeLC) Activate(ctx context.Context, dep string) error {
	f.acts.Add(1)
	f.mu.Lock()
	a := f.activate
	f.mu.Unlock()
	if a != nil {
		return a(ctx, dep)
	}
	return nil
}

func (f *fakeLC) Abort(ctx context.Context, _, requestID string) (bool, error) {
	if err := ctx.Err(); err != nil {
		return false, err // as a lifecycle asking a driver would
	}
	f.mu.Lock()
	f.abortIDs = append(f.abortIDs, requestID)
	f.mu.Unlock()
	f.aborts.Add(1)
	return f.eng.Load().Abort(requestID) > 0, nil
}

// abortedIDs returns the request IDs Abort was called with, in order.
func (f *fakeLC) abortedIDs() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.abortIDs...)
}

func (f *fakeLC) Load(ctx context.Context, _ string) (routes.InstanceLoad, error) {
	if err := ctx.Err(); err != nil {
		return routes.InstanceLoad{}, err // as a lifecycle asking a driver would
	}
	if f.noReading.Load() {
		return routes.InstanceLoad{}, errors.New("no reading (held by the test)")
	}
	if f.noIdle.Load() {
		return routes.InstanceLoad{}, nil
	}
	if f.unknownReadings.Add(-1) >= 0 {
		return routes.InstanceLoad{}, nil
	}
	f.unknownReadings.Store(0)
	s := f.eng.Load().Stats()
	busy := f.busy.Load()
	if busy > 0 {
		defer f.busyReadings.Add(1)
	}
	return routes.InstanceLoad{Known: true, Running: int64(s.Running), Waiting: int64(s.Waiting) + busy, At: time.Now()}, nil
}

func (f *fakeLC) InstanceRun(string) (uint64, structs.InstanceState, bool) {
	return f.gen.Load(), f.state.Load().(structs.InstanceState), true
}

func (f *fakeLC) RestartForSettlement(string) {
	f.restarts.Add(1)
	f.gen.Add(1)
}

// env is a router in front of one fake engine.
type env struct {
	t    testing.TB
	lc   *fakeLC
	rt   *router.Router
	srv  *httptest.Server
	eng  *fakeengine.Engine
	url  string
	ep   structs.EngineEndpoint
	spec func(*structs.Deployment)
	api  string
}

// startEngine runs a fake engine on loopback until the test ends.
func startEngine(t testing.TB, cfg fakeengine.Config) (*fakeengine.Engine, string) {
	t.Helper()
	if cfg.ServedName == "" {
		cfg.ServedName = "m"
	}
	cfg.Stdout, cfg.Stderr = io.Discard, io.Discard
	cfg.ShutdownGrace = time.Millisecond
	e, err := fakeengine.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := fakeengine.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = e.Serve(ctx, ln); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	<-e.Ready()
	return e, "http://" + ln.Addr().String()
}

type envOpts struct {
	engine  fakeengine.Config
	spec    func(*structs.Deployment)
	ep      func(*structs.EngineEndpoint)
	noReady bool
	router  func(*router.Config)
	api     string
	// idleTimeout is the HTTP server's (0: none).
	idleTimeout time.Duration
	// wrap wraps the router's handlers (as the API's authentication does).
	wrap func(http.Handler) http.Handler
	// h2 serves HTTP/2 over TLS (as a host's relay and a TLS listener do).
	h2 bool
}

func newEnv(t testing.TB, o envOpts) *env {
	t.Helper()
	eng, url := startEngine(t, o.engine)
	lc := &fakeLC{}
	lc.eng.Store(eng)
	lc.gen.Store(1)
	lc.state.Store(structs.StateReady)
	e := &env{t: t, lc: lc, eng: eng, url: url}
	e.ep = structs.EngineEndpoint{BaseURL: url, ChatPath: "/v1/chat/completions", DecisionsPath: "/v1/systemone", ServedName: "m"}
	if o.ep != nil {
		o.ep(&e.ep)
	}
	e.spec, e.api = o.spec, o.api
	e.publish(!o.noReady)
	// Streams are taken over at their first flush (TakeOverAfter -1), so
	// that the take-over is exercised by every streamed test;
	// TestRouter_YoungStreamStaysOnNetHTTP covers the default.
	cfg := router.Config{Lifecycle: lc, SettleInterval: 5 * time.Millisecond, SettleTransit: time.Millisecond, ProgressAfter: -1, TakeOverAfter: -1}
	if o.router != nil {
		o.router(&cfg)
	}
	e.rt = router.New(cfg)
	t.Cleanup(e.rt.Close)
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/chat/completions", e.rt.ChatCompletions)
	mux.HandleFunc("POST /v1/completions", e.rt.Completions)
	mux.HandleFunc("POST /v1/embeddings", e.rt.Embeddings)
	mux.HandleFunc("POST /v1/rerank", e.rt.Rerank)
	mux.HandleFunc("POST /v1/systemone", e.rt.Decisions)
	mux.HandleFunc("GET /v1/models", e.rt.Models)
	mux.HandleFunc("POST /v1/responses", e.rt.Responses)
	mux.HandleFunc("POST /v1/messages", e.rt.Messages)
	mux.HandleFunc("POST /v1/messages/count_tokens", e.rt.CountTokens)
	var h http.Handler = mux
	if o.wrap != nil {
		h = o.wrap(h)
	}
	e.srv = httptest.NewUnstartedServer(h)
	e.srv.Config.IdleTimeout = o.idleTimeout
	if o.h2 {
		e.srv.EnableHTTP2 = true
		e.srv.StartTLS()
	} else {
		e.srv.Start()
	}
	t.Cleanup(e.srv.Close)
	return e
}

// publish puts a new route table: the deployment with or without its ready
// instance.
func (e *env) publish(ready bool) {
	api := e.api
	if api == "" {
		api = structs.APIChat
	}
	s := &structs.Deployment{Name: "demo", API: api, Routes: []string{"demo"}, Instances: 1}
	if e.spec != nil {
		e.spec(s)
	}
	r := &routes.Route{Deployment: "demo", API: api, Routes: []string{"demo"}, Desired: structs.DesiredOnDemand, Spec: s, Instances: 1}
	if ready {
		r.Ready = []*routes.Target{{Instance: "demo/0", Generation: e.lc.gen.Load(), Endpoint: e.ep}}
	}
	e.lc.board.Publish(routes.NewTable(r))
}

// post sends a request with ctx.
func (e *env) post(ctx context.Context, path, body string, hdr map[string]string) (*http.Response, error) {
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, e.srv.URL+path, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	if e.srv.TLS != nil {
		return e.srv.Client().Do(req)
	}
	return http.DefaultClient.Do(req)
}

func chatBody(stream bool, extra string) string {
	b := `{"model":"demo","messages":[{"role":"user","content":"hello"}]`
	if stream {
		b += `,"stream":true`
	}
	return b + extra + "}"
}

func readBody(t testing.TB, resp *http.Response) string {
	t.Helper()
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("read body: %v", err)
	}
	return string(b)
}

// errCode returns the error envelope's code.
func errCode(body string) string {
	var env struct {
		Error struct {
			Code string `json:"code"`
		} `json:"error"`
	}
	_ = json.Unmarshal([]byte(body), &env)
	return env.Error.Code
}

// sseLines returns the data payloads and comments of a stream.
func sseLines(body string) (data, comments []string) {
	sc := bufio.NewScanner(strings.NewReader(body))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		l := sc.Text()
		switch {
		case strings.HasPrefix(l, "data: "):
			data = append(data, strings.TrimPrefix(l, "data: "))
		case strings.HasPrefix(l, ":"):
			comments = append(comments, l)
		}
	}
	return
}

// waitFor polls cond until it holds or 10s pass.
func waitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	poll.Until(t, 10*time.Second, what, cond)
}

// testDeadline bounds a test's clients and its waits on them, so that a test
// that goes wrong fails with what it waited for instead of hanging until
// the package's timeout.
const testDeadline = 60 * time.Second

// within waits for ch to close, failing the test past testDeadline.
func within(t testing.TB, what string, ch <-chan struct{}) {
	t.Helper()
	timer := time.NewTimer(testDeadline)
	defer timer.Stop()
	select {
	case <-ch:
	case <-timer.C:
		t.Fatalf("gave up waiting for %s after %s", what, testDeadline)
	}
}

// wgDone returns a channel closed once wg is done.
func wgDone(wg *sync.WaitGroup) <-chan struct{} {
	ch := make(chan struct{})
	go func() { wg.Wait(); close(ch) }()
	return ch
}

// counts returns the router's counts for the deployment.
func (e *env) counts() map[string]any {
	m := e.rt.DeploymentRequests("demo")
	if m == nil {
		return map[string]any{}
	}
	return m
}

func (e *env) count(k string) int {
	v, _ := e.counts()[k].(int)
	return v
}

// idle reports that the router holds nothing for the deployment and the
// engine runs nothing.
func (e *env) idle() bool {
	s := e.eng.Stats()
	c := e.counts()
	for _, k := range []string{"in_flight", "waiting", "settle_when_idle", "settle_at_stop", "settle_on_abort"} {
		if v, _ := c[k].(int); v != 0 {
			return false
		}
	}
	return s.Running == 0 && s.Waiting == 0
}

// heldUntilReading checks that n cut requests the engine may have hold
// their places until the evidence that the engine ended them. With the load
// readings held (e.lc.noReading set before the hang-up) and the requests
// recorded with outcome, n places still wait for the idle reading; then,
// given readings in which the engine still holds n requests more than it
// does, they still wait. Then it gives the true readings back.
func (e *env) heldUntilReading(t testing.TB, outcome string, n int) {
	t.Helper()
	want := fmt.Sprintf(`outcome=%q} %d`, outcome, n)
	waitFor(t, "the hung-up request to be recorded", func() bool { return strings.Contains(scrape(t, e), want) })
	if got := e.count("settle_when_idle"); got != n {
		t.Fatalf("settle_when_idle = %d before any load reading, want %d: a cut request the engine may have was settled with no evidence (counts %v)", got, n, e.counts())
	}
	e.lc.busy.Store(int64(n))
	e.lc.busyReadings.Store(0)
	e.lc.noReading.Store(false)
	// The second busy reading is taken after the router decided on the
	// first one (the router takes none once nothing waits for one).
	waitFor(t, "two readings of a busy engine", func() bool {
		return e.lc.busyReadings.Load() >= 2 || e.count("settle_when_idle") != n
	})
	if got := e.count("settle_when_idle"); got != n {
		t.Fatalf("settle_when_idle = %d after readings of an engine still running the cut requests, want %d (counts %v)", got, n, e.counts())
	}
	e.lc.busy.Store(0)
}

// settleAfterCuts waits until every cut request has settled on the
// engine's load reading, with no stop of the instance.
func (e *env) settleAfterCuts(t testing.TB) {
	t.Helper()
	waitFor(t, "every count back to zero", e.idle)
	if n := e.lc.restarts.Load(); n != 0 {
		t.Fatalf("the instance was restarted %d times to settle cut requests", n)
	}
}
