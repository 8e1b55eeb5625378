// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

//go:build !cgo || !linux

package gpu

import "fmt"

// openNVML: go-nvml needs cgo, so a build without it has no NVML and
// gpu.provider = auto means none.
func openNVML() (Provider, error) {
	return nil, fmt.Errorf("%w: this build of capyctl has no NVML (built without cgo)", ErrNoGPU)
}
