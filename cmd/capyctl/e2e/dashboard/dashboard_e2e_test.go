// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package dashboard_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/cookiejar"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/chromedp/cdproto/emulation"
	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/chromedp"

	"github.com/capyctl/capyctl/cmd/capyctl/internal/e2e"
	"github.com/capyctl/capyctl/core/api/client"
	"github.com/capyctl/capyctl/core/api/dashboard"
	"github.com/capyctl/capyctl/plugins-testkit/harness"
)

// EnvChrome names a Chromium or Chrome binary for the browser test; without
// it the test looks for chromium, chromium-browser, google-chrome on PATH.
const EnvChrome = "CAPYCTL_CHROME"

// dashboardCSRF is the dashboard session's CSRF header.
const dashboardCSRF = dashboard.HeaderCSRF

// EnvScreenshots names the directory the browser test saves its
// screenshots in; without it, $TMPDIR/capyctl-dashboard-screenshots (named
// in the test log).
const EnvScreenshots = "CAPYCTL_DASHBOARD_SCREENSHOTS"

func findBrowser(t *testing.T) string {
	t.Helper()
	if p := os.Getenv(EnvChrome); p != "" {
		return p
	}
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome", "google-chrome-stable", "headless-shell"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	t.Skipf("no Chromium on PATH (install it: apt-get install -y chromium; or set %s): the dashboard's browser test needs a real browser", EnvChrome)
	return ""
}

// devRole is a running `capyctl dev`.
type devRole struct {
	bin, state, dashboard, endpoint, key string
}

// startDev starts `capyctl dev` and reads its banner.
func startDev(t *testing.T) *devRole {
	t.Helper()
	bin, _ := harness.Binaries(t)
	tmp := t.TempDir()
	cmd := exec.Command(bin, "dev", "--listen", "127.0.0.1:0")
	cmd.Env = append(os.Environ(), "TMPDIR="+tmp)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr strings.Builder
	cmd.Stderr = &lockedBuilder{b: &stderr}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Signal(os.Interrupt)
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(60 * time.Second):
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		}
		harness.KillLeftovers(tmp)
	})
	d := &devRole{bin: bin}
	sc := bufio.NewScanner(stdout)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "Dashboard: "):
			d.dashboard = strings.TrimSpace(strings.TrimPrefix(line, "Dashboard: "))
		case strings.HasPrefix(line, "Endpoint: "):
			d.endpoint = strings.TrimSpace(strings.TrimPrefix(line, "Endpoint: "))
		case strings.HasPrefix(line, "API key: "):
			d.key = strings.TrimSpace(strings.TrimPrefix(line, "API key: "))
		case strings.HasPrefix(line, "State: "):
			d.state = strings.TrimSpace(strings.TrimPrefix(line, "State: "))
		}
		if strings.HasPrefix(line, "Press Ctrl-C") {
			break
		}
	}
	go func() {
		for sc.Scan() {
		}
	}()
	if d.dashboard == "" || d.state == "" {
		t.Fatalf("capyctl dev printed no Dashboard or State line\n%s", stderr.String())
	}
	return d
}

// cli runs a capyctl command against the dev role.
func (d *devRole) cli(t *testing.T, args ...string) string {
	t.Helper()
	cmd := exec.Command(d.bin, args...)
	cmd.Env = append(os.Environ(), "CAPYCTL_STATE_DIR="+d.state)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("capyctl %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// chat sends one chat request to the dev role's endpoint and reads the
// answer.
func (d *devRole) chat(t *testing.T, model string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, d.endpoint+"/chat/completions", strings.NewReader(harness.ChatBody(model, false, "Hello")))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+d.key)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("chat %s: %d %s", model, resp.StatusCode, body)
	}
}

type lockedBuilder struct {
	mu sync.Mutex
	b  *strings.Builder
}

func (l *lockedBuilder) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

