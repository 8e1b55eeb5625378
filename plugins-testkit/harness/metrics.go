// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package harness

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// Metrics are a role's Prometheus metrics (GET /metrics on the management
// listener) as series → value; a series is the metric's name with its
// labels as the exposition writes them (`capyctl_start_slots_in_use{family="custom"}`).
type Metrics map[string]float64

// Metrics reads the role's /metrics with its admin token.
func (r *Role) Metrics(ctx context.Context) (Metrics, error) {
	if r.Info == nil || r.Creds == nil {
		return nil, fmt.Errorf("the role is not running")
	}
	return ReadMetrics(ctx, "http://"+r.Info.Management+"/metrics", r.Creds.AdminToken)
}

// ReadMetrics reads a Prometheus text exposition with a bearer token.
func ReadMetrics(ctx context.Context, url, token string) (Metrics, error) {
	ctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return ParseMetrics(bufio.NewScanner(resp.Body))
}

// ParseMetrics reads the samples of a Prometheus text exposition
// (comments and timestamps ignored).
func ParseMetrics(sc *bufio.Scanner) (Metrics, error) {
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	out := Metrics{}
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		// The value follows the series: after the closing brace of the
		// labels (whose values may hold spaces), else after the name.
		cut := strings.LastIndexByte(line, '}')
		if cut < 0 {
			cut = strings.IndexByte(line, ' ')
		} else {
			cut++
		}
		if cut <= 0 || cut >= len(line) {
			continue
		}
		series, rest := line[:cut], strings.Fields(line[cut:])
		if len(rest) == 0 {
			continue
		}
		v, err := strconv.ParseFloat(rest[0], 64)
		if err != nil {
			return nil, fmt.Errorf("metrics line %q: %w", line, err)
		}
		out[series] = v
	}
	return out, sc.Err()
}

// Sum is the sum of every series of a metric (whatever its labels).
func (m Metrics) Sum(name string) float64 {
	var s float64
	for series, v := range m {
		if series == name || strings.HasPrefix(series, name+"{") {
			s += v
		}
	}
	return s
}

// Get is one series' value, and whether it is there.
func (m Metrics) Get(series string) (float64, bool) {
	v, ok := m[series]
	return v, ok
}
