// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

// Package flags is the flag-policy engine every driver uses: a family's
// table says, for each engine option and environment name, whether CapyCTL
// owns it (renders it itself), reserves it (refused in any spelling,
// whatever the host approves), gates it behind a host approval (a named
// option, a path under an approved directory, an approved environment name,
// remote code) or passes it unchanged, and why. Check turns a deployment's
// extra_args and engine_config.env into coded refusals; Proto turns the
// table into the Flags RPC's answer that `capyctl engine flags` prints.
//
// Spellings. An option is matched after normalising what the deployment
// wrote: "--opt=value" is "--opt", underscores are dashes ("--max_num_seqs"
// is "--max-num-seqs", as vLLM's parser accepts), a dotted JSON field
// ("--logging-config.level") is its option, and "--no-opt" is a spelling of
// "--opt" (boolean options). An option the table does not name exactly is
// still refused when it is a prefix of an option CapyCTL owns, reserves or
// gates, because Python's argparse resolves unambiguous abbreviations
// ("--api-k" is "--api-key"). Short options ("-tp") are refused: they cannot
// be resolved without the engine's own parser.
package flags

import (
	"fmt"
	"path"
	"path/filepath"
	"regexp"
	"sort"
	"strings"

	"github.com/capyctl/capyctl/sdk"
)

// Class is the policy class of an option or environment name.
type Class int

// Classes, from the most to the least restrictive after Reserved.
const (
	// Owned: CapyCTL renders it; a deployment may not set it.
	Owned Class = iota + 1
	// Reserved: refused in any spelling, whatever the host approves.
	Reserved
	// Gated: passed only with a host approval (Rule.Approval).
	Gated
	// Passed: passed unchanged.
	Passed
)

// String names the class as `capyctl engine flags` prints it.
func (c Class) String() string {
	switch c {
	case Owned:
		return "owned"
	case Reserved:
		return "reserved"
	case Gated:
		return "gated"
	case Passed:
		return "passed"
	}
	return "unknown"
}

// strictness orders classes for a spelling that may mean several rules
// (an abbreviation): the strictest wins.
func (c Class) strictness() int {
	switch c {
	case Reserved:
		return 4
	case Owned:
		return 3
	case Gated:
		return 2
	case Passed:
		return 1
	}
	return 0
}

// FlagClass is the class as the protocol names it (FlagRule.Class).
func (c Class) FlagClass() sdk.FlagClass {
	switch c {
	case Owned:
		return sdk.FlagClassOwned
	case Reserved:
		return sdk.FlagClassReserved
	case Gated:
		return sdk.FlagClassGated
	case Passed:
		return sdk.FlagClassPassed
	}
	return sdk.FlagClassUnspecified
}

// ClassName names a class received on the wire as `capyctl engine flags`
// prints it: "owned", "reserved", "gated", "passed" or "unknown".
func ClassName(c sdk.FlagClass) string {
	switch c {
	case sdk.FlagClassOwned:
		return Owned.String()
	case sdk.FlagClassReserved:
		return Reserved.String()
	case sdk.FlagClassGated:
		return Gated.String()
	case sdk.FlagClassPassed:
		return Passed.String()
	}
	return "unknown"
}

// Kind says whether a rule is about an option or an environment name.
type Kind int

// Kinds of rules.
const (
	// Option is a command-line option ("--api-key").
	Option Kind = iota + 1
	// Env is an environment name ("VLLM_API_KEY").
	Env
)

// FlagKind is the kind as the protocol names it (FlagRule.Kind).
func (k Kind) FlagKind() sdk.FlagKind {
	if k == Env {
		return sdk.FlagKindEnv
	}
	return sdk.FlagKindOption
}

// KindName names a kind received on the wire as `capyctl engine flags`
// prints it: "option", "env" or "unknown".
func KindName(k sdk.FlagKind) string {
	switch k {
	case sdk.FlagKindOption:
		return "option"
	case sdk.FlagKindEnv:
		return "env"
	}
	return "unknown"
}

// Approvals a Gated rule may need (Rule.Approval), named as the host's
// `capyctl engine add` options name them.
const (
	// ApproveOption: the option is named in --approve-option.
	ApproveOption = "option"
	// ApprovePath: every value of the option is a path under an
	// --approve-path directory.
	ApprovePath = "path"
	// ApproveEnv: the name matches an --approve-env pattern.
	ApproveEnv = "env"
	// ApproveRemoteCode: the host allows remote code (--allow-remote-code).
	ApproveRemoteCode = "remote_code"
)

