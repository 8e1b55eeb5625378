// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package command

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/capyctl/capyctl/core/agent"
	"github.com/capyctl/capyctl/core/api/client"
	"github.com/capyctl/capyctl/core/api/wire"
	"github.com/capyctl/capyctl/core/jobspec"
	"github.com/capyctl/capyctl/core/structs"
)

// devHostCards are the simulated cards of dev's hosts, in turn: hosts of
// different sizes show placement (the most free card first).
var devHostCards = []string{"80GiB", "24GiB", "48GiB"}

// devHost is one host process of dev --hosts.
type devHost struct {
	name string
	dir  string
	cmd  *exec.Cmd
	done chan struct{}
}

// runDevFleet is dev --hosts N: a server role in this process and N host
// processes on loopback, joined over mutual TLS with one-time tokens, each
// with a simulated card and the fake engines; Ctrl-C stops the engines, the
// hosts and the server. With --servers M above 1 the server in this
// process is the first of a raft cluster of M (bootstrap_expect M) and
// M-1 server processes join it with server join tokens; the hosts join
// the first.
func (c *DevCommand) runDevFleet(stateDir, listen string, fake fakeEngine, n, servers int) int {
	logger, logPath, closeLog := devLogger(stateDir, c.Err)
	defer closeLog()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	exe, err := os.Executable()
	if err != nil {
		return c.Fail(structs.Wrap(structs.CodeInternal, err, "find own executable"))
	}
	var hosts []*devHost
	var srvs []*devServer
	var cl *client.Client
	expect := 0
	if servers > 1 {
		expect = servers
	}
	err = agent.Run(ctx, agent.Options{
		Settings: agent.Settings{
			Role: "server", StateDir: stateDir, Listen: listen, ManagementListen: "127.0.0.1:0",
			ClusterListen: "127.0.0.1:0", HostHeartbeat: time.Second, Hostname: devServerName(0, servers), BootstrapExpect: expect,
		},
		Logger: logger,
		Ready: func(ctx context.Context, r agent.Running) error {
			cl = client.New(r.ManagementAddr(), r.AdminToken())
			var err error
			if srvs, err = startDevServers(ctx, cl, r, exe, stateDir, servers); err != nil {
				return err
			}
			for i := 0; i < n; i++ {
				h, err := startDevHost(ctx, cl, exe, stateDir, i)
				if h != nil {
					hosts = append(hosts, h)
				}
				if err != nil {
					return err
				}
			}
			if err := waitDevHosts(ctx, cl, hosts); err != nil {
				return err
			}
			if err := devSetup(ctx, cl, stateDir, fake); err != nil {
				return err
			}
			if len(hosts) >= 2 {
				if err := devSetupGroup(ctx, cl, stateDir, fake.path, hosts[0].name, hosts[1].name); err != nil {
					return err
				}
			}
			c.devFleetReady(r, stateDir, logPath, hosts, srvs)
			return nil
		},
		Stopping: func() (context.Context, context.CancelFunc) {
			if !c.JSON() {
				fmt.Fprintln(c.Err, "\nStopping: engines, hosts and the servers...")
			}
			sctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			stopDevFleet(sctx, cl, hosts)
			stopDevServers(sctx, srvs)
			return sctx, cancel
		},
	})
	if err != nil {
		stopDevFleet(context.Background(), cl, hosts)
		sctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		stopDevServers(sctx, srvs)
		cancel()
		return c.Fail(err)
	}
	return 0
}

// startDevHost joins host i: a fresh join token, a state directory of its
// own, the shared models root, its own engine ports and simulated card.
func startDevHost(ctx context.Context, cl *client.Client, exe, stateDir string, i int) (*devHost, error) {
	tok, err := cl.CreateJoinToken(ctx, wire.JoinTokenRequest{TTL: "5m"})
	if err != nil {
		return nil, err
	}
	name := fmt.Sprintf("dev-gpu-%d", i+1)
	dir := filepath.Join(stateDir, "hosts", name)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, structs.Wrap(structs.CodeInternal, err, "create %s", dir)
	}
	logf, err := os.OpenFile(filepath.Join(dir, "host.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, structs.Wrap(structs.CodeInternal, err, "open the host's log")
	}
	first := 8300 + i*50
	cmd := exec.Command(exe, "start", "host", "--state-dir", dir, "--server", tok.ClusterAddress, "--hostname", name,
		"--listen", "127.0.0.1:0", "--management-listen", "127.0.0.1:0", "--models-root", filepath.Join(stateDir, "models"),
		"--engine-ports", fmt.Sprintf("%d-%d", first, first+49), "--gpu-provider", "simulated",
		"--set", "gpu.sim_device_memory="+devHostCards[i%len(devHostCards)], "--log-format", "json",
		// The demo group's ranks meet on loopback: every dev host is this
		// machine (a real host names its address on the GPU hosts' link).
		"--peer-address", "127.0.0.1")
	// The token travels in the environment, never on the command line.
	cmd.Env = append(os.Environ(), "CAPYCTL_JOIN_TOKEN="+tok.Token)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		logf.Close()
		return nil, structs.Wrap(structs.CodeInternal, err, "start host %s", name)
	}
	h := &devHost{name: name, dir: dir, cmd: cmd, done: make(chan struct{})}
	go func() {
		_ = cmd.Wait()
		logf.Close()
		close(h.done)
	}()
	return h, nil
}

