// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package pluginmgr

import (
	"os"
	"path/filepath"
	"strings"
)

// maxSocketDir is the longest socket directory a driver can listen in:
// go-plugin names a socket <dir>/plugin<up to 10 digits>, and a unix socket
// path holds at most 107 bytes on Linux (sun_path, 108 with its NUL).
const maxSocketDir = 107 - len("/plugin") - 10

// fallbackSocketPrefix names the private directories made under the system
// temporary directory when the configured one is too long.
const fallbackSocketPrefix = "capyctl-plugins-"

// socketDir returns the directory drivers listen in, owner-only: the
// configured one (<state_dir>/run/plugins), or, when its path is too long for
// a unix socket, a private directory under the system temporary directory
// (made by this process with a random name and mode 0700, so no other user
// can have made or entered it). The same directory serves every launch of
// this manager; Shutdown removes a fallback one.
func (m *Manager) socketDir() (string, error) {
	m.sockMu.Lock()
	defer m.sockMu.Unlock()
	if m.sockDir != "" {
		return m.sockDir, nil
	}
	dir := m.cfg.SocketDir
	if len(dir) > maxSocketDir {
		tmp, err := os.MkdirTemp("", fallbackSocketPrefix)
		if err != nil {
			return "", err
		}
		m.logger.Info("the socket directory's path is too long for a unix socket; drivers listen in a private temporary directory",
			"configured", dir, "used", tmp)
		m.sockDir, m.sockFallback = tmp, true
		return tmp, nil
	}
	if err := ownerOnlyDir(dir); err != nil {
		return "", err
	}
	m.sockDir = dir
	return dir, nil
}

// ownerOnlyDir creates dir (and parents) and makes it 0700 even when it
// existed with a wider mode.
func ownerOnlyDir(dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	return os.Chmod(dir, 0o700)
}

// removeSocket removes a dead driver's socket file (a killed driver leaves
// it behind), when it lies in the configured socket directory or in a
// fallback one, and then that fallback directory once it is empty (one a
// previous core made stays behind after a crash).
func (m *Manager) removeSocket(network, addr string) {
	if network != "unix" || addr == "" {
		return
	}
	dir := filepath.Dir(addr)
	fallback := filepath.Dir(dir) == filepath.Clean(os.TempDir()) && strings.HasPrefix(filepath.Base(dir), fallbackSocketPrefix)
	if dir != filepath.Clean(m.cfg.SocketDir) && !fallback {
		return
	}
	_ = os.Remove(addr)
	if fallback {
		m.sockMu.Lock()
		inUse := dir == m.sockDir
		m.sockMu.Unlock()
		if !inUse {
			_ = os.Remove(dir) // fails while not empty
		}
	}
}

// removeFallbackDir removes this manager's fallback socket directory (at
// Shutdown, once its sockets are gone; fails while one is left).
func (m *Manager) removeFallbackDir() {
	m.sockMu.Lock()
	defer m.sockMu.Unlock()
	if m.sockFallback {
		_ = os.Remove(m.sockDir)
	}
}
