// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package harness

import (
	"encoding/json"
	"testing"

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
	out, errOut, code := r.CLI(args...)
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
	if token != "" {
		opts.Env = append(opts.Env, "CAPYCTL_JOIN_TOKEN="+token)
	}
	return StartStandalone(t, opts)
}
