// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package client

import (
	"errors"
	"io/fs"
	"os"

	"github.com/capyctl/capyctl/core/runinfo"
	"github.com/capyctl/capyctl/core/structs"
)

// The state directory's files live in core/runinfo (the role writes them,
// this client reads them); these names keep the client's API whole.
const (
	// CredentialsFile holds "api_key: <key>" and "admin_token: <token>"
	// lines, mode 0600.
	CredentialsFile = runinfo.CredentialsFile
	// RunInfoFile is written by a running role: its addresses and PID.
	RunInfoFile = runinfo.RunInfoFile
)

// Credentials are a role's secrets.
type Credentials = runinfo.Credentials

// RunInfo is what a running role records about itself.
type RunInfo = runinfo.RunInfo

// ReadCredentials reads a state directory's credentials file.
func ReadCredentials(stateDir string) (*Credentials, error) { return runinfo.ReadCredentials(stateDir) }

// WriteCredentials writes a credentials file (0600, atomically).
func WriteCredentials(stateDir string, c *Credentials) error {
	return runinfo.WriteCredentials(stateDir, c)
}

// ReadRunInfo reads what a running role recorded.
func ReadRunInfo(stateDir string) (*RunInfo, error) { return runinfo.ReadRunInfo(stateDir) }

// Discover finds the role running with a state directory and returns a
// client for it.
func Discover(stateDir string) (*Client, *RunInfo, error) {
	ri, err := ReadRunInfo(stateDir)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, nil, structs.Errf(structs.CodeRoleNotRunning,
				"no CapyCTL role is running with state directory %s (start one with capyctl start standalone, or pass --state-dir)", stateDir)
		}
		return nil, nil, structs.Wrap(structs.CodeRoleNotRunning, err, "read the role's run info")
	}
	if ri.PID > 0 {
		if err := processAlive(ri.PID); err != nil {
			return nil, ri, structs.Errf(structs.CodeRoleNotRunning,
				"the role recorded in %s (pid %d) is not running", stateDir, ri.PID)
		}
	}
	creds, err := ReadCredentials(stateDir)
	if err != nil {
		return nil, ri, structs.Wrap(structs.CodeUnauthorized, err, "read credentials")
	}
	// The role's Unix socket, when it serves one: only this user opens
	// it, so no other local user's connections stand in the way.
	if ri.ManagementSocket != "" {
		if st, err := os.Stat(ri.ManagementSocket); err == nil && st.Mode()&fs.ModeSocket != 0 {
			return NewOnSocket(ri.ManagementSocket, ri.Management, creds.AdminToken), ri, nil
		}
	}
	return New(ri.Management, creds.AdminToken), ri, nil
}
