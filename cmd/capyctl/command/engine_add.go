// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package command

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/capyctl/capyctl/core/api/wire"
	"github.com/capyctl/capyctl/core/structs"
)

// EngineAddCommand registers an engine installation.
type EngineAddCommand struct{ *Meta }

// Synopsis implements cli.Command.
func (c *EngineAddCommand) Synopsis() string {
	return "Register an engine installation (venv, binary or custom program)"
}

// Help implements cli.Command.
func (c *EngineAddCommand) Help() string {
	return `Usage: capyctl engine add <venv|llama-server> [options]
       capyctl engine add --custom <program> --name <name> --manifest <file> [--yes]

  Detects the engine family and version (from the venv's *.dist-info
  metadata, without running Python; llama-server's --version), records a
  digest of the installation and pins it: a changed installation is refused
  at launch. A custom engine is a program CapyCTL has no integration for,
  described by a manifest (command arguments, API served, optional health
  path and idle signal); you confirm it before it is pinned.

Add Options:

  --name NAME             Registration name (default: the family).
  --family FAMILY         Skip detection: vllm, sglang, llamacpp, tensorfold.
  --custom PROGRAM        Register a custom program (needs --manifest, --name).
  --manifest FILE         The custom engine's manifest (HCL).
  --yes                   Confirm without asking (needed without a terminal).
  --approve-option OPT    Let deployments pass this gated option (repeatable).
  --approve-path DIR      Let path-valued options name files under DIR.
  --approve-env GLOB      Let deployments set environment names matching GLOB.
  --allow-remote-code     Let deployments set trust_remote_code.
  --env K=V               Add K=V to every launch of this engine.

` + GeneralOptions
}

// Run implements cli.Command.
func (c *EngineAddCommand) Run(args []string) int {
	fs := c.FlagSet("engine add")
	var name, family, custom, manifest string
	var yes, remote bool
	var opts, paths, envs stringList
	env := kvList{}
	fs.StringVar(&name, "name", "", "")
	fs.StringVar(&family, "family", "", "")
	fs.StringVar(&custom, "custom", "", "")
	fs.StringVar(&manifest, "manifest", "", "")
	fs.BoolVar(&yes, "yes", false, "")
	fs.BoolVar(&remote, "allow-remote-code", false, "")
	fs.Var(&opts, "approve-option", "")
	fs.Var(&paths, "approve-path", "")
	fs.Var(&envs, "approve-env", "")
	fs.Var(env, "env", "")
	rest, code := c.parse(fs, args)
	if code != 0 {
		return helpOr(code)
	}
	req := wire.EngineAddRequest{
		Name: name, Family: family, Env: env,
		Approvals: structs.Approvals{Options: opts, Paths: paths, Env: envs, RemoteCode: remote},
	}
	switch {
	case custom != "":
		if len(rest) != 0 {
			return c.Usage("engine add --custom takes the program as the flag's value, not an argument")
		}
		if name == "" || manifest == "" {
			return c.Usage("engine add --custom needs --name <name> and --manifest <file>")
		}
		data, err := os.ReadFile(manifest)
		if err != nil {
			return c.Fail(structs.Errf(structs.CodeInvalidConfig, "read manifest: %v", err))
		}
		prog, err := filepath.Abs(custom)
		if err != nil {
			return c.Usage("program %q: %v", custom, err)
		}
		req.Family = structs.FamilyCustom
		req.Path = prog
		req.Manifest = string(data)
		req.ManifestFile = manifest
	case len(rest) == 1:
		p, err := filepath.Abs(rest[0])
		if err != nil {
			return c.Usage("path %q: %v", rest[0], err)
		}
		req.Path = p
	default:
		return c.Usage("usage: capyctl engine add <venv|llama-server> or --custom <program> --name <n> --manifest <file>")
	}
	cl, err := c.Client()
	if err != nil {
		return c.Fail(err)
	}
	dry := req
	dry.DryRun = true
	det, err := cl.AddEngine(c.ctx(), dry)
	if err != nil {
		return c.Fail(err)
	}
	if !c.JSON() || !yes {
		c.describeEngine(det)
	}
	if len(det.ToolchainMissing) > 0 {
		return c.Fail(structs.Errf(structs.CodeToolchainMissing, "the engine needs build tools that are not on its PATH: %s",
			strings.Join(det.ToolchainMissing, ", ")))
	}
	if !yes {
		if !isTerminal(c.Err) || c.In == nil {
			return c.Fail(structs.Errf(structs.CodeNotInteractive, "confirm the installation with --yes (no terminal to ask on)"))
		}
		fmt.Fprintf(c.Err, "Register and pin this installation? [y/N] ")
		line, _ := bufio.NewReader(c.In).ReadString('\n')
		if a := strings.ToLower(strings.TrimSpace(line)); a != "y" && a != "yes" {
			fmt.Fprintln(c.Err, "Not registered.")
			return 1
		}
	}
	req.ExpectDigest = det.Engine.Digest
	done, err := cl.AddEngine(c.ctx(), req)
	if err != nil {
		return c.Fail(err)
	}
	if c.JSON() {
		c.PrintJSON(done)
	} else {
		fmt.Fprintf(c.Out, "Engine %s registered (%s %s, pinned %s)\n", done.Engine.Name, done.Engine.Family, done.Engine.Version, short(done.Engine.Digest))
	}
	return 0
}

// describeEngine prints what is about to be registered.
func (c *Meta) describeEngine(det *wire.EngineDetected) {
	w := c.Err
	e := det.Engine
	verified := "custom (not verified)"
	if e.Verified {
		verified = "verified"
	}
	fmt.Fprintf(w, "Engine:   %s\n", e.Name)
	fmt.Fprintf(w, "Family:   %s\n", e.Family)
	fmt.Fprintf(w, "Version:  %s (%s)\n", orDash(e.Version), verified)
	fmt.Fprintf(w, "Path:     %s\n", e.Path)
	if e.Program != "" && e.Program != e.Path {
		fmt.Fprintf(w, "Program:  %s\n", e.Program)
	}
	fmt.Fprintf(w, "Digest:   %s\n", e.Digest)
	for _, n := range det.Notes {
		fmt.Fprintf(w, "Note:     %s\n", n)
	}
}

func short(digest string) string {
	if len(digest) > 19 {
		return digest[:19] + "…"
	}
	return digest
}
