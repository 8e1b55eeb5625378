// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package engine

import (
	"strconv"
	"strings"
)

// ReleaseAtLeast reports whether a release's numbers ([0 7 0] for 0.7.0)
// are at least min's, a missing number reading 0.
func ReleaseAtLeast(release, min []int) bool {
	for i := 0; i < max(len(release), len(min)); i++ {
		x, y := 0, 0
		if i < len(release) {
			x = release[i]
		}
		if i < len(min) {
			y = min[i]
		}
		if x != y {
			return x > y
		}
	}
	return true
}

// VersionAtLeast reports whether a version ("0.31.0", "v0.7.0rc1") is a
// release at least min; anything that is not a release is not.
func VersionAtLeast(v string, min []int) bool {
	v = strings.TrimPrefix(v, "v")
	if i := strings.IndexFunc(v, func(r rune) bool { return r != '.' && (r < '0' || r > '9') }); i >= 0 {
		v = v[:i]
	}
	parts := strings.Split(strings.TrimSuffix(v, "."), ".")
	if len(parts) < 2 {
		return false
	}
	rel := make([]int, len(parts))
	for i, p := range parts {
		n, err := strconv.Atoi(p)
		if err != nil {
			return false
		}
		rel[i] = n
	}
	return ReleaseAtLeast(rel, min)
}
