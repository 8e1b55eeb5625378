// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package command

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"

	"github.com/capyctl/capyctl/core/structs"
)

// SnapshotSaveCommand writes the server state to a file.
type SnapshotSaveCommand struct{ *Meta }

// Synopsis implements cli.Command.
func (c *SnapshotSaveCommand) Synopsis() string {
	return "Save the server state (hosts, placements) to a file"
}

// Help implements cli.Command.
func (c *SnapshotSaveCommand) Help() string {
	return `Usage: capyctl snapshot save <file> [--json]

  Writes the server's state to <file>, owner-only (0600): the hosts and
  the placements (which hosts run which deployment), with a header (the
  format version, the cluster CA's fingerprint, the raft index and term
  it was read at, when it was made) and the SHA-256 of the state. Any
  server of a cluster answers (its state is at least as new as the index
  it names); a server alone answers too.

  The file holds nothing secret: the CA's key, the servers' keys and the
  join tokens stay in each server's pki directory; back that directory
  up apart. The file is checked before it is written; it replaces
  <file> at once (written beside it, then renamed).

  Restore it with capyctl snapshot restore. Only a server has this
  state: a standalone role refuses with unsupported (exit 5).

` + GeneralOptions
}

// Run implements cli.Command.
func (c *SnapshotSaveCommand) Run(args []string) int {
	fs := c.FlagSet("snapshot save")
	rest, code := c.parse(fs, args)
	if code != 0 {
		return helpOr(code)
	}
	if len(rest) != 1 {
		return c.Usage("usage: capyctl snapshot save <file>")
	}
	cl, err := c.Client()
	if err != nil {
		return c.Fail(err)
	}
	snap, err := cl.StateSnapshot(c.ctx())
	if err != nil {
		return c.Fail(err)
	}
	if err := snap.Verify(); err != nil {
		return c.Fail(err)
	}
	data, err := json.MarshalIndent(snap, "", "  ")
	if err != nil {
		return c.Fail(err)
	}
	if err := writeOwnerOnly(rest[0], append(data, '\n')); err != nil {
		return c.Fail(structs.Wrap(structs.CodeInvalidRequest, err, "write %s", rest[0]))
	}
	if c.JSON() {
		c.PrintJSON(map[string]any{"file": rest[0], "server": snap.Server, "index": snap.Index, "term": snap.Term,
			"hosts": snap.Hosts, "placements": snap.Placements, "sha256": snap.SHA256, "ca_fingerprint": snap.CAFingerprint})
		return 0
	}
	where := "a server alone"
	if snap.Raft {
		where = fmt.Sprintf("index %d, term %d", snap.Index, snap.Term)
	}
	fmt.Fprintf(c.Out, "Saved %d hosts and %d placements from server %s (%s) to %s\nsha256 %s\n",
		snap.Hosts, snap.Placements, snap.Server, where, rest[0], snap.SHA256)
	return 0
}

// writeOwnerOnly writes data to a new file beside path (0600) and renames
// it over path, so a reader sees the old file or the whole new one.
func writeOwnerOnly(path string, data []byte) error {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return err
	}
	tmp := f.Name()
	defer os.Remove(tmp)
	if err := f.Chmod(0o600); err != nil {
		_ = f.Close()
		return err
	}
	if _, err := f.Write(data); err != nil {
		_ = f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		_ = f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}
