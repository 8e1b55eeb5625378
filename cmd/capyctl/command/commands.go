// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package command

import (
	"bytes"
	"fmt"
	"sort"
	"strings"

	"github.com/mitchellh/cli"

	"github.com/capyctl/capyctl/core/version"
)

// Commands returns the command table.
func Commands(m *Meta) map[string]cli.CommandFactory {
	f := func(c cli.Command) cli.CommandFactory { return func() (cli.Command, error) { return c, nil } }
	var table map[string]cli.CommandFactory
	all := func() map[string]cli.CommandFactory { return table }
	parent := func(name, synopsis string) cli.CommandFactory {
		return f(&ParentCommand{Meta: m, name: name, synopsis: synopsis, commands: all})
	}
	table = map[string]cli.CommandFactory{
		"version":           f(&VersionCommand{Meta: m}),
		"help":              f(&HelpCommand{Meta: m, commands: all}),
		"help exit-codes":   f(&ExitCodesCommand{Meta: m}),
		"init":              parent("init", "Write a commented role configuration"),
		"init standalone":   f(&RoleInitCommand{Meta: m, role: "standalone"}),
		"init server":       f(&RoleInitCommand{Meta: m, role: "server"}),
		"init host":         f(&RoleInitCommand{Meta: m, role: "host"}),
		"start":             parent("start", "Start a role, a deployment or an instance"),
		"start standalone":  f(&StandaloneStartCommand{Meta: m}),
		"start server":      f(&RoleStartCommand{Meta: m, role: "server"}),
		"start host":        f(&RoleStartCommand{Meta: m, role: "host"}),
		"start deployment":  f(&DeploymentStartCommand{Meta: m}),
		"start instance":    f(&InstanceActionCommand{Meta: m, action: "start"}),
		"stop":              parent("stop", "Stop a deployment or an instance"),
		"stop deployment":   f(&DeploymentStopCommand{Meta: m}),
		"stop instance":     f(&InstanceActionCommand{Meta: m, action: "stop"}),
		"park":              parent("park", "Park a deployment or an instance"),
		"park deployment":   f(&DeploymentParkCommand{Meta: m}),
		"park instance":     f(&InstanceActionCommand{Meta: m, action: "park"}),
		"delete":            parent("delete", "Delete a deployment"),
		"delete deployment": f(&DeploymentDeleteCommand{Meta: m}),
		"status":            f(&RoleStatusCommand{Meta: m}),
		"status deployment": f(&DeploymentStatusCommand{Meta: m}),
		"status host":       f(&HostStatusCommand{Meta: m}),
		"create":            parent("create", "Create a join token or an API key"),
		"create join-token": f(&JoinTokenCreateCommand{Meta: m}),
		"create api-key":    f(&APIKeyCreateCommand{Meta: m}),
		"update":            parent("update", "Update an API key"),
		"update api-key":    f(&APIKeyUpdateCommand{Meta: m}),
		"revoke":            parent("revoke", "Revoke an API key"),
		"revoke api-key":    f(&APIKeyRevokeCommand{Meta: m}),
		"usage":             f(&UsageCommand{Meta: m}),
		"drain":             parent("drain", "Drain a host"),
		"drain host":        f(&HostDrainCommand{Meta: m}),
		"remove":            parent("remove", "Remove a host"),
		"remove host":       f(&HostRemoveCommand{Meta: m}),
		"remove server":     f(&ServerRemoveCommand{Meta: m}),
		"list":              parent("list", "List deployments, engines, hosts or API keys"),
		"list api-keys":     f(&APIKeyListCommand{Meta: m}),
		"list deployments":  f(&DeploymentListCommand{Meta: m}),
		"list engines":      f(&EngineListCommand{Meta: m}),
		"list hosts":        f(&HostListCommand{Meta: m}),
		"list servers":      f(&ServerListCommand{Meta: m}),
		"snapshot":          parent("snapshot", "Save or restore the server state"),
		"snapshot save":     f(&SnapshotSaveCommand{Meta: m}),
		"snapshot restore":  f(&SnapshotRestoreCommand{Meta: m}),
		"deploy":            f(&DeployCommand{Meta: m}),
		"dev":               f(&DevCommand{Meta: m}),
		"engine":            parent("engine", "Register, list and inspect engines"),
		"engine add":        f(&EngineAddCommand{Meta: m}),
		"engine list":       f(&EngineListCommand{Meta: m}),
		"engine remove":     f(&EngineRemoveCommand{Meta: m}),
		"engine flags":      f(&EngineFlagsCommand{Meta: m}),
		"model pull":        f(&ModelPullCommand{Meta: m}),
		"config":            parent("config", "Show role settings"),
		"config show":       f(&ConfigShowCommand{Meta: m}),
		"validate":          parent("validate", "Validate a job spec offline"),
		"validate config":   f(&ValidateConfigCommand{Meta: m}),
		"driver":            f(&DriverCommand{Meta: m}),
		fakeEngineName:      f(&FakeEngineCommand{Meta: m}),
	}
	return table
}