// Refusal codes (rows of CapyCTL's error catalogue); a refusal carries the
// option or variable after a colon ("engine_option_reserved:--api-key").
const (
	CodeOptionReserved    = "engine_option_reserved"
	CodeOptionOwned       = "engine_option_owned"
	CodeOptionNotApproved = "engine_option_not_approved"
	CodeEnvReserved       = "engine_env_reserved"
	CodeEnvNotApproved    = "engine_env_not_approved"
	CodeExtraArgsRefused  = "extra_args_not_accepted"
	CodeRemoteCode        = "remote_code_not_allowed"
	CodeInvalidConfig     = "invalid_config"
)

// Job-spec fields refusals name.
const (
	FieldExtraArgs = "engine_config.extra_args"
	FieldEnv       = "engine_config.env"
)

// Bounds of engine_config.env.
const (
	// MaxEnvNames is how many variables a deployment may set.
	MaxEnvNames = 64
	// MaxEnvValueBytes bounds one value.
	MaxEnvValueBytes = 4 << 10
)

// Rule is one row of a table.
type Rule struct {
	// Name is "--option" or an environment name. A "*" matches any run of
	// characters: "--debug-tensor-dump-*" and "SGLANG_DUMP*" are prefixes,
	// "--*-path" is a suffix.
	Name string
	// Aliases are other spellings of the same option ("--tp" for
	// "--tp-size").
	Aliases []string
	Kind    Kind
	Class   Class
	// Approval is what a Gated rule needs: ApproveOption, ApprovePath,
	// ApproveEnv or ApproveRemoteCode.
	Approval string
	// Reason says why, for `capyctl engine flags`.
	Reason string
	// Field is the job-spec field that renders this option when the
	// deployment sets it ("engine_config.dtype"): the option in extra_args
	// as well is refused as a duplicate.
	Field string
}

// isPattern reports whether the rule's name has a wildcard.
func (r *Rule) isPattern() bool { return strings.Contains(r.Name, "*") }

// literalLen is the length of the name without its wildcards: the more
// literal characters, the more specific a pattern.
func (r *Rule) literalLen() int { return len(strings.ReplaceAll(r.Name, "*", "")) }

// Table is an engine family's flag policy.
type Table struct {
	// Family is the engine family ("vllm").
	Family string
	// Rules are the rows, options and environment names together.
	Rules []Rule
}

// Response is the table as the Flags call returns it.
func (t *Table) Response() *sdk.FlagsResponse {
	out := &sdk.FlagsResponse{Family: t.Family}
	for _, r := range t.Rules {
		out.Rules = append(out.Rules, &sdk.FlagRule{
			Name:     r.Name,
			Kind:     r.Kind.FlagKind(),
			Class:    r.Class.FlagClass(),
			Reason:   r.Reason,
			Approval: r.Approval,
			Aliases:  append([]string(nil), r.Aliases...),
		})
	}
	return out
}

// Validate reports a table that cannot work: an empty name, a Gated rule
// without an approval, an unknown approval, a rule without a reason, or a
// name listed twice. Driver tests call it.
func (t *Table) Validate() error {
	seen := map[string]bool{}
	for _, r := range t.Rules {
		names := append([]string{r.Name}, r.Aliases...)
		for _, n := range names {
			if n == "" {
				return fmt.Errorf("flag table %s: a rule has an empty name", t.Family)
			}
			if r.Kind == Option && !strings.HasPrefix(n, "--") {
				return fmt.Errorf("flag table %s: option %q must start with --", t.Family, n)
			}
			key := fmt.Sprintf("%d/%s", r.Kind, n)
			if seen[key] {
				return fmt.Errorf("flag table %s: %s is listed twice", t.Family, n)
			}
			seen[key] = true
		}
		if r.Kind != Option && r.Kind != Env {
			return fmt.Errorf("flag table %s: %s has no kind", t.Family, r.Name)
		}
		if r.Class < Owned || r.Class > Passed {
			return fmt.Errorf("flag table %s: %s has no class", t.Family, r.Name)
		}
		if strings.TrimSpace(r.Reason) == "" {
			return fmt.Errorf("flag table %s: %s has no reason", t.Family, r.Name)
		}
		switch {
		case r.Class == Gated && r.Approval == "":
			return fmt.Errorf("flag table %s: gated %s names no approval", t.Family, r.Name)
		case r.Class != Gated && r.Approval != "":
			return fmt.Errorf("flag table %s: %s is %s but names an approval", t.Family, r.Name, r.Class)
		}
		switch r.Approval {
		case "", ApproveOption, ApprovePath, ApproveEnv, ApproveRemoteCode:
		default:
			return fmt.Errorf("flag table %s: %s: unknown approval %q", t.Family, r.Name, r.Approval)
		}
	}
	return nil
}

