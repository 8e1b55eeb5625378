// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package fakeengine

import (
	"fmt"
	"math"
	"strconv"
	"strings"
)

// Byte units.
const (
	kib int64 = 1 << 10
	mib int64 = 1 << 20
	gib int64 = 1 << 30
	tib int64 = 1 << 40
)

// ParseBytes parses a size: a bare integer of bytes, or a number with a
// unit: "512MiB", "2GiB", "1.5GiB", "4096B"; KiB/MiB/GiB/TiB (also K, M, G,
// T) are powers of two, KB/MB/GB/TB powers of ten. Negative sizes are
// refused.
func ParseBytes(s string) (int64, error) {
	t := strings.TrimSpace(s)
	i := len(t)
	for i > 0 && (t[i-1] < '0' || t[i-1] > '9') && t[i-1] != '.' {
		i--
	}
	num, unit := strings.TrimSpace(t[:i]), strings.TrimSpace(t[i:])
	if num == "" {
		return 0, fmt.Errorf("size %q has no number", s)
	}
	mult, ok := map[string]float64{
		"": 1, "B": 1,
		"KiB": float64(kib), "MiB": float64(mib), "GiB": float64(gib), "TiB": float64(tib),
		"K": float64(kib), "M": float64(mib), "G": float64(gib), "T": float64(tib),
		"KB": 1e3, "MB": 1e6, "GB": 1e9, "TB": 1e12,
	}[unit]
	if !ok {
		return 0, fmt.Errorf("size %q has an unknown unit %q", s, unit)
	}
	f, err := strconv.ParseFloat(num, 64)
	if err != nil || math.IsNaN(f) || math.IsInf(f, 0) {
		return 0, fmt.Errorf("size %q does not parse", s)
	}
	if f < 0 {
		return 0, fmt.Errorf("size %q is negative", s)
	}
	if v := f * mult; v < float64(math.MaxInt64/2) {
		return int64(math.Round(v)), nil
	}
	return 0, fmt.Errorf("size %q is too large", s)
}

// FormatBytes renders a byte count with the largest binary unit that keeps
// it readable ("2GiB", "1.5GiB", "300MiB", "512B").
func FormatBytes(n int64) string {
	units := []struct {
		size int64
		name string
	}{{tib, "TiB"}, {gib, "GiB"}, {mib, "MiB"}, {kib, "KiB"}}
	for _, u := range units {
		if n >= u.size || -n >= u.size {
			s := strconv.FormatFloat(float64(n)/float64(u.size), 'f', 1, 64)
			return strings.TrimSuffix(s, ".0") + u.name
		}
	}
	return strconv.FormatInt(n, 10) + "B"
}

// gibString renders bytes as PyTorch's messages do ("2.00 GiB").
func gibString(n int64) string {
	return fmt.Sprintf("%.2f GiB", float64(n)/float64(gib))
}
