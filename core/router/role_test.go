// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package router_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/capyctl/capyctl/plugins-testkit/harness"
	"github.com/capyctl/capyctl/sdk/decisions"
)

// These tests run a real standalone role with the fake engine as a custom
// engine (no engine key, so the test reads the engine's /fake/stats).

type roleEnv struct {
	t      *testing.T
	r      *harness.Role
	engine string
}

func fakeManifest(api string, extra ...string) string {
	m := strings.Replace(harness.FakeManifest(extra...), "key_env     = \"FAKE_ENGINE_API_KEY\"\n", "", 1)
	return strings.Replace(m, `api         = "chat"`, `api         = "`+api+`"`, 1)
}

func startRoleEnv(t *testing.T, api, spec string, activate bool, fakeArgs ...string) *roleEnv {
	t.Helper()
	return startRoleEnvWith(t, harness.Options{}, api, spec, activate, fakeArgs...)
}

// startRoleEnvWith is startRoleEnv with the role's options.
func startRoleEnvWith(t *testing.T, opts harness.Options, api, spec string, activate bool, fakeArgs ...string) *roleEnv {
	t.Helper()
	if testing.Short() {
		t.Skip("runs a role")
	}
	r := harness.StartStandalone(t, opts)
	// Keep-alive connections to the role end with the test (goleak).
	t.Cleanup(http.DefaultClient.CloseIdleConnections)
	f := r.WriteFile("manifests/fake.hcl", fakeManifest(api, fakeArgs...))
	if out, errOut, code := r.CLI("engine", "add", "--custom", r.FakeBin, "--name", "fake", "--manifest", f, "--yes"); code != 0 {
		t.Fatalf("engine add: %d %s %s", code, out, errOut)
	}
	e := &roleEnv{t: t, r: r}
	if !activate {
		if out, errOut, code := r.Deploy("demo", spec); code != 0 {
			t.Fatalf("deploy: %d %s %s", code, out, errOut)
		}
		return e
	}
	r.MustDeploy("demo", spec)
	e.findEngine()
	return e
}

func (e *roleEnv) findEngine() {
	st, err := e.r.Mgmt.Deployment(context.Background(), "demo")
	if err != nil || len(st.Instances) == 0 || st.Instances[0].Port == 0 {
		e.t.Fatalf("status: %v %+v", err, st)
	}
	e.engine = "http://127.0.0.1:" + strconv.Itoa(st.Instances[0].Port)
}

type fakeStats struct {
	Running   int    `json:"running"`
	Waiting   int    `json:"waiting"`
	Total     uint64 `json:"total"`
	Completed uint64 `json:"completed"`
	Cancelled uint64 `json:"cancelled"`

	GenerationTokens uint64 `json:"generation_tokens"`
}

func (e *roleEnv) stats() fakeStats {
	resp, err := http.Get(e.engine + "/fake/stats")
	if err != nil {
		e.t.Fatal(err)
	}
	defer resp.Body.Close()
	var s fakeStats
	_ = json.NewDecoder(resp.Body).Decode(&s)
	return s
}

// requests returns the router's counts from the deployment's status.
func (e *roleEnv) requests() map[string]float64 {
	st, err := e.r.Mgmt.Deployment(context.Background(), "demo")
	if err != nil {
		e.t.Fatal(err)
	}
	out := map[string]float64{}
	for k, v := range st.Requests {
		if f, ok := v.(float64); ok {
			out[k] = f
		}
	}
	return out
}

func (e *roleEnv) settled() bool {
	q := e.requests()
	return q["in_flight"] == 0 && q["waiting"] == 0 && q["settle_when_idle"] == 0 && q["settle_at_stop"] == 0 && q["settle_on_abort"] == 0
}

// settleAfterCuts waits for every cut request to settle on the engine's
// load reading, with no stop of the deployment.
func (e *roleEnv) settleAfterCuts() {
	e.t.Helper()
	harness.Eventually(e.t, 30*time.Second, "every count back to zero", e.settled)
}

func (e *roleEnv) post(ctx context.Context, path, body string) (*http.Response, error) {
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, e.r.InferenceURL()+path, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+e.r.Creds.APIKey)
	return http.DefaultClient.Do(req)
}

