// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package llamacpp

import (
	"path"
	"strings"

	pb "github.com/capyctl/capyctl/sdk/proto/driverv1"
)

// checkOptions checks a deployment's extra_args and engine_config.env
// against the flag table (flags.go).
//
// IMPORTANT: this is the narrow interim check of exact names and "*"
// prefixes, written while sdk/flags (the project's flag-policy engine,
// which also resolves spellings and path approvals) had not landed. The
// table in flags.go is the data that engine takes; replace this function
// with flags.Table.CheckArgs and CheckEnv when it is on main.
func checkOptions(dep *pb.Deployment, host *pb.HostPolicy) []*pb.Refusal {
	var out refusals
	if len(dep.GetExtraArgs()) > 0 && !dep.GetAcceptExtraArgs() {
		out.add("extra_args_not_accepted", "engine_config.extra_args", "extra_args need engine_config.accept_extra_args = true")
	}
	for i, a := range dep.GetExtraArgs() {
		if !strings.HasPrefix(a, "-") {
			if i == 0 {
				out.add(codeInvalidConfig, "engine_config.extra_args", "%q is not an option: extra_args are long options (--name value)", a)
			}
			continue
		}
		if !strings.HasPrefix(a, "--") {
			out.add("engine_option_reserved:"+a, "engine_config.extra_args", "short option %s is refused: write the long form", a)
			continue
		}
		name, _, _ := strings.Cut(a, "=")
		r, ok := matchRule(name, false)
		if !ok {
			continue
		}
		switch r.class {
		case pb.FlagClass_FLAG_CLASS_OWNED:
			out.add("engine_option_owned:"+name, "engine_config.extra_args", "option %s is set by CapyCTL: %s", name, r.reason)
		case pb.FlagClass_FLAG_CLASS_RESERVED:
			out.add("engine_option_reserved:"+name, "engine_config.extra_args", "option %s is reserved: %s", name, r.reason)
		case pb.FlagClass_FLAG_CLASS_GATED:
			if !pathsApproved(dep.GetExtraArgs(), i, host.GetApprovedPaths()) {
				out.add("engine_option_not_approved:"+name, "engine_config.extra_args", "option %s needs a path the host approved (%s): capyctl engine add ... --approve-path <dir>", name, r.reason)
			}
		}
	}
	for name := range dep.GetEnv() {
		if r, ok := matchRule(name, true); ok && r.class != pb.FlagClass_FLAG_CLASS_PASSED {
			out.add("engine_env_reserved:"+name, "engine_config.env", "%s is owned by CapyCTL: %s", name, r.reason)
			continue
		}
		approved := false
		for _, p := range host.GetApprovedEnv() {
			if ok, _ := path.Match(p, name); ok {
				approved = true
			}
		}
		if !approved {
			out.add("engine_env_not_approved:"+name, "engine_config.env", "%s is not approved for this engine: capyctl engine add ... --approve-env %s", name, name)
		}
	}
	return out
}

// matchRule finds the rule of an option (with its "--no-" spelling) or an
// environment name: an exact name or alias, else a "*" prefix.
func matchRule(name string, env bool) (rule, bool) {
	names := []string{name}
	if !env && strings.HasPrefix(name, "--no-") {
		names = append(names, "--"+strings.TrimPrefix(name, "--no-"))
	}
	for _, n := range names {
		for _, r := range rules {
			if r.env != env {
				continue
			}
			for _, cand := range append([]string{r.name}, r.aliases...) {
				if cand == n || strings.HasSuffix(cand, "*") && strings.HasPrefix(n, strings.TrimSuffix(cand, "*")) {
					return r, true
				}
			}
		}
	}
	return rule{}, false
}

// pathsApproved reports whether the value of the option at i (after "=" or
// the next token) lies under an approved directory.
func pathsApproved(args []string, i int, dirs []string) bool {
	_, v, ok := strings.Cut(args[i], "=")
	if !ok {
		if i+1 >= len(args) {
			return false
		}
		v = args[i+1]
	}
	if !strings.HasPrefix(v, "/") {
		return false
	}
	v = path.Clean(v)
	for _, d := range dirs {
		d = path.Clean(d)
		if strings.HasPrefix(d, "/") && (v == d || strings.HasPrefix(v, strings.TrimSuffix(d, "/")+"/")) {
			return true
		}
	}
	return false
}
