// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package main

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	goplugin "github.com/hashicorp/go-plugin"

	"github.com/capyctl/capyctl/plugins-testkit/conformance"
	"github.com/capyctl/capyctl/plugins-testkit/fakeengine"
	"github.com/capyctl/capyctl/plugins-testkit/harness"
	"github.com/capyctl/capyctl/plugins-testkit/testbin"
	"github.com/capyctl/capyctl/sdk"
	sdkplugin "github.com/capyctl/capyctl/sdk/plugin"
)

// program is the name a role looks for in its plugin directory.
const program = "capyctl-driver-" + Family

// maxCodeLines is the promise of the driver-author guide.
const maxCodeLines = 150

// driverBinary is the example built as capyctl-driver-hello (make build
// puts it in bin/).
func driverBinary(t testing.TB) string {
	return testbin.Program(t, program, "./website/examples/driver")
}

// TestDriver_CodeLines counts the example's own code: every line of its
// non-test Go files that is neither blank nor only a comment.
func TestDriver_CodeLines(t *testing.T) {
	files, _ := filepath.Glob("*.go")
	code, total := 0, 0
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(string(b), "\n") {
			total++
			if s := strings.TrimSpace(line); s != "" && !strings.HasPrefix(s, "//") {
				code++
			}
		}
	}
	t.Logf("%d lines of code (%d with comments and blank lines)", code, total)
	if code == 0 || code >= maxCodeLines {
		t.Fatalf("the example has %d lines of code; the guide promises under %d", code, maxCodeLines)
	}
}

// TestConformance runs the whole driver conformance suite against the
// example, served as a plugin from its binary, with the testkit's fake
// engine as the program.
func TestConformance(t *testing.T) {
	bin := driverBinary(t)
	conformance.Run(t, conformance.Target{
		Family: Family,
		Driver: conformance.ProgramDriver(bin),
		Install: func(t testing.TB, _ string) string {
			_, fake := testbin.Binaries(t)
			return fake
		},
		// The fake engine holds its weights on the suite's simulated GPU.
		HostEnv: map[string]string{fakeengine.EnvName("sim-weights"): "2GiB"},
		Refusals: []conformance.Refusal{
			{Name: "the port", ExtraArgs: []string{"--port", "80"}, Code: "engine_option_owned:--port"},
			{Name: "the key variable", Env: map[string]string{keyEnv: "x"}, Code: "engine_env_reserved:" + keyEnv},
		},
	})
}

// TestWholeRole installs the example in a role's plugin directory,
// registers the fake engine for it, deploys a model, streams an answer
// through the role, and survives a kill -9 of the driver: the engine keeps
// serving, and the relaunched driver re-attaches to the same engine
// process.
func TestWholeRole(t *testing.T) {
	bin := driverBinary(t)
	r := harness.StartStandalone(t, harness.Options{})
	installDriver(t, bin, filepath.Join(r.StateDir, "plugins", program))

	out, errOut, code := r.CLI("engine", "add", r.FakeBin, "--family", Family, "--name", "hello-fake", "--yes", "--json")
	if code != 0 || !strings.Contains(out, `"family":"hello"`) {
		t.Fatalf("engine add: exit %d\n%s%s", code, out, errOut)
	}
	r.MustDeploy("greet", harness.SimpleSpec("greet", "hello-fake"))
	streamOK(t, r, "greet")
	engine := enginePID(t, r, "greet")

	drivers := harness.ProgramPIDs(r.StateDir, program)
	if len(drivers) != 1 {
		t.Fatalf("driver processes %v, want one", drivers)
	}
	if err := syscall.Kill(drivers[0], syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	// Requests never pass through the driver: the engine keeps answering.
	streamOK(t, r, "greet")
	harness.Eventually(t, 60*time.Second, "a relaunched driver", func() bool {
		now := harness.ProgramPIDs(r.StateDir, program)
		return len(now) == 1 && now[0] != drivers[0]
	})
	// The relaunched driver recovered the instance: same engine, and a stop
	// through it ends the engine.
	harness.Eventually(t, 60*time.Second, "the instance ready again", func() bool {
		return deploymentState(t, r, "greet") == "ready"
	})
	if now := enginePID(t, r, "greet"); now != engine {
		t.Fatalf("engine pid %d after the driver was killed, was %d", now, engine)
	}
	streamOK(t, r, "greet")
	if _, errOut, code := r.CLI("stop", "deployment", "greet", "--wait"); code != 0 {
		t.Fatalf("stop: %s", errOut)
	}
	if harness.Alive(engine) {
		t.Fatalf("engine %d still alive after the stop", engine)
	}
}

// installDriver copies the driver binary into the plugin directory.
func installDriver(t *testing.T, bin, dst string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(dst), 0o700); err != nil {
		t.Fatal(err)
	}
	in, err := os.Open(bin)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o755)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(out, in); err != nil {
		t.Fatal(err)
	}
	if err := out.Close(); err != nil {
		t.Fatal(err)
	}
}

// streamOK sends a streamed chat request through the role and wants
// content chunks and the end of the stream.
func streamOK(t *testing.T, r *harness.Role, model string) {
	t.Helper()
	resp, err := r.Chat(context.Background(), harness.ChatBody(model, true, "hello"), nil)
	if err != nil {
		t.Fatalf("chat: %v", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("chat: %d %s", resp.StatusCode, harness.ReadAll(resp))
	}
	chunks, done := 0, false
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case line == "data: [DONE]":
			done = true
		case strings.HasPrefix(line, "data: ") && strings.Contains(line, `"content"`):
			chunks++
		}
	}
	if chunks == 0 || !done {
		t.Fatalf("stream: %d content chunks, done %v", chunks, done)
	}
}

