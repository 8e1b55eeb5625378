// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package faults

import (
	"fmt"
	"regexp"
	"sort"
	"strings"
	"time"
)

// The promises the faults share, for Fault.Expect. Each fault states its
// own (website/content/operations/faults.md says them in words); these
// are the pieces.

// expect runs checks in order.
func expect(checks ...func(e *Env, got Result)) func(e *Env, got Result) {
	return func(e *Env, got Result) {
		for _, c := range checks {
			c(e, got)
		}
	}
}

// allEnginesSurvive: every engine that ran before the fault runs on as the
// same instance's engine, with the same PID.
func allEnginesSurvive(e *Env, got Result) {
	if got.Kept != got.Of || got.Of == 0 {
		e.Miss("engines survived %d/%d (%s), want every one", got.Kept, got.Of, strings.Join(got.Gone, "; "))
	}
}

// nothingFails: no request and no stream of the traffic failed.
func nothingFails(e *Env, got Result) {
	if bad := failures(got.Out, func(string) bool { return false }); bad != "" {
		e.Miss("requests or streams failed (%s), want none", bad)
	}
}

// failOnly: every failure of the traffic is one that allowed accepts.
func failOnly(what string, allowed func(outcome string) bool) func(e *Env, got Result) {
	return func(e *Env, got Result) {
		if bad := failures(got.Out, allowed); bad != "" {
			e.Miss("failures other than %s: %s", what, bad)
		}
	}
}

// connectionLost accepts the outcomes of a role that is not there: its
// listener closed, its connections cut.
func connectionLost(outcome string) bool {
	switch outcome {
	case "connection refused", "connection closed", "connection reset", "stream cut", "body cut":
		return true
	}
	return false
}

var codedOutcome = regexp.MustCompile(`^(?:[1-5][0-9]{2} |stream error )[a-z][a-z_]*$`)

// coded accepts an answer with a catalogue code: an HTTP error with the
// code in its envelope, or a stream's error event with one.
func coded(outcome string) bool { return codedOutcome.MatchString(outcome) }

// codedAs accepts a coded outcome with one of codes.
func codedAs(codes ...string) func(string) bool {
	return func(outcome string) bool {
		if !coded(outcome) {
			return false
		}
		for _, c := range codes {
			if strings.HasSuffix(outcome, " "+c) {
				return true
			}
		}
		return false
	}
}

// anyOf accepts what any of fs accepts.
func anyOf(fs ...func(string) bool) func(string) bool {
	return func(outcome string) bool {
		for _, f := range fs {
			if f(outcome) {
				return true
			}
		}
		return false
	}
}

// failures lists the outcomes other than "ok" that allowed refuses, with
// their counts ("" when none).
func failures(o Outcomes, allowed func(string) bool) string {
	var bad []string
	for kind, m := range map[string]map[string]int{"requests": o.Requests, "streams": o.Streams} {
		for k, n := range m {
			if k != "ok" && !allowed(k) {
				bad = append(bad, fmt.Sprintf("%s %d× %s", kind, n, k))
			}
		}
	}
	sort.Strings(bad)
	return strings.Join(bad, ", ")
}

// within is the slack a bound of the role's own (a timeout, a ping
// schedule) is given in a row: the role's timer, the client's reading of
// the answer and a loaded machine's scheduling. A row measures a promise
// in seconds; the slack keeps a loaded 2-core machine from failing it.
const within = 5 * time.Second
