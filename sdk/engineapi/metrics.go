// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

// Package engineapi holds the HTTP helpers drivers share to talk to an
// engine on its loopback port: a Prometheus text parser for the engines'
// /metrics, an SSE reader for streamed answers, a pooled client with fine
// polling, and readiness probes (/v1/models and a real chat answer).
package engineapi

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
)

// maxMetricsLine bounds one line of a metrics exposition.
const maxMetricsLine = 1 << 20

// Sample is one sample line of a Prometheus text exposition.
type Sample struct {
	// Name is the sample's name as exposed ("vllm:num_requests_running",
	// "x_bucket", "y_total").
	Name   string
	Labels map[string]string
	Value  float64
	// Timestamp is in milliseconds since the epoch, 0 when the line has
	// none.
	Timestamp int64
}

// Metrics is a parsed exposition.
type Metrics struct {
	// Samples are in exposition order.
	Samples []Sample
	// Types maps a metric family to its declared type (counter, gauge,
	// histogram, summary, untyped) from "# TYPE" lines.
	Types map[string]string
	// Help maps a metric family to its "# HELP" text.
	Help   map[string]string
	byName map[string][]int
}

// ParseMetrics parses the Prometheus text format (0.0.4, and the parts of
// OpenMetrics engines emit): "# HELP" and "# TYPE" lines, label values with
// escapes (\\, \", \n) in any order, NaN and ±Inf, optional timestamps after
// the value, exemplars, "# EOF". It keeps every sample it can parse and
// reports the first malformed line in err, so a caller can still read the
// figures it needs from an engine that emits one odd line.
func ParseMetrics(r io.Reader) (Metrics, error) {
	m := Metrics{Types: map[string]string{}, Help: map[string]string{}, byName: map[string][]int{}}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), maxMetricsLine)
	var firstErr error
	n := 0
	for sc.Scan() {
		n++
		line := strings.TrimRight(sc.Text(), "\r")
		trimmed := strings.TrimLeft(line, " \t")
		if trimmed == "" {
			continue
		}
		if trimmed[0] == '#' {
			if parseComment(&m, trimmed) {
				break // # EOF
			}
			continue
		}
		s, err := parseSample(trimmed)
		if err != nil {
			if firstErr == nil {
				firstErr = fmt.Errorf("metrics line %d: %w", n, err)
			}
			continue
		}
		m.byName[s.Name] = append(m.byName[s.Name], len(m.Samples))
		m.Samples = append(m.Samples, s)
	}
	if err := sc.Err(); err != nil {
		return m, fmt.Errorf("read metrics: %w", err)
	}
	return m, firstErr
}

// parseComment records HELP and TYPE lines; it reports true for "# EOF".
func parseComment(m *Metrics, line string) bool {
	fields := strings.Fields(line[1:])
	if len(fields) == 0 {
		return false
	}
	switch fields[0] {
	case "EOF":
		return len(fields) == 1
	case "TYPE":
		if len(fields) >= 3 {
			m.Types[unquoteName(fields[1])] = strings.ToLower(fields[2])
		}
	case "HELP":
		if len(fields) >= 2 {
			rest := strings.TrimLeft(line[1:], " \t")
			rest = strings.TrimLeft(rest[len("HELP"):], " \t")
			rest = strings.TrimLeft(rest[len(fields[1]):], " \t")
			m.Help[unquoteName(fields[1])] = unescapeHelp(rest)
		}
	}
	return false
}

// unquoteName removes the quotes around a UTF-8 metric name.
func unquoteName(s string) string {
	if len(s) >= 2 && s[0] == '"' && s[len(s)-1] == '"' {
		return s[1 : len(s)-1]
	}
	return s
}

