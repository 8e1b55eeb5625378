// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package client

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/capyctl/capyctl/core/structs"
)

// Files a running role keeps in its state directory.
const (
	// CredentialsFile holds "api_key: <key>" and "admin_token: <token>"
	// lines, mode 0600.
	CredentialsFile = "credentials"
	// RunInfoFile is written by a running role: its addresses and PID.
	RunInfoFile = "run/role.json"
)

// Credentials are a role's secrets.
type Credentials struct {
	APIKey     string
	AdminToken string
}

// RunInfo is what a running role records about itself.
type RunInfo struct {
	Role       string    `json:"role"`
	PID        int       `json:"pid"`
	Management string    `json:"management"`
	Inference  string    `json:"inference"`
	StartedAt  time.Time `json:"started_at"`
	Version    string    `json:"version"`
	Host       string    `json:"host"`
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
	return New(ri.Management, creds.AdminToken), ri, nil
}
