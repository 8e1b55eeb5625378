// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

//go:build !cgo || !linux

package version

// NVML reports whether this build reads NVIDIA GPUs through NVML: not
// without cgo on Linux (see nvml.go).
const NVML = false