// Approvals are what a host allows beyond the table's passed rows.
type Approvals struct {
	// Options are option names ("--speculative-config"; the dashes may be
	// left out).
	Options []string
	// Paths are directories a path-valued option may name files under.
	Paths []string
	// Env are glob patterns of environment names.
	Env []string
	// RemoteCode allows trust_remote_code.
	RemoteCode bool
}

// HostApprovals reads the approvals of a host policy.
func HostApprovals(h *sdk.HostPolicy) Approvals {
	if h == nil {
		return Approvals{}
	}
	return Approvals{
		Options:    h.ApprovedOptions,
		Paths:      h.ApprovedPaths,
		Env:        h.ApprovedEnv,
		RemoteCode: h.AllowRemoteCode,
	}
}

// optionApproved reports whether an option (canonical spelling) is named in
// the approvals.
func (a Approvals) optionApproved(names ...string) bool {
	for _, o := range a.Options {
		o = NormalizeOption(ensureDashes(o))
		for _, n := range names {
			if o == n {
				return true
			}
		}
	}
	return false
}

// pathApproved reports whether p is an approved directory or lies under one.
func (a Approvals) pathApproved(p string) bool {
	if p == "" || !filepath.IsAbs(p) {
		return false
	}
	p = filepath.Clean(p)
	for _, dir := range a.Paths {
		if dir == "" || !filepath.IsAbs(dir) {
			continue
		}
		dir = filepath.Clean(dir)
		if p == dir || strings.HasPrefix(p, strings.TrimSuffix(dir, "/")+"/") {
			return true
		}
	}
	return false
}

// envApproved reports whether name matches an approved pattern.
func (a Approvals) envApproved(name string) bool {
	for _, p := range a.Env {
		if ok, _ := path.Match(p, name); ok {
			return true
		}
	}
	return false
}

func ensureDashes(s string) string {
	if strings.HasPrefix(s, "-") {
		return s
	}
	return "--" + s
}

// Violation is one refusal.
type Violation struct {
	// Code is a catalogue code with its subject ("engine_option_reserved:--api-key").
	Code string
	// Field is the job-spec path ("engine_config.extra_args").
	Field string
	// Message says what was refused and what to do.
	Message string
}

// Refusal is the violation as a Plan refusal.
func (v Violation) Refusal() *sdk.Refusal {
	return &sdk.Refusal{Code: v.Code, Field: v.Field, Message: v.Message}
}

// Refusals converts violations.
func Refusals(vs []Violation) []*sdk.Refusal {
	out := make([]*sdk.Refusal, 0, len(vs))
	for _, v := range vs {
		out = append(out, v.Refusal())
	}
	return out
}

// NormalizeOption returns the canonical spelling of an option token:
// "--opt=value" → "--opt", underscores → dashes, "--json-arg.field" →
// "--json-arg". A token that is not a long option is returned unchanged.
func NormalizeOption(tok string) string {
	if !strings.HasPrefix(tok, "--") || len(tok) == 2 {
		return tok
	}
	name := tok[2:]
	if i := strings.IndexByte(name, '='); i >= 0 {
		name = name[:i]
	}
	if i := strings.IndexByte(name, '.'); i >= 0 {
		name = name[:i]
	}
	return "--" + strings.ReplaceAll(name, "_", "-")
}

// Match is how a spelling resolved.
type Match struct {
	// Rule is the rule it resolved to; nil for an option the table does not
	// know (passed) or an environment name it does not know (gated by env
	// approval).
	Rule *Rule
	// Canonical is the normalised spelling ("--api-key").
	Canonical string
	// How says how it matched: "exact", "pattern", "abbreviation",
	// "negation", or "" for no rule.
	How string
}

