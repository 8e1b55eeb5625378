// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

// Package pyengine is what the drivers of engines installed in a Python
// environment (vLLM, SGLang, TensorFold) share beside sdk/enginekit:
// finding an engine in a venv from its *.dist-info metadata without running
// Python, the installation digest and its pinning, the environment a
// Python engine starts from, the plan checks and engine_config keys common
// to them, the memory and timeouts derived from a checkpoint, the tool-call
// and reasoning parsers picked by model family, and the parts of a
// `python -m` server's command line and plan answer.
package pyengine

import (
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/capyctl/capyctl/drivers/internal/engine"
	"github.com/capyctl/capyctl/sdk"
	"github.com/capyctl/capyctl/sdk/enginekit"
)

// Venv is a Python virtual environment (or any prefix with bin/python and
// lib/python3.*/site-packages).
type Venv struct {
	// Dir is the environment's root.
	Dir string
	// Python is the interpreter a launch runs: Dir/bin/python (or python3).
	Python string
	// SitePackages are the environment's site-packages directories.
	SitePackages []string
}

// FindVenv finds the environment at path: its root, or its bin/python.
// It runs nothing.
func FindVenv(path string) (*Venv, error) {
	if path == "" {
		return nil, sdk.Errorf(enginekit.CodeEngineUnsupported, "no installation named")
	}
	abs, err := filepath.Abs(path)
	if err != nil {
		return nil, sdk.Errorf(enginekit.CodeEngineUnsupported, "%s: %v", path, err)
	}
	st, err := os.Stat(abs)
	if err != nil {
		return nil, sdk.Errorf(sdk.CodeEngineNotFound, "%s: %v", path, enginekit.UnwrapPathErr(err))
	}
	dir := abs
	if !st.IsDir() {
		// bin/python → the root.
		dir = filepath.Dir(filepath.Dir(abs))
	}
	v := &Venv{Dir: dir}
	for _, name := range []string{"python", "python3"} {
		p := filepath.Join(dir, "bin", name)
		if fi, err := os.Stat(p); err == nil && !fi.IsDir() && fi.Mode()&0o111 != 0 {
			v.Python = p
			break
		}
	}
	if v.Python == "" {
		return nil, sdk.Errorf(enginekit.CodeEngineUnsupported, "%s is not a Python environment (no executable bin/python)", path)
	}
	for _, lib := range []string{"lib", "lib64"} {
		matches, _ := filepath.Glob(filepath.Join(dir, lib, "python3*", "site-packages"))
		for _, m := range matches {
			if fi, err := os.Stat(m); err == nil && fi.IsDir() && !slices.Contains(v.SitePackages, m) {
				v.SitePackages = append(v.SitePackages, m)
			}
		}
	}
	sort.Strings(v.SitePackages)
	if len(v.SitePackages) == 0 {
		return nil, sdk.Errorf(enginekit.CodeEngineUnsupported, "%s is not a Python environment (no lib/python3*/site-packages)", path)
	}
	return v, nil
}

// Dist is an installed distribution, read from its *.dist-info.
type Dist struct {
	// Name is the distribution's name from METADATA.
	Name string
	// Version is its version from METADATA.
	Version string
	// Dir is the *.dist-info directory.
	Dir string
}

// NormalizeDistName is PEP 503's normalised name with underscores, as
// *.dist-info directories spell it ("nvidia-cutlass-dsl" → "nvidia_cutlass_dsl").
func NormalizeDistName(name string) string {
	return strings.ToLower(distSep.ReplaceAllString(name, "_"))
}

var distSep = regexp.MustCompile(`[-_.]+`)

// Dists lists every distribution of the environment.
func (v *Venv) Dists() []Dist {
	var out []Dist
	for _, sp := range v.SitePackages {
		matches, _ := filepath.Glob(filepath.Join(sp, "*.dist-info"))
		sort.Strings(matches)
		for _, m := range matches {
			name, version, err := readMetadata(filepath.Join(m, "METADATA"))
			if err != nil {
				continue
			}
			out = append(out, Dist{Name: name, Version: version, Dir: m})
		}
	}
	return out
}