// waitDevHosts waits until every host is ready on the server.
func waitDevHosts(ctx context.Context, cl *client.Client, hosts []*devHost) error {
	deadline := time.Now().Add(time.Minute)
	for {
		list, err := cl.Hosts(ctx)
		ready := 0
		if err == nil {
			for _, h := range list {
				if h.State == wire.HostReady {
					ready++
				}
			}
		}
		if ready == len(hosts) {
			return nil
		}
		for _, h := range hosts {
			select {
			case <-h.done:
				return structs.Errf(structs.CodeLaunchFailed, "host %s exited while joining; its log: %s", h.name, filepath.Join(h.dir, "host.log"))
			default:
			}
		}
		if time.Now().After(deadline) {
			return structs.Errf(structs.CodeStartupTimeout, "%d of %d hosts joined within a minute", ready, len(hosts))
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// devGroupName is dev --hosts's demo group: one model across its first two
// hosts, started by the first request that names it.
const devGroupName = "group-demo"

// devGroupSpec is the demo group on the fake vLLM: one rank on each host,
// tensor_parallel 2; it parks deep and wakes as a whole.
const devGroupSpec = `deployment "group-demo" {
  engine = "vllm-group"
  topology {
    tensor_parallel = 2
  }
  placement {
    hosts = [%q, %q]
  }
  model {
    path = "group-demo"
  }
  engine_config {
    memory {
      request = "12GiB"
      startup = "12GiB"
    }
  }
}
`

// devSetupGroup registers the fake vLLM for groups (no weights knob: each
// rank holds its share of what the model files say) and deploys the demo
// group on two hosts.
func devSetupGroup(ctx context.Context, cl *client.Client, stateDir, fakePath, head, worker string) error {
	venv, err := devFakeVenv(stateDir, fakePath)
	if err != nil {
		return structs.Wrap(structs.CodeInternal, err, "create the fake vLLM environment")
	}
	if _, err := cl.AddEngine(ctx, wire.EngineAddRequest{Name: "vllm-group", Path: venv,
		Env: devFakeEnv(map[string]string{"CAPYCTL_FAKE_TOKEN_RATE": "200"})}); err != nil && !structs.HasCode(err, structs.CodeEngineExists) {
		return err
	}
	dir := filepath.Join(stateDir, "models", devGroupName)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return structs.Wrap(structs.CodeInternal, err, "create a demo model directory")
	}
	for n, body := range devModelFiles {
		if err := os.WriteFile(filepath.Join(dir, n), []byte(body), 0o600); err != nil {
			return structs.Wrap(structs.CodeInternal, err, "write a demo model")
		}
	}
	if _, err := cl.Deployment(ctx, devGroupName); err == nil {
		return nil
	}
	specs, err := jobspec.Parse([]byte(fmt.Sprintf(devGroupSpec, head, worker)), "dev-group.hcl")
	if err != nil {
		return err
	}
	_, err = cl.Deploy(ctx, wire.DeployRequest{Deployment: *specs[0]}, "")
	return err
}

// stopDevFleet stops every deployment (their engines, proven gone), then
// the host processes.
func stopDevFleet(ctx context.Context, cl *client.Client, hosts []*devHost) {
	if cl != nil {
		if list, err := cl.Deployments(ctx); err == nil {
			for _, d := range list {
				_, _ = cl.Action(ctx, d.Name, wire.ActionRequest{Action: "stop", Wait: true})
			}
		}
	}
	for _, h := range hosts {
		_ = h.cmd.Process.Signal(syscall.SIGTERM)
	}
	for _, h := range hosts {
		select {
		case <-h.done:
		case <-ctx.Done():
			_ = syscall.Kill(-h.cmd.Process.Pid, syscall.SIGKILL)
			<-h.done
		}
	}
}

// devFleetReady prints what dev --hosts runs and how to use it.
func (c *DevCommand) devFleetReady(r agent.Running, stateDir, logPath string, hosts []*devHost, srvs []*devServer) {
	key, addr := r.APIKey(), r.InferenceAddr()
	dashboard := "http://" + r.ManagementAddr() + "/dashboard/"
	names := make([]string, 0, len(hosts))
	for i, h := range hosts {
		names = append(names, fmt.Sprintf("%s (%s card)", h.name, devHostCards[i%len(devHostCards)]))
	}
	if c.JSON() {
		hostNames := make([]string, 0, len(hosts))
		for _, h := range hosts {
			hostNames = append(hostNames, h.name)
		}
		out := map[string]string{
			"endpoint": "http://" + addr + "/v1", "api_key": key, "state_dir": stateDir, "role": "server",
			"management": "http://" + r.ManagementAddr(), "dashboard": dashboard, "hosts": strings.Join(hostNames, ","), "model": "demo",
			"switch_models": "chat-a,chat-b",
		}
		if len(hosts) >= 2 {
			out["group_model"] = devGroupName
		}
		if len(srvs) > 1 {
			var names, endpoints, mgmts, dashboards []string
			for _, s := range srvs {
				names, endpoints, mgmts = append(names, s.name), append(endpoints, "http://"+s.inference+"/v1"), append(mgmts, "http://"+s.management)
				dashboards = append(dashboards, "http://"+s.management+"/dashboard/")
			}
			out["servers"], out["server_endpoints"], out["server_managements"] = strings.Join(names, ","), strings.Join(endpoints, ","), strings.Join(mgmts, ",")
			out["server_dashboards"] = strings.Join(dashboards, ",")
		}
		c.PrintJSON(out)
		return
	}
	self := selfCommand()
	if len(srvs) > 1 {
		fmt.Fprintf(c.Out, "\nCapyCTL dev is running: a cluster of %d servers (raft) and %d hosts on loopback, joined over mutual TLS\n", len(srvs), len(hosts))
	} else {
		fmt.Fprintf(c.Out, "\nCapyCTL dev is running: a server and %d hosts on loopback, joined over mutual TLS\n", len(hosts))
	}
	fmt.Fprintf(c.Out, "(simulated GPUs, fake engines, no GPU needed).\n\n")
	fmt.Fprintf(c.Out, "Endpoint: http://%s/v1\n", addr)
	fmt.Fprintf(c.Out, "API key: %s\n", key)
	fmt.Fprintf(c.Out, "Dashboard: %s\n", dashboard)
	fmt.Fprintf(c.Out, "          (log in with the admin token: the admin_token line of %s; one token for every server)\n", filepath.Join(stateDir, client.CredentialsFile))
	fmt.Fprintf(c.Out, "Hosts:    %s\n", strings.Join(names, ", "))
	if len(srvs) > 1 {
		fmt.Fprintf(c.Out, "Servers (one API key for all; the hosts link to %s, the leader at start):\n", srvs[0].name)
		for _, s := range srvs {
			fmt.Fprintf(c.Out, "  %-13s endpoint http://%s/v1  dashboard http://%s/dashboard/  state %s\n", s.name, s.inference, s.management, s.dir)
		}
		fmt.Fprintf(c.Out, "  %s list servers shows the raft state; %s snapshot save FILE backs the state up.\n", self, self)
	}
	fmt.Fprintf(c.Out, "State:    %s (each host's under hosts/)\n", stateDir)
	if logPath != "" {
		fmt.Fprintf(c.Out, "Log:      %s (each host's host.log beside its state; warnings and errors show here)\n", logPath)
	}
	fmt.Fprintf(c.Out, "CLI:      CAPYCTL_STATE_DIR=%s %s list hosts\n\n", stateDir, self)
	fmt.Fprintf(c.Out, "Try a streamed chat request (the server relays it to the host that runs demo):\n\n")
	fmt.Fprintf(c.Out, "  curl -N http://%s/v1/chat/completions \\\n    -H 'Authorization: Bearer %s' \\\n    -H 'Content-Type: application/json' \\\n    -d '{\"model\":\"demo\",\"stream\":true,\"messages\":[{\"role\":\"user\",\"content\":\"Hello\"}]}'\n\n", addr, key)
	if len(hosts) >= 2 {
		fmt.Fprintf(c.Out, "One model across two machines: %s runs one vLLM rank on %s (the head) and one on %s;\n", devGroupName, hosts[0].name, hosts[1].name)
		fmt.Fprintf(c.Out, "its first request starts both (\"model\":%q), and %s status deployment %s lists its members.\n\n", devGroupName, self, devGroupName)
	}
	what := "the server"
	if len(srvs) > 1 {
		what = "the servers"
	}
	fmt.Fprintf(c.Out, "Press Ctrl-C to stop: the engines, the hosts and %s stop and nothing is left behind.\n", what)
}
