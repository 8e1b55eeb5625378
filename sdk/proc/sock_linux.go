// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package proc

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"golang.org/x/sys/unix"
)

// maxSunPath is the longest socket path bind and connect accept directly
// (sun_path is 108 bytes with the terminating NUL).
const maxSunPath = 100

// shimRequestTimeout bounds one exchange with the shim.
const shimRequestTimeout = 5 * time.Second

// withSocketPath calls fn with a path for dir/shim.sock that fits in
// sun_path: the path itself when short, else the same file reached through
// /proc/self/fd/<fd of dir>, which stays open until fn returns.
func withSocketPath(dir string, fn func(path string) error) error {
	p := filepath.Join(dir, SocketName)
	if len(p) <= maxSunPath {
		return fn(p)
	}
	fd, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open launch dir: %w", err)
	}
	defer unix.Close(fd)
	return fn("/proc/self/fd/" + strconv.Itoa(fd) + "/" + SocketName)
}

// listenShim listens on dir/shim.sock (0600), replacing a stale socket.
func listenShim(dir string) (*net.UnixListener, error) {
	_ = os.Remove(filepath.Join(dir, SocketName))
	var ln *net.UnixListener
	err := withSocketPath(dir, func(path string) error {
		l, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
		if err != nil {
			return err
		}
		// The listener must not unlink a path that goes through a closed
		// descriptor; the shim removes the socket itself.
		l.SetUnlinkOnClose(false)
		ln = l
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("listen on shim socket: %w", err)
	}
	if err := os.Chmod(filepath.Join(dir, SocketName), 0o600); err != nil {
		ln.Close()
		return nil, fmt.Errorf("chmod shim socket: %w", err)
	}
	return ln, nil
}

// shimRequest sends one command to the shim of dir and decodes its JSON
// answer into out.
func shimRequest(ctx context.Context, dir, command string, out any) error {
	var conn net.Conn
	err := withSocketPath(dir, func(path string) error {
		var d net.Dialer
		c, err := d.DialContext(ctx, "unix", path)
		conn = c
		return err
	})
	if err != nil {
		return fmt.Errorf("dial shim: %w", err)
	}
	defer conn.Close()
	deadline := time.Now().Add(shimRequestTimeout)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	_ = conn.SetDeadline(deadline)
	if _, err := conn.Write([]byte(command + "\n")); err != nil {
		return fmt.Errorf("send %q to shim: %w", command, err)
	}
	var resp shimResponse
	if err := json.NewDecoder(bufio.NewReader(conn)).Decode(&resp); err != nil {
		return fmt.Errorf("read shim answer to %q: %w", command, err)
	}
	if resp.Error != "" {
		return fmt.Errorf("shim answered %q: %s", command, resp.Error)
	}
	if out != nil && len(resp.Result) > 0 {
		if err := json.Unmarshal(resp.Result, out); err != nil {
			return fmt.Errorf("decode shim answer to %q: %w", command, err)
		}
	}
	return nil
}

// shimResponse is the envelope of every shim answer.
type shimResponse struct {
	Result json.RawMessage `json:"result,omitempty"`
	Error  string          `json:"error,omitempty"`
}

// tailResult is the shim's answer to "tail N".
type tailResult struct {
	Text      []byte `json:"text"`
	Truncated bool   `json:"truncated"`
}
