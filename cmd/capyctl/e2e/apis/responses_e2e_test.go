// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package apis_test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/capyctl/capyctl/plugins-testkit/harness"
	"github.com/capyctl/capyctl/plugins-testkit/poll"
)

// startDevFleet runs capyctl dev --json with args and returns what it
// printed; the role stops (Ctrl-C) when the test ends.
func startDevFleet(t *testing.T, args ...string) map[string]string {
	t.Helper()
	bin, _ := harness.Binaries(t)
	cmd := exec.Command(bin, append([]string{"dev", "--json", "--listen", "127.0.0.1:0"}, args...)...)
	tmp := t.TempDir()
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
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil {
		t.Fatalf("dev --json printed nothing: %v\n%s", err, stderr.String())
	}
	var info map[string]string
	if err := json.Unmarshal([]byte(line), &info); err != nil || info["api_key"] == "" {
		t.Fatalf("dev --json: %q %v", line, err)
	}
	return info
}

// call sends one request with the key and returns the status and body.
func call(t *testing.T, key, method, url, body string) (int, string) {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, _ := http.NewRequest(method, url, rd)
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, harness.ReadAll(resp)
}

// TestResponses_AnyServerOfAFleet: in a cluster of two servers, a
// response is kept by the server that took the request, under an ID that
// names it; the other server continues it (previous_response_id), reads
// it and deletes it by asking its holder. Streamed answers are kept
// before the client has their end.
func TestResponses_AnyServerOfAFleet(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a server cluster and a host")
	}
	info := startDevFleet(t, "--hosts", "1", "--servers", "2")
	eps := strings.Split(info["server_endpoints"], ",")
	if len(eps) != 2 {
		t.Fatalf("dev --servers 2: %v", info)
	}
	key := info["api_key"]
	for _, ep := range eps {
		poll.Until(t, 60*time.Second, "demo listed on "+ep, func() bool {
			code, body := call(t, key, http.MethodGet, ep+"/models", "")
			return code == 200 && strings.Contains(body, `"id":"demo"`)
		})
	}
	decode := func(body string) map[string]any {
		var m map[string]any
		if err := json.Unmarshal([]byte(body), &m); err != nil {
			t.Fatalf("%v: %s", err, body)
		}
		return m
	}
	// Server 1 keeps the first turn.
	code, body := call(t, key, http.MethodPost, eps[0]+"/responses", `{"model":"demo","input":"hello there"}`)
	if code != 200 {
		t.Fatalf("turn 1: %d %s", code, body)
	}
	r1 := decode(body)
	id1 := r1["id"].(string)
	// Server 2 reads it, and continues it in a stream; the stored answer
	// can be read the moment the stream ends.
	if code, body := call(t, key, http.MethodGet, eps[1]+"/responses/"+id1, ""); code != 200 || decode(body)["id"] != id1 {
		t.Fatalf("server 2 reading server 1's response: %d %s", code, body)
	}
	code, body = call(t, key, http.MethodPost, eps[1]+"/responses", `{"model":"demo","input":"again","stream":true,"previous_response_id":"`+id1+`"}`)
	if code != 200 || !strings.Contains(body, "event: response.completed") {
		t.Fatalf("turn 2 on server 2: %d %s", code, body)
	}
	var done struct {
		Response map[string]any `json:"response"`
	}
	for _, l := range strings.Split(body, "\n") {
		if strings.HasPrefix(l, `data: {"type":"response.completed"`) {
			_ = json.Unmarshal([]byte(strings.TrimPrefix(l, "data: ")), &done)
		}
	}
	id2, _ := done.Response["id"].(string)
	if done.Response["previous_response_id"] != id1 || id2 == "" || id2[5:13] == id1[5:13] {
		t.Fatalf("turn 2 %v: its ID should name server 2, not server 1 (%s)", done.Response, id1)
	}
	in1 := r1["usage"].(map[string]any)["input_tokens"].(float64)
	in2 := done.Response["usage"].(map[string]any)["input_tokens"].(float64)
	if in2 <= in1 {
		t.Fatalf("turn 2's prompt (%v tokens) does not carry turn 1's (%v)", in2, in1)
	}
	code, body = call(t, key, http.MethodGet, eps[0]+"/responses/"+id2, "")
	if code != 200 || decode(body)["id"] != id2 {
		t.Fatalf("server 1 reading server 2's response: %d %s", code, body)
	}
	// Server 1 deletes server 2's response; neither has it after.
	if code, body := call(t, key, http.MethodDelete, eps[0]+"/responses/"+id2, ""); code != 200 || !strings.Contains(body, `"deleted":true`) {
		t.Fatalf("delete through server 1: %d %s", code, body)
	}
	for _, ep := range eps {
		if code, body := call(t, key, http.MethodGet, ep+"/responses/"+id2, ""); code != 404 || !strings.Contains(body, "response_not_found") {
			t.Fatalf("a deleted response on %s: %d %s", ep, code, body)
		}
	}
	// A client's own "capyctl" member is refused on the server.
	if code, body := call(t, key, http.MethodPost, eps[0]+"/responses", `{"model":"demo","input":"x","capyctl":{"response_id":"resp_x","history":[]}}`); code != 400 {
		t.Fatalf("a client's relayed member: %d %s", code, body)
	}
}
