// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package pluginmgr

import (
	"bytes"
	"os"
	"strconv"
)

// environ is a process and its environment.
type environ struct {
	pid int
	env [][]byte
}

// has reports whether the environment holds the entry kv.
func (e environ) has(kv string) bool {
	for _, x := range e.env {
		if string(x) == kv {
			return true
		}
	}
	return false
}

// environs returns the processes (readable to this user) with an
// environment entry that begins with prefix.
func environs(prefix string) []environ {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	var out []environ
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/environ")
		if err != nil || !bytes.Contains(b, []byte(prefix)) {
			continue
		}
		env := bytes.Split(bytes.TrimRight(b, "\x00"), []byte{0})
		for _, kv := range env {
			if bytes.HasPrefix(kv, []byte(prefix)) {
				out = append(out, environ{pid: pid, env: env})
				break
			}
		}
	}
	return out
}
