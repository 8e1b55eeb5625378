// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package dashboard_test

import (
	"bufio"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/capyctl/capyctl/core/api/client"
	"github.com/capyctl/capyctl/plugins-testkit/harness"
)

// TestDashboard_FleetBrowser drives a server's dashboard (capyctl dev
// --hosts 2) in a real headless Chromium: dev prints the dashboard's
// address; each host's memory bars come from the host's own ledger (the
// server lists only its totals), with demo's instance charged on its
// card; the fleet's events read as words, with no raw host clock and no
// empty message; the playground answers through the server's relay.
func TestDashboard_FleetBrowser(t *testing.T) {
	browser := findBrowser(t)
	bin, _ := harness.Binaries(t)
	tmp := t.TempDir()
	cmd := exec.Command(bin, "dev", "--hosts", "2", "--json", "--listen", "127.0.0.1:0")
	cmd.Env = append(os.Environ(), "TMPDIR="+tmp)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	var stderr strings.Builder
	cmd.Stderr = &lockedBuilder{b: &stderr}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Signal(os.Interrupt)
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(90 * time.Second):
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		}
		harness.KillLeftovers(tmp)
	})
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil {
		t.Fatalf("dev --hosts 2 printed nothing: %v\n%s", err, stderr.String())
	}
	var info map[string]string
	if err := json.Unmarshal([]byte(line), &info); err != nil || !strings.HasSuffix(info["dashboard"], "/dashboard/") {
		t.Fatalf("dev --hosts 2 --json names no dashboard: %q %v", line, err)
	}
	creds, err := client.ReadCredentials(info["state_dir"])
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
	waitJS := func(what, expr string) {
		t.Helper()
		step(what, 30*time.Second, chromedp.Poll[chromedp.Void](expr, chromedp.WithPollingTimeout(0), chromedp.WithPollingInterval(100*time.Millisecond)))
	}

	step("log in", 30*time.Second,
		chromedp.Navigate(info["dashboard"]),
		chromedp.WaitVisible(chromedp.ID("token")),
		chromedp.SendKeys(chromedp.ID("token"), creds.AdminToken),
		chromedp.Click(chromedp.ID("login-submit")),
	)
	// Each host's card and RAM, from its own ledger; demo runs on one.
	waitJS("both hosts' cards drawn from their ledgers",
		`['dev-gpu-1','dev-gpu-2'].every(h => document.querySelector('.host[data-host="'+h+'"] svg.bar[data-domain="gpu0"]') && document.querySelector('.host[data-host="'+h+'"] svg.bar[data-domain="system"]'))`)
	waitJS("demo's instance charged on a host's card", `document.querySelector('.host svg.bar[data-domain="gpu0"] rect[data-owner="demo/0"][data-phase="ready"]') !== null`)
	if hint, _ := chromedp.Run(ctx, chromedp.Evaluate[string](`document.getElementById('hosts').textContent`)); strings.Contains(hint, "No memory ledger") {
		t.Errorf("a host still reads 'No memory ledger': %s", hint)
	}
	// The events read as words.
	waitJS("the fleet's events are listed", `document.querySelectorAll('#event-list li[data-kind="host_joined"]').length >= 2`)
	events, err := chromedp.Run(ctx, chromedp.Evaluate[[]string](`[...document.querySelectorAll('#event-list li .detail')].map(e => e.textContent)`))
	if err != nil {
		t.Fatal(err)
	}
	// No raw clock (a Unix millisecond count, an RFC 3339 time), no member
	// named for a raw clock, no empty "message".
	raw := regexp.MustCompile(`\d{12,}|\d{4}-\d{2}-\d{2}T\d{2}:|unix|host time|(^|· )message( ·|$)`)
	for _, e := range events {
		if raw.MatchString(e) {
			t.Errorf("an event reads raw: %q", e)
		}
	}
	joined, _ := chromedp.Run(ctx, chromedp.Evaluate[string](`document.querySelector('#event-list li[data-kind="instance_ready"] .detail')?.textContent || ''`))
	if !strings.HasPrefix(joined, "demo/0 ") || !strings.Contains(joined, "on dev-gpu-") {
		t.Errorf("instance_ready reads %q; want the instance and its host", joined)
	}

	// The playground answers through the server's relay.
	waitJS("the playground offers demo", `[...document.querySelectorAll('#pg-model option')].some(o => o.value === 'demo')`)
	step("ask demo through the server", 30*time.Second,
		chromedp.SetValue(chromedp.ID("pg-model"), "demo"),
		chromedp.Click(chromedp.ID("pg-send")),
	)
	waitJS("the server's playground answer is complete", `document.getElementById('pg-status').textContent === 'demo answered.'`)
	if id, _ := chromedp.Run(ctx, chromedp.Text(chromedp.ID("pg-request-id"))); !strings.HasPrefix(id, "capy-") {
		t.Errorf("request ID through the server %q", id)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(problems) > 0 {
		t.Errorf("the page reported problems (exceptions or CSP violations):\n%s", strings.Join(problems, "\n"))
	}
}
