// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package role_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/capyctl/capyctl/cmd/capyctl/internal/e2e"
	"github.com/capyctl/capyctl/core/api/client"
	"github.com/capyctl/capyctl/plugins-testkit/harness"
)

// TestSwitchLoad_DevAlternatingBursts is the new user's try of switching
// under load, on a real capyctl dev (the role, the vLLM driver, the fake
// vLLM engines, the simulated 24 GiB card on which chat-a and chat-b do not
// fit together): two rounds of 16 concurrent requests alternating between
// the two models are all answered 200 (none refused because the other
// model was busy), with at most 6 switches: each model serves its batch,
// then the other.
func TestSwitchLoad_DevAlternatingBursts(t *testing.T) {
	bin, _ := harness.Binaries(t)
	tmp := t.TempDir()
	cmd := exec.Command(bin, "dev", "--json", "--listen", "127.0.0.1:0")
	cmd.Env = append(os.Environ(), "TMPDIR="+tmp)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
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
		case <-time.After(60 * time.Second):
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			<-done
		}
		harness.KillLeftovers(tmp)
	})
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil {
		t.Fatalf("dev --json printed nothing: %v\n%s", err, stderr.String())
	}
	var info map[string]string
	if err := json.Unmarshal([]byte(line), &info); err != nil || info["switch_models"] != "chat-a,chat-b" {
		t.Fatalf("dev --json: %q %v", line, err)
	}
	creds, err := client.ReadCredentials(info["state_dir"])
	if err != nil {
		t.Fatal(err)
	}

	for round := 1; round <= 2; round++ {
		var wg sync.WaitGroup
		var mu sync.Mutex
		var bad []string
		for i := 0; i < 16; i++ {
			model := []string{"chat-a", "chat-b"}[i%2]
			wg.Add(1)
			go func() {
				defer wg.Done()
				body := fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":"Hello %d"}]}`, model, i)
				req, _ := http.NewRequest(http.MethodPost, info["endpoint"]+"/chat/completions", strings.NewReader(body))
				req.Header.Set("Authorization", "Bearer "+info["api_key"])
				req.Header.Set("Content-Type", "application/json")
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					mu.Lock()
					bad = append(bad, fmt.Sprintf("%s: %v", model, err))
					mu.Unlock()
					return
				}
				out := harness.ReadAll(resp)
				if resp.StatusCode != http.StatusOK || !strings.Contains(out, `"model":"`+model+`"`) {
					mu.Lock()
					bad = append(bad, fmt.Sprintf("%s: %d %s", model, resp.StatusCode, out))
					mu.Unlock()
				}
			}()
		}
		wg.Wait()
		if len(bad) > 0 {
			t.Fatalf("round %d: %d of 16 not answered 200:\n%s\nrole:\n%s", round, len(bad), strings.Join(bad, "\n"), stderr.String())
		}
	}

	metrics := func() string {
		req, _ := http.NewRequest(http.MethodGet, info["management"]+"/metrics", nil)
		req.Header.Set("Authorization", "Bearer "+creds.AdminToken)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		return harness.ReadAll(resp)
	}
	m := metrics()
	switches := metricValue(t, m, "capyctl_switches_total")
	if switches < 1 || switches > 6 {
		t.Fatalf("%v switches for two rounds of 16 alternating requests, want 1 to 6\n%s", switches, m)
	}
	if strings.Contains(m, "capyctl_refusals_total{") {
		t.Fatalf("requests were refused:\n%s", m)
	}
	t.Logf("2 rounds of 16 alternating requests: 32 answered 200, %v switches", switches)
}

// metricValue reads one unlabelled sample of the Prometheus text.
func metricValue(t *testing.T, text, name string) float64 {
	t.Helper()
	for _, l := range strings.Split(text, "\n") {
		if v, ok := strings.CutPrefix(l, name+" "); ok {
			f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
			if err != nil {
				t.Fatalf("%s: %v", l, err)
			}
			return f
		}
	}
	t.Fatalf("no %s in the metrics", name)
	return 0
}

// TestSwitchLoad_ThroughAServer: the relay path waits too. A server relays
// to one host whose 24 GiB card holds one of two 14 GiB models at a time;
// 16 concurrent requests alternating between them, sent to the server, are
// all answered: the host switches, and the server holds each request on
// the relay while the host's router waits, never bouncing it.
func TestSwitchLoad_ThroughAServer(t *testing.T) {
	f := e2e.StartFleet(t, map[string]string{"gpu-a": "24GiB"})
	for _, name := range []string{"sw-a", "sw-b"} {
		spec := strings.Replace(harness.SimpleSpec(name, "fake"), "  model {",
			"  resources {\n    gpu = \"14GiB\"\n    ram = \"1GiB\"\n  }\n  model {", 1)
		if out, errOut, code := f.Deploy(name, spec); code != 0 {
			t.Fatalf("deploy %s: exit %d\n%s%s", name, code, out, errOut)
		}
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var bad []string
	for i := 0; i < 16; i++ {
		model := []string{"sw-a", "sw-b"}[i%2]
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp, err := f.Server.Chat(context.Background(), harness.ChatBody(model, i%4 == 0, "hello"), nil)
			if err != nil {
				mu.Lock()
				bad = append(bad, fmt.Sprintf("%s: %v", model, err))
				mu.Unlock()
				return
			}
			if out := harness.ReadAll(resp); resp.StatusCode != http.StatusOK || strings.Contains(out, `"error"`) {
				mu.Lock()
				bad = append(bad, fmt.Sprintf("%s: %d %s", model, resp.StatusCode, out))
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if len(bad) > 0 {
		t.Fatalf("%d of 16 not answered through the server:\n%s\nhost:\n%s", len(bad), strings.Join(bad, "\n"), f.Hosts["gpu-a"].Output())
	}
}
