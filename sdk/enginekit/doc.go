// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

// Package enginekit is what every CapyCTL driver needs besides the
// knowledge of its own engine: the parts of Start, Probe, Stop, Recover,
// Logs and Load that are the same for any engine that serves an
// OpenAI-compatible API on a loopback port. CapyCTL's first-party drivers
// (vLLM, SGLang, llama.cpp, TensorFold, custom programs) are built on it
// exactly as a third-party driver is; website/examples/driver is a whole
// driver on it in under 150 lines.
//
// A driver built on the kit keeps one Registry of its instances. The
// pieces, in the order an instance's life uses them:
//
//   - Plan: NewEnv and its steps (PinDevices, NoTelemetry, Merge) render the
//     engine's environment; Refusals collects what the deployment may not
//     do, each with a catalogue code (CheckOptions runs an sdk/flags table).
//   - Start: StartLaunch runs the plan behind sdk/proc's launch shim (own
//     session and process group, output captured and redacted), after
//     checking that the leased port is free. NewEndpoint says how the
//     router reaches the engine; NewInstance is the handle; Registry.Started
//     keeps it and answers.
//   - Probe: Instance.WaitReady polls a ReadyFunc (ChatReady: the served
//     name listed, then a real answer) until it holds, the engine exits,
//     the engine listens off loopback (it is then stopped), or the
//     deadline passes; every failure carries a code and the engine's last
//     log lines. Instance.Liveness answers a liveness probe.
//   - Load: Registry.Load reads the idle signal from the engine's
//     Prometheus /metrics (MetricNames).
//   - Stop: Registry.Stop ends the whole process group and proves it gone,
//     from the kept handle or from the launch the core recorded.
//   - Recover: Registry.Recover re-attaches a restarted driver to a recorded
//     launch (RUNNING, GONE or UNCERTAIN), building the handle with an
//     AttachFunc.
//   - Logs: Registry.Logs is the redacted tail of the engine's output.
//
// A Handle is *Instance itself, or a driver's own type that embeds
// *Instance beside what only its engine needs. RestartOnly answers Park,
// Wake and Abort for engines that cannot release their memory while they
// run.
//
// The package imports nothing of CapyCTL's core: a driver that imports it
// links the SDK, go-plugin, gRPC, protobuf and go-hclog, no more (a test in
// sdk/ keeps it so).
package enginekit
