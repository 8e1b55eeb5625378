// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package command

// RoleStartCommand is `start server` and `start host`: the roles of a
// CapyCTL spread over several machines.
type RoleStartCommand struct {
	*Meta
	role string
}

// Synopsis implements cli.Command.
func (c *RoleStartCommand) Synopsis() string {
	if c.role == "server" {
		return "Run the server role: the endpoint, placement and the store for GPU hosts that join it"
	}
	return "Run the host role: this machine's GPUs and engines, joined to a server over mutual TLS"
}

// Help implements cli.Command.
func (c *RoleStartCommand) Help() string {
	if c.role == "server" {
		return `Usage: capyctl start server [--config FILE] [options]

  Runs the server of a CapyCTL spread over several machines: the
  OpenAI-compatible endpoint (listen), the management API (loopback), the
  store, and the cluster listener GPU hosts dial (cluster_listen, default
  0.0.0.0:8444; TLS 1.3 with client certificates from the server's own CA,
  kept owner-only in <state_dir>/pki). The server runs no engine: it places
  each deployment on hosts and relays every request to the host that runs
  it, over the connection the host opened.

  Join a host: capyctl create join-token prints a one-time token; on the
  host, capyctl start host --server ADDR --join-token-file FILE.

  Options (each also a setting of the config file and a CAPYCTL_* variable):
    --config FILE           The role's configuration (capyctl init server).
    --cluster-listen ADDR   The address hosts dial.
    --set cluster_advertise=HOST:PORT
                            The address hosts are told to dial, when it is
                            not cluster_listen's (NAT, a load balancer).
    --group-stall-timeout D How long a group's bring-up may take until its
                            head is ready before the whole group is stopped
                            (group_stalled; default 120s).
    --hostname NAME         This server's name (in a cluster of servers,
                            each server's own).
    --bootstrap-expect N    The first server of a cluster of N servers
                            (raft; 1, the default, is a server alone).
    --join ADDR[,ADDR...]   Join the cluster of servers through a running
                            server's cluster address (server_join; several,
                            comma-separated: the next is tried when one is
                            out of reach), with a server join token
                            (capyctl create join-token --role server) in
                            --join-token-file FILE or CAPYCTL_JOIN_TOKEN;
                            later starts need neither.
  and the options of capyctl start standalone.

` + GeneralOptions
	}
	return `Usage: capyctl start host --server ADDR [--join-token-file FILE] [options]

  Runs a GPU host of a CapyCTL spread over several machines: its GPUs,
  ledger, drivers and engines, as a standalone role does, but its models are
  placed and reached through the server. The host dials the server (it may
  sit behind NAT) and keeps two connections open, both mutual TLS: the host
  link (inventory, ledger readings, instance journals, heartbeats) and the
  relay the server sends requests and management calls on.

  The first start joins: the join token (capyctl create join-token on the
  server) pins the server's CA by its fingerprint, and the host gets a
  certificate for its hostname (24 h, renewed by itself at two thirds of its
  life). Later starts use that certificate; the token is not needed again.
  A host whose name changed is refused (host_name_changed); a removed host
  must join again with a new token.

  Options:
    --config FILE           The role's configuration (capyctl init host).
    --server ADDR           The server's cluster address (server_address).
    --join-token-file FILE  A file holding the join token (or the
                            CAPYCTL_JOIN_TOKEN variable). --join-token T works
                            too, but shows on the process list while it runs.
    --peer-address IP       This host's address on the direct link between
                            the GPU hosts, where the ranks of a group (one
                            model across machines) meet and talk,
                            unauthenticated: name one only the GPU hosts
                            reach. No default: a group member on a host
                            without it is refused (peer_address_missing).
    --rendezvous-ports A-B  The ports a group head's host picks its
                            rendezvous port from (default 25000-25099).
    --require-rdma BOOL     Group traffic must go over RDMA (default false).
  and the options of capyctl start standalone.

` + GeneralOptions
}

// Run implements cli.Command.
func (c *RoleStartCommand) Run(args []string) int {
	if c.role != "server" && c.role != "host" {
		return c.Usage("unknown role %q", c.role)
	}
	return c.runRole(c.role, args)
}
