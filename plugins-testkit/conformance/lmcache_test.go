// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package conformance_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/capyctl/capyctl/plugins-testkit/conformance"
	"github.com/capyctl/capyctl/plugins-testkit/harness"
	"github.com/capyctl/capyctl/sdk/proc"
)

// TestRole_LMCache registers vLLM 0.32.0 and SGLang 0.5.22 venvs with
// LMCache 0.5.6 installed, deploys a restart_only model on each with
// lmcache = "required", and shows, through the router: the instance's own
// LMCache server runs beside the engine (a process of the launch, on
// loopback); a prompt whose 256-token prefix was seen before is answered
// with that prefix cached (usage.prompt_tokens_details.cached_tokens), so
// less of it is prefilled; and a stop ends the server with the engine.
// Where LMCache cannot run, lmcache = "required" is refused at deploy; the
// server lives in a network namespace of its own (the engine joins it),
// so another local user reaches nothing on its port, and where no
// namespace can be made (not root) it never runs.
func TestRole_LMCache(t *testing.T) {
	r := harness.StartStandalone(t, harness.Options{})
	for _, e := range []struct{ family, version string }{{"vllm", "0.32.0"}, {"sglang", "0.5.22"}} {
		t.Run(e.family, func(t *testing.T) {
			venv := conformance.FakeVenv(t, t.TempDir(), map[string]string{e.family: e.version, "lmcache": "0.5.6"}, nil)
			name := "lmc-" + e.family
			if out, errOut, code := r.CLI("engine", "add", venv, "--yes", "--name", name); code != 0 {
				t.Fatalf("engine add: exit %d\n%s%s", code, out, errOut)
			}
			// Deep parking is not qualified with LMCache: required is refused
			// when the deployment is written, with its code and exit 5.
			deep := fmt.Sprintf("deployment %q {\n  engine = %q\n  lmcache = \"required\"\n  model {\n    path = %q\n  }\n}\n", "deep-"+e.family, name, "deep-"+e.family)
			out, errOut, code := r.Deploy("deep-"+e.family, deep)
			if code != 5 || !strings.Contains(out+errOut, "lmcache_unavailable:residency_not_qualified") {
				t.Fatalf("deploy lmcache = required, residency deep: exit %d, want 5 and lmcache_unavailable\n%s%s", code, out, errOut)
			}

			dep := "cache-" + e.family
			spec := fmt.Sprintf("deployment %q {\n  engine = %q\n  residency = \"restart_only\"\n  lmcache = \"required\"\n  model {\n    path = %q\n  }\n}\n", dep, name, dep)
			if !proc.NetnsSupported() {
				// LMCache's server is unauthenticated TCP: where it cannot
				// get a network namespace of its own (a role not run as
				// root) it never runs, and required is refused.
				out, errOut, code := r.Deploy(dep, spec)
				if code != 5 || !strings.Contains(out+errOut, "lmcache_unavailable:not_isolated") {
					t.Fatalf("deploy lmcache = required without a network namespace: exit %d, want 5 and lmcache_unavailable:not_isolated\n%s%s", code, out, errOut)
				}
				return
			}
			if out, errOut, code := r.Deploy(dep, spec, "--activate", "--wait"); code != 0 {
				t.Fatalf("deploy: exit %d\n%s%s\nrole:\n%s", code, out, errOut, r.Output())
			}
			server := lmcacheServers(r)
			if len(server) != 1 {
				t.Fatalf("want one LMCache server of the launch, found %v\nrole:\n%s", server, r.Output())
			}
			// Another local user knows the server's port: it reaches
			// nothing there (the server listens in a namespace of its own).
			if port := lmcachePort(t, server[0]); port != "" {
				if c, err := net.DialTimeout("tcp", "127.0.0.1:"+port, 2*time.Second); err == nil {
					c.Close()
					t.Fatalf("the LMCache server's port %s answers on the host's loopback", port)
				}
			}

			words := make([]string, 300)
			for i := range words {
				words[i] = "w" + strconv.Itoa(i)
			}
			prefix := strings.Join(words, " ")
			first := cachedTokens(t, r, dep, prefix+" first question")
			second := cachedTokens(t, r, dep, prefix+" second question")
			if first.cached != 0 {
				t.Fatalf("first prompt: %d tokens cached before anything was stored", first.cached)
			}
			if second.cached < 256 || second.prompt-second.cached >= first.prompt-first.cached {
				t.Fatalf("repeated prefix: %d of %d prompt tokens cached (first: %d of %d): want the 256-token chunk from LMCache",
					second.cached, second.prompt, first.cached, first.prompt)
			}

			// LMCache's keys ignore cache_salt with both engines today, so
			// a salted request to an instance with LMCache is refused rather
			// than served with an isolation the cache does not give.
			salted, _ := json.Marshal(map[string]any{"model": dep, "cache_salt": "tenant-a",
				"messages": []map[string]string{{"role": "user", "content": strings.Repeat("s ", 300) + "salted question"}}})
			resp, err := r.Chat(context.Background(), string(salted), nil)
			if err != nil {
				t.Fatal(err)
			}
			if body := harness.ReadAll(resp); resp.StatusCode != http.StatusBadRequest || !strings.Contains(body, "cache_salt_unsupported") {
				t.Fatalf("a salted request to an instance with LMCache: %d %s", resp.StatusCode, body)
			}

			if out, errOut, code := r.CLI("stop", "deployment", dep, "--wait"); code != 0 {
				t.Fatalf("stop: exit %d\n%s%s", code, out, errOut)
			}
			for _, pid := range server {
				if harness.Alive(pid) {
					t.Fatalf("the LMCache server %d outlived its stopped instance", pid)
				}
			}
		})
	}
}

