// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package command

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/capyctl/capyctl/core/agent"
	"github.com/capyctl/capyctl/core/api/client"
	"github.com/capyctl/capyctl/core/api/wire"
	"github.com/capyctl/capyctl/core/jobspec"
	"github.com/capyctl/capyctl/core/structs"
)

// DevCommand runs the embedded default: a standalone role in a temporary
// state directory, the fake engine built into capyctl registered, a demo
// deployment started, and a ready-to-paste curl printed.
type DevCommand struct{ *Meta }

// Synopsis implements cli.Command.
func (c *DevCommand) Synopsis() string {
	return "Run a standalone role with fake engines (no GPU needed) to try CapyCTL"
}

// Help implements cli.Command.
func (c *DevCommand) Help() string {
	return `Usage: capyctl dev [--listen ADDR] [--state-dir DIR] [--sim-devices N] [--sim-device-memory SIZE] [--hosts N [--servers N]]

  Starts a standalone role in a temporary state directory with the fake
  engine built into capyctl (capyctl fake-engine) registered as a custom
  engine and as a fake vLLM, deploys a demo model and
  waits until it is ready, then prints the endpoint, the API key, the
  dashboard's address (log in with the admin token from the state
  directory's credentials file) and a curl line. Ctrl-C stops the engines and the role and leaves no process
  (and, for a temporary state directory, no file) behind.

  The role runs on a simulated GPU (one discrete 24 GiB card beside the
  host's RAM unless the options below say otherwise): the fake engines
  allocate on it, the memory ledger charges it, and capyctl status
  deployment demo shows both.

  With --json, one JSON object says the same (endpoint, api_key,
  state_dir, management, dashboard, gpu, model).

Dev Options:

  --listen ADDR             Inference address (default 127.0.0.1:8443).
  --state-dir DIR           Keep the state here instead of a temporary directory.
  --fake-engine PATH        Run this fake engine program instead of the one
                            built into capyctl (the testkit's
                            capyctl-fake-engine, for instance).
  --gpu-provider P          simulated (default), auto, nvml or none.
  --sim-devices N           Simulated cards (default 1).
  --sim-device-memory SIZE  Memory of each simulated card (default 24GiB).
  --sim-unified             Simulate one unified memory pool instead of cards.
  --hosts N                 Run a server and N host processes instead (1..8):
                            the hosts join over mutual TLS with one-time
                            tokens and get simulated cards of 80, 24 and
                            48 GiB in turn; the --sim-* options then do not
                            apply.
  --servers N               With --hosts: run a cluster of N servers (raft,
                            1..5, default 1): the first in this process with
                            --bootstrap-expect N, the others as processes
                            joined with server join tokens and sharing its
                            API key and admin token; the hosts join the
                            first. Every server's endpoint and management
                            address are printed (and in --json: servers,
                            server_endpoints, server_managements).
`
}

