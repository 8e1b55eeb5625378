// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package command

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"time"

	"github.com/capyctl/capyctl/core/agent"
	"github.com/capyctl/capyctl/core/api/client"
	"github.com/capyctl/capyctl/core/api/wire"
	"github.com/capyctl/capyctl/core/structs"
)

// devServer is one server of dev --servers: the first runs in dev's own
// process (cmd nil), the others are processes that joined it.
type devServer struct {
	name       string
	dir        string
	inference  string
	management string
	cmd        *exec.Cmd
	done       chan struct{}
}

// devServerName is the name of dev's server i (0-based) in a cluster of n:
// "dev-server" alone, as before --servers.
func devServerName(i, n int) string {
	if n <= 1 {
		return "dev-server"
	}
	return fmt.Sprintf("dev-server-%d", i+1)
}

// startDevServers starts servers 2..n as processes, each joining the
// first with a server join token (in a file, owner-only) and sharing its
// credentials (one API key and admin token for every endpoint), and
// waits until each is a voter. The first server is r.
func startDevServers(ctx context.Context, cl *client.Client, r agent.Running, exe, stateDir string, n int) ([]*devServer, error) {
	out := []*devServer{{name: devServerName(0, n), dir: stateDir, inference: r.InferenceAddr(), management: r.ManagementAddr()}}
	creds := &client.Credentials{APIKey: r.APIKey(), AdminToken: r.AdminToken()}
	for i := 1; i < n; i++ {
		s, err := startDevServer(ctx, cl, creds, exe, stateDir, devServerName(i, n))
		if s != nil {
			out = append(out, s)
		}
		if err != nil {
			return out, err
		}
		if err := waitDevServer(ctx, cl, s, i+1); err != nil {
			return out, err
		}
	}
	return out, nil
}

func startDevServer(ctx context.Context, cl *client.Client, creds *client.Credentials, exe, stateDir, name string) (*devServer, error) {
	tok, err := cl.CreateJoinToken(ctx, wire.JoinTokenRequest{TTL: "5m", Role: "server"})
	if err != nil {
		return nil, err
	}
	dir := filepath.Join(stateDir, "servers", name)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, structs.Wrap(structs.CodeInternal, err, "create %s", dir)
	}
	if err := client.WriteCredentials(dir, creds); err != nil {
		return nil, structs.Wrap(structs.CodeInternal, err, "write %s's credentials", name)
	}
	tokFile := filepath.Join(dir, "server-join-token")
	if err := os.WriteFile(tokFile, []byte(tok.Token+"\n"), 0o600); err != nil {
		return nil, structs.Wrap(structs.CodeInternal, err, "write %s's join token", name)
	}
	logf, err := os.OpenFile(filepath.Join(dir, "server.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, structs.Wrap(structs.CodeInternal, err, "open the server's log")
	}
	cmd := exec.Command(exe, "start", "server", "--state-dir", dir, "--join", tok.ClusterAddress, "--join-token-file", tokFile,
		"--hostname", name, "--listen", "127.0.0.1:0", "--management-listen", "127.0.0.1:0", "--cluster-listen", "127.0.0.1:0",
		"--set", "host_heartbeat=1s", "--log-format", "json")
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		logf.Close()
		return nil, structs.Wrap(structs.CodeInternal, err, "start server %s", name)
	}
	s := &devServer{name: name, dir: dir, cmd: cmd, done: make(chan struct{})}
	go func() {
		_ = cmd.Wait()
		logf.Close()
		close(s.done)
	}()
	return s, nil
}

// waitDevServer waits until s serves its management API and the cluster
// counts voters voters.
func waitDevServer(ctx context.Context, cl *client.Client, s *devServer, voters int) error {
	deadline := time.Now().Add(time.Minute)
	for {
		if s.management == "" {
			if ri, err := client.ReadRunInfo(s.dir); err == nil && ri.PID == s.cmd.Process.Pid && ri.Management != "" {
				s.inference, s.management = ri.Inference, ri.Management
			}
		}
		if s.management != "" {
			if list, err := cl.Servers(ctx); err == nil && list.Voters >= voters && list.Leader != "" {
				return nil
			}
		}
		select {
		case <-s.done:
			return structs.Errf(structs.CodeLaunchFailed, "server %s exited while joining; its log: %s", s.name, filepath.Join(s.dir, "server.log"))
		default:
		}
		if time.Now().After(deadline) {
			return structs.Errf(structs.CodeStartupTimeout, "server %s did not join within a minute; its log: %s", s.name, filepath.Join(s.dir, "server.log"))
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// stopDevServers stops the server processes (not the first, dev's own).
func stopDevServers(ctx context.Context, servers []*devServer) {
	for _, s := range servers {
		if s.cmd != nil {
			_ = s.cmd.Process.Signal(syscall.SIGTERM)
		}
	}
	for _, s := range servers {
		if s.cmd == nil {
			continue
		}
		select {
		case <-s.done:
		case <-ctx.Done():
			_ = syscall.Kill(-s.cmd.Process.Pid, syscall.SIGKILL)
			<-s.done
		}
	}
}
