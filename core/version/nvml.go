// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

//go:build cgo && linux

package version

// NVML reports whether this build reads NVIDIA GPUs through NVML: it needs
// cgo on Linux (core/gpu's NVML provider). A build without it sees no
// NVIDIA GPU and says so (capyctl version, the role's GPU line).
const NVML = true