// Dist finds the distribution called name (compared normalised).
func (v *Venv) Dist(name string) (*Dist, bool) {
	want := NormalizeDistName(name)
	for _, d := range v.Dists() {
		if NormalizeDistName(d.Name) == want {
			return &d, true
		}
	}
	return nil, false
}

// readMetadata reads Name and Version from a METADATA file's headers.
func readMetadata(path string) (name, version string, err error) {
	f, err := os.Open(path)
	if err != nil {
		return "", "", err
	}
	defer f.Close()
	sc := bufio.NewScanner(io.LimitReader(f, 1<<20))
	sc.Buffer(make([]byte, 64<<10), 64<<10)
	for sc.Scan() {
		line := sc.Text()
		if line == "" {
			break // end of the headers
		}
		k, val, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		switch strings.ToLower(strings.TrimSpace(k)) {
		case "name":
			name = strings.TrimSpace(val)
		case "version":
			version = strings.TrimSpace(val)
		}
	}
	if name == "" || version == "" {
		return "", "", fmt.Errorf("%s: no Name or Version", path)
	}
	return name, version, nil
}

// Digest is "sha256:<hex>" over what the environment runs: the interpreter
// file, and the name, version and RECORD (the list of installed files with
// their own hashes; METADATA when there is no RECORD) of every
// distribution. Any pip install, upgrade or removal changes it. It reads
// only metadata and the interpreter, so it is quick on a venv of many
// gigabytes.
func (v *Venv) Digest() (string, error) {
	h := sha256.New()
	py, err := filepath.EvalSymlinks(v.Python)
	if err != nil {
		return "", fmt.Errorf("installation digest: %w", err)
	}
	f, err := os.Open(py)
	if err != nil {
		return "", fmt.Errorf("installation digest: %w", err)
	}
	_, err = io.Copy(h, f)
	f.Close()
	if err != nil {
		return "", fmt.Errorf("installation digest: %w", err)
	}
	for _, d := range v.Dists() {
		fmt.Fprintf(h, "\x00%s\x00%s\x00", NormalizeDistName(d.Name), d.Version)
		rec := filepath.Join(d.Dir, "RECORD")
		if _, err := os.Stat(rec); err != nil {
			rec = filepath.Join(d.Dir, "METADATA")
		}
		b, err := os.ReadFile(rec)
		if err != nil {
			return "", fmt.Errorf("installation digest: %w", err)
		}
		h.Write(b)
	}
	return "sha256:" + hex.EncodeToString(h.Sum(nil)), nil
}

// PthDirs returns the directories that the *.pth files of a distribution
// (by file-name prefix, "nvidia_cutlass_dsl") add to Python's path, where
// they exist inside the environment. Lines that import code are skipped:
// CapyCTL adds a path; it never runs a hook.
func (v *Venv) PthDirs(prefix string) []string {
	var out []string
	for _, sp := range v.SitePackages {
		matches, _ := filepath.Glob(filepath.Join(sp, prefix+"*.pth"))
		sort.Strings(matches)
		for _, m := range matches {
			b, err := os.ReadFile(m)
			if err != nil {
				continue
			}
			for _, line := range strings.Split(string(b), "\n") {
				line = strings.TrimSpace(line)
				if line == "" || strings.HasPrefix(line, "#") || strings.HasPrefix(line, "import ") || strings.HasPrefix(line, "import\t") {
					continue
				}
				p := line
				if !filepath.IsAbs(p) {
					p = filepath.Join(sp, p)
				}
				p = filepath.Clean(p)
				if !strings.HasPrefix(p, filepath.Clean(v.Dir)+"/") {
					continue // only directories inside the installation
				}
				if fi, err := os.Stat(p); err == nil && fi.IsDir() && !slices.Contains(out, p) {
					out = append(out, p)
				}
			}
		}
	}
	return out
}

