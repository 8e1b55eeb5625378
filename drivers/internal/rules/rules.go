// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

// Package rules builds the rows of the first-party drivers' flag tables
// (sdk/flags), so that each driver's flags.go reads as data: the option or
// variable, its class, and the reason an operator is shown.
package rules

import (
	"slices"

	"github.com/capyctl/capyctl/sdk/flags"
)

// Table is a family's flag table: its option rules, then its variable
// rules, then the variables every engine shares (flags.CommonEnvRules),
// which the family's own rows precede and so win over.
func Table(family string, options, env []flags.Rule) *flags.Table {
	return &flags.Table{Family: family, Rules: slices.Concat(options, env, flags.CommonEnvRules())}
}

// Owned is an option CapyCTL renders; a deployment may not set it.
func Owned(name, reason string, aliases ...string) flags.Rule {
	return flags.Rule{Name: name, Aliases: aliases, Kind: flags.Option, Class: flags.Owned, Reason: reason}
}

// OwnedBy is an option CapyCTL renders from a job-spec field: setting it
// in extra_args is refused as a duplicate of the field.
func OwnedBy(name, field, reason string, aliases ...string) flags.Rule {
	r := Owned(name, reason, aliases...)
	r.Field = field
	return r
}

// Reserved is an option no deployment may set, whatever the host approves.
func Reserved(name, reason string, aliases ...string) flags.Rule {
	return flags.Rule{Name: name, Aliases: aliases, Kind: flags.Option, Class: flags.Reserved, Reason: reason}
}

// Gated is an option a deployment may set with the host's approval.
func Gated(name, approval, reason string, aliases ...string) flags.Rule {
	return flags.Rule{Name: name, Aliases: aliases, Kind: flags.Option, Class: flags.Gated, Approval: approval, Reason: reason}
}

// Passed is an option that passes unchanged (named for its reason).
func Passed(name, reason string) flags.Rule {
	return flags.Rule{Name: name, Kind: flags.Option, Class: flags.Passed, Reason: reason}
}

// Typed is an option that passes unchanged but that CapyCTL also renders
// from a job-spec field: setting both is refused as a duplicate.
func Typed(name, field, reason string) flags.Rule {
	r := Passed(name, reason)
	r.Field = field
	return r
}

// OwnedEnv is a variable CapyCTL sets; a deployment may not.
func OwnedEnv(name, reason string) flags.Rule {
	return flags.Rule{Name: name, Kind: flags.Env, Class: flags.Owned, Reason: reason}
}

// ReservedEnv is a variable no deployment may set, whatever the host
// approves.
func ReservedEnv(name, reason string) flags.Rule {
	return flags.Rule{Name: name, Kind: flags.Env, Class: flags.Reserved, Reason: reason}
}
