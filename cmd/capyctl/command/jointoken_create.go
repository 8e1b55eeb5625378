// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package command

import (
	"fmt"
	"net"
	"net/netip"
	"time"

	"github.com/capyctl/capyctl/core/api/wire"
)

// JoinTokenCreateCommand makes a one-time join token for a host.
type JoinTokenCreateCommand struct{ *Meta }

// Synopsis implements cli.Command.
func (c *JoinTokenCreateCommand) Synopsis() string {
	return "Make a one-time token a host joins the server with"
}

// Help implements cli.Command.
func (c *JoinTokenCreateCommand) Help() string {
	return `Usage: capyctl create join-token [--ttl D] [--host NAME] [--role host|server] [--json]

  Makes a one-time token that one host joins the server with, and prints
  it with its expiry, the fingerprint of the server's CA (the token
  carries it, and the host pins that CA before it sends anything) and the
  command to run on the host, with the token in a file (never on a
  command line, where every local user's process list shows it):

    capyctl start host --server <cluster address> --join-token-file FILE

  The token is shown once: the server keeps only its digest. It joins one
  host, once, before it expires. For a script, take it from the JSON:
  capyctl create join-token --json | jq -r .token

  Only a server makes join tokens: a standalone role refuses with
  unsupported (exit 5).

Token Options:

  --ttl D           How long the token stays valid, as a duration (15m,
                    2h). Default: the server's, 1h.
  --host NAME       Bind the token to a host name: any other host that
                    shows it is refused with host_name_changed.
  --role R          host (the default) or server: a server join token
                    joins another server to the cluster of servers
                    (capyctl start server --join ADDR, the token in
                    --join-token-file or CAPYCTL_JOIN_TOKEN). Only a
                    cluster's server makes one (its first server started
                    with --bootstrap-expect N, N > 1). In a cluster, join
                    tokens live on the leader: a follower relays this
                    command there, and the cluster address printed is the
                    leader's.

` + GeneralOptions
}

// Run implements cli.Command.
func (c *JoinTokenCreateCommand) Run(args []string) int {
	fs := c.FlagSet("create join-token")
	var req wire.JoinTokenRequest
	// The TTL goes to the server as written: the server owns the rule
	// (a positive Go duration) and answers invalid_request otherwise.
	fs.StringVar(&req.TTL, "ttl", "", "")
	fs.StringVar(&req.HostName, "host", "", "")
	fs.StringVar(&req.Role, "role", "", "")
	rest, code := c.parse(fs, args)
	if code != 0 {
		return helpOr(code)
	}
	if len(rest) != 0 {
		return c.Usage("usage: capyctl create join-token [--ttl D] [--host NAME] [--role host|server]")
	}
	cl, err := c.Client()
	if err != nil {
		return c.Fail(err)
	}
	tok, err := cl.CreateJoinToken(c.ctx(), req)
	if err != nil {
		return c.Fail(err)
	}
	if c.JSON() {
		c.PrintJSON(tok)
		return 0
	}
	server, note := dialAddress(tok.ClusterAddress)
	if tok.Role == "server" {
		fmt.Fprintf(c.Out, "Server join token (shown once; the leader keeps only its digest):\n\n  %s\n\n", tok.Token)
		fmt.Fprintf(c.Out, "Expires:         %s (%s)\n", tok.ExpiresAt.UTC().Format(time.RFC3339), until(tok.ExpiresAt, c.now()))
		fmt.Fprintf(c.Out, "CA fingerprint:  %s\n", tok.CAFingerprint)
		fmt.Fprintf(c.Out, "\nOn the new server, put the token in a file (owner-only) and run:\n\n  capyctl start server --join %s --join-token-file FILE --hostname NAME\n", server)
		if note != "" {
			fmt.Fprintf(c.Out, "\n%s\n", note)
		}
		return 0
	}
	bound := "any host"
	if tok.HostName != "" {
		bound = tok.HostName + " only"
	}
	fmt.Fprintf(c.Out, "Join token (shown once; the server keeps only its digest):\n\n  %s\n\n", tok.Token)
	fmt.Fprintf(c.Out, "Expires:         %s (%s)\n", tok.ExpiresAt.UTC().Format(time.RFC3339), until(tok.ExpiresAt, c.now()))
	fmt.Fprintf(c.Out, "CA fingerprint:  %s\n", tok.CAFingerprint)
	fmt.Fprintf(c.Out, "Joins:           %s, once\n", bound)
	fmt.Fprintf(c.Out, "Cluster address: %s\n", orDash(tok.ClusterAddress))
	// IMPORTANT: never the token in the suggested command: an argument
	// shows in every local user's process list while the host joins.
	fmt.Fprintf(c.Out, "\nOn the host, put the token in a file only its user reads (umask 077; cat > FILE), and run:\n\n  capyctl start host --server %s --join-token-file FILE\n", server)
	fmt.Fprintf(c.Out, "\nOr give it in CAPYCTL_JOIN_TOKEN (the systemd units read it from an owner-only environment file).\n")
	if note != "" {
		fmt.Fprintf(c.Out, "\n%s\n", note)
	}
	return 0
}

// dialAddress turns the server's cluster address into one a host can dial,
// with a note when it cannot: a wildcard listen address (0.0.0.0:7444,
// [::]:7444) names no machine, so the command shows a placeholder with the
// port and says which address to put there.
func dialAddress(cluster string) (addr, note string) {
	if cluster == "" {
		return "<server address>", "The server did not report its cluster address: use the address and port of its cluster_listen that the host can reach."
	}
	host, port, err := net.SplitHostPort(cluster)
	if err != nil {
		return cluster, ""
	}
	if ip, err := netip.ParseAddr(host); host == "" || (err == nil && ip.IsUnspecified()) {
		return net.JoinHostPort("<server address>", port),
			fmt.Sprintf("The server listens on every address (%s): put one the host can reach in place of <server address>.", cluster)
	}
	return cluster, ""
}