// lmcachePort is the port an LMCache server was started on (its command
// line: lmcache.v1.server 127.0.0.1 PORT cpu).
func lmcachePort(t *testing.T, pid int) string {
	t.Helper()
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
	if err != nil {
		t.Fatal(err)
	}
	args := strings.Split(string(b), "\x00")
	for i, a := range args {
		if a == "127.0.0.1" && i+1 < len(args) {
			return args[i+1]
		}
	}
	t.Fatalf("no port in the LMCache server's command line %q", args)
	return ""
}

// lmcacheServers are the live LMCache servers of the role's launches.
func lmcacheServers(r *harness.Role) []int {
	return launchedPIDs(r, "lmcache.v1.server\x00127.0.0.1\x00")
}

// enginePrograms are the engine modules the fake venvs run, by family.
var enginePrograms = map[string]string{"vllm": "-m\x00vllm.entrypoints.openai.api_server\x00", "sglang": "-m\x00sglang.launch_server\x00"}

// launchedPIDs are the live processes of the role's launches whose
// command line contains marker.
func launchedPIDs(r *harness.Role, marker string) []int {
	var out []int
	for _, pid := range harness.EnginePIDs(r.StateDir) {
		b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
		if err == nil && strings.Contains(string(b), marker) {
			out = append(out, pid)
		}
	}
	return out
}