// TestDashboard_Browser drives the dashboard of a `capyctl dev` role in a
// real headless Chromium: log in with the admin token, see the card's bar
// change when a model is parked from the CLI, park one from the page (with
// its confirmation), see the event arrive, ask a model in the playground
// (a streamed answer, its request ID and figures, with the role's key or a
// pasted one), and save screenshots (light, dark, phone) for a person to
// look at.
func TestDashboard_Browser(t *testing.T) {
	browser := findBrowser(t)
	d := startDev(t)
	creds, err := client.ReadCredentials(d.state)
	if err != nil {
		t.Fatal(err)
	}
	d.cli(t, "start", "deployment", "chat-a", "--wait")

	shots := os.Getenv(EnvScreenshots)
	if shots == "" {
		// One fixed place, overwritten by each run: kept for a person to
		// look at, without piling up.
		shots = filepath.Join(os.TempDir(), "capyctl-dashboard-screenshots")
	}
	if err := os.MkdirAll(shots, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Logf("screenshots in %s", shots)

	opts := []chromedp.ExecAllocatorOption{
		chromedp.ExecPath(browser), chromedp.Headless, chromedp.DisableGPU, chromedp.NoFirstRun,
		chromedp.NoDefaultBrowserCheck, chromedp.WindowSize(1280, 800), chromedp.UserDataDir(t.TempDir()),
		chromedp.Flag("disable-dev-shm-usage", true),
	}
	if os.Geteuid() == 0 {
		opts = append(opts, chromedp.NoSandbox) // Chromium refuses to run as root with its sandbox
	}
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	defer cancelAlloc()
	ctx, cancel := chromedp.NewContext(actx)
	defer cancel()
	// The first Run starts the browser; it must not carry the test's
	// deadline (that would end the browser), the steps below do.
	if err := chromedp.Do(ctx); err != nil {
		t.Fatalf("start %s: %v", browser, err)
	}
	var mu sync.Mutex
	var problems, console []string
	go func() {
		for m, err := range chromedp.Console(ctx) {
			if err != nil {
				return
			}
			mu.Lock()
			console = append(console, m.String())
			if m.IsException() || strings.Contains(m.Text, "Content Security Policy") {
				problems = append(problems, m.String())
			}
			mu.Unlock()
		}
	}()
	step := func(what string, timeout time.Duration, actions ...chromedp.Action[chromedp.Void]) {
		t.Helper()
		sctx, scancel := context.WithTimeout(ctx, timeout)
		defer scancel()
		if err := chromedp.Do(sctx, actions...); err != nil {
			mu.Lock()
			defer mu.Unlock()
			t.Fatalf("%s: %v\nconsole:\n%s", what, err, strings.Join(console, "\n"))
		}
	}
	shot := func(name string) {
		t.Helper()
		sctx, scancel := context.WithTimeout(ctx, 20*time.Second)
		defer scancel()
		png, err := chromedp.Run(sctx, chromedp.FullScreenshot(100))
		if err != nil {
			t.Fatalf("screenshot %s: %v", name, err)
		}
		p := filepath.Join(shots, name+".png")
		if err := os.WriteFile(p, png, 0o644); err != nil {
			t.Fatal(err)
		}
		t.Logf("screenshot %s", p)
	}
	waitJS := func(what, expr string) {
		t.Helper()
		step(what, 20*time.Second, chromedp.Poll[chromedp.Void](expr, chromedp.WithPollingTimeout(0), chromedp.WithPollingInterval(50*time.Millisecond)))
	}
	bar := func(owner, phase string) string {
		return fmt.Sprintf(`document.querySelector('svg.bar[data-domain="gpu0"] rect[data-owner=%q][data-phase=%q]')`, owner, phase)
	}

	// Log in: the page asks for the token, the cookie is HttpOnly and
	// SameSite=Strict, and the page never sees it.
	step("open the login", 20*time.Second,
		chromedp.Navigate(d.dashboard),
		chromedp.WaitVisible(chromedp.ID("token")),
	)
	shot("0-login")
	step("log in", 20*time.Second,
		chromedp.SendKeys(chromedp.ID("token"), creds.AdminToken),
		chromedp.Click(chromedp.ID("login-submit")),
	)
	waitJS("demo/0 and chat-a/0 ready on the card's bar", bar("demo/0", "ready")+" && "+bar("chat-a/0", "ready"))
	waitJS("the event stream is live", `document.getElementById('conn').dataset.state === 'live'`)
	cookies, err := chromedp.Call(ctx, network.GetCookies, network.GetCookiesParams{URLs: []string{d.dashboard}})
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, c := range cookies.Cookies {
		if strings.HasPrefix(c.Name, "capyctl_dashboard") {
			found = true
			if !c.HTTPOnly || c.SameSite != network.CookieSameSiteStrict {
				t.Errorf("session cookie %s: HttpOnly %v, SameSite %q; want HttpOnly, Strict", c.Name, c.HTTPOnly, c.SameSite)
			}
			if strings.Contains(c.Value, creds.AdminToken) {
				t.Errorf("the session cookie carries the admin token")
			}
		}
	}
	if !found {
		t.Fatalf("no session cookie after the login: %+v", cookies.Cookies)
	}
	if js, err := chromedp.Run(ctx, chromedp.Evaluate[string](`document.cookie`)); err != nil || js != "" {
		t.Errorf("document.cookie = %q (%v); want the session out of the page's reach", js, err)
	}
	before, err := chromedp.Run(ctx, chromedp.Evaluate[float64](bar("chat-a/0", "ready")+`.getBBox().width`))
	if err != nil {
		t.Fatal(err)
	}
	// A hover names the instance, its phase and the figure's provenance.
	step("focus a segment", 10*time.Second, chromedp.Focus(chromedp.CSS(`svg.bar[data-domain="gpu0"] rect[data-owner="demo/0"]`)))
	tip, err := chromedp.Run(ctx, chromedp.Text(chromedp.ID("tooltip")))
	if err != nil || !strings.Contains(tip, "demo/0") || !strings.Contains(tip, "ready") || !strings.Contains(tip, "figure:") {
		t.Errorf("tooltip of demo/0 = %q (%v); want the instance, its phase and the figure's provenance", tip, err)
	}
	shot("1-logged-in")

	// Parked from the CLI: the page's bar follows through the event stream.
	d.cli(t, "park", "deployment", "chat-a", "--wait")
	waitJS("chat-a/0 parked on the card's bar", bar("chat-a/0", "parked"))
	after, err := chromedp.Run(ctx, chromedp.Evaluate[float64](bar("chat-a/0", "parked")+`.getBBox().width`))
	if err != nil {
		t.Fatal(err)
	}
	if after >= before {
		t.Errorf("chat-a/0's segment is %.1f wide parked, %.1f ready; want it narrower once parked", after, before)
	}
	shot("2-parked-from-cli")

	// Wake it from the page, then park it from the page: each action asks
	// first, and its events arrive.
	step("wake chat-a/0 from the page", 20*time.Second,
		chromedp.Click(chromedp.CSS(`button[data-instance="chat-a/0"][data-action="start"]`)),
		chromedp.WaitVisible(chromedp.ID("confirm")),
		chromedp.Click(chromedp.ID("confirm-ok")),
	)
	waitJS("chat-a/0 ready again", bar("chat-a/0", "ready"))
	step("ask to park chat-a/0 from the page", 20*time.Second,
		chromedp.Click(chromedp.CSS(`button[data-instance="chat-a/0"][data-action="park"]`)),
		chromedp.WaitVisible(chromedp.ID("confirm")),
	)
	shot("3-confirm-park")
	step("confirm", 10*time.Second, chromedp.Click(chromedp.ID("confirm-ok")))
	waitJS("a second instance_parked event for chat-a/0 in the list",
		`document.querySelectorAll('#event-list li[data-kind="instance_parked"][data-instance="chat-a/0"]').length >= 2`)
	waitJS("chat-a/0 parked on the bar", bar("chat-a/0", "parked"))
	status, _ := chromedp.Run(ctx, chromedp.Text(chromedp.ID("action-status")))
	if !strings.Contains(status, "accepted") {
		t.Errorf("action status = %q; want the park accepted", status)
	}
	// A few requests, so the charts have something to draw.
	for i := 0; i < 3; i++ {
		d.chat(t, "demo")
	}
	waitJS("the latency chart drew demo's requests over two samples", `Number(document.querySelector('#chart-latency polyline[data-series="demo:p50"]')?.dataset.points) >= 2`)
	shot("4-parked-from-page")

	// The playground: pick a model, send a message with the role's key
	// (by name), and the answer streams in with its request ID and the
	// per-answer figures; a pasted key works too, and a wrong one is
	// refused by the inference API.
	waitJS("the playground offers demo and the role's key", `[...document.querySelectorAll('#pg-model option')].some(o => o.value === 'demo') && `+
		`[...document.querySelectorAll('#pg-key option')].some(o => o.value === 'default')`)
	step("ask demo in the playground", 20*time.Second,
		chromedp.SetValue(chromedp.ID("pg-model"), "demo"),
		chromedp.SetValue(chromedp.ID("pg-key"), "default"),
		chromedp.SetValue(chromedp.ID("pg-prompt"), "Hello from the playground"),
		chromedp.Click(chromedp.ID("pg-send")),
	)
	waitJS("the playground's answer is complete", `document.getElementById('pg-status').textContent === 'demo answered.'`)
	answer, err := chromedp.Run(ctx, chromedp.Evaluate[map[string]any](`({text: document.getElementById('pg-answer').textContent,
		chunks: Number(document.getElementById('pg-answer').dataset.chunks), id: document.getElementById('pg-request-id').textContent,
		metrics: [...document.querySelectorAll('#pg-metrics tr[data-metric]')].map(r => r.dataset.metric)})`))
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("playground answer: %v", answer)
	text, _ := answer["text"].(string)
	chunks, _ := answer["chunks"].(float64)
	id, _ := answer["id"].(string)
	metrics := fmt.Sprint(answer["metrics"])
	if strings.TrimSpace(text) == "" || chunks < 2 {
		t.Errorf("playground answer %q in %v chunks; want a streamed answer", text, chunks)
	}
	if !strings.HasPrefix(id, "capy-") {
		t.Errorf("playground request ID %q; want the answer's X-CapyCTL-Request-Id", id)
	}
	for _, m := range []string{"total_ms", "ttft_ms", "output_tokens"} {
		if !strings.Contains(metrics, m) {
			t.Errorf("playground figures %s lack %s", metrics, m)
		}
	}
	// The request went through the inference API as any client's: the
	// request ledger has it under its ID.
	if logged := d.cli(t, "status", "deployment", "demo", "--json"); !strings.Contains(logged, `"in_flight":0`) {
		t.Errorf("demo still counts the playground's request in flight: %s", logged)
	}
	shot("5-playground")
	step("a wrong pasted key", 20*time.Second,
		chromedp.SetValue(chromedp.ID("pg-key"), ""),
		chromedp.Evaluate[chromedp.Void](`document.getElementById('pg-key').dispatchEvent(new Event('change'))`),
		chromedp.WaitVisible(chromedp.ID("pg-key-pasted")),
		chromedp.SendKeys(chromedp.ID("pg-key-pasted"), "capy-not-the-key"),
		chromedp.Click(chromedp.ID("pg-send")),
	)
	waitJS("the wrong key is refused", `document.getElementById('pg-status').textContent.includes('refused the pasted key')`)
	step("the right pasted key", 20*time.Second,
		chromedp.Evaluate[chromedp.Void](`document.getElementById('pg-key-pasted').value = ''`),
		chromedp.SendKeys(chromedp.ID("pg-key-pasted"), d.key),
		chromedp.Click(chromedp.ID("pg-send")),
	)
	waitJS("the pasted key's answer is complete", `document.getElementById('pg-status').textContent === 'demo answered.'`)

	// The same page in the dark theme and on a phone.
	if _, err := chromedp.Call(ctx, emulation.SetEmulatedMedia, emulation.SetEmulatedMediaParams{
		Features: []*emulation.MediaFeature{{Name: "prefers-color-scheme", Value: "dark"}},
	}); err != nil {
		t.Fatal(err)
	}
	shot("6-dark")
	step("phone viewport", 10*time.Second, chromedp.EmulateViewport(390, 844, chromedp.EmulateMobile))
	shot("7-phone-dark")

	mu.Lock()
	defer mu.Unlock()
	if len(problems) > 0 {
		t.Errorf("the page reported problems (exceptions or CSP violations):\n%s", strings.Join(problems, "\n"))
	}
}

// TestDashboard_SessionActionIdempotent: on a real role, the dashboard's
// session (no bearer token) carries an action through the management API
// under an Idempotency-Key; the retry replays it; the same action from
// another origin is refused and changes nothing.
func TestDashboard_SessionActionIdempotent(t *testing.T) {
	r := e2e.StartWithDemo(t)
	base := "http://" + r.Info.Management
	jar, _ := cookiejar.New(nil)
	hc := &http.Client{Jar: jar}
	call := func(method, path, body string, headers map[string]string) (*http.Response, string) {
		t.Helper()
		req, err := http.NewRequest(method, base+path, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/json")
		for k, v := range headers {
			req.Header.Set(k, v)
		}
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		return resp, harness.ReadAll(resp)
	}
	resp, body := call(http.MethodPost, "/dashboard/login", `{"token":"wrong"}`, map[string]string{"Origin": base})
	if resp.StatusCode != http.StatusUnauthorized || len(resp.Cookies()) != 0 {
		t.Fatalf("wrong token: %d %s", resp.StatusCode, body)
	}
	resp, body = call(http.MethodPost, "/dashboard/login", `{"token":"`+r.Creds.AdminToken+`"}`, map[string]string{"Origin": base})
	var info struct {
		CSRF string `json:"csrf"`
	}
	if resp.StatusCode != http.StatusOK || json.Unmarshal([]byte(body), &info) != nil {
		t.Fatalf("login: %d %s", resp.StatusCode, body)
	}
	const path = "/management/v1/deployments/demo/instances/0/actions"
	action := `{"action":"stop","wait":true}`

	// From another site: refused, the instance still ready.
	resp, body = call(http.MethodPost, path, action, map[string]string{
		"Origin": "http://127.0.0.1:1", "Sec-Fetch-Site": "cross-site", dashboardCSRF: info.CSRF, "Idempotency-Key": "dash-cross"})
	if resp.StatusCode != http.StatusForbidden || !strings.Contains(body, "cross_site_refused") {
		t.Fatalf("cross-site action: %d %s", resp.StatusCode, body)
	}
	if st := e2e.Status(t, r, "demo"); st.Instances[0].State != "ready" {
		t.Fatalf("after the refused action demo/0 is %s", st.Instances[0].State)
	}

	// From the page: done once, replayed on the retry.
	page := map[string]string{"Origin": base, "Sec-Fetch-Site": "same-origin", dashboardCSRF: info.CSRF, "Idempotency-Key": "dash-stop-1"}
	resp, body = call(http.MethodPost, path, action, page)
	if resp.StatusCode != http.StatusOK || resp.Header.Get("Idempotent-Replayed") != "" {
		t.Fatalf("action: %d %s (replayed %q)", resp.StatusCode, body, resp.Header.Get("Idempotent-Replayed"))
	}
	if st := e2e.Status(t, r, "demo"); st.Instances[0].State != "stopped" {
		t.Fatalf("after the stop demo/0 is %s", st.Instances[0].State)
	}
	resp2, body2 := call(http.MethodPost, path, action, page)
	if resp2.StatusCode != http.StatusOK || resp2.Header.Get("Idempotent-Replayed") != "true" || body2 != body {
		t.Fatalf("retry: %d %s (replayed %q), first answer %s", resp2.StatusCode, body2, resp2.Header.Get("Idempotent-Replayed"), body)
	}
}
