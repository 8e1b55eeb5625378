// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

// Package keys_test runs named API keys end to end: capyctl dev (one
// standalone role, and a cluster of servers with hosts), the key commands
// of the CLI, and real HTTP clients of the inference API.
package keys_test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"io"
	"io/fs"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/capyctl/capyctl/core/api/client"
	"github.com/capyctl/capyctl/plugins-testkit/harness"
	"github.com/capyctl/capyctl/plugins-testkit/poll"
)

// dev is a running capyctl dev.
type dev struct {
	info map[string]string
	bin  string
	// stop stops it (Ctrl-C) and waits; a second call does nothing.
	stop func()
	// log is what it wrote to stderr (the roles' logs).
	log func() string
}

// startDev runs capyctl dev --json with args; it stops (Ctrl-C) when the
// test ends, leaving nothing behind.
func startDev(t *testing.T, args ...string) *dev {
	t.Helper()
	bin, _ := harness.Binaries(t)
	tmp := t.TempDir()
	// A state directory of the test's: dev keeps it after its stop.
	cmd := exec.Command(bin, append([]string{"dev", "--json", "--listen", "127.0.0.1:0", "--state-dir", filepath.Join(tmp, "state")}, args...)...)
	cmd.Env = append(os.Environ(), "TMPDIR="+tmp)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	stderr := &lockedBuffer{}
	cmd.Stderr = stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	stop := func() {
		once.Do(func() {
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGINT)
			done := make(chan struct{})
			go func() { _ = cmd.Wait(); close(done) }()
			select {
			case <-done:
			case <-time.After(2 * time.Minute):
				_ = cmd.Process.Kill()
				<-done
			}
			harness.KillLeftovers(tmp)
		})
	}
	t.Cleanup(func() {
		stop()
		if t.Failed() {
			t.Logf("capyctl dev's log (last 4000 bytes):\n%s", lastBytes(stderr.String(), 4000))
		}
	})
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil {
		t.Fatalf("dev --json printed nothing: %v\n%s", err, stderr.String())
	}
	var info map[string]string
	if err := json.Unmarshal([]byte(line), &info); err != nil || info["api_key"] == "" || info["state_dir"] == "" {
		t.Fatalf("dev --json: %q %v", line, err)
	}
	return &dev{info: info, bin: bin, stop: stop, log: stderr.String}
}

// lockedBuffer is a bytes.Buffer a process writes while the test reads.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

func lastBytes(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[len(s)-n:]
}

// cli runs a capyctl command against dev's role; it returns stdout and
// fails the test on a non-zero exit.
func (d *dev) cli(t *testing.T, args ...string) string {
	t.Helper()
	out, errOut, code := d.run(args...)
	if code != 0 {
		t.Fatalf("capyctl %s: exit %d: %s%s", strings.Join(args, " "), code, out, errOut)
	}
	return out
}

func (d *dev) run(args ...string) (string, string, int) {
	cmd := exec.Command(d.bin, append(args, "--state-dir", d.info["state_dir"])...)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		code = -1
	}
	return out.String(), errOut.String(), code
}

// createKey makes a key with the CLI and returns it (capyctl create
// api-key NAME ... --json: {"name","key"}).
func (d *dev) createKey(t *testing.T, name string, args ...string) string {
	t.Helper()
	out := d.cli(t, append([]string{"create", "api-key", name, "--json"}, args...)...)
	var created map[string]string
	if err := json.Unmarshal([]byte(out), &created); err != nil || created["name"] != name || created["key"] == "" || len(created) != 2 {
		t.Fatalf("create api-key --json: %q %v", out, err)
	}
	return created["key"]
}

// answer is one inference answer.
type answer struct {
	status int
	header http.Header
	body   string
}