// deploymentStatus is the part of `capyctl status deployment --json` the
// test reads.
type deploymentStatus struct {
	State     string `json:"state"`
	Instances []struct {
		PID int `json:"pid"`
	} `json:"instances"`
}

func status(t *testing.T, r *harness.Role, name string) deploymentStatus {
	t.Helper()
	out, errOut, code := r.CLI("status", "deployment", name, "--json")
	if code != 0 {
		t.Fatalf("status: exit %d: %s", code, errOut)
	}
	var st deploymentStatus
	if err := json.Unmarshal([]byte(out), &st); err != nil {
		t.Fatalf("status json: %v\n%s", err, out)
	}
	return st
}

func deploymentState(t *testing.T, r *harness.Role, name string) string {
	return status(t, r, name).State
}

func enginePID(t *testing.T, r *harness.Role, name string) int {
	t.Helper()
	st := status(t, r, name)
	if len(st.Instances) != 1 || st.Instances[0].PID == 0 {
		t.Fatalf("status %+v: want one instance with a pid", st)
	}
	return st.Instances[0].PID
}

// TestProtocol_OneLoadsBesideANewerOne is the compatibility promise of the
// driver-author guide: this driver, built against protocol 1, keeps
// loading when the core also speaks a newer protocol. The core's side here
// offers protocol 1 and a test-only protocol 2 through go-plugin's
// VersionedPlugins; the driver serves 1 only, so 1 is negotiated and every
// call works.
func TestProtocol_OneLoadsBesideANewerOne(t *testing.T) {
	bin := driverBinary(t)
	core := sdkplugin.VersionedPlugins(nil)
	core[2] = goplugin.PluginSet{sdkplugin.PluginName: &sdkplugin.GRPCDriverPlugin{}} // the test-only newer protocol
	client := goplugin.NewClient(&goplugin.ClientConfig{
		HandshakeConfig:  sdkplugin.Handshake,
		VersionedPlugins: core,
		Cmd:              exec.Command(bin),
		AllowedProtocols: []goplugin.Protocol{goplugin.ProtocolGRPC},
		Logger:           hclog.NewNullLogger(),
	})
	defer client.Kill()
	rpc, err := client.Client()
	if err != nil {
		t.Fatalf("a protocol 1 driver did not load beside protocol 2: %v", err)
	}
	if v := client.NegotiatedVersion(); v != 1 {
		t.Fatalf("negotiated protocol %d, want 1", v)
	}
	raw, err := rpc.Dispense(sdkplugin.PluginName)
	if err != nil {
		t.Fatal(err)
	}
	desc, err := raw.(sdk.Driver).Describe(context.Background(), &sdk.DescribeRequest{})
	if err != nil || desc.Name != Family || desc.Protocol != 1 {
		t.Fatalf("Describe over protocol 1: %v %v", desc, err)
	}

	// The same driver and a core that no longer speaks protocol 1 do not
	// agree on any: the driver is refused, never half-loaded.
	newer := goplugin.NewClient(&goplugin.ClientConfig{
		HandshakeConfig:  sdkplugin.Handshake,
		VersionedPlugins: map[int]goplugin.PluginSet{2: core[2]},
		Cmd:              exec.Command(bin),
		AllowedProtocols: []goplugin.Protocol{goplugin.ProtocolGRPC},
		Logger:           hclog.NewNullLogger(),
	})
	defer newer.Kill()
	if _, err := newer.Client(); err == nil {
		t.Fatal("a core of protocol 2 only loaded a protocol 1 driver")
	}
}

// TestGuide_QuotesTheDriver keeps the driver-author guide's walk-through
// true: every code block marked as quoted from driver.go appears in it, line
// after line in order (blanks and spacing aside).
func TestGuide_QuotesTheDriver(t *testing.T) {
	guide, err := os.ReadFile("../../content/guides/driver-author.md")
	if err != nil {
		t.Fatal(err)
	}
	src, err := os.ReadFile("driver.go")
	if err != nil {
		t.Fatal(err)
	}
	norm := func(s string) string { return strings.Join(strings.Fields(s), " ") }
	var lines []string
	for _, l := range strings.Split(string(src), "\n") {
		if n := norm(l); n != "" && !strings.HasPrefix(n, "//") {
			lines = append(lines, n)
		}
	}
	const marker = "<!-- from: website/examples/driver/driver.go -->\n```go\n"
	blocks := strings.Split(string(guide), marker)[1:]
	if len(blocks) < 10 {
		t.Fatalf("the guide quotes driver.go %d times; the walk-through lost its steps", len(blocks))
	}
	for _, b := range blocks {
		code, _, _ := strings.Cut(b, "```")
		at := 0
		for _, l := range strings.Split(code, "\n") {
			n := norm(l)
			if n == "" {
				continue
			}
			i := slices.Index(lines[at:], n)
			if i < 0 {
				t.Errorf("the guide quotes a line driver.go does not have (in this order): %q", l)
				break
			}
			at += i + 1
		}
	}
}