const roleChat = `{"model":"demo","stream":%v,"messages":[{"role":"user","content":"hello"}]}`

func TestRole_HangUpStopsTheEngine(t *testing.T) {
	e := startRoleEnv(t, "chat", harness.SimpleSpec("demo", "fake"), true, "--token-rate", "50", "--tokens", "100000")
	for i, stream := range []bool{true, false} {
		gen0 := e.stats().GenerationTokens
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() {
			defer close(done)
			if resp, err := e.post(ctx, "/v1/chat/completions", fmt.Sprintf(roleChat, stream)); err == nil {
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
		}()
		// Wait for output: a hang-up before the router read the engine's
		// head settles only at the next stop.
		harness.Eventually(t, 10*time.Second, "the engine to generate", func() bool { return e.stats().GenerationTokens >= gen0+3 })
		cancel()
		<-done
		harness.Eventually(t, 10*time.Second, "the engine to see the hang-up", func() bool {
			s := e.stats()
			if s.Cancelled != uint64(i+1) || s.Running != 0 {
				t.Logf("engine %+v", s)
				return false
			}
			return true
		})
		harness.Eventually(t, 10*time.Second, "the router to settle", func() bool {
			ok := e.settled()
			if !ok {
				t.Logf("requests %v", e.requests())
			}
			return ok
		})
	}
}

func TestRole_HangUpWhileWaking(t *testing.T) {
	hold := filepath.Join(t.TempDir(), "loaded")
	e := startRoleEnv(t, "chat", harness.SimpleSpec("demo", "fake"), false, "--hold-startup-file", hold)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		if resp, err := e.post(ctx, "/v1/chat/completions", fmt.Sprintf(roleChat, true)); err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
	}()
	harness.Eventually(t, 10*time.Second, "the model to start for the request", func() bool {
		st, err := e.r.Mgmt.Deployment(context.Background(), "demo")
		return err == nil && len(st.Instances) > 0 && st.Instances[0].State == "starting" && e.requests()["waiting"] == 1
	})
	cancel()
	<-done
	harness.Eventually(t, 10*time.Second, "the line to empty", e.settled)
	if err := os.WriteFile(hold, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	harness.Eventually(t, 30*time.Second, "the model to be ready", func() bool {
		st, err := e.r.Mgmt.Deployment(context.Background(), "demo")
		return err == nil && st.ReadyN == 1
	})
	e.findEngine()
	// The engine's one request is the driver's readiness probe.
	if s := e.stats(); s.Total != 1 || s.Cancelled != 0 {
		t.Fatalf("the abandoned request reached the engine: %+v", s)
	}
}

// (Forty engine errors in a row are tested in-process: through a role the
// driver's readiness probe would consume the fake's fail-requests knob.)

func TestRole_ThreeHundredClientsAgainstThirtyTwoPlaces(t *testing.T) {
	spec := `deployment "demo" {
  engine = "fake"
  model {
    path = "demo"
  }
  engine_config {
    max_concurrent_requests = 32
  }
  limits {
    max_waiting = 64
  }
}
`
	e := startRoleEnv(t, "chat", spec, true, "--token-rate", "20", "--tokens", "100000", "--max-running", "300")
	// The clients' own deadline: a test that goes wrong ends its 300
	// requests and fails, instead of hanging until the package timeout.
	ctx, cancel := context.WithTimeout(context.Background(), testDeadline)
	defer cancel()
	tr := &http.Transport{MaxIdleConnsPerHost: 300}
	defer tr.CloseIdleConnections()
	cl := &http.Client{Transport: tr}
	var refused, bad atomic.Int64
	var wg sync.WaitGroup
	for i := 0; i < 300; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, e.r.InferenceURL()+"/v1/chat/completions", strings.NewReader(fmt.Sprintf(roleChat, true)))
			req.Header.Set("Authorization", "Bearer "+e.r.Creds.APIKey)
			resp, err := cl.Do(req)
			if err != nil {
				return
			}
			defer resp.Body.Close()
			if resp.StatusCode == 429 {
				b, _ := io.ReadAll(resp.Body)
				if !strings.Contains(string(b), `"queue_full"`) || resp.Header.Get("Retry-After") == "" {
					bad.Add(1)
				}
				refused.Add(1)
				return
			}
			_, _ = io.Copy(io.Discard, resp.Body)
		}()
	}
	harness.Eventually(t, 30*time.Second, "32 running, 64 waiting, 204 refused", func() bool {
		q := e.requests()
		return e.stats().Running == 32 && q["in_flight"] == 32 && q["waiting"] == 64 && refused.Load() == 204
	})
	if s := e.stats(); s.Running != 32 || s.Waiting != 0 {
		t.Fatalf("engine %+v", s)
	}
	if bad.Load() != 0 {
		t.Fatalf("%d refusals without queue_full and Retry-After", bad.Load())
	}
	cancel()
	within(t, "the 300 clients to end", wgDone(&wg))
	e.settleAfterCuts()
}