// call sends one inference request with key (Authorization: Bearer, or
// x-api-key when anthropic).
func call(t *testing.T, key, method, url, body string, anthropic bool) answer {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, _ := http.NewRequest(method, url, rd)
	if anthropic {
		req.Header.Set("x-api-key", key)
	} else {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	return answer{status: resp.StatusCode, header: resp.Header, body: harness.ReadAll(resp)}
}

func chatBody(model string) string {
	return `{"model":"` + model + `","messages":[{"role":"user","content":"hello"}],"max_tokens":8}`
}

// modelIDs lists the ids of /v1/models.
func modelIDs(t *testing.T, a answer) []string {
	t.Helper()
	var list struct {
		Data []struct {
			ID string `json:"id"`
		} `json:"data"`
	}
	if a.status != 200 || json.Unmarshal([]byte(a.body), &list) != nil {
		t.Fatalf("/v1/models: %d %s", a.status, a.body)
	}
	var ids []string
	for _, m := range list.Data {
		ids = append(ids, m.ID)
	}
	return ids
}

// usageOf reads an answer's token counts.
func usageOf(t *testing.T, a answer) (int64, int64) {
	t.Helper()
	var v struct {
		Usage struct {
			Prompt     int64 `json:"prompt_tokens"`
			Completion int64 `json:"completion_tokens"`
		} `json:"usage"`
	}
	if err := json.Unmarshal([]byte(a.body), &v); err != nil || v.Usage.Prompt == 0 || v.Usage.Completion == 0 {
		t.Fatalf("no usage in %s (%v)", a.body, err)
	}
	return v.Usage.Prompt, v.Usage.Completion
}

// noKeyUnder reads every file under dir and fails when one holds a key in
// clear.
func noKeyUnder(t *testing.T, dir string, keys ...string) {
	t.Helper()
	files := 0
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !d.Type().IsRegular() {
			return nil
		}
		data, err := os.ReadFile(path)
		if err != nil {
			return nil // a file gone since the walk listed it (a log rotated)
		}
		files++
		for _, k := range keys {
			if bytes.Contains(data, []byte(k)) {
				t.Errorf("%s holds a key in clear", path)
			}
			// Its secret alone neither.
			if bytes.Contains(data, []byte(k[len(k)-43:])) {
				t.Errorf("%s holds a key's secret in clear", path)
			}
		}
		return nil
	})
	if err != nil || files == 0 {
		t.Fatalf("walk %s: %d files, %v", dir, files, err)
	}
}

