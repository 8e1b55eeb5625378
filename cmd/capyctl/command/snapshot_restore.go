// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package command

import (
	"fmt"
	"os"

	"github.com/capyctl/capyctl/core/api/wire"
	"github.com/capyctl/capyctl/core/structs"
)

// SnapshotRestoreCommand replaces the server state with a saved one.
type SnapshotRestoreCommand struct {
	*Meta
	force bool
}

// Synopsis implements cli.Command.
func (c *SnapshotRestoreCommand) Synopsis() string {
	return "Restore the server state from a snapshot file"
}

// Help implements cli.Command.
func (c *SnapshotRestoreCommand) Help() string {
	return `Usage: capyctl snapshot restore <file> [--force] [--json]

  Replaces the server state (hosts and placements) with the one
  capyctl snapshot save wrote to <file>. The file is verified first, here
  and again on the server: its format version and the SHA-256 of its
  state; a file changed or cut short is refused with snapshot_invalid
  (exit 2) and nothing changes. The leader commits the restore through
  the replicated log (a follower relays it), so every server holds the
  same state afterwards; a server alone applies it to its store.

  Meant for a fresh cluster. The hosts the snapshot names hold
  certificates of the cluster CA it was saved on: start the new
  cluster's first server from a copy of the old pki directory (ca.crt,
  ca.key) so they are trusted. A snapshot of another CA is refused with
  snapshot_ca_mismatch (exit 3), and a cluster that has hosts or
  placements already with conflict (exit 2): engines its hosts run for
  placements the snapshot lacks would be forgotten, not stopped.

Restore options:

  --force
      Restore anyway: over an existing state, or a snapshot of another CA.

` + GeneralOptions
}

// Run implements cli.Command.
func (c *SnapshotRestoreCommand) Run(args []string) int {
	fs := c.FlagSet("snapshot restore")
	fs.BoolVar(&c.force, "force", false, "")
	rest, code := c.parse(fs, args)
	if code != 0 {
		return helpOr(code)
	}
	if len(rest) != 1 {
		return c.Usage("usage: capyctl snapshot restore <file>")
	}
	data, err := os.ReadFile(rest[0])
	if err != nil {
		return c.Fail(structs.Wrap(structs.CodeInvalidRequest, err, "read the snapshot"))
	}
	snap, err := wire.DecodeStateSnapshot(data)
	if err != nil {
		return c.Fail(err)
	}
	cl, err := c.Client()
	if err != nil {
		return c.Fail(err)
	}
	out, err := cl.RestoreState(c.ctx(), wire.StateRestoreRequest{Snapshot: *snap, Force: c.force})
	if err != nil {
		return c.Fail(err)
	}
	if c.JSON() {
		c.PrintJSON(out)
		return 0
	}
	fmt.Fprintf(c.Out, "Restored %d hosts and %d placements from %s (saved on server %s at %s)\n",
		out.Hosts, out.Placements, rest[0], snap.Server, snap.CreatedAt.Format("2006-01-02 15:04:05Z07:00"))
	if out.Replaced > 0 {
		fmt.Fprintf(c.Out, "Replaced %d hosts and placements the cluster had\n", out.Replaced)
	}
	return 0
}