// Class is the match's class (Passed for an unknown option, Gated for an
// unknown environment name).
func (m Match) Class(kind Kind) Class {
	if m.Rule != nil {
		return m.Rule.Class
	}
	if kind == Env {
		return Gated
	}
	return Passed
}

// ResolveOption finds the rule an option token means (see the package
// comment for spellings).
func (t *Table) ResolveOption(tok string) Match {
	canon := NormalizeOption(tok)
	if m, ok := t.resolveOption(canon); ok {
		return m
	}
	if strings.HasPrefix(canon, "--no-") && len(canon) > 5 {
		if m, ok := t.resolveOption("--" + canon[5:]); ok {
			m.Canonical = canon
			if m.How == "exact" {
				m.How = "negation"
			}
			return m
		}
	}
	return Match{Canonical: canon}
}

// resolveOption matches an exact name, a pattern, or an abbreviation.
func (t *Table) resolveOption(canon string) (Match, bool) {
	for i := range t.Rules {
		r := &t.Rules[i]
		if r.Kind != Option || r.isPattern() {
			continue
		}
		if r.Name == canon || contains(r.Aliases, canon) {
			return Match{Rule: r, Canonical: canon, How: "exact"}, true
		}
	}
	if r := t.bestPattern(Option, canon); r != nil {
		return Match{Rule: r, Canonical: canon, How: "pattern"}, true
	}
	// An abbreviation of one or more owned, reserved or gated options: the
	// engine's argparse would resolve it (or refuse it as ambiguous).
	var best *Rule
	for i := range t.Rules {
		r := &t.Rules[i]
		if r.Kind != Option || r.Class == Passed {
			continue
		}
		if !abbreviates(canon, r) {
			continue
		}
		if best == nil || r.Class.strictness() > best.Class.strictness() {
			best = r
		}
	}
	if best != nil {
		return Match{Rule: best, Canonical: canon, How: "abbreviation"}, true
	}
	return Match{}, false
}

// abbreviates reports whether canon is a strict prefix of the rule's name,
// an alias, or the literal head of a prefix pattern ("--debug-tensor" of
// "--debug-tensor-dump-*").
func abbreviates(canon string, r *Rule) bool {
	if len(canon) <= 2 {
		return false
	}
	names := append([]string{r.Name}, r.Aliases...)
	for _, n := range names {
		if i := strings.IndexByte(n, '*'); i >= 0 {
			n = n[:i]
			if i == 2 { // "--*-path": no literal head
				continue
			}
			if strings.HasPrefix(n, canon) || strings.HasPrefix(canon, n) {
				return true
			}
			continue
		}
		if len(n) > len(canon) && strings.HasPrefix(n, canon) {
			return true
		}
	}
	return false
}

// bestPattern returns the most specific pattern rule of kind matching name.
func (t *Table) bestPattern(kind Kind, name string) *Rule {
	var best *Rule
	for i := range t.Rules {
		r := &t.Rules[i]
		if r.Kind != kind || !r.isPattern() {
			continue
		}
		matched := wildcard(r.Name, name)
		for _, a := range r.Aliases {
			matched = matched || wildcard(a, name)
		}
		if !matched {
			continue
		}
		if best == nil || r.literalLen() > best.literalLen() {
			best = r
		}
	}
	return best
}

// ResolveEnv finds the rule of an environment name: an exact name, else the
// most specific pattern.
func (t *Table) ResolveEnv(name string) Match {
	for i := range t.Rules {
		r := &t.Rules[i]
		if r.Kind == Env && !r.isPattern() && (r.Name == name || contains(r.Aliases, name)) {
			return Match{Rule: r, Canonical: name, How: "exact"}
		}
	}
	if r := t.bestPattern(Env, name); r != nil {
		return Match{Rule: r, Canonical: name, How: "pattern"}
	}
	return Match{Canonical: name}
}