// TestRole_LMCacheAcrossRestartOnlyPark shows that an instance's LMCache
// server belongs to the instance, not to one engine launch: a
// restart_only deployment answers a 300-word prompt, is parked (its
// engine stops), and a request wakes it with a new engine process that
// reconnects to the same server, so the same prompt is answered with its
// prefix cached. That needs the keys to survive the restart: the fake, as
// LMCache, chains its chunk keys from a seed drawn per engine process
// unless PYTHONHASHSEED fixes it, which the drivers set the same for every
// launch of the instance. A stop then ends the server, and nothing of the
// role's launches is left.
func TestRole_LMCacheAcrossRestartOnlyPark(t *testing.T) {
	r := harness.StartStandalone(t, harness.Options{})
	for _, e := range []struct{ family, version string }{{"vllm", "0.32.0"}, {"sglang", "0.5.22"}} {
		t.Run(e.family, func(t *testing.T) {
			venv := conformance.FakeVenv(t, t.TempDir(), map[string]string{e.family: e.version, "lmcache": "0.5.6"}, nil)
			name := "lmc-park-" + e.family
			if out, errOut, code := r.CLI("engine", "add", venv, "--yes", "--name", name); code != 0 {
				t.Fatalf("engine add: exit %d\n%s%s", code, out, errOut)
			}
			dep := "park-" + e.family
			spec := fmt.Sprintf("deployment %q {\n  engine = %q\n  residency = \"restart_only\"\n  lmcache = \"required\"\n  model {\n    path = %q\n  }\n}\n", dep, name, dep)
			if out, errOut, code := r.Deploy(dep, spec, "--activate", "--wait"); code != 0 {
				t.Fatalf("deploy: exit %d\n%s%s\nrole:\n%s", code, out, errOut, r.Output())
			}
			servers, engines := lmcacheServers(r), launchedPIDs(r, enginePrograms[e.family])
			if len(servers) != 1 || len(engines) != 1 {
				t.Fatalf("want one LMCache server and one engine, found %v and %v\nrole:\n%s", servers, engines, r.Output())
			}

			words := make([]string, 300)
			for i := range words {
				words[i] = "p" + strconv.Itoa(i)
			}
			prompt := strings.Join(words, " ")
			first := cachedTokens(t, r, dep, prompt)
			if first.cached != 0 {
				t.Fatalf("first prompt: %d tokens cached before anything was stored", first.cached)
			}

			// A restart_only park stops the engine; the server stays.
			if out, errOut, code := r.CLI("park", "deployment", dep, "--wait"); code != 0 {
				t.Fatalf("park: exit %d\n%s%s", code, out, errOut)
			}
			if harness.Alive(engines[0]) {
				t.Fatalf("the engine %d still runs after a restart_only park", engines[0])
			}
			if !harness.Alive(servers[0]) {
				t.Fatalf("the LMCache server %d ended with the parked engine: its cache is lost\nrole:\n%s", servers[0], r.Output())
			}

			// A request wakes it: a new engine, the same server.
			again := cachedTokens(t, r, dep, prompt)
			woken := launchedPIDs(r, enginePrograms[e.family])
			if len(woken) != 1 || woken[0] == engines[0] {
				t.Fatalf("after the wake: engines %v, want one new process (was %d)", woken, engines[0])
			}
			if now := lmcacheServers(r); len(now) != 1 || now[0] != servers[0] {
				t.Fatalf("after the wake: LMCache servers %v, want the kept %d", now, servers[0])
			}
			if again.cached <= 0 || again.prompt != first.prompt {
				t.Fatalf("the same prompt after a restart_only park: %d of %d prompt tokens cached, want the stored prefix from LMCache",
					again.cached, again.prompt)
			}

			// Parked again, then stopped while parked: the server alone is
			// ended (the stopped engine's old process IDs are not named
			// again), and nothing is left.
			if out, errOut, code := r.CLI("park", "deployment", dep, "--wait"); code != 0 {
				t.Fatalf("second park: exit %d\n%s%s", code, out, errOut)
			}
			if !harness.Alive(servers[0]) {
				t.Fatalf("the LMCache server %d ended at the second park", servers[0])
			}
			if out, errOut, code := r.CLI("stop", "deployment", dep, "--wait"); code != 0 {
				t.Fatalf("stop: exit %d\n%s%s", code, out, errOut)
			}
			if harness.Alive(servers[0]) {
				t.Fatalf("the LMCache server %d outlived its stopped deployment", servers[0])
			}
			if left := harness.EnginePIDs(r.StateDir); len(left) > 0 {
				t.Fatalf("processes of the role's launches left after the stop: %v", left)
			}
			if st, err := r.Mgmt.Deployment(context.Background(), dep); err != nil || st.State != "stopped" || len(st.Instances) != 1 || st.Instances[0].Charges != nil {
				t.Fatalf("after a stop while parked: %v %+v", err, st)
			}
		})
	}
}

// usage is an answer's prompt and cached token counts.
type usage struct{ prompt, cached int }

// cachedTokens sends one chat request and returns its usage.
func cachedTokens(t *testing.T, r *harness.Role, model, content string) usage {
	t.Helper()
	return chatUsage(t, r, harness.ChatBody(model, false, content))
}

// chatUsage sends one chat body and returns its usage.
func chatUsage(t *testing.T, r *harness.Role, req string) usage {
	t.Helper()
	resp, err := r.Chat(context.Background(), req, nil)
	if err != nil {
		t.Fatal(err)
	}
	body := harness.ReadAll(resp)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("chat: %d %s", resp.StatusCode, body)
	}
	var a struct {
		Usage struct {
			PromptTokens        int `json:"prompt_tokens"`
			PromptTokensDetails *struct {
				CachedTokens int `json:"cached_tokens"`
			} `json:"prompt_tokens_details"`
		} `json:"usage"`
	}
	if err := json.Unmarshal([]byte(body), &a); err != nil {
		t.Fatalf("answer: %v\n%s", err, body)
	}
	u := usage{prompt: a.Usage.PromptTokens}
	if d := a.Usage.PromptTokensDetails; d != nil {
		u.cached = d.CachedTokens
	}
	return u
}