// unescapeHelp undoes the HELP escapes \\ and \n.
func unescapeHelp(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	return strings.NewReplacer(`\\`, `\`, `\n`, "\n").Replace(s)
}

// sampleParser walks one sample line.
type sampleParser struct {
	s   string
	pos int
}

func (p *sampleParser) skipBlanks() {
	for p.pos < len(p.s) && (p.s[p.pos] == ' ' || p.s[p.pos] == '\t') {
		p.pos++
	}
}

func (p *sampleParser) peek() byte {
	if p.pos < len(p.s) {
		return p.s[p.pos]
	}
	return 0
}

// parseSample parses `name{labels} value [timestamp] [# exemplar]`, where
// the name may also be a quoted string inside the braces.
func parseSample(line string) (Sample, error) {
	p := &sampleParser{s: line}
	var s Sample
	if p.peek() != '{' {
		s.Name = p.name(true)
		if s.Name == "" {
			return s, fmt.Errorf("bad metric name in %q", clip(line))
		}
	}
	p.skipBlanks()
	if p.peek() == '{' {
		p.pos++
		if err := p.labels(&s); err != nil {
			return s, fmt.Errorf("%w in %q", err, clip(line))
		}
	}
	if s.Name == "" {
		return s, fmt.Errorf("no metric name in %q", clip(line))
	}
	p.skipBlanks()
	v, err := parseValue(p.word())
	if err != nil {
		return s, fmt.Errorf("bad value in %q: %w", clip(line), err)
	}
	s.Value = v
	p.skipBlanks()
	if w := p.peek(); w != 0 && w != '#' {
		ts, err := parseTimestamp(p.word())
		if err != nil {
			return s, fmt.Errorf("bad timestamp in %q: %w", clip(line), err)
		}
		s.Timestamp = ts
		p.skipBlanks()
	}
	if w := p.peek(); w != 0 && w != '#' {
		return s, fmt.Errorf("trailing text in %q", clip(line))
	}
	return s, nil
}

// name reads a metric (colons allowed) or label name.
func (p *sampleParser) name(metric bool) string {
	start := p.pos
	for p.pos < len(p.s) {
		c := p.s[p.pos]
		ok := c == '_' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' ||
			(p.pos > start && c >= '0' && c <= '9') || (metric && c == ':')
		if !ok {
			break
		}
		p.pos++
	}
	return p.s[start:p.pos]
}

// word reads up to the next blank.
func (p *sampleParser) word() string {
	start := p.pos
	for p.pos < len(p.s) && p.s[p.pos] != ' ' && p.s[p.pos] != '\t' {
		p.pos++
	}
	return p.s[start:p.pos]
}

// quoted reads a double-quoted string with the escapes \\, \" and \n; other
// escapes are kept as written.
func (p *sampleParser) quoted() (string, error) {
	if p.peek() != '"' {
		return "", errors.New("expected '\"'")
	}
	p.pos++
	var b strings.Builder
	for p.pos < len(p.s) {
		c := p.s[p.pos]
		switch c {
		case '"':
			p.pos++
			return b.String(), nil
		case '\\':
			if p.pos+1 >= len(p.s) {
				return "", errors.New("unterminated escape")
			}
			switch e := p.s[p.pos+1]; e {
			case '\\', '"':
				b.WriteByte(e)
			case 'n':
				b.WriteByte('\n')
			default:
				b.WriteByte('\\')
				b.WriteByte(e)
			}
			p.pos += 2
		default:
			b.WriteByte(c)
			p.pos++
		}
	}
	return "", errors.New("unterminated label value")
}

// labels reads the label set after '{', up to and including '}'.
func (p *sampleParser) labels(s *Sample) error {
	for {
		p.skipBlanks()
		switch p.peek() {
		case '}':
			p.pos++
			return nil
		case 0:
			return errors.New("unterminated label set")
		}
		var name string
		if p.peek() == '"' {
			q, err := p.quoted()
			if err != nil {
				return err
			}
			p.skipBlanks()
			if c := p.peek(); c == ',' || c == '}' {
				// A quoted metric name (UTF-8 names).
				if s.Name != "" {
					return errors.New("two metric names")
				}
				s.Name = q
				if c == ',' {
					p.pos++
				}
				continue
			}
			name = q
		} else {
			name = p.name(false)
			if name == "" {
				return errors.New("bad label name")
			}
		}
		p.skipBlanks()
		if p.peek() != '=' {
			return fmt.Errorf("expected '=' after label %q", name)
		}
		p.pos++
		p.skipBlanks()
		v, err := p.quoted()
		if err != nil {
			return err
		}
		if s.Labels == nil {
			s.Labels = map[string]string{}
		}
		s.Labels[name] = v
		p.skipBlanks()
		switch p.peek() {
		case ',':
			p.pos++
		case '}':
		default:
			return errors.New("expected ',' or '}' in label set")
		}
	}
}

// parseValue parses a sample value: a float, NaN, +Inf, -Inf.
func parseValue(w string) (float64, error) {
	if w == "" {
		return 0, errors.New("missing value")
	}
	switch strings.ToLower(w) {
	case "nan":
		return math.NaN(), nil
	case "+inf", "inf":
		return math.Inf(1), nil
	case "-inf":
		return math.Inf(-1), nil
	}
	return strconv.ParseFloat(w, 64)
}

// parseTimestamp parses milliseconds (Prometheus text) or fractional
// seconds (OpenMetrics) into milliseconds.
func parseTimestamp(w string) (int64, error) {
	if ms, err := strconv.ParseInt(w, 10, 64); err == nil {
		return ms, nil
	}
	f, err := strconv.ParseFloat(w, 64)
	if err != nil || math.IsNaN(f) || math.IsInf(f, 0) || math.Abs(f) > 1e15 {
		return 0, fmt.Errorf("timestamp %q", w)
	}
	return int64(f * 1000), nil
}

// clip shortens a line for an error message.
func clip(s string) string {
	if len(s) > 120 {
		return s[:120] + "..."
	}
	return s
}

// lookup returns the indices of the samples named name, trying the other
// spelling of a counter (with or without "_total") when there are none.
func (m Metrics) lookup(name string) []int {
	if idx := m.byName[name]; len(idx) > 0 {
		return idx
	}
	if base, ok := strings.CutSuffix(name, "_total"); ok {
		return m.byName[base]
	}
	return m.byName[name+"_total"]
}

// Value returns the first sample named name whose labels include all of
// labels (a subset match, in any order; nil matches any). A counter is
// found with or without its "_total" suffix.
func (m Metrics) Value(name string, labels map[string]string) (float64, bool) {
	for _, i := range m.lookup(name) {
		if matches(m.Samples[i].Labels, labels) {
			return m.Samples[i].Value, true
		}
	}
	return 0, false
}

// Sum adds every sample named name (all label sets), reporting false when
// there is none. A counter is found with or without its "_total" suffix.
func (m Metrics) Sum(name string) (float64, bool) {
	return m.SumMatching(name, nil)
}

// SumMatching adds the samples named name whose labels include labels
// (the figure across engine indexes of one model, for example).
func (m Metrics) SumMatching(name string, labels map[string]string) (float64, bool) {
	var sum float64
	found := false
	for _, i := range m.lookup(name) {
		if matches(m.Samples[i].Labels, labels) {
			sum += m.Samples[i].Value
			found = true
		}
	}
	return sum, found
}

// Has reports whether any sample is named name.
func (m Metrics) Has(name string) bool { return len(m.lookup(name)) > 0 }

// matches reports whether have includes every pair of want.
func matches(have, want map[string]string) bool {
	for k, v := range want {
		hv, ok := have[k]
		if !ok || hv != v {
			return false
		}
	}
	return true
}