func TestRole_ClientThatStopsReading(t *testing.T) {
	spec := `deployment "demo" {
  engine = "fake"
  model {
    path = "demo"
  }
  limits {
    client_read_idle = "200ms"
  }
}
`
	e := startRoleEnv(t, "chat", spec, true, "--tokens", "5000000")
	c, err := net.Dial("tcp", e.r.Info.Inference)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.(*net.TCPConn).SetReadBuffer(4096)
	body := fmt.Sprintf(roleChat, true)
	fmt.Fprintf(c, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", e.r.Creds.APIKey, len(body), body)
	br := bufio.NewReader(c)
	if line, err := br.ReadString('\n'); err != nil || !strings.Contains(line, "200") {
		t.Fatalf("status line %q: %v", line, err)
	}
	// Read nothing more.
	harness.Eventually(t, 30*time.Second, "the engine to be cancelled", func() bool { return e.stats().Cancelled == 1 })
	harness.Eventually(t, 10*time.Second, "the router to settle", e.settled)
}

func TestRole_DecisionDeployment(t *testing.T) {
	spec := `deployment "demo" {
  engine = "fake"
  api    = "decisions"
  model {
    path = "demo"
  }
}
`
	e := startRoleEnv(t, "decisions", spec, true, "--flavour", "decisions")
	resp, err := e.post(context.Background(), decisions.Path, `{"model":"demo","state":"a calm sea","questions":[{"id":"q","type":"choice","text":"Colour?","options":["blue","grey"]}]}`)
	if err != nil {
		t.Fatal(err)
	}
	body := harness.ReadAll(resp)
	if resp.StatusCode != 200 || !strings.Contains(body, `"probabilities"`) || !strings.Contains(body, `"capyctl":{"metrics"`) || !strings.Contains(body, `"id":"`+resp.Header.Get("X-CapyCTL-Request-Id")+`"`) {
		t.Fatalf("decision: %d %s", resp.StatusCode, body)
	}
	resp, err = e.post(context.Background(), "/v1/chat/completions", fmt.Sprintf(roleChat, false))
	if err != nil {
		t.Fatal(err)
	}
	if body := harness.ReadAll(resp); resp.StatusCode != 400 || !strings.Contains(body, "api_mismatch") || !strings.Contains(body, decisions.Path) {
		t.Fatalf("chat to a decision model: %d %s", resp.StatusCode, body)
	}
	req, _ := http.NewRequest(http.MethodGet, e.r.InferenceURL()+"/v1/models", nil)
	req.Header.Set("Authorization", "Bearer "+e.r.Creds.APIKey)
	mr, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if mb := harness.ReadAll(mr); !strings.Contains(mb, `"api":"decisions"`) {
		t.Fatalf("models: %s", mb)
	}
	// The core's metrics are on the management listener, behind the admin
	// token, and so are the load and latency views.
	for _, path := range []string{"/metrics", "/management/v1/metrics/load", "/management/v1/metrics/latency"} {
		mreq, _ := http.NewRequest(http.MethodGet, "http://"+e.r.Info.Management+path, nil)
		if resp, err := http.DefaultClient.Do(mreq); err != nil || resp.StatusCode != 401 {
			t.Fatalf("%s without the token: %v %v", path, resp, err)
		} else {
			resp.Body.Close() // else its connection's goroutines outlive the test
		}
		mreq.Header.Set("Authorization", "Bearer "+e.r.Creds.AdminToken)
		resp, err := http.DefaultClient.Do(mreq)
		if err != nil {
			t.Fatal(err)
		}
		b := harness.ReadAll(resp)
		if resp.StatusCode != 200 || !strings.Contains(b, "demo") {
			t.Fatalf("%s: %d %s", path, resp.StatusCode, b)
		}
		if path == "/metrics" && !strings.Contains(b, `capyctl_requests_total{api="decisions",deployment="demo",outcome="completed"} 1`) {
			t.Fatalf("metrics: %s", b)
		}
	}
}

// openRoleStream opens a stream through the role on a plain connection and
// reads it to its first content (by then the stream is taken over from
// net/http); it returns the connection's reader and the answer's (past
// what was read).
func (e *roleEnv) openRoleStream() (conn, answer *bufio.Reader) {
	e.t.Helper()
	c, err := net.Dial("tcp", e.r.Info.Inference)
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { c.Close() })
	body := fmt.Sprintf(roleChat, true)
	fmt.Fprintf(c, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", e.r.Creds.APIKey, len(body), body)
	conn = bufio.NewReader(c)
	var head strings.Builder
	for {
		line, err := conn.ReadString('\n')
		if err != nil {
			e.t.Fatalf("head %q: %v", head.String(), err)
		}
		head.WriteString(line)
		if line == "\r\n" {
			break
		}
	}
	if !strings.Contains(head.String(), "Transfer-Encoding: chunked\r\n") {
		e.t.Fatalf("head %q: not a stream", head.String())
	}
	answer = bufio.NewReader(httputil.NewChunkedReader(conn))
	for {
		line, err := answer.ReadString('\n')
		if err != nil {
			e.t.Fatalf("stream: %v", err)
		}
		if strings.Contains(line, `"content"`) {
			return conn, answer
		}
	}
}

// restOfStream reads a chunked answer to its end and the connection to its
// close, and returns the answer's data payloads.
func restOfStream(t *testing.T, conn, answer *bufio.Reader) []string {
	t.Helper()
	b, err := io.ReadAll(answer)
	if err != nil {
		t.Fatalf("the answer broke off: %v (read %q)", err, b)
	}
	// The last chunk's empty trailer, then the connection closes: the role
	// is stopping.
	if rest, err := io.ReadAll(conn); err != nil || string(rest) != "\r\n" {
		t.Fatalf("after the answer: %q, %v; want the end of the trailer and the connection closed", rest, err)
	}
	var data []string
	for _, l := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(l, "data: ") {
			data = append(data, strings.TrimPrefix(l, "data: "))
		}
	}
	return data
}

