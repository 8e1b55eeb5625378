// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package command

import (
	"fmt"
	"runtime"

	"github.com/mitchellh/cli"

	"github.com/capyctl/capyctl/core/version"
)

// VersionCommand prints the version and the commit.
type VersionCommand struct{ *Meta }

// Synopsis implements cli.Command.
func (c *VersionCommand) Synopsis() string {
	return "Print the version and the commit it was built from"
}

// Help implements cli.Command.
func (c *VersionCommand) Help() string {
	return `Usage: capyctl version [--json]

  Prints CapyCTL's version, the commit the binary was built from, and
  whether it reads NVIDIA GPUs through NVML ("nvml no": compiled without
  cgo, it sees no NVIDIA GPU). Include it in bug reports. (capyctl
  --version prints the version alone.)

` + GeneralOptions
}

// Run implements cli.Command.
func (c *VersionCommand) Run(args []string) int {
	fs := c.FlagSet("version")
	if _, code := c.parse(fs, args); code != 0 {
		return helpOr(code)
	}
	nvml := "yes"
	if !version.NVML {
		nvml = "no"
	}
	if c.JSON() {
		c.PrintJSON(map[string]string{"version": version.Version, "commit": version.GetCommit(), "go": runtime.Version(), "nvml": nvml})
		return 0
	}
	if !version.NVML {
		nvml = "no (built without cgo: this binary sees no NVIDIA GPU)"
	}
	fmt.Fprintf(c.Out, "capyctl %s\ncommit %s\n%s %s/%s\nnvml %s\n", version.Version, version.GetCommit(), runtime.Version(), runtime.GOOS, runtime.GOARCH, nvml)
	return 0
}

// helpOr maps parse's -1 (help asked) to cli's help result.
func helpOr(code int) int {
	if code == -1 {
		return cli.RunResultHelp
	}
	return code
}