// Run implements cli.Command.
func (c *DevCommand) Run(args []string) int {
	fs := c.FlagSet("dev")
	var listen, fake, provider, simMemory string
	var simDevices, hosts, servers int
	var simUnified bool
	fs.StringVar(&listen, "listen", "127.0.0.1:8443", "")
	fs.StringVar(&fake, "fake-engine", "", "")
	fs.StringVar(&provider, "gpu-provider", "simulated", "")
	fs.IntVar(&simDevices, "sim-devices", 1, "")
	fs.StringVar(&simMemory, "sim-device-memory", "24GiB", "")
	fs.BoolVar(&simUnified, "sim-unified", false, "")
	fs.IntVar(&hosts, "hosts", 0, "")
	fs.IntVar(&servers, "servers", 1, "")
	if _, code := c.parse(fs, args); code != 0 {
		return helpOr(code)
	}
	simBytes, err := structs.ParseByteSize(simMemory)
	if err != nil || simBytes <= 0 {
		return c.Usage("--sim-device-memory %q is not a size (like 24GiB)", simMemory)
	}
	if simDevices < 1 || simDevices > 16 {
		return c.Usage("--sim-devices %d is outside 1..16", simDevices)
	}
	if hosts < 0 || hosts > 8 {
		return c.Usage("--hosts %d is outside 0..8", hosts)
	}
	if servers < 1 || servers > 5 {
		return c.Usage("--servers %d is outside 1..5", servers)
	}
	if servers > 1 && hosts == 0 {
		return c.Usage("--servers %d needs --hosts N: a cluster of servers places engines on hosts", servers)
	}
	stateDir := c.stateDir
	temp := false
	if stateDir == "" {
		d, err := os.MkdirTemp("", "capyctl-dev-")
		if err != nil {
			return c.Fail(structs.Wrap(structs.CodeInternal, err, "create a temporary state directory"))
		}
		stateDir, temp = d, true
	}
	if temp {
		defer os.RemoveAll(stateDir)
	}
	fakeEng, err := findFakeEngine(fake)
	if err != nil {
		return c.Fail(err)
	}
	if hosts > 0 {
		return c.runDevFleet(stateDir, listen, fakeEng, hosts, servers)
	}
	logger, logPath, closeLog := devLogger(stateDir, c.Err)
	defer closeLog()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	err = agent.Run(ctx, agent.Options{
		Settings: agent.Settings{
			Role: "standalone", StateDir: stateDir, Listen: listen, ManagementListen: "127.0.0.1:0",
			ModelsRoot: filepath.Join(stateDir, "models"),
			GPU: agent.GPUSettings{
				Provider: provider, SimDevices: simDevices, SimDeviceMemory: int64(simBytes), SimUnified: simUnified,
			},
		},
		Logger:      logger,
		StopEngines: true,
		Ready: func(ctx context.Context, r agent.Running) error {
			// The CLI is a client: dev sets the role up through its
			// management API, as an operator's commands would.
			cl := client.New(r.ManagementAddr(), r.AdminToken())
			if err := devSetup(ctx, cl, stateDir, fakeEng); err != nil {
				return err
			}
			c.devReady(r, stateDir, logPath)
			return nil
		},
		Stopping: func() (context.Context, context.CancelFunc) {
			if !c.JSON() {
				fmt.Fprintln(c.Err, "\nStopping: engines, drivers and the role...")
			}
			return context.WithTimeout(context.Background(), 2*time.Minute)
		},
	})
	if err != nil {
		return c.Fail(err)
	}
	return 0
}

// devReady prints what dev runs and how to use it.
func (c *DevCommand) devReady(r agent.Running, stateDir, logPath string) {
	key := r.APIKey()
	addr := r.InferenceAddr()
	// The dashboard is served under /dashboard/ on the management listener
	// (core/api/dashboard.Prefix).
	dashboard := "http://" + r.ManagementAddr() + "/dashboard/"
	if c.JSON() {
		c.PrintJSON(map[string]string{
			"endpoint": "http://" + addr + "/v1", "api_key": key, "state_dir": stateDir,
			"management": "http://" + r.ManagementAddr(), "dashboard": dashboard, "gpu": r.GPUKind(), "model": "demo",
			"switch_models": "chat-a,chat-b",
		})
		return
	}
	self := selfCommand()
	fmt.Fprintf(c.Out, "\nCapyCTL dev is running (standalone role, fake engine, %s GPU, no GPU needed).\n\n", r.GPUKind())
	fmt.Fprintf(c.Out, "Endpoint: http://%s/v1\n", addr)
	fmt.Fprintf(c.Out, "API key: %s\n", key)
	fmt.Fprintf(c.Out, "Dashboard: %s\n", dashboard)
	fmt.Fprintf(c.Out, "          (log in with the admin token: the admin_token line of %s)\n", filepath.Join(stateDir, client.CredentialsFile))
	for i, line := range r.GPULines() {
		label := "GPUs:"
		if i > 0 {
			label = ""
		}
		fmt.Fprintf(c.Out, "%-9s %s\n", label, line)
	}
	fmt.Fprintf(c.Out, "State:    %s\n", stateDir)
	if logPath != "" {
		fmt.Fprintf(c.Out, "Log:      %s (warnings and errors show here)\n", logPath)
	}
	fmt.Fprintf(c.Out, "CLI:      CAPYCTL_STATE_DIR=%s %s status deployment demo\n\n", stateDir, self)
	fmt.Fprintf(c.Out, "Try a streamed chat request:\n\n")
	fmt.Fprintf(c.Out, "  curl -N http://%s/v1/chat/completions \\\n    -H 'Authorization: Bearer %s' \\\n    -H 'Content-Type: application/json' \\\n    -d '{\"model\":\"demo\",\"stream\":true,\"messages\":[{\"role\":\"user\",\"content\":\"Hello\"}]}'\n\n", addr, key)
	fmt.Fprintf(c.Out, "Two more models, chat-a and chat-b, run on a fake vLLM and do not fit on the\n")
	fmt.Fprintf(c.Out, "simulated card together. Ask one, then the other: CapyCTL wakes the one you\n")
	fmt.Fprintf(c.Out, "name and parks the other to make room (%s status deployment chat-a).\n", self)
	fmt.Fprintf(c.Out, "The dashboard's playground asks any of them from the browser.\n\n")
	fmt.Fprintf(c.Out, "Press Ctrl-C to stop: the engines stop and nothing is left behind.\n")
}