// TestKeys_Dev is issue #29's "done when" on capyctl dev: a key for demo
// answers for demo only, 404 for chat-a (as for a model that does not
// exist) and lists only demo; a key with --rpm 5 gets 429 with
// Retry-After and x-ratelimit-remaining-requests on its sixth request; a
// revoked key gets 401 (waited for with a bound of a second); capyctl
// usage --key bob --json shows the requests and exactly the tokens the
// answers reported; and no key is found in clear under the state
// directory.
func TestKeys_Dev(t *testing.T) {
	if testing.Short() {
		t.Skip("runs capyctl dev")
	}
	d := startDev(t)
	ep := d.info["endpoint"]

	// The role's own key is the key named default.
	if out := d.cli(t, "list", "api-keys"); !strings.Contains(out, "default") {
		t.Fatalf("list api-keys: %s", out)
	}
	alice := d.createKey(t, "alice", "--models", "demo")
	bob := d.createKey(t, "bob", "--rpm", "5")

	// alice: demo only, as if nothing else existed.
	if ids := modelIDs(t, call(t, alice, "GET", ep+"/models", "", false)); len(ids) != 1 || ids[0] != "demo" {
		t.Fatalf("alice's /v1/models: %v", ids)
	}
	if ids := modelIDs(t, call(t, d.info["api_key"], "GET", ep+"/models", "", false)); len(ids) < 3 {
		t.Fatalf("default's /v1/models: %v", ids)
	}
	if a := call(t, alice, "POST", ep+"/chat/completions", chatBody("demo"), false); a.status != 200 {
		t.Fatalf("alice on demo: %d %s", a.status, a.body)
	}
	hidden := call(t, alice, "POST", ep+"/chat/completions", chatBody("chat-a"), false)
	absent := call(t, alice, "POST", ep+"/chat/completions", chatBody("chat-z"), false)
	if hidden.status != 404 || absent.status != 404 || strings.Replace(hidden.body, "chat-a", "M", 1) != strings.Replace(absent.body, "chat-z", "M", 1) ||
		!strings.Contains(hidden.body, `"code":"unknown_model"`) {
		t.Fatalf("alice on chat-a: %d %s; on a model that does not exist: %d %s", hidden.status, hidden.body, absent.status, absent.body)
	}
	// x-api-key works as Authorization does (Anthropic's clients send it).
	if a := call(t, alice, "POST", ep+"/messages", `{"model":"chat-a","max_tokens":8,"messages":[{"role":"user","content":"hi"}]}`, true); a.status != 404 {
		t.Fatalf("alice's Messages request for chat-a: %d %s", a.status, a.body)
	}

	// bob: five requests a minute; the sixth is refused.
	var prompt, completion int64
	for i := 1; i <= 5; i++ {
		a := call(t, bob, "POST", ep+"/chat/completions", chatBody("demo"), false)
		if a.status != 200 || a.header.Get("X-Ratelimit-Limit-Requests") != "5" || a.header.Get("X-Ratelimit-Remaining-Requests") == "" {
			t.Fatalf("bob's request %d: %d %v %s", i, a.status, a.header, a.body)
		}
		p, c := usageOf(t, a)
		prompt, completion = prompt+p, completion+c
	}
	sixth := call(t, bob, "POST", ep+"/chat/completions", chatBody("demo"), false)
	if sixth.status != 429 || sixth.header.Get("Retry-After") == "" || sixth.header.Get("X-Ratelimit-Remaining-Requests") != "0" ||
		!strings.Contains(sixth.body, `"code":"rate_limited"`) {
		t.Fatalf("bob's sixth request: %d %v %s", sixth.status, sixth.header, sixth.body)
	}

	// bob's usage: the six requests (one refused) and the tokens the five
	// answers reported, exactly.
	var usage struct {
		Totals []struct {
			Key              string           `json:"key"`
			Model            string           `json:"model"`
			Requests         int64            `json:"requests"`
			Errors           map[string]int64 `json:"errors"`
			PromptTokens     int64            `json:"prompt_tokens"`
			CompletionTokens int64            `json:"completion_tokens"`
		} `json:"totals"`
	}
	out := d.cli(t, "usage", "--key", "bob", "--json")
	if err := json.Unmarshal([]byte(out), &usage); err != nil {
		t.Fatalf("usage --json: %v\n%s", err, out)
	}
	var requests, refused, gotPrompt, gotCompletion int64
	for _, r := range usage.Totals {
		if r.Key != "bob" {
			t.Fatalf("usage --key bob shows %s", r.Key)
		}
		requests += r.Requests
		refused += r.Errors["rate_limited"]
		gotPrompt += r.PromptTokens
		gotCompletion += r.CompletionTokens
	}
	if requests != 6 || refused != 1 || gotPrompt != prompt || gotCompletion != completion {
		t.Fatalf("bob's usage: %d requests (%d refused), %d+%d tokens; the answers said 6 (1), %d+%d\n%s",
			requests, refused, gotPrompt, gotCompletion, prompt, completion, out)
	}

	// The role's /metrics has bob's series, the same tokens.
	creds, err := client.ReadCredentials(d.info["state_dir"])
	if err != nil {
		t.Fatal(err)
	}
	req, _ := http.NewRequest("GET", d.info["management"]+"/metrics", nil)
	req.Header.Set("Authorization", "Bearer "+creds.AdminToken)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	metrics := harness.ReadAll(resp)
	for _, series := range []string{
		`capyctl_key_tokens_total{key="bob",kind="completion",model="demo"} ` + strconv.FormatInt(completion, 10),
		`capyctl_key_tokens_total{key="bob",kind="prompt",model="demo"} ` + strconv.FormatInt(prompt, 10),
		`capyctl_key_requests_total{code="ok",key="bob",model="demo"} 5`,
		`capyctl_key_requests_total{code="rate_limited",key="bob",model=""} 1`,
	} {
		if !strings.Contains(metrics, series+"\n") {
			t.Errorf("/metrics lacks %s", series)
		}
	}

	// Revoked: 401, within a second.
	d.cli(t, "revoke", "api-key", "alice")
	poll.Until(t, time.Second, "alice's key refused after its revocation", func() bool {
		return call(t, alice, "GET", ep+"/models", "", false).status == 401
	})
	if a := call(t, bob, "GET", ep+"/models", "", false); a.status == 401 {
		t.Fatalf("bob's key went with alice's: %d", a.status)
	}

	// No key in clear anywhere under the state directory, while the role
	// runs and once it stopped (and wrote what it held).
	dir := d.info["state_dir"]
	noKeyUnder(t, dir, alice, bob)
	d.stop()
	noKeyUnder(t, dir, alice, bob)
	noKeyIn(t, "the role's log", d.log(), alice, bob)
}

