// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package dashboard_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/capyctl/capyctl/core/api/client"
)

// TestDashboard_Keys drives the dashboard's keys and usage panels in a
// real headless Chromium against capyctl dev: create a key scoped to demo
// from the page (shown once, then gone from the page), use it, see its
// tokens in the usage panel equal to the answers', revoke it from the
// page (with its confirmation), and the key is refused.
func TestDashboard_Keys(t *testing.T) {
	browser := findBrowser(t)
	d := startDev(t)
	creds, err := client.ReadCredentials(d.state)
	if err != nil {
		t.Fatal(err)
	}
	opts := []chromedp.ExecAllocatorOption{
		chromedp.ExecPath(browser), chromedp.Headless, chromedp.DisableGPU, chromedp.NoFirstRun,
		chromedp.NoDefaultBrowserCheck, chromedp.WindowSize(1280, 900), chromedp.UserDataDir(t.TempDir()),
		chromedp.Flag("disable-dev-shm-usage", true),
	}
	if os.Geteuid() == 0 {
		opts = append(opts, chromedp.NoSandbox)
	}
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	defer cancelAlloc()
	ctx, cancel := chromedp.NewContext(actx)
	defer cancel()
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
	step := func(what string, actions ...chromedp.Action[chromedp.Void]) {
		t.Helper()
		sctx, scancel := context.WithTimeout(ctx, 30*time.Second)
		defer scancel()
		if err := chromedp.Do(sctx, actions...); err != nil {
			mu.Lock()
			defer mu.Unlock()
			t.Fatalf("%s: %v\nconsole:\n%s", what, err, strings.Join(console, "\n"))
		}
	}
	waitJS := func(what, expr string) {
		t.Helper()
		step(what, chromedp.Poll[chromedp.Void](expr, chromedp.WithPollingTimeout(0), chromedp.WithPollingInterval(50*time.Millisecond)))
	}
	step("log in",
		chromedp.Navigate(d.dashboard),
		chromedp.WaitVisible(chromedp.ID("token")),
		chromedp.SendKeys(chromedp.ID("token"), creds.AdminToken),
		chromedp.Click(chromedp.ID("login-submit")),
	)
	waitJS("the keys panel lists default", `!!document.querySelector('#key-rows tr[data-key="default"]')`)

	step("create a key scoped to demo with 1000 requests a minute",
		chromedp.SendKeys(chromedp.ID("key-name"), "web"),
		chromedp.SendKeys(chromedp.ID("key-models"), "demo"),
		chromedp.SendKeys(chromedp.ID("key-rpm"), "1000"),
		chromedp.Click(chromedp.ID("key-create")),
	)
	waitJS("the new key is shown", `document.getElementById('key-new-value').value.startsWith('capyk_')`)
	key, err := chromedp.Run(ctx, chromedp.Evaluate[string](`document.getElementById('key-new-value').value`))
	if err != nil {
		t.Fatal(err)
	}
	waitJS("the list has the key with its scope and limit", `(() => { const r = document.querySelector('#key-rows tr[data-key="web"]');`+
		` return r && r.textContent.includes('demo') && r.textContent.includes('1000 requests/min') && !r.textContent.includes(`+strconv.Quote(key[18:])+`); })()`)
	step("done with the key", chromedp.Click(chromedp.ID("key-done")))
	if v, _ := chromedp.Run(ctx, chromedp.Evaluate[string](`document.getElementById('key-new-value').value + document.body.innerText`)); strings.Contains(v, key) {
		t.Fatal("the page still holds the key after Done")
	}

	// The key works for demo, and only demo; its tokens reach the usage
	// panel as the answers reported them.
	var tokens int64
	for i := 0; i < 3; i++ {
		status, body := inference(t, d.endpoint+"/chat/completions", key, `{"model":"demo","messages":[{"role":"user","content":"hello"}]}`)
		var a struct {
			Usage struct {
				Prompt     int64 `json:"prompt_tokens"`
				Completion int64 `json:"completion_tokens"`
			} `json:"usage"`
		}
		if status != 200 || json.Unmarshal([]byte(body), &a) != nil {
			t.Fatalf("chat with the page's key: %d %s", status, body)
		}
		tokens += a.Usage.Prompt + a.Usage.Completion
	}
	if status, body := inference(t, d.endpoint+"/chat/completions", key, `{"model":"chat-a","messages":[{"role":"user","content":"hello"}]}`); status != 404 {
		t.Fatalf("the page's key on chat-a: %d %s", status, body)
	}
	waitJS("the usage panel shows the key's tokens", `(() => { const r = document.querySelector('#usage-rows tr[data-usage-key="web"]'); if (!r) return false;`+
		` const p = Number(r.querySelector('[data-prompt]').dataset.prompt), c = Number(r.querySelector('[data-completion]').dataset.completion);`+
		` return p + c === `+strconv.FormatInt(tokens, 10)+` && !!document.querySelector('#chart-usage polyline[data-usage-series="web"]'); })()`)

	step("revoke it from the page",
		chromedp.Click(chromedp.CSS(`button[data-revoke="web"]`)),
		chromedp.WaitVisible(chromedp.ID("confirm")),
		chromedp.Click(chromedp.ID("confirm-ok")),
	)
	waitJS("the list no longer has it", `!document.querySelector('#key-rows tr[data-key="web"]')`)
	if status, _ := inference(t, d.endpoint+"/models", key, ""); status != 401 {
		t.Fatalf("the revoked key: %d", status)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(problems) > 0 {
		t.Errorf("the page reported problems (exceptions or CSP violations):\n%s", strings.Join(problems, "\n"))
	}
}

// inference sends one request with key (POST with a body, else GET).
func inference(t *testing.T, url, key, body string) (int, string) {
	t.Helper()
	method := http.MethodGet
	var rd io.Reader
	if body != "" {
		method, rd = http.MethodPost, strings.NewReader(body)
	}
	req, _ := http.NewRequest(method, url, rd)
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}