// fakeEngine is the program dev's engines run: capyctl itself (the
// hidden fake-engine command) or a fake engine program of its own.
type fakeEngine struct {
	// path is the program.
	path string
	// args come before the fake engine's own arguments ("fake-engine"
	// for capyctl).
	args []string
}

// findFakeEngine returns the fake engine: --fake-engine's program, or
// this capyctl.
func findFakeEngine(flagValue string) (fakeEngine, error) {
	if flagValue != "" {
		p, err := filepath.Abs(flagValue)
		if err != nil {
			return fakeEngine{}, structs.Wrap(structs.CodeEngineNotFound, err, "--fake-engine %s", flagValue)
		}
		if st, err := os.Stat(p); err != nil || st.IsDir() {
			return fakeEngine{}, structs.Errf(structs.CodeEngineNotFound, "--fake-engine %s is not a program", flagValue)
		}
		return fakeEngine{path: p}, nil
	}
	exe, err := os.Executable()
	if err != nil {
		return fakeEngine{}, structs.Wrap(structs.CodeInternal, err, "find own executable")
	}
	return fakeEngine{path: exe, args: []string{fakeEngineName}}, nil
}

// manifest is the fake engine's custom-engine manifest: devManifestArgs
// after the program's own leading arguments.
func (f fakeEngine) manifest() string {
	args := make([]string, 0, len(f.args)+len(devManifestArgs))
	for _, a := range append(append([]string{}, f.args...), devManifestArgs...) {
		args = append(args, strconv.Quote(a))
	}
	return "# The fake OpenAI-compatible engine of capyctl dev, as a custom engine.\n" +
		"args = [" + strings.Join(args, ", ") + "]\n" + devManifest
}

// devManifestArgs are the fake engine's arguments in the manifest.
var devManifestArgs = []string{"serve", "--host", "{{host}}", "--port", "{{port}}", "--served-name", "{{served_name}}",
	"--token-rate", "200", "--sim-weights", "3GiB", "--sim-kv", "512MiB"}

// devManifest is the rest of the fake engine's custom-engine manifest.
const devManifest = `api         = "chat"
health_path = "/health"
key_env     = "FAKE_ENGINE_API_KEY"
version     = "testkit"
idle {
  metrics_path = "/metrics"
  running      = "fake:requests_running"
  waiting      = "fake:requests_waiting"
}
`

// devSpec is the demo deployment.
const devSpec = `deployment "demo" {
  engine = "fake"
  api    = "chat"
  model {
    path = "demo"
  }
  resources {
    gpu = "4GiB"
    ram = "1GiB"
  }
  engine_config {
    max_concurrent_requests = 8
  }
}
`

// devSwitchSpec are two models on the fake vLLM that do not fit on the
// simulated card together (14 GiB each of a 24 GiB card beside demo's 4
// GiB): requests for one and then the other show parking and waking.
const devSwitchSpec = `deployment "chat-a" {
  engine = "vllm"
  model {
    path = "chat-a"
  }
  engine_config {
    memory {
      request = "14GiB"
      startup = "14GiB"
    }
  }
}

deployment "chat-b" {
  engine = "vllm"
  model {
    path = "chat-b"
  }
  engine_config {
    memory {
      request = "14GiB"
      startup = "14GiB"
    }
  }
}
`

// devModelFiles are a small Qwen3-shaped model directory: the fake vLLM
// reads its config and holds the weights its knob says on the simulated
// card.
var devModelFiles = map[string]string{
	"config.json": `{"model_type":"qwen3","architectures":["Qwen3ForCausalLM"],"num_hidden_layers":28,"num_attention_heads":16,` +
		`"num_key_value_heads":8,"hidden_size":1024,"head_dim":128,"torch_dtype":"bfloat16","max_position_embeddings":40960}`,
	"tokenizer_config.json": `{"chat_template":"{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"}`,
	"README":                "A placeholder model for the testkit's fake vLLM.\n",
}

