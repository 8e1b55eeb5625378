// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package command

import (
	"fmt"
	"io"
	"os"

	"github.com/mitchellh/cli"

	"github.com/capyctl/capyctl/core/version"
)

// Commands returns the command table.
func Commands(m *Meta) map[string]cli.CommandFactory {
	f := func(c cli.Command) cli.CommandFactory { return func() (cli.Command, error) { return c, nil } }
	return map[string]cli.CommandFactory{
		"version":           f(&VersionCommand{Meta: m}),
		"start":             f(&ParentCommand{Meta: m, name: "start", synopsis: "Start a role or a deployment"}),
		"start standalone":  f(&StandaloneStartCommand{Meta: m}),
		"start deployment":  f(&DeploymentStartCommand{Meta: m}),
		"stop":              f(&ParentCommand{Meta: m, name: "stop", synopsis: "Stop a deployment"}),
		"stop deployment":   f(&DeploymentStopCommand{Meta: m}),
		"delete":            f(&ParentCommand{Meta: m, name: "delete", synopsis: "Delete a deployment"}),
		"delete deployment": f(&DeploymentDeleteCommand{Meta: m}),
		"status":            f(&ParentCommand{Meta: m, name: "status", synopsis: "Show the status of a deployment"}),
		"status deployment": f(&DeploymentStatusCommand{Meta: m}),
		"list":              f(&ParentCommand{Meta: m, name: "list", synopsis: "List deployments or engines"}),
		"list deployments":  f(&DeploymentListCommand{Meta: m}),
		"list engines":      f(&EngineListCommand{Meta: m}),
		"deploy":            f(&DeployCommand{Meta: m}),
		"dev":               f(&DevCommand{Meta: m}),
		"engine":            f(&ParentCommand{Meta: m, name: "engine", synopsis: "Register, list and inspect engines"}),
		"engine add":        f(&EngineAddCommand{Meta: m}),
		"engine list":       f(&EngineListCommand{Meta: m}),
		"engine remove":     f(&EngineRemoveCommand{Meta: m}),
		"engine flags":      f(&EngineFlagsCommand{Meta: m}),
		"validate":          f(&ParentCommand{Meta: m, name: "validate", synopsis: "Validate a job spec offline"}),
		"validate config":   f(&ValidateConfigCommand{Meta: m}),
		"driver":            f(&DriverCommand{Meta: m}),
	}
}

// hidden commands are not listed in help.
var hidden = []string{"driver"}

// Run runs the CLI and returns the exit code.
func Run(args []string) int {
	return RunWith(newMeta(), args)
}

// RunWith runs the CLI with a given Meta (tests use it).
func RunWith(m *Meta, args []string) int {
	if len(args) == 1 && (args[0] == "--version" || args[0] == "-v") {
		fmt.Fprintf(m.Out, "capyctl %s\n", version.Version)
		return 0
	}
	c := &cli.CLI{
		Name:           "capyctl",
		Args:           args,
		Commands:       Commands(m),
		HiddenCommands: hidden,
		HelpWriter:     m.Out,
		ErrorWriter:    m.Err,
		Autocomplete:   false,
	}
	code, err := c.Run()
	if err != nil {
		fmt.Fprintf(m.Err, "error [invalid_request]: %v\n", err)
		return 2
	}
	return code
}

// ParentCommand is a noun or verb whose subcommands do the work.
type ParentCommand struct {
	*Meta
	name     string
	synopsis string
}

// Synopsis implements cli.Command.
func (c *ParentCommand) Synopsis() string { return c.synopsis }

// Help implements cli.Command.
func (c *ParentCommand) Help() string {
	return fmt.Sprintf("Usage: capyctl %s <subcommand> [options]\n\n  %s.\n", c.name, c.synopsis)
}

// Run implements cli.Command.
func (c *ParentCommand) Run([]string) int { return cli.RunResultHelp }

var _ io.Writer = os.Stdout
