// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package proc

import (
	"errors"
	"time"
)

// ShimArg is the first argument that makes an executable act as the shim
// (see MaybeRunShim).
const ShimArg = "__capyctl_engine_shim"

// Log modes of a launch.
const (
	// LogModeFile keeps the redacted output in LaunchDir/engine.log (0600),
	// rotated at 16 MiB keeping 3 files, besides the shim's ring.
	LogModeFile = "file"
	// LogModeMemory keeps the redacted output only in the shim's 4 MiB ring;
	// no log file is ever written.
	LogModeMemory = "memory"
)

// Files in a launch directory.
const (
	// SocketName is the shim's unix socket.
	SocketName = "shim.sock"
	// ExitFileName records the engine's exit status.
	ExitFileName = "exit.json"
	// LogFileName is the current engine log (file mode); rotated copies get
	// the suffixes .1 and .2.
	LogFileName = "engine.log"
)

const (
	// RingSize is the size of the shim's in-memory log ring.
	RingSize = 4 << 20
	// LogRotateBytes is the size at which engine.log is rotated.
	LogRotateBytes = 16 << 20
	// LogFiles is how many log files a launch keeps (engine.log and its
	// rotated copies).
	LogFiles = 3
	// MemoryLinger is how long a memory-mode shim keeps serving its ring
	// after the engine's group is gone, unless told to go.
	MemoryLinger = 60 * time.Second
)

// Errors callers may test with errors.Is.
var (
	// ErrUnsupported: process management needs Linux.
	ErrUnsupported = errors.New("process management is supported on linux only")
	// ErrIdentityMismatch: a recorded PID now names another process (PID
	// reuse); nothing was signalled.
	ErrIdentityMismatch = errors.New("recorded process identity does not match")
	// ErrNoStatus: neither the shim nor an exit record answers.
	ErrNoStatus = errors.New("no engine status: the shim is gone and no exit record exists")
	// ErrNoLogs: no shim and no log file hold the engine's output.
	ErrNoLogs = errors.New("no engine output available")
)

// Identity identifies a process across PID reuse.
type Identity struct {
	PID int `json:"pid"`
	// StartTicks is field 22 of /proc/<pid>/stat: the start time in clock
	// ticks since boot.
	StartTicks uint64 `json:"start_ticks"`
}

// LaunchSpec is what Start launches.
type LaunchSpec struct {
	// Argv is the program and its arguments. Argv[0] is an absolute path,
	// or a name looked up in Env["PATH"] (never the caller's PATH).
	Argv []string `json:"argv"`
	// Env is the complete environment of the engine; nothing is inherited.
	Env map[string]string `json:"env"`
	// Dir is the working directory; "" means LaunchDir.
	Dir string `json:"dir"`
	// LaunchDir is the launch's private directory (created 0700): it holds
	// shim.sock, exit.json and, in file mode, engine.log.
	LaunchDir string `json:"launch_dir"`
	// LogMode is LogModeFile (the default when empty) or LogModeMemory.
	LogMode string `json:"log_mode"`
	// Secrets are exact values redacted from the output (the engine key and
	// others), besides the Redactor's patterns.
	Secrets []string `json:"secrets"`
	// NoCoreDumps sets the engine's core-file size limit to 0, so a crash
	// leaves no memory image (prompts, keys) on disk: retention = "zero".
	NoCoreDumps bool `json:"no_core_dumps,omitempty"`
	// NetNamespace starts the engine in a network namespace of its own
	// with only loopback up (needs root): no other process of the host
	// reaches its ports, CapyCTL reaches them with DialNetns. The shim
	// stays in the host's namespace.
	NetNamespace bool `json:"net_namespace,omitempty"`
	// JoinNetns, when set, starts the engine in the network namespace of
	// that live process instead (a server of the instance the engine must
	// reach on 127.0.0.1, itself launched with NetNamespace). The identity
	// is checked after the namespace is opened, so a reused PID is refused.
	JoinNetns Identity `json:"join_netns,omitempty"`
	// Executable overrides the executable started as the shim (default
	// os.Executable()). It must call MaybeRunShim first thing in main.
	Executable string `json:"-"`
}

// Launched is a running launch: what a driver records to find it again.
type Launched struct {
	// Pgid is the process group of the launch; it equals the shim's PID.
	Pgid int `json:"pgid"`
	// Shim is the supervisor process.
	Shim Identity `json:"shim"`
	// Engine is the engine process, the shim's child.
	Engine Identity `json:"engine"`
	// LaunchDir is the launch directory.
	LaunchDir string `json:"launch_dir"`
}

// StopResult is the outcome of Stop.
type StopResult struct {
	// Gone is true once no live process is left in the group and the
	// recorded identities are dead: the proof of exit.
	Gone bool
	// Forced is true when the group had to be killed with SIGKILL.
	Forced bool
	// ExitCode is the engine's exit code (128+signal when a signal ended
	// it), -1 when unknown.
	ExitCode int
	// Signal names the signal that ended the engine ("SIGKILL"), "" when it
	// exited by itself or the status is unknown.
	Signal string
	// Detail says what Stop did and saw, for logs and the operator.
	Detail string
}

// Status is an engine's state as the shim (or its exit record) knows it.
type Status struct {
	// EnginePID is the engine's PID, 0 when unknown.
	EnginePID int `json:"engine_pid"`
	// Running is true while the engine process runs.
	Running bool `json:"running"`
	// Exited is true once the engine process has ended.
	Exited bool `json:"exited"`
	// ExitCode is the exit code (128+signal for a signal), -1 when unknown
	// or still running.
	ExitCode int `json:"exit_code"`
	// Signal names the signal that ended the engine, if one did.
	Signal string `json:"signal"`
}

// LaunchState is what Inspect finds of a recorded launch.
type LaunchState int

const (
	// LaunchGone: no process of the launch is left.
	LaunchGone LaunchState = iota
	// LaunchRunning: the engine process is alive.
	LaunchRunning
	// LaunchExited: the engine has ended, but its shim still holds the
	// group (other processes are left, or it lingers to serve its tail).
	LaunchExited
	// LaunchUncertain: the recorded processes are gone but their group
	// still has members whose ownership cannot be proven (the shim was
	// killed from outside). Stop refuses such a group.
	LaunchUncertain
)

// String returns "gone", "running", "exited" or "uncertain".
func (s LaunchState) String() string {
	switch s {
	case LaunchRunning:
		return "running"
	case LaunchExited:
		return "exited"
	case LaunchUncertain:
		return "uncertain"
	default:
		return "gone"
	}
}

// exitRecord is the content of exit.json.
type exitRecord struct {
	Code   int    `json:"code"`
	Signal string `json:"signal,omitempty"`
	// At is the Unix time in milliseconds when the shim saw the exit.
	At  int64 `json:"at"`
	PID int   `json:"pid"`
}
