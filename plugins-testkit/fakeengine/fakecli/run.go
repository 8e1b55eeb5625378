// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

// Package fakecli is the testkit's fake inference engine as a process:
// the fakeengine library behind a command line. Two programs run it: the
// testkit's capyctl-fake-engine (plugins-testkit/cmd/capyctl-fake-engine)
// and capyctl itself, as the hidden `capyctl fake-engine` that
// `capyctl dev` registers, so that the tour needs nothing but capyctl.
//
//	capyctl-fake-engine serve --host 127.0.0.1 --port 0 --served-name NAME [knobs]
//	capyctl fake-engine serve --host 127.0.0.1 --port 0 --served-name NAME [knobs]
//
// The same program is meant to be installed under a real engine's name and
// invoked with that engine's argv (a venv's bin/python with
// "-m vllm.entrypoints.openai.api_server …", "llama-server -m …",
// "tensorfold serve …"): Run dispatches on the program's base name and on
// "-m <module>", and each engine flavour adds its invocation to the table
// in invocations; anything else is refused with exit status 2.
//
// Exit status: 0 after SIGTERM or SIGINT (the flavour's SignalExitCode), the
// engine's code when it exits on its own (1 for a crash or an out-of-memory
// at load, the --exit-during-startup code), 2 for a bad command line.
package fakecli

import (
	"fmt"
	"io"
	"path/filepath"
	"strings"
)

// Run runs the fake engine invoked as argv0 (its base name selects an
// engine flavour: "python" with "-m <module>", "llama-server",
// "tensorfold"; any other name takes "serve") with args, and returns the
// process's exit status.
func Run(argv0 string, args []string, env func(string) string, stdout, stderr io.Writer) int {
	return run(argv0, args, env, stdout, stderr)
}

// EngineName reports whether prog (a base name) is one a real engine's
// program has ("python3.12", "llama-server", "tensorfold", "vllm",
// "sglang"): a program that runs the fake under such a name is standing
// in for that engine.
func EngineName(prog string) bool { return isEngineName(prog) }

// invocation is one way the binary can be called.
type invocation struct {
	// usage is shown in the error for an unknown invocation.
	usage string
	// match reports whether prog (argv[0]'s base name), module (the value
	// of "-m" for a Python interpreter, else "") and args select it.
	match func(prog, module string, args []string) bool
	// run runs it with the arguments after the selecting words.
	run func(args []string, env func(string) string, stdout, stderr io.Writer) int
}

// invocations is the dispatch table, tried in order.
var invocations = []invocation{
	{
		usage: "capyctl-fake-engine serve --served-name NAME [--host H] [--port P] [knobs]",
		match: func(prog, module string, args []string) bool {
			return module == "" && len(args) > 0 && args[0] == "serve" && !isEngineName(prog)
		},
		run: func(args []string, env func(string) string, stdout, stderr io.Writer) int {
			return serveCommand(args[1:], env, stdout, stderr)
		},
	},
	{
		usage: "llama-server --model FILE.gguf [--host H] [--port P] [--alias NAME] [-c N] [-np N] [--metrics] [--slots] ... | --version",
		match: func(prog, module string, args []string) bool { return prog == "llama-server" },
		run: func(args []string, env func(string) string, stdout, stderr io.Writer) int {
			return llamaServerCommand(args, env, stdout, stderr)
		},
	},
	{
		usage: "tensorfold serve MODEL_DIR --name NAME [--host H] [--port P] [--parallel N] [--context N] [--no-drafts] ... | --version",
		match: func(prog, module string, args []string) bool { return prog == "tensorfold" },
		run: func(args []string, env func(string) string, stdout, stderr io.Writer) int {
			return tensorFoldCommand(args, env, stdout, stderr)
		},
	},
	vllmInvocation,
	sglangInvocation,
	lmcacheInvocation,
}

// isEngineName reports a program name that a real engine uses: those
// invocations belong to the engine flavours, never to the generic serve.
func isEngineName(prog string) bool {
	switch prog {
	case "vllm", "llama-server", "tensorfold", "sglang":
		return true
	}
	return isPython(prog)
}

// isPython reports a Python interpreter's name ("python", "python3.12").
func isPython(prog string) bool { return strings.HasPrefix(prog, "python") }

// run dispatches argv and returns the exit status.
func run(argv0 string, args []string, env func(string) string, stdout, stderr io.Writer) int {
	prog := filepath.Base(argv0)
	module := ""
	if isPython(prog) {
		module = pythonModule(args)
	}
	for _, inv := range invocations {
		if inv.match(prog, module, args) {
			return inv.run(args, env, stdout, stderr)
		}
	}
	fmt.Fprintf(stderr, "capyctl-fake-engine: unknown invocation %q: no fake engine flavour simulates it\n", describe(prog, module, args))
	fmt.Fprintln(stderr, "known invocations:")
	for _, inv := range invocations {
		fmt.Fprintln(stderr, "  "+inv.usage)
	}
	return 2
}

// pythonModule is the module of "python [opts] -m MODULE …", or "".
func pythonModule(args []string) string {
	for i, a := range args {
		switch {
		case a == "-m" && i+1 < len(args):
			return args[i+1]
		case strings.HasPrefix(a, "-m") && len(a) > 2:
			return a[2:]
		case !strings.HasPrefix(a, "-"):
			return "" // a script: "python script.py"
		}
	}
	return ""
}

// describe names an invocation for messages.
func describe(prog, module string, args []string) string {
	switch {
	case module != "":
		return prog + " -m " + module
	case len(args) > 0 && !strings.HasPrefix(args[0], "-"):
		return prog + " " + args[0]
	}
	return prog
}