// devFakeVenv makes a Python environment whose interpreter is the fake
// engine (a link to it, run with CAPYCTL_FAKE_ENGINE=1 when it is capyctl:
// devFakeEnv): the vLLM driver runs `<venv>/bin/python -m
// vllm.entrypoints...` exactly as for a real vLLM and gets the fake vLLM
// flavour.
func devFakeVenv(dir, fakePath string) (string, error) {
	venv := filepath.Join(dir, "engines", "vllm-fake")
	site := filepath.Join(venv, "lib", "python3.12", "site-packages", "vllm-0.32.0.dist-info")
	if err := os.MkdirAll(filepath.Join(venv, "bin"), 0o700); err != nil {
		return "", err
	}
	if err := os.MkdirAll(site, 0o700); err != nil {
		return "", err
	}
	py := filepath.Join(venv, "bin", "python")
	_ = os.Remove(py)
	if err := os.Symlink(fakePath, py); err != nil {
		return "", err
	}
	files := map[string]string{
		"METADATA": "Metadata-Version: 2.1\nName: vllm\nVersion: 0.32.0\n\n",
		"RECORD":   "vllm/__init__.py,sha256=fake,1\n",
	}
	for n, body := range files {
		if err := os.WriteFile(filepath.Join(site, n), []byte(body), 0o600); err != nil {
			return "", err
		}
	}
	return venv, nil
}

// devSetup registers the fake engines and deploys the demo models: demo
// (started at once) and chat-a and chat-b (started by the first request
// that names each).
func devSetup(ctx context.Context, cl *client.Client, stateDir string, fake fakeEngine) error {
	if err := devSetupDemo(ctx, cl, stateDir, fake); err != nil {
		return err
	}
	venv, err := devFakeVenv(stateDir, fake.path)
	if err != nil {
		return structs.Wrap(structs.CodeInternal, err, "create the fake vLLM environment")
	}
	if _, err := cl.AddEngine(ctx, wire.EngineAddRequest{
		Name: "vllm", Path: venv,
		Env: devFakeEnv(map[string]string{"CAPYCTL_FAKE_SIM_WEIGHTS": "8GiB", "CAPYCTL_FAKE_TOKEN_RATE": "200"}),
	}); err != nil && !structs.HasCode(err, structs.CodeEngineExists) {
		return err
	}
	for _, name := range []string{"chat-a", "chat-b"} {
		dir := filepath.Join(stateDir, "models", name)
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return structs.Wrap(structs.CodeInternal, err, "create a demo model directory")
		}
		for n, body := range devModelFiles {
			if err := os.WriteFile(filepath.Join(dir, n), []byte(body), 0o600); err != nil {
				return structs.Wrap(structs.CodeInternal, err, "write a demo model")
			}
		}
	}
	specs, err := jobspec.Parse([]byte(devSwitchSpec), "dev-switch.hcl")
	if err != nil {
		return err
	}
	for _, spec := range specs {
		if _, err := cl.Deployment(ctx, spec.Name); err == nil {
			continue
		}
		if _, err := cl.Deploy(ctx, wire.DeployRequest{Deployment: *spec}, ""); err != nil {
			return err
		}
	}
	return nil
}

// devSetupDemo registers the generic fake engine and starts demo.
func devSetupDemo(ctx context.Context, cl *client.Client, stateDir string, fake fakeEngine) error {
	modelDir := filepath.Join(stateDir, "models", "demo")
	if err := os.MkdirAll(modelDir, 0o700); err != nil {
		return structs.Wrap(structs.CodeInternal, err, "create demo model directory")
	}
	_ = os.WriteFile(filepath.Join(modelDir, "README"), []byte("A placeholder model for the fake engine.\n"), 0o600)
	if _, err := cl.AddEngine(ctx, wire.EngineAddRequest{Name: "fake", Family: structs.FamilyCustom, Path: fake.path, Manifest: fake.manifest()}); err != nil {
		if !structs.HasCode(err, structs.CodeEngineExists) {
			return err
		}
	}
	specs, err := jobspec.Parse([]byte(devSpec), "dev.hcl")
	if err != nil {
		return err
	}
	for _, spec := range specs {
		if _, err := cl.Deployment(ctx, spec.Name); err == nil {
			continue
		}
		if _, err := cl.Deploy(ctx, wire.DeployRequest{Deployment: *spec}, ""); err != nil {
			return err
		}
		if _, err := cl.Action(ctx, spec.Name, wire.ActionRequest{Action: wire.ActionStart, Wait: true}); err != nil {
			return err
		}
	}
	return nil
}

// devFakeEnv is env with CAPYCTL_FAKE_ENGINE=1, which lets capyctl linked
// as a venv's bin/python run as the fake engine (FakeEngineEnv).
func devFakeEnv(env map[string]string) map[string]string {
	out := map[string]string{FakeEngineEnv: "1"}
	for k, v := range env {
		out[k] = v
	}
	return out
}
