// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package pluginmgr

import (
	"crypto/rand"
	"encoding/hex"
	"os"
	"path/filepath"

	sdkplugin "github.com/capyctl/capyctl/sdk/plugin"
	"github.com/capyctl/capyctl/sdk/proc"
)

// A driver's reattach record is written once the driver answered its
// handshake and its Describe: a core killed between the driver's start
// and that write leaves a driver no record names. Nothing would ever
// re-attach to it or end it, and it runs on under PID 1, one more after
// every such crash (found by the soak's kill -9 of the role). Every
// driver carries two marks in its environment: its log file under the
// role's log directory (sdkplugin.EnvDriverLogFile), which says whose it
// is, and the launcher ID of the manager that started it (envLauncher).
// After adopting the recorded drivers, a new core ends the role's drivers
// that another manager launched and that it did not adopt.

// envLauncher names the manager that launched a driver.
const envLauncher = "CAPYCTL_DRIVER_LAUNCHER"

// newLauncherID returns a fresh launcher ID.
func newLauncherID() string {
	b := make([]byte, 8)
	if _, err := rand.Read(b); err != nil {
		panic(err)
	}
	return hex.EncodeToString(b)
}

// endUnrecorded ends the role's drivers that no record names: launched by
// an earlier core of this role (its log directory), not by this manager,
// and not adopted. Without a log directory it cannot tell which drivers
// are the role's, and ends none.
func (m *Manager) endUnrecorded() {
	if m.cfg.LogDir == "" {
		return
	}
	owner := sdkplugin.EnvDriverLogFile + "=" + filepath.Clean(m.cfg.LogDir) + string(os.PathSeparator)
	mine := envLauncher + "=" + m.launcher
	keep := map[int]bool{os.Getpid(): true}
	m.mu.Lock()
	for _, d := range m.drivers {
		d.mu.Lock()
		if d.pid > 0 {
			keep[d.pid] = true
		}
		d.mu.Unlock()
	}
	m.mu.Unlock()
	for _, p := range environs(owner) {
		if keep[p.pid] || p.has(mine) {
			continue
		}
		ticks, err := proc.ReadStartTicks(p.pid)
		if err != nil {
			continue
		}
		if killPID(p.pid, ticks) {
			m.logger.Warn("ended a driver an earlier core launched and never recorded", "pid", p.pid)
		}
	}
}
