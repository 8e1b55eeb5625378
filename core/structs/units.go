// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package structs

import (
	"encoding/json"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"
)

// Byte units.
const (
	KiB int64 = 1 << 10
	MiB int64 = 1 << 20
	GiB int64 = 1 << 30
	TiB int64 = 1 << 40
)

// ByteSize is a byte count written with a unit: "512MiB", "11GiB",
// "1.5GiB", "2048B", or a bare integer of bytes. Decimal units (KB, MB, GB,
// TB) are powers of ten.
type ByteSize int64

// ParseByteSize parses a size. Negative sizes and overflows are refused.
func ParseByteSize(s string) (ByteSize, error) {
	t := strings.TrimSpace(s)
	if t == "" {
		return 0, fmt.Errorf("empty size")
	}
	i := len(t)
	for i > 0 && (t[i-1] < '0' || t[i-1] > '9') && t[i-1] != '.' {
		i--
	}
	num, unit := strings.TrimSpace(t[:i]), strings.TrimSpace(t[i:])
	if num == "" {
		return 0, fmt.Errorf("size %q has no number", s)
	}
	mult := map[string]float64{
		"": 1, "B": 1,
		"KiB": float64(KiB), "MiB": float64(MiB), "GiB": float64(GiB), "TiB": float64(TiB),
		"KB": 1e3, "MB": 1e6, "GB": 1e9, "TB": 1e12,
		"K": float64(KiB), "M": float64(MiB), "G": float64(GiB), "T": float64(TiB),
	}[unit]
	if mult == 0 {
		return 0, fmt.Errorf("size %q has an unknown unit %q (use B, KiB, MiB, GiB, TiB)", s, unit)
	}
	f, err := strconv.ParseFloat(num, 64)
	if err != nil || math.IsNaN(f) || math.IsInf(f, 0) {
		return 0, fmt.Errorf("size %q does not parse", s)
	}
	if f < 0 {
		return 0, fmt.Errorf("size %q is negative", s)
	}
	v := f * mult
	if v > float64(math.MaxInt64/2) {
		return 0, fmt.Errorf("size %q is too large", s)
	}
	return ByteSize(math.Round(v)), nil
}

// String renders the size with the largest binary unit that keeps it
// readable ("11GiB", "1.5GiB", "300MiB").
func (b ByteSize) String() string { return FormatBytes(int64(b)) }

// FormatBytes renders a byte count for people.
func FormatBytes(n int64) string {
	neg := n < 0
	if neg {
		n = -n
	}
	var s string
	switch {
	case n >= TiB:
		s = trimFloat(float64(n)/float64(TiB)) + "TiB"
	case n >= GiB:
		s = trimFloat(float64(n)/float64(GiB)) + "GiB"
	case n >= MiB:
		s = trimFloat(float64(n)/float64(MiB)) + "MiB"
	case n >= KiB:
		s = trimFloat(float64(n)/float64(KiB)) + "KiB"
	default:
		s = strconv.FormatInt(n, 10) + "B"
	}
	if neg {
		return "-" + s
	}
	return s
}

func trimFloat(f float64) string {
	s := strconv.FormatFloat(f, 'f', 1, 64)
	return strings.TrimSuffix(s, ".0")
}

// MarshalJSON writes the size as an integer of bytes.
func (b ByteSize) MarshalJSON() ([]byte, error) { return json.Marshal(int64(b)) }

// UnmarshalJSON reads an integer of bytes or a size string.
func (b *ByteSize) UnmarshalJSON(data []byte) error {
	var n int64
	if err := json.Unmarshal(data, &n); err == nil {
		*b = ByteSize(n)
		return nil
	}
	var s string
	if err := json.Unmarshal(data, &s); err != nil {
		return fmt.Errorf("size must be a number of bytes or a string like \"11GiB\"")
	}
	v, err := ParseByteSize(s)
	if err != nil {
		return err
	}
	*b = v
	return nil
}

// Duration is a time.Duration written as "30s", "5m", "1h30m".
type Duration time.Duration

// ParseDuration parses a non-negative duration.
func ParseDuration(s string) (Duration, error) {
	d, err := time.ParseDuration(strings.TrimSpace(s))
	if err != nil {
		return 0, fmt.Errorf("duration %q does not parse (use ms, s, m, h)", s)
	}
	if d < 0 {
		return 0, fmt.Errorf("duration %q is negative", s)
	}
	return Duration(d), nil
}

// D returns the time.Duration.
func (d Duration) D() time.Duration { return time.Duration(d) }

// String renders the duration.
func (d Duration) String() string { return FormatDuration(time.Duration(d)) }

// MarshalJSON writes the duration as a string.
func (d Duration) MarshalJSON() ([]byte, error) {
	return json.Marshal(FormatDuration(time.Duration(d)))
}

// FormatDuration renders a duration as an operator writes one: the units
// that are not zero ("2m", "168h", "1h30m", "1m30s"), not Go's "2m0s"; a
// fraction of a second as Go writes it ("1.5s", "250ms"). It parses back
// with ParseDuration.
func FormatDuration(d time.Duration) string {
	if d == 0 {
		return "0s"
	}
	if d < 0 {
		return "-" + FormatDuration(-d)
	}
	if d%time.Second != 0 {
		return d.String()
	}
	h, m, sec := d/time.Hour, (d%time.Hour)/time.Minute, (d%time.Minute)/time.Second
	var b strings.Builder
	if h > 0 {
		b.WriteString(strconv.FormatInt(int64(h), 10) + "h")
	}
	if m > 0 {
		b.WriteString(strconv.FormatInt(int64(m), 10) + "m")
	}
	if sec > 0 {
		b.WriteString(strconv.FormatInt(int64(sec), 10) + "s")
	}
	return b.String()
}

// UnmarshalJSON reads a duration string or an integer of nanoseconds.
func (d *Duration) UnmarshalJSON(data []byte) error {
	var s string
	if err := json.Unmarshal(data, &s); err == nil {
		v, err := ParseDuration(s)
		if err != nil {
			return err
		}
		*d = v
		return nil
	}
	var n int64
	if err := json.Unmarshal(data, &n); err != nil {
		return fmt.Errorf("duration must be a string like \"30s\"")
	}
	*d = Duration(n)
	return nil
}
