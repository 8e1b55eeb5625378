// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package proc

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
)

// LaunchedFileName holds a launch's process identities in its launch
// directory (no secrets). The shim writes it as soon as the engine runs.
const LaunchedFileName = "launched.json"

// writeLaunchedFile records identities; a failure only loses a fallback.
func writeLaunchedFile(dir string, l Launched) {
	data, err := json.Marshal(l)
	if err != nil {
		return
	}
	tmp := filepath.Join(dir, LaunchedFileName+".tmp")
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		return
	}
	_ = os.Rename(tmp, filepath.Join(dir, LaunchedFileName))
}

// ReadLaunched returns the identities a launch directory records: what a
// driver uses to find a launch whose identities never reached its caller
// (the core died between the spawn and recording it).
func ReadLaunched(dir string) (Launched, error) {
	data, err := os.ReadFile(filepath.Join(dir, LaunchedFileName))
	if err != nil {
		return Launched{}, err
	}
	var l Launched
	if err := json.Unmarshal(data, &l); err != nil {
		return Launched{}, fmt.Errorf("parse %s: %w", LaunchedFileName, err)
	}
	if l.Pgid <= 1 || l.Shim.PID <= 1 || l.Engine.PID <= 1 {
		return Launched{}, fmt.Errorf("%s names no processes", LaunchedFileName)
	}
	return l, nil
}
