// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package soak

import (
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
)

// closeWaitToGoneEngines lists the role's TCP connections that its peer
// closed and the role did not (CLOSE_WAIT) to a port no running engine
// listens on: a connection kept to an engine that has stopped. The role's
// own listeners' connections (clients) are left out, and so are the
// running engines' (an engine may close a pooled connection that the role
// drops at its next use). Read from /proc: the process's socket inodes,
// and the TCP tables of its network namespace.
func closeWaitToGoneEngines(pid int, listeners []string, running map[int]bool) []string {
	inodes := map[string]bool{}
	fds, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		return nil
	}
	for _, fd := range fds {
		link, err := os.Readlink(fmt.Sprintf("/proc/%d/fd/%s", pid, fd.Name()))
		if err == nil && strings.HasPrefix(link, "socket:[") {
			inodes[strings.TrimSuffix(strings.TrimPrefix(link, "socket:["), "]")] = true
		}
	}
	own := map[int]bool{}
	for _, l := range listeners {
		if _, p, err := net.SplitHostPort(l); err == nil {
			n, _ := strconv.Atoi(p)
			own[n] = true
		}
	}
	var out []string
	for _, table := range []string{"tcp", "tcp6"} {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/net/%s", pid, table))
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(b), "\n")[1:] {
			f := strings.Fields(line)
			// sl local rem st tx:rx tr:when retrnsmt uid timeout inode
			if len(f) < 10 || f[3] != "08" || !inodes[f[9]] {
				continue
			}
			local, remote := hexPort(f[1]), hexPort(f[2])
			if own[local] || running[remote] {
				continue
			}
			out = append(out, fmt.Sprintf("port %d (from %d)", remote, local))
		}
	}
	return out
}

// hexPort is the port of a /proc/net/tcp address ("0100007F:1F90").
func hexPort(addr string) int {
	_, p, ok := strings.Cut(addr, ":")
	if !ok {
		return 0
	}
	n, _ := strconv.ParseUint(p, 16, 32)
	return int(n)
}
