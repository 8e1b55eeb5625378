// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

// Package runinfo owns the files a role keeps in its state directory for
// the programs that talk to it: the credentials and the run info (its
// addresses and PID). The role writes them (core/agent); the management
// client reads them to find the role (core/api/client). It imports only
// the standard library, so both sides share it without importing each
// other.
package runinfo

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// Files a running role keeps in its state directory.
const (
	// CredentialsFile holds "api_key: <key>" and "admin_token: <token>"
	// lines, mode 0600.
	CredentialsFile = "credentials"
	// RunInfoFile is written by a running role: its addresses and PID.
	RunInfoFile = "run/role.json"
	// ManagementSocketFile is the management API's Unix socket (0600, in
	// the owner-only run directory): the CLI's way in, which no other
	// local user can open or flood.
	ManagementSocketFile = "run/management.sock"
)

// Credentials are a role's secrets.
type Credentials struct {
	APIKey     string
	AdminToken string
}

// RunInfo is what a running role records about itself.
type RunInfo struct {
	Role       string `json:"role"`
	PID        int    `json:"pid"`
	Management string `json:"management"`
	// ManagementSocket is the management API's Unix socket, empty when the
	// role serves none (a state directory whose path is too long for a
	// socket's).
	ManagementSocket string    `json:"management_socket,omitempty"`
	Inference        string    `json:"inference"`
	StartedAt        time.Time `json:"started_at"`
	Version          string    `json:"version"`
	Host             string    `json:"host"`
}

// ReadCredentials reads a state directory's credentials file.
func ReadCredentials(stateDir string) (*Credentials, error) {
	f, err := os.Open(filepath.Join(stateDir, CredentialsFile))
	if err != nil {
		return nil, err
	}
	defer f.Close()
	c := &Credentials{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		switch strings.TrimSpace(k) {
		case "api_key":
			c.APIKey = strings.TrimSpace(v)
		case "admin_token":
			c.AdminToken = strings.TrimSpace(v)
		}
	}
	if c.APIKey == "" || c.AdminToken == "" {
		return nil, fmt.Errorf("credentials file %s is incomplete", f.Name())
	}
	return c, sc.Err()
}

// WriteCredentials writes a credentials file (0600, atomically).
func WriteCredentials(stateDir string, c *Credentials) error {
	path := filepath.Join(stateDir, CredentialsFile)
	tmp := path + ".tmp"
	data := fmt.Sprintf("# CapyCTL credentials: keep private\napi_key: %s\nadmin_token: %s\n", c.APIKey, c.AdminToken)
	if err := os.WriteFile(tmp, []byte(data), 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// ReadRunInfo reads what a running role recorded.
func ReadRunInfo(stateDir string) (*RunInfo, error) {
	data, err := os.ReadFile(filepath.Join(stateDir, RunInfoFile))
	if err != nil {
		return nil, err
	}
	var ri RunInfo
	if err := json.Unmarshal(data, &ri); err != nil {
		return nil, fmt.Errorf("parse %s: %w", RunInfoFile, err)
	}
	return &ri, nil
}

// WriteRunInfo records a running role (0600, atomically).
func WriteRunInfo(stateDir string, ri RunInfo) error {
	data, _ := json.MarshalIndent(ri, "", "  ")
	path := filepath.Join(stateDir, RunInfoFile)
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// RemoveRunInfo removes the record of a role that stops.
func RemoveRunInfo(stateDir string) {
	_ = os.Remove(filepath.Join(stateDir, RunInfoFile))
}
