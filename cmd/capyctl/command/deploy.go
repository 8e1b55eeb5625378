// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package command

import (
	"fmt"
	"strconv"
	"time"

	"github.com/capyctl/capyctl/core/api/wire"
	"github.com/capyctl/capyctl/core/jobspec"
)

// DeployCommand writes deployments from a job spec file.
type DeployCommand struct{ *Meta }

// Synopsis implements cli.Command.
func (c *DeployCommand) Synopsis() string { return "Create or update deployments from an HCL job spec" }

// Help implements cli.Command.
func (c *DeployCommand) Help() string {
	return `Usage: capyctl deploy --file <spec.hcl> [--activate] [--wait] [--revision N]

  Parses the job spec (offline first: a malformed file is refused with its
  file:line:col and exit 2), then applies each deployment block to the
  running role, which converges on it: a deployment that does not exist
  is created; one whose spec is already this one is left alone ("unchanged",
  exit 0, nothing restarted); any other change is a new revision, which
  replaces the running instances. Deploying the same file twice is safe.
  A new deployment starts on the first request that names it, or at once
  with --activate.

Deploy Options:

  --file FILE       The job spec (HCL, or HCL's JSON syntax for .json).
  --activate        Start the deployment once written.
  --wait            With --activate, wait until every instance is ready; a
                    start that gives up ends the wait at once (exit 13).
  --timeout DUR     Bound for --wait (default 30m).
  --revision N      Replace revision N only (a compare-and-set): if another
                    revision is current, refuse with revision_conflict.
  --idempotency-key KEY
                    Send this key, so a retry of the same command is not
                    applied twice.

` + GeneralOptions
}

// Run implements cli.Command.
func (c *DeployCommand) Run(args []string) int {
	fs := c.FlagSet("deploy")
	var file, key, timeout string
	var activate, wait bool
	var revision uint64
	fs.StringVar(&file, "file", "", "")
	fs.BoolVar(&activate, "activate", false, "")
	fs.BoolVar(&wait, "wait", false, "")
	fs.StringVar(&timeout, "timeout", "30m", "")
	fs.Uint64Var(&revision, "revision", 0, "")
	fs.StringVar(&key, "idempotency-key", "", "")
	rest, code := c.parse(fs, args)
	if code != 0 {
		return helpOr(code)
	}
	if file == "" && len(rest) == 1 {
		file = rest[0]
	}
	if file == "" {
		return c.Usage("deploy needs --file <spec.hcl>")
	}
	wait = wait && activate
	tmo, err := time.ParseDuration(timeout)
	if err != nil {
		return c.Usage("--timeout: %v", err)
	}
	specs, err := jobspec.ParseFile(file)
	if err != nil {
		return c.Fail(err)
	}
	cl, err := c.Client()
	if err != nil {
		return c.Fail(err)
	}
	var results []*wire.DeployAccepted
	for i, spec := range specs {
		k := key
		if k != "" && len(specs) > 1 {
			k = key + "-" + strconv.Itoa(i)
		}
		since := time.Now().UTC()
		acc, err := cl.Apply(c.ctx(), wire.DeployRequest{Deployment: *spec, Activate: activate, ExpectedRevision: revision}, k)
		if err != nil {
			return c.Fail(err)
		}
		results = append(results, acc)
		if !c.JSON() {
			switch {
			case acc.Created:
				fmt.Fprintf(c.Out, "Deployment %s created (revision %d, %s)\n", acc.Name, acc.Revision, acc.Desired)
			case acc.Unchanged:
				fmt.Fprintf(c.Out, "Deployment %s unchanged (revision %d, %s): its spec is already this one\n", acc.Name, acc.Revision, acc.Desired)
			default:
				fmt.Fprintf(c.Out, "Deployment %s updated to revision %d (%s)\n", acc.Name, acc.Revision, acc.Desired)
			}
		}
		if wait {
			if code := c.waitReady(cl, acc.Name, since, tmo); code != 0 {
				return code
			}
		}
	}
	if c.JSON() {
		c.PrintJSON(results)
	}
	return 0
}