func TestRole_ShutdownAndTakenOverStreams(t *testing.T) {
	t.Run("a stream finishes within the drain timeout", func(t *testing.T) {
		e := startRoleEnv(t, "chat", harness.SimpleSpec("demo", "fake"), true, "--token-rate", "20", "--tokens", "20")
		conn, answer := e.openRoleStream()
		stopped := make(chan struct{})
		go func() { e.r.Stop(); close(stopped) }()
		data := restOfStream(t, conn, answer)
		if len(data) < 2 || data[len(data)-1] != "[DONE]" || strings.Contains(data[len(data)-2], `"error"`) {
			t.Fatalf("events %q", data)
		}
		<-stopped
	})
	t.Run("streams are cut when the drain timeout ends", func(t *testing.T) {
		e := startRoleEnvWith(t, harness.Options{Args: []string{"--set", "shutdown.drain_timeout=200ms"}}, "chat",
			harness.SimpleSpec("demo", "fake"), true, "--token-rate", "20", "--tokens", "100000")
		conn, answer := e.openRoleStream()
		stopped := make(chan struct{})
		go func() { e.r.Stop(); close(stopped) }()
		data := restOfStream(t, conn, answer)
		if len(data) < 2 || data[len(data)-1] != "[DONE]" || !strings.Contains(data[len(data)-2], `"shutting_down"`) {
			t.Fatalf("events %q", data)
		}
		<-stopped
		// The engine outlives the role and saw the cut.
		harness.Eventually(t, 10*time.Second, "the engine to see the cut", func() bool { s := e.stats(); return s.Cancelled == 1 && s.Running == 0 })
	})
}
