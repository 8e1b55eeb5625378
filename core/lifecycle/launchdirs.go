// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package lifecycle

import (
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
)

// Every launch of an instance has a directory of its own,
// <state_dir>/launches/<deployment>/<index>-<launch>, which holds its
// engine's log (engine_logs = "file"), its supervisor's socket and what
// the engine writes there; an LMCache server has one too
// (<index>-lmcache-<id>). A directory is given back like the rest of what
// a launch takes: a launch that never got recorded removes its own (the
// start's undo); a recorded one keeps it, with its logs, while it is one
// of the instance's last KeptLaunchDirs launches; deleting a deployment
// removes them all. Without that, a model that idles out and is asked for
// again many times a day (every llama.cpp model is restart only) leaves a
// directory, and up to 48 MiB of log, per start, for good.

// KeptLaunchDirs is how many launch directories an instance keeps (its
// current launch and the ones before it, for their logs).
const KeptLaunchDirs = 4

// launchesDir is a deployment's directory of launches.
func (m *Manager) launchesDir(dep string) string {
	return filepath.Join(m.cfg.Host.StateDir, "launches", dep)
}

// pruneLaunchDirs removes the directories of an instance's launches but
// its newest KeptLaunchDirs, and those of its ended LMCache servers; keep
// are directories in use (the current launch's and LMCache server's). It
// runs once a new launch is recorded: the launches before it have ended.
func (in *instance) pruneLaunchDirs(keep ...string) {
	dir := in.m.launchesDir(in.dep)
	entries, err := os.ReadDir(dir)
	if err != nil {
		return
	}
	kept := map[string]bool{}
	for _, k := range keep {
		if k != "" {
			kept[filepath.Clean(k)] = true
		}
	}
	prefix := strconv.Itoa(in.idx) + "-"
	type launchDir struct {
		path string
		mod  int64
	}
	var launches []launchDir
	for _, e := range entries {
		name := e.Name()
		if !e.IsDir() || !strings.HasPrefix(name, prefix) {
			continue
		}
		path := filepath.Join(dir, name)
		if kept[path] {
			continue
		}
		if strings.HasPrefix(name, prefix+"lmcache-") {
			// An LMCache server that is not the instance's any more has
			// ended (its stop proved it, or it never started).
			_ = os.RemoveAll(path)
			continue
		}
		info, err := e.Info()
		if err != nil {
			continue
		}
		launches = append(launches, launchDir{path: path, mod: info.ModTime().UnixNano()})
	}
	sort.Slice(launches, func(i, j int) bool { return launches[i].mod > launches[j].mod })
	// The kept directories count among the newest.
	room := KeptLaunchDirs - len(kept)
	for i, l := range launches {
		if i >= room {
			_ = os.RemoveAll(l.path)
		}
	}
}
