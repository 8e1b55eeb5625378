// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package fakecli

import (
	"bufio"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	"github.com/capyctl/capyctl/plugins-testkit/fakeengine"
	"github.com/capyctl/capyctl/plugins-testkit/simgpu"
)

// Option arities for pyArgs.
const (
	argFlag  = 0  // store_true
	argValue = 1  // one value
	argMany  = -1 // nargs="+"
)

// pyArgs is what an argparse-like parse of a Python engine's options found.
type pyArgs struct {
	values map[string][]string
	flags  map[string]bool
}

// parsePyArgs parses long options the way Python's argparse does: "--opt
// value", "--opt=value", unambiguous abbreviations; unknown options are an
// error ("unrecognized arguments"), as the real engines refuse them.
// underscores makes "--max_num_seqs" the same as "--max-num-seqs" (vLLM's
// parser does that; SGLang's does not).
func parsePyArgs(args []string, known map[string]int, underscores bool) (*pyArgs, error) {
	out := &pyArgs{values: map[string][]string{}, flags: map[string]bool{}}
	var unknown []string
	for i := 0; i < len(args); i++ {
		tok := args[i]
		if !strings.HasPrefix(tok, "--") || tok == "--" {
			unknown = append(unknown, tok)
			continue
		}
		name, val, hasVal := strings.Cut(tok[2:], "=")
		if underscores {
			name = strings.ReplaceAll(name, "_", "-")
		}
		if j := strings.IndexByte(name, '.'); j >= 0 && underscores {
			name = name[:j] // vLLM's --json-arg.field
		}
		arity, ok := known[name]
		if !ok {
			var cands []string
			for k := range known {
				if strings.HasPrefix(k, name) {
					cands = append(cands, k)
				}
			}
			sort.Strings(cands)
			switch len(cands) {
			case 0:
				unknown = append(unknown, tok)
				continue
			case 1:
				name, arity = cands[0], known[cands[0]]
			default:
				return nil, fmt.Errorf("ambiguous option: --%s could match %s", name, "--"+strings.Join(cands, ", --"))
			}
		}
		switch arity {
		case argFlag:
			if hasVal {
				return nil, fmt.Errorf("argument --%s: ignored explicit argument '%s'", name, val)
			}
			out.flags[name] = true
		case argValue:
			if !hasVal {
				if i+1 >= len(args) || (strings.HasPrefix(args[i+1], "-") && !isNumber(args[i+1])) {
					return nil, fmt.Errorf("argument --%s: expected one argument", name)
				}
				i++
				val = args[i]
			}
			out.values[name] = []string{val}
		case argMany:
			var vals []string
			if hasVal {
				vals = append(vals, val)
			}
			for i+1 < len(args) && !strings.HasPrefix(args[i+1], "--") {
				i++
				vals = append(vals, args[i])
			}
			if len(vals) == 0 {
				return nil, fmt.Errorf("argument --%s: expected at least one argument", name)
			}
			out.values[name] = vals
		}
	}
	if len(unknown) > 0 {
		return nil, fmt.Errorf("unrecognized arguments: %s", strings.Join(unknown, " "))
	}
	return out, nil
}

func isNumber(s string) bool {
	_, err := strconv.ParseFloat(s, 64)
	return err == nil
}

// str returns an option's value, or def.
func (a *pyArgs) str(name, def string) string {
	if v, ok := a.values[name]; ok && len(v) > 0 {
		return v[0]
	}
	return def
}

// num returns an option's value as a number, or def; a bad number is an
// error naming the option.
func (a *pyArgs) num(name string, def float64) (float64, error) {
	s := a.str(name, "")
	if s == "" {
		return def, nil
	}
	f, err := strconv.ParseFloat(s, 64)
	if err != nil {
		return 0, fmt.Errorf("argument --%s: invalid value: '%s'", name, s)
	}
	return f, nil
}

// afterModule returns the arguments after "-m MODULE" (or "-mMODULE").
func afterModule(args []string) []string {
	for i, a := range args {
		switch {
		case a == "-m" && i+1 < len(args):
			return args[i+2:]
		case strings.HasPrefix(a, "-m") && len(a) > 2:
			return args[i+1:]
		}
	}
	return nil
}