// noKeyIn fails when text holds a key or its secret.
func noKeyIn(t *testing.T, what, text string, keys ...string) {
	t.Helper()
	for _, k := range keys {
		if strings.Contains(text, k[len(k)-43:]) {
			t.Errorf("%s holds a key's secret", what)
		}
	}
}

// on returns a copy of d whose CLI commands go to another server of its
// cluster (its state directory).
func (d *dev) on(stateDir string) *dev {
	info := map[string]string{}
	for k, v := range d.info {
		info[k] = v
	}
	info["state_dir"] = stateDir
	return &dev{info: info, bin: d.bin, stop: func() {}, log: d.log}
}

// standing is a key's standing against its limits as one server sees it
// (GET /management/v1/api-keys/NAME on its management address).
func standing(t *testing.T, mgmt, token, name string) (remaining int64, found bool) {
	t.Helper()
	req, _ := http.NewRequest("GET", mgmt+"/management/v1/api-keys/"+name, nil)
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, false
	}
	body := harness.ReadAll(resp)
	var k struct {
		Standing *struct {
			RemainingRequests int64 `json:"remaining_requests"`
		} `json:"standing"`
	}
	if resp.StatusCode != 200 || json.Unmarshal([]byte(body), &k) != nil || k.Standing == nil {
		return 0, false
	}
	return k.Standing.RemainingRequests, true
}

// hostRequests counts the records of key in the hosts' request logs
// (GET /management/v1/requests on each host's own management listener).
func hostRequests(hosts []string, key string) int {
	n := 0
	for _, h := range hosts {
		ri, err := client.ReadRunInfo(h)
		hc, cerr := client.ReadCredentials(h)
		if err != nil || cerr != nil {
			continue
		}
		req, _ := http.NewRequest("GET", "http://"+ri.Management+"/management/v1/requests?limit=100", nil)
		req.Header.Set("Authorization", "Bearer "+hc.AdminToken)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			continue
		}
		var recs struct {
			Requests []struct {
				Key string `json:"key"`
			} `json:"requests"`
		}
		_ = json.Unmarshal([]byte(harness.ReadAll(resp)), &recs)
		for _, r := range recs.Requests {
			if r.Key == key {
				n++
			}
		}
	}
	return n
}

