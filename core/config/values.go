// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package config

import (
	"fmt"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/capyctl/capyctl/core/structs"
)

// Amount is a memory limit or reserve: "auto" (the role derives it), a
// size ("90GiB") or a percentage of the domain's capacity ("75%").
type Amount struct {
	Auto    bool
	Bytes   structs.ByteSize
	Percent float64
}

// IsPercent reports whether the amount is a percentage.
func (a Amount) IsPercent() bool { return !a.Auto && a.Percent > 0 }

// ParseAmount parses "auto", a size or a percentage in 0..100.
func ParseAmount(s string) (Amount, error) {
	t := strings.TrimSpace(s)
	switch {
	case t == "auto":
		return Amount{Auto: true}, nil
	case strings.HasSuffix(t, "%"):
		p, err := strconv.ParseFloat(strings.TrimSpace(strings.TrimSuffix(t, "%")), 64)
		if err != nil {
			return Amount{}, fmt.Errorf("percentage %q does not parse", s)
		}
		if p <= 0 || p > 100 {
			return Amount{}, fmt.Errorf("percentage %q is outside (0%%, 100%%]", s)
		}
		return Amount{Percent: p}, nil
	default:
		b, err := structs.ParseByteSize(t)
		if err != nil {
			return Amount{}, fmt.Errorf("%w (or use auto, or a percentage like 75%%)", err)
		}
		if b == 0 {
			return Amount{}, fmt.Errorf("size %q is zero", s)
		}
		return Amount{Bytes: b}, nil
	}
}

// String renders the amount as it parses back.
func (a Amount) String() string {
	switch {
	case a.Auto:
		return "auto"
	case a.Percent > 0:
		return strconv.FormatFloat(a.Percent, 'f', -1, 64) + "%"
	default:
		return a.Bytes.String()
	}
}

// Resolve returns the amount in bytes for a domain of capacity bytes;
// "auto" takes autoPercent of the capacity.
func (a Amount) Resolve(capacity int64, autoPercent float64) int64 {
	switch {
	case a.Auto:
		return int64(float64(capacity) * autoPercent / 100)
	case a.Percent > 0:
		return int64(float64(capacity) * a.Percent / 100)
	default:
		return int64(a.Bytes)
	}
}

// PortRange is an inclusive range of TCP ports, "8100-8199".
type PortRange struct {
	First, Last int
}

// ParsePortRange parses "first-last" (or one port).
func ParsePortRange(s string) (PortRange, error) {
	a, b, found := strings.Cut(strings.TrimSpace(s), "-")
	if !found {
		b = a
	}
	first, err1 := strconv.Atoi(strings.TrimSpace(a))
	last, err2 := strconv.Atoi(strings.TrimSpace(b))
	if err1 != nil || err2 != nil {
		return PortRange{}, fmt.Errorf("port range %q does not parse (use first-last, like 8100-8199)", s)
	}
	if first < 1024 || last > 65535 || first > last {
		return PortRange{}, fmt.Errorf("port range %q must lie within 1024-65535, first <= last", s)
	}
	return PortRange{First: first, Last: last}, nil
}

// String renders "first-last".
func (r PortRange) String() string { return fmt.Sprintf("%d-%d", r.First, r.Last) }

// Contains reports whether port lies in the range.
func (r PortRange) Contains(port int) bool { return port >= r.First && port <= r.Last }

// Len is the number of ports in the range.
func (r PortRange) Len() int { return r.Last - r.First + 1 }

// parseDuration accepts Go durations and whole days ("7d", "7d12h").
func parseDuration(s string) (structs.Duration, error) {
	t := strings.TrimSpace(s)
	if days, rest, ok := strings.Cut(t, "d"); ok {
		n, err := strconv.Atoi(days)
		if err != nil || n < 0 {
			return 0, fmt.Errorf("duration %q does not parse (use ms, s, m, h or d)", s)
		}
		d := time.Duration(n) * 24 * time.Hour
		if rest != "" {
			r, err := structs.ParseDuration(rest)
			if err != nil {
				return 0, fmt.Errorf("duration %q does not parse (use ms, s, m, h or d)", s)
			}
			d += r.D()
		}
		return structs.Duration(d), nil
	}
	return structs.ParseDuration(t)
}

// parseAddr checks "host:port" and returns the port. Port 0 asks the
// system for any free port (tests and capyctl dev use it; the role records
// the port it got in its state directory).
func parseAddr(s string) (host string, port int, err error) {
	h, p, err := net.SplitHostPort(strings.TrimSpace(s))
	if err != nil {
		return "", 0, fmt.Errorf("address %q is not host:port", s)
	}
	n, err := strconv.Atoi(p)
	if err != nil || n < 0 || n > 65535 {
		return "", 0, fmt.Errorf("address %q has no valid port (0-65535)", s)
	}
	return h, n, nil
}

// isLoopback reports whether host names the loopback interface.
func isLoopback(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
