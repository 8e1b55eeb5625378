// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

// Package version holds the build's version and commit, injected with
// -ldflags by the GNUmakefile.
package version

import "runtime/debug"

// Version and Commit are set at link time:
// -X github.com/capyctl/capyctl/core/version.Version=0.2.0
var (
	Version = "0.0.0-dev"
	Commit  = ""
)

// GetCommit returns the injected commit, or the VCS revision Go recorded in
// the binary, or "unknown".
func GetCommit() string {
	if Commit != "" {
		return Commit
	}
	if info, ok := debug.ReadBuildInfo(); ok {
		for _, s := range info.Settings {
			if s.Key == "vcs.revision" && len(s.Value) >= 12 {
				return s.Value[:12]
			}
		}
	}
	return "unknown"
}