// hidden commands are not listed in help.
var hidden = []string{"driver", fakeEngineName}

// Run runs the CLI and returns the exit code.
func Run(args []string) int {
	return RunWith(newMeta(), args)
}

// RunWith runs the CLI with a given Meta (tests use it).
func RunWith(m *Meta, args []string) int {
	// Hosts and engines write some of what the CLI prints: nothing a
	// terminal would act on reaches it (termsafe.go).
	m.Out, m.Err = safeOutput(m.Out), safeOutput(m.Err)
	if len(args) == 1 && (args[0] == "--version" || args[0] == "-v") {
		fmt.Fprintf(m.Out, "capyctl %s\n", version.Version)
		return 0
	}
	table := Commands(m)
	c := &cli.CLI{
		Name:           "capyctl",
		Args:           args,
		Commands:       table,
		HiddenCommands: hidden,
		HelpFunc:       func(map[string]cli.CommandFactory) string { return helpFunc(table) },
		HelpWriter:     m.Out,
		ErrorWriter:    m.Err,
		Autocomplete:   false,
	}
	code, err := c.Run()
	if err != nil {
		fmt.Fprintf(m.Err, "error [invalid_request]: %v\n", err)
		return 2
	}
	if code == 127 {
		// An unknown command: cli printed the commands.
		if len(args) > 0 {
			fmt.Fprintf(m.Err, "error [invalid_request]: unknown command %q (capyctl --help lists them)\n", strings.Join(args, " "))
		}
		return 2
	}
	return code
}

// CommandNames returns every command a person can run, sorted (the docs'
// CLI reference is generated from it).
func CommandNames() []string {
	var out []string
	for name := range Commands(newMeta()) {
		if isHidden(name) || isParentOnly(name) {
			continue
		}
		out = append(out, name)
	}
	sort.Strings(out)
	return out
}

func isHidden(name string) bool {
	for _, h := range hidden {
		if name == h || strings.HasPrefix(name, h+" ") {
			return true
		}
	}
	return false
}

// isParentOnly reports whether a command only groups subcommands.
func isParentOnly(name string) bool {
	cmd, err := Commands(newMeta())[name]()
	if err != nil {
		return false
	}
	_, ok := cmd.(*ParentCommand)
	return ok
}

// helpFunc lists every runnable command, subcommands included.
func helpFunc(commands map[string]cli.CommandFactory) string {
	var buf bytes.Buffer
	buf.WriteString("Usage: capyctl [--version] [--help] <command> [<args>]\n\n")
	buf.WriteString("CapyCTL runs LLM inference engines on your GPUs behind one OpenAI-compatible endpoint.\n\n")
	buf.WriteString("Commands:\n")
	names := make([]string, 0, len(commands))
	width := 0
	for name := range commands {
		if isHidden(name) {
			continue
		}
		if cmd, err := commands[name](); err == nil {
			if _, ok := cmd.(*ParentCommand); ok {
				continue
			}
		}
		names = append(names, name)
		if len(name) > width {
			width = len(name)
		}
	}
	sort.Strings(names)
	for _, name := range names {
		cmd, err := commands[name]()
		if err != nil {
			continue
		}
		fmt.Fprintf(&buf, "    %-*s  %s\n", width, name, cmd.Synopsis())
	}
	buf.WriteString("\ncapyctl <command> --help prints a command's options; capyctl help exit-codes the exit codes.\n")
	return buf.String()
}

// ParentCommand is a noun or verb whose subcommands do the work.
type ParentCommand struct {
	*Meta
	name     string
	synopsis string
	commands func() map[string]cli.CommandFactory
}

// Synopsis implements cli.Command.
func (c *ParentCommand) Synopsis() string { return c.synopsis }

// Help implements cli.Command.
func (c *ParentCommand) Help() string {
	var b strings.Builder
	fmt.Fprintf(&b, "Usage: capyctl %s <subcommand> [options]\n\n  %s.\n\nSubcommands:\n", c.name, c.synopsis)
	var subs []string
	table := c.commands()
	for name := range table {
		if strings.HasPrefix(name, c.name+" ") && !isHidden(name) {
			subs = append(subs, name)
		}
	}
	sort.Strings(subs)
	for _, name := range subs {
		cmd, err := table[name]()
		if err != nil {
			continue
		}
		fmt.Fprintf(&b, "    %-22s %s\n", strings.TrimPrefix(name, c.name+" "), cmd.Synopsis())
	}
	return b.String()
}

// Run implements cli.Command: a parent alone is a usage error.
func (c *ParentCommand) Run(args []string) int {
	fmt.Fprint(c.Err, c.Help())
	if len(args) > 0 {
		return c.Usage("capyctl %s has no subcommand %q", c.name, args[0])
	}
	return c.Usage("capyctl %s needs a subcommand", c.name)
}