// venvDistVersion reads a distribution's version from the venv that holds
// the interpreter prog (<venv>/bin/python), without running anything; ""
// when there is none.
func venvDistVersion(prog, dist string) string {
	root := filepath.Dir(filepath.Dir(prog))
	matches, _ := filepath.Glob(filepath.Join(root, "lib", "python3*", "site-packages", dist+"-*.dist-info", "METADATA"))
	for _, m := range matches {
		f, err := os.Open(m)
		if err != nil {
			continue
		}
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			if k, v, ok := strings.Cut(sc.Text(), ":"); ok && strings.EqualFold(strings.TrimSpace(k), "version") {
				f.Close()
				return strings.TrimSpace(v)
			}
			if sc.Text() == "" {
				break
			}
		}
		f.Close()
	}
	return ""
}

// venvEntryPoints lists the entry points of a group ("sglang.srt.plugins")
// declared by the venv's distributions (entry_points.txt).
func venvEntryPoints(prog, group string) []string {
	root := filepath.Dir(filepath.Dir(prog))
	matches, _ := filepath.Glob(filepath.Join(root, "lib", "python3*", "site-packages", "*.dist-info", "entry_points.txt"))
	sort.Strings(matches)
	var out []string
	for _, m := range matches {
		b, err := os.ReadFile(m)
		if err != nil {
			continue
		}
		in := false
		for _, line := range strings.Split(string(b), "\n") {
			line = strings.TrimSpace(line)
			switch {
			case strings.HasPrefix(line, "["):
				in = line == "["+group+"]"
			case in && line != "" && !strings.HasPrefix(line, "#"):
				if name, _, ok := strings.Cut(line, "="); ok {
					out = append(out, strings.TrimSpace(name))
				}
			}
		}
	}
	return out
}

// weightsInDir is the size of a model directory's *.safetensors files.
func weightsInDir(dir string) int64 {
	matches, _ := filepath.Glob(filepath.Join(dir, "*.safetensors"))
	var n int64
	for _, m := range matches {
		if fi, err := os.Stat(m); err == nil {
			n += fi.Size()
		}
	}
	return n
}

// simDeviceTotal is the capacity of the simulated device the engine will
// use, 0 without a simulated GPU.
func simDeviceTotal(sim fakeengine.SimConfig) int64 {
	if sim.StatePath == "" {
		return 0
	}
	g, err := simgpu.Open(sim.StatePath)
	if err != nil {
		return 0
	}
	st, err := g.Snapshot()
	if err != nil {
		return 0
	}
	dev, err := simgpu.ResolveDevice(st, sim.Visible)
	if err != nil {
		return 0
	}
	return dev.TotalBytes
}

// defaultParkResidue is what a parked engine keeps on the card unless the
// sim-park-residue knob says otherwise: the CUDA context and the
// allocator's bookkeeping.
const defaultParkResidue = 512 << 20

// envKnobs resolves the knobs from the environment only: an engine
// launched with a real engine's argv cannot take fake flags.
func envKnobs(cfg *fakeengine.Config, env func(string) string) (*fakeengine.Knobs, map[string]bool, error) {
	fs := flag.NewFlagSet("knobs", flag.ContinueOnError)
	k := fakeengine.RegisterKnobs(fs, cfg)
	if err := k.Resolve(env); err != nil {
		return nil, nil, err
	}
	given := map[string]bool{}
	for _, name := range []string{"sim-weights", "sim-kv", "sim-park-residue", "max-running"} {
		given[name] = env(fakeengine.EnvName(name)) != ""
	}
	return k, given, nil
}

// releaseAtLeast reports whether version ("0.31.0") is at least min
// ([0 11]); a version that does not read as a release is.
func releaseAtLeast(version string, min []int) bool {
	parts := strings.Split(version, ".")
	for i, m := range min {
		if i >= len(parts) {
			return m == 0
		}
		digits := strings.TrimRightFunc(parts[i], func(r rune) bool { return r < '0' || r > '9' })
		n, err := strconv.Atoi(digits)
		if err != nil {
			return true
		}
		if n != m {
			return n > m
		}
	}
	return true
}