// wildcard matches name against a pattern whose "*" matches any run of
// characters.
func wildcard(pattern, name string) bool {
	parts := strings.Split(pattern, "*")
	if len(parts) == 1 {
		return pattern == name
	}
	if !strings.HasPrefix(name, parts[0]) {
		return false
	}
	rest := name[len(parts[0]):]
	for i, p := range parts[1:] {
		last := i == len(parts)-2
		if last {
			return strings.HasSuffix(rest, p) && len(rest) >= len(p)
		}
		j := strings.Index(rest, p)
		if j < 0 {
			return false
		}
		rest = rest[j+len(p):]
	}
	return true
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// Arg is one option of extra_args with its values.
type Arg struct {
	// Token is the option as written ("--max_model_len=4096").
	Token string
	// Match is what it resolved to.
	Match Match
	// Values are the option's values: the part after "=" or the tokens
	// after it that are not options.
	Values []string
}

// negativeNumber matches a value such as "-1" (argparse reads it as a
// value, not an option, when no option looks like a number).
var negativeNumber = regexp.MustCompile(`^-[0-9]+(\.[0-9]*)?$`)

// SplitArgs groups extra_args into options and their values. A token
// before any option, and a short option, are violations.
func (t *Table) SplitArgs(args []string) ([]Arg, []Violation) {
	var out []Arg
	var vs []Violation
	for _, tok := range args {
		switch {
		case strings.HasPrefix(tok, "--") && len(tok) > 2:
			a := Arg{Token: tok, Match: t.ResolveOption(tok)}
			if i := strings.IndexByte(tok, '='); i >= 0 {
				a.Values = append(a.Values, tok[i+1:])
			}
			out = append(out, a)
		case tok == "--":
			vs = append(vs, Violation{Code: CodeInvalidConfig, Field: FieldExtraArgs,
				Message: `extra_args may not contain "--": every argument must belong to an option`})
		case strings.HasPrefix(tok, "-") && !negativeNumber.MatchString(tok):
			vs = append(vs, Violation{Code: CodeOptionReserved + ":" + tok, Field: FieldExtraArgs,
				Message: fmt.Sprintf("short option %s is refused: CapyCTL cannot tell which option it means; write the long form", tok)})
			// Its values, if any, are swallowed with it.
			out = append(out, Arg{Token: tok, Match: Match{Canonical: tok, How: "short"}})
		default:
			if len(out) == 0 {
				vs = append(vs, Violation{Code: CodeInvalidConfig, Field: FieldExtraArgs,
					Message: fmt.Sprintf("%q is not an option: extra_args are long options (--name value), and CapyCTL renders the model itself", tok)})
				continue
			}
			last := &out[len(out)-1]
			last.Values = append(last.Values, tok)
		}
	}
	return out, vs
}

// CheckArgs checks a deployment's extra_args: owned and reserved options
// in any spelling, gated options without their approval, and options that a
// typed field the deployment sets already renders (typed maps a Rule.Field
// to true when the deployment sets it). It returns the parsed options, for
// a driver that looks for one (a parser chosen in extra_args).
func (t *Table) CheckArgs(args []string, ap Approvals, typed map[string]bool) ([]Arg, []Violation) {
	parsed, vs := t.SplitArgs(args)
	for _, a := range parsed {
		if a.Match.How == "short" {
			continue
		}
		r := a.Match.Rule
		if r == nil {
			continue
		}
		name := r.Name
		if r.isPattern() {
			name = a.Match.Canonical
		}
		wrote := a.Token
		if i := strings.IndexByte(wrote, '='); i >= 0 {
			wrote = wrote[:i]
		}
		spelled := ""
		if wrote != name {
			spelled = fmt.Sprintf(" (written %s)", wrote)
		}
		switch r.Class {
		case Reserved:
			vs = append(vs, Violation{Code: CodeOptionReserved + ":" + name, Field: FieldExtraArgs,
				Message: fmt.Sprintf("option %s%s is reserved in any spelling: %s", name, spelled, r.Reason)})
		case Owned:
			vs = append(vs, Violation{Code: CodeOptionOwned + ":" + name, Field: FieldExtraArgs,
				Message: fmt.Sprintf("option %s%s is set by CapyCTL: %s", name, spelled, r.Reason)})
		case Gated:
			if v, ok := checkGated(r, name, spelled, a.Values, ap); !ok {
				vs = append(vs, v)
			}
		}
		if r.Field != "" && typed[r.Field] {
			vs = append(vs, Violation{Code: CodeOptionOwned + ":" + name, Field: FieldExtraArgs,
				Message: fmt.Sprintf("option %s%s duplicates %s, which the deployment sets: set it in one place", name, spelled, r.Field)})
		}
	}
	return parsed, vs
}

// checkGated checks one gated option against the approvals.
func checkGated(r *Rule, name, spelled string, values []string, ap Approvals) (Violation, bool) {
	code := CodeOptionNotApproved + ":" + name
	switch r.Approval {
	case ApproveOption:
		if ap.optionApproved(name, r.Name) {
			return Violation{}, true
		}
		return Violation{Code: code, Field: FieldExtraArgs,
			Message: fmt.Sprintf("option %s%s needs the host's approval (%s): capyctl engine add ... --approve-option %s", name, spelled, r.Reason, name)}, false
	case ApprovePath:
		if len(values) == 0 {
			return Violation{Code: code, Field: FieldExtraArgs,
				Message: fmt.Sprintf("option %s%s names a path and has no value", name, spelled)}, false
		}
		for _, v := range values {
			if !ap.pathApproved(v) {
				return Violation{Code: code, Field: FieldExtraArgs,
					Message: fmt.Sprintf("option %s%s names %s, which is not under a directory the host approved (%s): capyctl engine add ... --approve-path <dir>", name, spelled, v, r.Reason)}, false
			}
		}
		return Violation{}, true
	case ApproveRemoteCode:
		if ap.RemoteCode {
			return Violation{}, true
		}
		return Violation{Code: CodeRemoteCode, Field: FieldExtraArgs,
			Message: fmt.Sprintf("option %s%s runs code the checkpoint ships; the host must allow it: capyctl engine add ... --allow-remote-code", name, spelled)}, false
	}
	return Violation{Code: code, Field: FieldExtraArgs, Message: fmt.Sprintf("option %s%s needs a host approval", name, spelled)}, false
}

// envNameRe is a valid environment name.
var envNameRe = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// CheckEnv checks a deployment's engine_config.env: names CapyCTL owns or
// reserves are refused (engine_env_reserved:<name>), names the host did not
// approve are refused (engine_env_not_approved:<name>) unless the table
// passes them, and the bounds hold (64 names, 4 KiB a value).
func (t *Table) CheckEnv(env map[string]string, ap Approvals) []Violation {
	var vs []Violation
	names := make([]string, 0, len(env))
	for k := range env {
		names = append(names, k)
	}
	sort.Strings(names)
	if len(names) > MaxEnvNames {
		vs = append(vs, Violation{Code: CodeInvalidConfig, Field: FieldEnv,
			Message: fmt.Sprintf("engine_config.env sets %d variables; at most %d are allowed", len(names), MaxEnvNames)})
	}
	for _, name := range names {
		if !envNameRe.MatchString(name) {
			vs = append(vs, Violation{Code: CodeInvalidConfig, Field: FieldEnv,
				Message: fmt.Sprintf("%q is not a valid environment name", name)})
			continue
		}
		if len(env[name]) > MaxEnvValueBytes {
			vs = append(vs, Violation{Code: CodeInvalidConfig, Field: FieldEnv,
				Message: fmt.Sprintf("the value of %s is longer than %d bytes", name, MaxEnvValueBytes)})
		}
		m := t.ResolveEnv(name)
		switch m.Class(Env) {
		case Owned, Reserved:
			vs = append(vs, Violation{Code: CodeEnvReserved + ":" + name, Field: FieldEnv,
				Message: fmt.Sprintf("%s is owned by CapyCTL: %s", name, m.Rule.Reason)})
		case Gated:
			if !ap.envApproved(name) {
				vs = append(vs, Violation{Code: CodeEnvNotApproved + ":" + name, Field: FieldEnv,
					Message: fmt.Sprintf("%s is not approved for this engine: capyctl engine add ... --approve-env %s", name, name)})
			}
		}
	}
	return vs
}

// Find returns the parsed option that resolved to the rule named name (or
// one of its aliases), nil when there is none.
func Find(args []Arg, name string) *Arg {
	for i := range args {
		if r := args[i].Match.Rule; r != nil && (r.Name == name || contains(r.Aliases, name)) && args[i].Match.How != "abbreviation" {
			return &args[i]
		}
		if args[i].Match.Canonical == name {
			return &args[i]
		}
	}
	return nil
}