// TestKeys_Servers is issue #29's "done when" on capyctl dev --servers 3
// --hosts 2: a key created through one server works through the others
// (within a second), a revocation through one applies on all (within a
// second); a key's requests per minute hold across the servers (each
// server learns the others' counts within a fraction of a second); and
// the usage through any server sums every server's counts.
func TestKeys_Servers(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a cluster of three servers and two hosts")
	}
	d := startDev(t, "--hosts", "2", "--servers", "3")
	eps := strings.Split(d.info["server_endpoints"], ",")
	names := strings.Split(d.info["servers"], ",")
	if len(eps) != 3 || len(names) != 3 {
		t.Fatalf("dev --servers 3: %v", d.info)
	}
	servers := []*dev{d, d.on(filepath.Join(d.info["state_dir"], "servers", names[1])), d.on(filepath.Join(d.info["state_dir"], "servers", names[2]))}
	mgmts := strings.Split(d.info["server_managements"], ",")
	creds, err := client.ReadCredentials(d.info["state_dir"])
	if err != nil || len(mgmts) != 3 {
		t.Fatalf("credentials %v, managements %v", err, mgmts)
	}
	for _, ep := range eps {
		poll.Until(t, 2*time.Minute, "demo served through "+ep, func() bool {
			return call(t, d.info["api_key"], "POST", ep+"/chat/completions", chatBody("demo"), false).status == 200
		})
	}

	// Created through the second server: it works through every one.
	alice := servers[1].createKey(t, "alice", "--models", "demo")
	for _, ep := range eps {
		poll.Until(t, time.Second, "alice's key works through "+ep, func() bool {
			return call(t, alice, "GET", ep+"/models", "", false).status == 200
		})
		if ids := modelIDs(t, call(t, alice, "GET", ep+"/models", "", false)); len(ids) != 1 || ids[0] != "demo" {
			t.Fatalf("alice's models through %s: %v", ep, ids)
		}
		if a := call(t, alice, "POST", ep+"/chat/completions", chatBody("chat-a"), false); a.status != 404 || !strings.Contains(a.body, "unknown_model") {
			t.Fatalf("alice on chat-a through %s: %d %s", ep, a.status, a.body)
		}
	}

	// Three requests a minute, all used through the first server: the
	// others learn it and refuse the fourth.
	bob := servers[2].createKey(t, "bob", "--models", "demo", "--rpm", "3")
	for i := range servers {
		poll.Until(t, time.Second, "bob known to server "+names[i], func() bool { _, ok := standing(t, mgmts[i], creds.AdminToken, "bob"); return ok })
	}
	var prompt, completion int64
	for i := 0; i < 3; i++ {
		a := call(t, bob, "POST", eps[0]+"/chat/completions", chatBody("demo"), false)
		if a.status != 200 {
			t.Fatalf("bob's request %d: %d %s", i, a.status, a.body)
		}
		p, c := usageOf(t, a)
		prompt, completion = prompt+p, completion+c
	}
	for i := 1; i < 3; i++ {
		poll.Until(t, 2*time.Second, names[i]+" counts bob's requests on "+names[0], func() bool {
			left, ok := standing(t, mgmts[i], creds.AdminToken, "bob")
			return ok && left == 0
		})
		a := call(t, bob, "POST", eps[i]+"/chat/completions", chatBody("demo"), false)
		if a.status != 429 || !strings.Contains(a.body, "rate_limited") || a.header.Get("X-Ratelimit-Remaining-Requests") != "0" || a.header.Get("Retry-After") == "" {
			t.Fatalf("bob's fourth request, through %s: %d %v %s", names[i], a.status, a.header, a.body)
		}
	}
	// The host that served bob's requests logged them under his key (the
	// server relayed its name); the request log commits in groups.
	hosts, _ := filepath.Glob(filepath.Join(d.info["state_dir"], "hosts", "*"))
	poll.Until(t, 10*time.Second, "bob's three requests in the hosts' request logs", func() bool {
		return hostRequests(hosts, "bob") == 3
	})
	// The usage through the third server sums every server's: three
	// answered through the first, two refused through the others.
	var usage struct {
		Totals []struct {
			Requests         int64            `json:"requests"`
			Errors           map[string]int64 `json:"errors"`
			PromptTokens     int64            `json:"prompt_tokens"`
			CompletionTokens int64            `json:"completion_tokens"`
		} `json:"totals"`
		Servers []string `json:"servers"`
		Missing []string `json:"missing"`
	}
	out := servers[2].cli(t, "usage", "--key", "bob", "--json")
	if err := json.Unmarshal([]byte(out), &usage); err != nil {
		t.Fatalf("usage: %v\n%s", err, out)
	}
	var requests, refused, gotPrompt, gotCompletion int64
	for _, r := range usage.Totals {
		requests += r.Requests
		refused += r.Errors["rate_limited"]
		gotPrompt += r.PromptTokens
		gotCompletion += r.CompletionTokens
	}
	if requests != 5 || refused != 2 || gotPrompt != prompt || gotCompletion != completion || len(usage.Servers) != 3 || len(usage.Missing) != 0 {
		t.Fatalf("bob's usage through %s: %d requests (%d refused), %d+%d tokens from %v (missing %v); want 5 (2), %d+%d from 3 servers\n%s",
			names[2], requests, refused, gotPrompt, gotCompletion, usage.Servers, usage.Missing, prompt, completion, out)
	}

	// Revoked through the third server: refused through every one.
	servers[2].cli(t, "revoke", "api-key", "alice")
	for _, ep := range eps {
		poll.Until(t, time.Second, "alice's key refused through "+ep, func() bool {
			return call(t, alice, "GET", ep+"/models", "", false).status == 401
		})
	}
	dir := d.info["state_dir"]
	d.stop()
	noKeyUnder(t, dir, alice, bob)
	noKeyIn(t, "the roles' logs", d.log(), alice, bob)
}
