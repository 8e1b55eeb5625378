// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

// Package sysmonpace keeps the Go runtime's system monitor of a role's
// process at its own pace instead of waking it on every return from idle.
//
// The runtime's system monitor (sysmon) sleeps deeply while every
// processor is idle, and the first system call after that wakes it (a
// futex wake on the request's path) and sets it polling every 20 µs for
// at least a millisecond: a bet that it will soon have to take back a
// processor held by a blocking system call. A role serving one request at
// a time goes idle and back several times per request (it waits for the
// engine, for the client), so the bet is made again and again: 14 % of
// the role's CPU at one stream at a time was the monitor's 20 µs sleeps
// (perf record, 64-chunk streams in front of the fake engine), and as
// much again in the bare Go proxy it is measured against.
//
// The one way to keep the monitor out of its deep sleep is the runtime's
// own GODEBUG schedtrace setting (runtime/proc.go: "sysmon should not
// enter deep sleep if schedtrace is enabled"), read once as the process
// starts. With it the monitor never sleeps deeply: it polls every 20 µs
// for a millisecond after it last took a processor back, then doubles its
// sleep up to 10 ms, as it does today between those bets; under load,
// when it does take processors back, nothing changes. An idle role's
// monitor wakes every 10 ms instead of sleeping until the next timer:
// `capyctl dev` left idle spent 0.6 % of a processor against 0.2 %
// without the setting (2-core virtual machine, 30 s each).
//
// What else the setting does, as the runtime stands (Go 1.26): it prints
// a scheduler trace line every period, and the period here is the largest
// the setting takes, 2³¹-1 ms (24.8 days), counted from the machine's
// boot: a machine up that long prints one line, "SCHED ...", on the
// role's standard error (between its log lines, which are otherwise one
// JSON object each with log_format = "json") as the role starts and again
// every 24.8 days. And a crash (a panic, a fatal error, SIGQUIT) prints
// the scheduler's detailed state before the usual traceback: a line per
// processor, thread and goroutine.
//
// Settle re-executes the binary with the setting, once, before a role
// starts; the re-executed process puts GODEBUG back as it was, so that
// anything it starts inherits the operator's environment, not the
// setting. An operator's own schedtrace is left alone: GODEBUG=schedtrace=0
// keeps the runtime's default. So is a process limited to one processor
// (GOMAXPROCS, or a CPU quota): nothing to take back from another.
package sysmonpace

import (
	"os"
	"strings"
)

// Setting is the GODEBUG setting Settle adds.
const Setting = "schedtrace=2147483647"

// origEnv holds GODEBUG as it was before Settle re-executed the binary
// ("-" when it was unset).
const origEnv = "CAPYCTL_GODEBUG_BEFORE_SYSMONPACE"

// Wants reports whether args start a role: `capyctl start standalone`,
// `start server`, `start host` or `capyctl dev`, the commands that run one
// in this process (`start deployment` and `start instance` are a
// client's).
func Wants(args []string) bool {
	if len(args) < 2 {
		return false
	}
	switch args[1] {
	case "dev":
		return true
	case "start":
		return len(args) > 2 && (args[2] == "standalone" || args[2] == "server" || args[2] == "host")
	}
	return false
}

// withSetting returns GODEBUG with Setting added, and false when it holds
// a schedtrace of its own.
func withSetting(godebug string) (string, bool) {
	for _, f := range strings.Split(godebug, ",") {
		if strings.HasPrefix(strings.TrimSpace(f), "schedtrace=") {
			return godebug, false
		}
	}
	if godebug == "" {
		return Setting, true
	}
	return godebug + "," + Setting, true
}

// reexecEnv returns environ with GODEBUG holding Setting and the marker
// holding GODEBUG as it was, each once (the runtime and os read a
// variable's first occurrence); false when GODEBUG has a schedtrace of
// its own.
func reexecEnv(environ []string) ([]string, bool) {
	was, set := "", false
	out := make([]string, 0, len(environ)+2)
	for _, kv := range environ {
		switch {
		case strings.HasPrefix(kv, "GODEBUG="):
			if !set {
				was, set = kv[len("GODEBUG="):], true
			}
		case strings.HasPrefix(kv, origEnv+"="):
		default:
			out = append(out, kv)
		}
	}
	next, ok := withSetting(was)
	if !ok {
		return environ, false
	}
	if !set {
		was = "-"
	}
	return append(out, "GODEBUG="+next, origEnv+"="+was), true
}

// restore puts GODEBUG back as it was before the re-execution; it reports
// whether this process is the re-executed one.
func restore() bool {
	was, ok := os.LookupEnv(origEnv)
	if !ok {
		return false
	}
	// Only the environment Settle made: a marker copied with the rest of
	// a role's environment (/proc/<pid>/environ shows it) into an
	// operator's shell must not rewrite the operator's GODEBUG.
	if g := os.Getenv("GODEBUG"); g != Setting && !strings.HasSuffix(g, ","+Setting) {
		_ = os.Unsetenv(origEnv)
		return false
	}
	_ = os.Unsetenv(origEnv)
	if was == "-" {
		_ = os.Unsetenv("GODEBUG")
	} else {
		_ = os.Setenv("GODEBUG", was)
	}
	return true
}
