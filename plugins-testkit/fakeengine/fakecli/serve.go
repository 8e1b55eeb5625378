// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package fakecli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os/signal"
	"strconv"
	"syscall"

	"github.com/capyctl/capyctl/plugins-testkit/fakeengine"
)

// serveCommand runs "serve": the generic command line of the fake engine.
func serveCommand(args []string, env func(string) string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("capyctl-fake-engine serve", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var (
		cfg     = fakeengine.Config{Stdout: stdout, Stderr: stderr}
		host    = fs.String("host", "127.0.0.1", "address to listen on")
		port    = fs.Int("port", 0, "port to listen on (0: any free port, printed in the log)")
		flavour = fs.String("flavour", "openai", "wire flavour")
	)
	fs.StringVar(&cfg.ServedName, "served-name", "", "model name to serve (required)")
	knobs := fakeengine.RegisterKnobs(fs, &cfg)
	fs.Usage = func() {
		fmt.Fprintln(stderr, "Usage: capyctl-fake-engine serve --served-name NAME [options]")
		fmt.Fprintln(stderr, "\nEvery knob is also read from CAPYCTL_FAKE_<NAME> (e.g. CAPYCTL_FAKE_STARTUP_DELAY); flags win.")
		fmt.Fprintln(stderr, "\nOptions:")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "capyctl-fake-engine serve: unexpected arguments %q\n", fs.Args())
		return 2
	}
	if err := knobs.Resolve(env); err != nil {
		fmt.Fprintf(stderr, "capyctl-fake-engine serve: %v\n", err)
		return 2
	}
	f, err := fakeengine.FlavourByName(*flavour)
	if err != nil {
		fmt.Fprintf(stderr, "capyctl-fake-engine serve: %v\n", err)
		return 2
	}
	cfg.Flavour = f
	if *port < 0 || *port > 65535 {
		fmt.Fprintf(stderr, "capyctl-fake-engine serve: port %d out of range\n", *port)
		return 2
	}
	return serveEngine(cfg, *host, *port, knobs.ListenAll, stderr)
}

// serveEngine listens, serves until a signal or an exit, and maps the end
// to an exit status. Flavours' invocations end here too.
func serveEngine(cfg fakeengine.Config, host string, port int, listenAll bool, stderr io.Writer) int {
	return serveEngineOn(cfg, host, port, "", listenAll, stderr)
}

// serveEngineOn is serveEngine on the Unix socket sock when it is not "".
func serveEngineOn(cfg fakeengine.Config, host string, port int, sock string, listenAll bool, stderr io.Writer) int {
	e, err := fakeengine.New(cfg)
	if err != nil {
		fmt.Fprintf(stderr, "capyctl-fake-engine: %v\n", err)
		return 2
	}
	network := "tcp"
	if listenAll {
		network, host = "tcp4", "0.0.0.0"
	}
	var ln net.Listener
	if sock != "" && !listenAll {
		ln, err = fakeengine.ListenUnix(sock)
	} else {
		ln, err = fakeengine.Listen(network, net.JoinHostPort(host, strconv.Itoa(port)))
	}
	if err != nil {
		fmt.Fprintf(stderr, "capyctl-fake-engine: %v\n", err)
		return 1
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	err = e.Serve(ctx, ln)
	var x *fakeengine.ExitError
	switch {
	case errors.As(err, &x):
		return x.Code
	case err != nil:
		fmt.Fprintf(stderr, "capyctl-fake-engine: %v\n", err)
		return 1
	}
	return e.Flavour().SignalExitCode()
}
