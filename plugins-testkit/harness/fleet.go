// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package harness

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/capyctl/capyctl/core/api/wire"
)

// StartServer starts `capyctl start server` on loopback ports (its cluster
// listener too) and waits until its management API answers.
func StartServer(t testing.TB, opts Options) *Role {
	t.Helper()
	opts.Role = "server"
	r := StartStandalone(t, opts)
	_, r.ClusterAddr = r.JoinToken("1m")
	return r
}

// JoinToken makes a one-time join token on a server role through its CLI
// (ttl "" for the default) and returns it with the address hosts dial.
func (r *Role) JoinToken(ttl string) (token, cluster string) {
	r.t.Helper()
	args := []string{"create", "join-token", "--json"}
	if ttl != "" {
		args = append(args, "--ttl", ttl)
	}
	out, errOut, code := r.retryNotLeader(args...)
	if code != 0 {
		r.t.Fatalf("create join-token: exit %d: %s", code, errOut)
	}
	var tok wire.JoinToken
	if err := json.Unmarshal([]byte(out), &tok); err != nil {
		r.t.Fatalf("create join-token --json: %v\n%s", err, out)
	}
	return tok.Token, tok.ClusterAddress
}

// HostOptions configure StartHost.
type HostOptions struct {
	Options
	// Name is the host's name (--hostname).
	Name string
	// GPU is the host's simulated GPU (SimGPU{} : one 24 GiB card).
	GPU SimGPU
}

// StartHost joins a new host to server with a fresh join token and waits
// until the host serves. The token travels in CAPYCTL_JOIN_TOKEN, as a
// systemd unit's environment file gives it.
func StartHost(t testing.TB, server *Role, o HostOptions) *Role {
	t.Helper()
	token, cluster := server.JoinToken("")
	return StartHostWith(t, cluster, token, o)
}

// StartHostWith starts a host role that dials cluster (joining with token
// when it holds no certificate yet).
func StartHostWith(t testing.TB, cluster, token string, o HostOptions) *Role {
	t.Helper()
	opts := o.Options
	opts.Role = "host"
	opts.Args = append(append([]string{"--server", cluster, "--hostname", o.Name}, o.GPU.SimArgs()...), opts.Args...)
	if !strings.Contains(strings.Join(opts.Args, " "), "peer") {
		// Every test host is this machine: group ranks meet on loopback,
		// named as an operator names a host's group link (no default).
		opts.Args = append(opts.Args, "--peer-address", "127.0.0.1")
	}
	if token != "" {
		opts.Env = append(opts.Env, "CAPYCTL_JOIN_TOKEN="+token)
	}
	return StartStandalone(t, opts)
}

// StartFirstServer starts the first server of a cluster of expect servers
// (--bootstrap-expect, --hostname name): it bootstraps raft alone and is
// its leader once the role is up.
func StartFirstServer(t testing.TB, name string, expect int, opts Options) *Role {
	t.Helper()
	opts.Role = "server"
	opts.Args = append([]string{"--bootstrap-expect", fmt.Sprint(expect), "--hostname", name}, opts.Args...)
	r := StartStandalone(t, opts)
	r.ClusterAddr = r.selfClusterAddr()
	return r
}

// JoinServer starts a server named name that joins the cluster through
// via's cluster address, with a server join token made on via (a follower
// relays it to the leader), given in a file as an operator would.
func JoinServer(t testing.TB, via *Role, name string, opts Options) *Role {
	t.Helper()
	out, errOut, code := via.retryNotLeader("create", "join-token", "--role", "server", "--json")
	if code != 0 {
		t.Fatalf("create join-token --role server: exit %d: %s", code, errOut)
	}
	var tok wire.JoinToken
	if err := json.Unmarshal([]byte(out), &tok); err != nil {
		t.Fatalf("create join-token --json: %v\n%s", err, out)
	}
	file := filepath.Join(t.TempDir(), "server-token")
	if err := os.WriteFile(file, []byte(tok.Token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	opts.Role = "server"
	opts.Args = append([]string{"--join", via.ClusterAddr, "--join-token-file", file, "--hostname", name}, opts.Args...)
	r := StartStandalone(t, opts)
	r.ClusterAddr = r.selfClusterAddr()
	return r
}

// retryNotLeader runs a CLI command against r, again while it answers
// not_leader (exit 28, retryable: a cluster electing its leader, as when
// a second server just joined) for up to 30 s, as an operator would.
func (r *Role) retryNotLeader(args ...string) (string, string, int) {
	r.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		out, errOut, code := r.CLI(args...)
		if code != 28 || time.Now().After(deadline) {
			return out, errOut, code
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// Servers is `list servers --json` on a server.
func (r *Role) Servers() (wire.ServerList, error) {
	out, errOut, code := r.CLI("list", "servers", "--json")
	var list wire.ServerList
	if code != 0 {
		return list, fmt.Errorf("list servers: exit %d: %s", code, errOut)
	}
	if err := json.Unmarshal([]byte(out), &list); err != nil {
		return list, fmt.Errorf("list servers --json: %v\n%s", err, out)
	}
	return list, nil
}

// selfClusterAddr is the server's own cluster address as it lists itself
// (a restart binds it again: raft knows the server by it).
func (r *Role) selfClusterAddr() string {
	r.t.Helper()
	list, err := r.Servers()
	if err != nil {
		r.t.Fatal(err)
	}
	for _, s := range list.Servers {
		if s.Name == list.Self {
			return s.Address
		}
	}
	r.t.Fatalf("server %s does not list itself: %+v", list.Self, list)
	return ""
}