// VersionIn reports whether version's release (its leading numbers, a
// ".postN" or local suffix ignored) starts with one of the prefixes
// ("0.31" matches 0.31.0 and 0.31.2; "0.5.22" matches 0.5.22.post1).
func VersionIn(version string, prefixes []string) bool {
	rel := releaseNumbers(version)
	for _, p := range prefixes {
		want := releaseNumbers(p)
		if len(want) == 0 || len(rel) < len(want) {
			continue
		}
		ok := true
		for i := range want {
			if rel[i] != want[i] {
				ok = false
				break
			}
		}
		if ok {
			return true
		}
	}
	return false
}

// VersionAtLeast reports whether version's release is at least min's.
func VersionAtLeast(version, min string) bool {
	return engine.ReleaseAtLeast(releaseNumbers(version), releaseNumbers(min))
}

// releaseNumbers is the leading dotted numbers of a PEP 440 version.
func releaseNumbers(v string) []int {
	v = strings.TrimPrefix(strings.TrimSpace(v), "v")
	var out []int
	for _, part := range strings.Split(v, ".") {
		end := 0
		for end < len(part) && part[end] >= '0' && part[end] <= '9' {
			end++
		}
		if end == 0 {
			break
		}
		n, err := strconv.Atoi(part[:end])
		if err != nil {
			break
		}
		out = append(out, n)
		if end < len(part) {
			break // "0rc1", "22+cu128"
		}
	}
	return out
}

// DetectSpec says what one family looks for in an environment.
type DetectSpec struct {
	// Family is the engine family ("vllm").
	Family string
	// Dist is the distribution that makes an environment this family's
	// ("vllm", "sglang").
	Dist string
	// Verified are the version prefixes CapyCTL is verified with.
	Verified []string
	// Module is the module a launch runs ("vllm.entrypoints.openai.api_server").
	Module string
}

// Detect inspects an environment for a family without running Python:
// the version from the distribution's METADATA, whether it is one of
// spec.Verified, and the installation digest. The answer names the
// interpreter a launch runs as its program, and the environment (and
// spec.Module, when set) in its details; the driver adds its notes. An
// environment without the family's distribution is CodeEngineUnsupported.
func Detect(path string, spec DetectSpec) (*Venv, *sdk.DetectResponse, error) {
	v, err := FindVenv(path)
	if err != nil {
		return nil, nil, err
	}
	d, ok := v.Dist(spec.Dist)
	if !ok {
		return nil, nil, sdk.Errorf(enginekit.CodeEngineUnsupported, "%s has no %s distribution (no %s-*.dist-info in %s)",
			path, spec.Dist, NormalizeDistName(spec.Dist), strings.Join(v.SitePackages, ", "))
	}
	digest, err := v.Digest()
	if err != nil {
		return nil, nil, sdk.Errorf(sdk.CodeEngineNotFound, "%v", err)
	}
	resp := &sdk.DetectResponse{
		Family:   spec.Family,
		Version:  d.Version,
		Verified: VersionIn(d.Version, spec.Verified),
		Digest:   digest,
		Program:  v.Python,
		Details:  map[string]string{"venv": v.Dir},
	}
	if spec.Module != "" {
		resp.Details["module"] = spec.Module
	}
	return v, resp, nil
}

// CheckPinned refuses a launch when the installation changed since it was
// registered (its digest differs from the pinned one).
func CheckPinned(path, pinned string) (*Venv, error) {
	v, err := FindVenv(path)
	if err != nil {
		return nil, err
	}
	if pinned == "" {
		return v, nil
	}
	digest, err := v.Digest()
	if err != nil {
		return nil, sdk.Errorf(sdk.CodeEngineNotFound, "%v", err)
	}
	if digest != pinned {
		return nil, sdk.Errorf(enginekit.CodeInstallationDrift,
			"the installation at %s changed since it was registered (pinned %s, now %s): register it again with capyctl engine add", path, pinned, digest)
	}
	return v, nil
}
