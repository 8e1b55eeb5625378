// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package docs_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"go/parser"
	"go/token"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/capyctl/capyctl/cmd/capyctl/command"
	"github.com/capyctl/capyctl/core/api/wire"
	"github.com/capyctl/capyctl/core/config"
	"github.com/capyctl/capyctl/core/jobspec"
	"github.com/capyctl/capyctl/drivers/custom"
	"github.com/capyctl/capyctl/plugins-testkit/harness"
	"github.com/capyctl/capyctl/website/docs"
)

const (
	contentDir = "../content"
	repoRoot   = "../.."
)

func loadPages(t *testing.T) []*docs.Page {
	t.Helper()
	pages, err := docs.Load(contentDir, repoRoot)
	if err != nil {
		t.Fatal(err)
	}
	return pages
}

// TestSite_Builds builds the site and checks every page is there, in the
// navigation, and that every link between pages resolves.
func TestSite_Builds(t *testing.T) {
	pages := loadPages(t)
	out := t.TempDir()
	if err := docs.Build(pages, out); err != nil {
		t.Fatal(err)
	}
	required := []string{
		"index.md", "getting-started.md", "concepts/roles.md", "concepts/drivers.md", "concepts/parking.md",
		"reference/jobspec.md", "reference/management-api.md", "reference/cli.md", "reference/configuration.md",
		"guides/controller.md", "guides/driver-author.md",
		"operations/install.md", "operations/systemd.md", "operations/containers.md", "operations/upgrades.md",
		"operations/data-retention.md",
		"reference/responses-and-messages.md", "guides/coding-agents.md",
	}
	have := map[string]bool{}
	for _, p := range pages {
		have[p.Path] = true
	}
	for _, r := range required {
		if !have[r] {
			t.Errorf("no page %s", r)
		}
	}
	hrefRe := regexp.MustCompile(`href="([^"]+)"`)
	idRe := regexp.MustCompile(`id="([^"]+)"`)
	ids := map[string]map[string]bool{}
	for _, p := range pages {
		data, err := os.ReadFile(filepath.Join(out, p.HTMLPath()))
		if err != nil {
			t.Fatal(err)
		}
		ids[p.HTMLPath()] = map[string]bool{}
		for _, m := range idRe.FindAllSubmatch(data, -1) {
			ids[p.HTMLPath()][string(m[1])] = true
		}
	}
	for _, p := range pages {
		data, _ := os.ReadFile(filepath.Join(out, p.HTMLPath()))
		for _, q := range pages {
			if !bytes.Contains(data, []byte(">"+htmlEscape(q.Title)+"</a>")) {
				t.Errorf("%s: the navigation lacks %q", p.Path, q.Title)
			}
		}
		for _, m := range hrefRe.FindAllSubmatch(data, -1) {
			href := string(m[1])
			if strings.Contains(href, "://") || strings.HasPrefix(href, "mailto:") {
				continue
			}
			file, frag, _ := strings.Cut(href, "#")
			target := p.HTMLPath()
			if file != "" {
				target = filepath.ToSlash(filepath.Clean(filepath.Join(filepath.Dir(p.HTMLPath()), file)))
				if _, err := os.Stat(filepath.Join(out, target)); err != nil {
					t.Errorf("%s: broken link %s", p.Path, href)
					continue
				}
			}
			if frag != "" && ids[target] != nil && !ids[target][frag] {
				t.Errorf("%s: link %s names no heading in %s", p.Path, href, target)
			}
		}
	}
}

func htmlEscape(s string) string {
	r := strings.NewReplacer("&", "&amp;", "<", "&lt;", ">", "&gt;", `"`, "&#34;", "'", "&#39;")
	return r.Replace(s)
}

// TestJobspecReference_EveryField checks the job spec reference documents
// every field a deployment has.
func TestJobspecReference_EveryField(t *testing.T) {
	specs, err := jobspec.Parse([]byte("deployment \"d\" {\n  engine = \"vllm\"\n  model {\n    path = \"d\"\n  }\n}\n"), "d.hcl")
	if err != nil {
		t.Fatal(err)
	}
	page, err := os.ReadFile(filepath.Join(contentDir, "reference", "jobspec.md"))
	if err != nil {
		t.Fatal(err)
	}
	for field := range specs[0].Provenance {
		if !bytes.Contains(page, []byte("| `"+field+"` |")) {
			t.Errorf("reference/jobspec.md has no row for `%s`", field)
		}
	}
}

// TestExamples validates every example of every page: job specs, role
// configurations and manifests parse; JSON decodes (into its wire type when
// the block names one); Go parses (and an included file is the file);
// every capyctl command exists and takes the options shown; other programs
// are known ones. Blocks marked "run" are executed by TestRunnableExamples.
func TestExamples(t *testing.T) {
	for _, p := range loadPages(t) {
		for _, b := range p.Blocks() {
			b := b
			t.Run(fmt.Sprintf("%s:%d", b.Page, b.Line), func(t *testing.T) {
				if err := validateBlock(t, b); err != nil {
					t.Errorf("%s:%d (%s block): %v\n%s", b.Page, b.Line, b.Lang, err, b.Code)
				}
			})
		}
	}
}

// wireTypes are the types a ```json wire=<Type> block must decode into.
var wireTypes = map[string]func() any{
	"ErrorEnvelope":    func() any { return &wire.ErrorEnvelope{} },
	"Snapshot":         func() any { return &wire.Snapshot{} },
	"Event":            func() any { return &wire.Event{} },
	"DeployAccepted":   func() any { return &wire.DeployAccepted{} },
	"ActionRequest":    func() any { return &wire.ActionRequest{} },
	"ActionAccepted":   func() any { return &wire.ActionAccepted{} },
	"EffectiveConfig":  func() any { return &wire.EffectiveConfig{} },
	"EngineLog":        func() any { return &wire.EngineLog{} },
	"RoleConfig":       func() any { return &wire.RoleConfig{} },
	"DeploymentStatus": func() any { return &wire.DeploymentStatus{} },
	"HostDetail":       func() any { return &wire.HostDetail{} },
	"JoinTokenRequest": func() any { return &wire.JoinTokenRequest{} },
	"JoinToken":        func() any { return &wire.JoinToken{} },
	"HostAction":       func() any { return &wire.HostAction{} },
	"ServerList":       func() any { return &wire.ServerList{} },
	"StateRestored":    func() any { return &wire.StateRestored{} },
	"StateSnapshot":    func() any { return &wire.StateSnapshot{} },
	// Named API keys and their usage.
	"APIKeyCreateRequest": func() any { return &wire.APIKeyCreateRequest{} },
	"APIKeyCreated":       func() any { return &wire.APIKeyCreated{} },
	"APIKey":              func() any { return &wire.APIKey{} },
	"APIKeyUpdateRequest": func() any { return &wire.APIKeyUpdateRequest{} },
	"UsageResponse":       func() any { return &wire.UsageResponse{} },
}

func validateBlock(t *testing.T, b docs.Block) error {
	switch b.Lang {
	case "text":
		return nil // output shown for reading
	case "hcl":
		return validateHCL(t, b)
	case "json":
		if name := b.Attrs["wire"]; name != "" {
			mk, ok := wireTypes[name]
			if !ok {
				return fmt.Errorf("no wire type %q", name)
			}
			dec := json.NewDecoder(strings.NewReader(b.Code))
			dec.DisallowUnknownFields()
			return dec.Decode(mk())
		}
		var v map[string]any
		if err := json.Unmarshal([]byte(b.Code), &v); err != nil {
			return err
		}
		if d, ok := v["deployment"]; ok {
			raw, _ := json.Marshal(d)
			_, err := jobspec.FromJSON(raw)
			return err
		}
		return nil
	case "go":
		if f := b.Attrs["file"]; f != "" {
			data, err := os.ReadFile(filepath.Join(repoRoot, f))
			if err != nil {
				return err
			}
			if strings.TrimRight(string(data), "\n") != strings.TrimRight(b.Code, "\n") {
				return fmt.Errorf("the block differs from %s", f)
			}
			return nil
		}
		src := b.Code
		if !strings.HasPrefix(strings.TrimSpace(src), "package ") {
			src = "package x\nfunc _() {\n" + src + "\n}\n"
		}
		_, err := parser.ParseFile(token.NewFileSet(), "block.go", src, parser.AllErrors)
		return err
	case "ini":
		unit, err := os.ReadFile(filepath.Join(repoRoot, "configs", "systemd", "system", "capyctl-standalone.service"))
		if err != nil {
			return err
		}
		lines := strings.Split(string(unit), "\n")
		for _, l := range strings.Split(strings.TrimSpace(b.Code), "\n") {
			if !slices.Contains(lines, l) {
				return fmt.Errorf("%q is not in configs/systemd/system/capyctl-standalone.service", l)
			}
		}
		return nil
	case "dockerfile":
		return validateDockerfile(b.Code)
	case "console":
		// "$ command" lines are commands; the others are their output.
		for _, line := range strings.Split(b.Code, "\n") {
			if cmd, ok := strings.CutPrefix(line, "$ "); ok {
				for _, words := range shellLines(cmd) {
					if err := validateCommand(words); err != nil {
						return err
					}
				}
			}
		}
		return nil
	case "sh", "bash":
		if _, ok := b.Attrs["run"]; ok {
			return nil // executed by TestRunnableExamples
		}
		for _, line := range shellLines(b.Code) {
			if err := validateCommand(line); err != nil {
				return err
			}
		}
		return nil
	}
	return fmt.Errorf("no validation for a %q block: use hcl, json, go, sh, console, ini, dockerfile or text (website/README.md)", b.Lang)
}

func validateHCL(t *testing.T, b docs.Block) error {
	code := []byte(b.Code)
	switch {
	case bytes.Contains(code, []byte("deployment \"")):
		_, err := jobspec.Parse(code, b.Page+".hcl")
		return err
	case bytes.Contains(code, []byte("args")) && bytes.Contains(code, []byte("api")):
		_, err := custom.ParseManifest(code, b.Page+".hcl")
		return err
	default:
		f := filepath.Join(t.TempDir(), "role.hcl")
		if err := os.WriteFile(f, code, 0o600); err != nil {
			return err
		}
		_, err := config.Load(config.LoadOptions{File: f, Env: []string{"HOME=/home/capy"}})
		return err
	}
}

func validateDockerfile(code string) error {
	envs := knownEnv()
	for _, line := range strings.Split(code, "\n") {
		f := strings.Fields(line)
		if len(f) == 0 {
			continue
		}
		switch f[0] {
		case "ENTRYPOINT", "CMD":
			var argv []string
			if err := json.Unmarshal([]byte(strings.TrimSpace(strings.TrimPrefix(line, f[0]))), &argv); err != nil {
				return fmt.Errorf("%s: %v", f[0], err)
			}
			if err := validateCommand(argv); err != nil {
				return err
			}
		case "ENV":
			for _, kv := range f[1:] {
				k, _, _ := strings.Cut(kv, "=")
				if strings.HasPrefix(k, "CAPYCTL_") && !envs[k] {
					return fmt.Errorf("ENV %s: no such setting", k)
				}
			}
		}
	}
	return nil
}

// knownEnv are the CAPYCTL_ variables a page may name.
func knownEnv() map[string]bool {
	out := map[string]bool{"CAPYCTL_CONFIG": true, "CAPYCTL_RELEASE_URL": true, "CAPYCTL_ARCH": true, "CAPYCTL_INSTALL_ROOT": true}
	for _, d := range config.Definitions() {
		out[d.Env] = true
	}
	return out
}

// shellLines splits a shell block into commands: continuation lines
// joined, comments dropped, pipelines and && lists split.
func shellLines(code string) [][]string {
	code = strings.ReplaceAll(code, "\\\n", " ")
	var out [][]string
	for _, line := range strings.Split(code, "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		var cur []string
		for _, w := range shellWords(line) {
			switch w {
			case "|", "&&", "||", ";":
				if len(cur) > 0 {
					out = append(out, cur)
				}
				cur = nil
			default:
				if strings.HasPrefix(w, "#") {
					break
				}
				cur = append(cur, w)
			}
		}
		if len(cur) > 0 {
			out = append(out, cur)
		}
	}
	return out
}

// shellWords splits a line into words, keeping quoted strings and $(...)
// whole, and returning |, &&, || and ; as words of their own.
func shellWords(line string) []string {
	var words []string
	var b strings.Builder
	var quote byte
	depth := 0
	flush := func() {
		if b.Len() > 0 {
			words = append(words, b.String())
			b.Reset()
		}
	}
	for i := 0; i < len(line); i++ {
		c := line[i]
		switch {
		case quote != 0:
			if c == quote {
				quote = 0
			} else {
				b.WriteByte(c)
			}
		case c == '\'' || c == '"':
			quote = c
		case c == '$' && i+1 < len(line) && line[i+1] == '(':
			depth++
			b.WriteString("$(")
			i++
		case c == ')' && depth > 0:
			depth--
			b.WriteByte(c)
		case depth > 0:
			b.WriteByte(c)
		case c == ' ' || c == '\t':
			flush()
		case c == '|' || c == ';' || c == '&':
			flush()
			if i+1 < len(line) && line[i+1] == c {
				words = append(words, string([]byte{c, c}))
				i++
			} else {
				words = append(words, string(c))
			}
		default:
			b.WriteByte(c)
		}
	}
	flush()
	return words
}

// programs other than capyctl that the pages may show.
var programs = []string{
	"curl", "wget", "systemctl", "journalctl", "loginctl", "useradd", "mkdir", "chown", "chmod", "cp", "mv", "ln",
	"rm", "ls", "install", "tar", "sha256sum", "go", "make", "docker", "podman", "awk", "grep", "cat", "jq",
	"export", "cd", "echo", "test", "sh", "bash", "sudo", "git", "uname", "id", "kill", "ps", "free", "df",
	"nvidia-smi", "python3", "pip", "uv", "huggingface-cli", "hf", "llama-server",
	"codex", "claude", // the coding agents the Coding agents guide points at CapyCTL
}

var assignRe = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*=`)

// validateCommand checks one command: a capyctl command that exists with
// options its help names, or a known program (whose capyctl arguments,
// as in sudo ... capyctl or docker exec <c> capyctl, are checked too).
func validateCommand(words []string) error {
	envs := knownEnv()
	for len(words) > 0 && assignRe.MatchString(words[0]) {
		k, _, _ := strings.Cut(words[0], "=")
		if strings.HasPrefix(k, "CAPYCTL_") && !envs[k] {
			return fmt.Errorf("%s: no such setting", k)
		}
		words = words[1:]
	}
	if len(words) == 0 {
		return nil
	}
	prog := filepath.Base(words[0])
	if prog == "capyctl" {
		return validateCapyctl(words[1:])
	}
	if !slices.Contains(programs, prog) {
		return fmt.Errorf("unknown program %q (add it to the doc test's list if the page means it)", prog)
	}
	switch prog {
	case "sudo":
		// sudo [-u user] [-E] command...
		rest := words[1:]
		for len(rest) > 0 && strings.HasPrefix(rest[0], "-") {
			if rest[0] == "-u" || rest[0] == "-g" {
				rest = rest[1:]
			}
			rest = rest[1:]
		}
		return validateCommand(rest)
	case "docker":
		// docker exec [options] <container> command...
		if len(words) < 2 || words[1] != "exec" {
			return nil
		}
		rest := words[2:]
		for len(rest) > 0 && strings.HasPrefix(rest[0], "-") {
			if rest[0] == "-e" || rest[0] == "-u" || rest[0] == "-w" {
				rest = rest[1:]
			}
			rest = rest[1:]
		}
		if len(rest) < 2 {
			return fmt.Errorf("docker exec without a command")
		}
		return validateCommand(rest[1:])
	}
	return nil
}

var globalFlags = []string{"--json", "--format", "--state-dir", "--help"}

func validateCapyctl(args []string) error {
	if len(args) == 1 && args[0] == "--version" {
		return nil
	}
	table := command.Commands(&command.Meta{})
	names := command.CommandNames()
	var name string
	for n := min(2, len(args)); n >= 1; n-- {
		candidate := strings.Join(args[:n], " ")
		if slices.Contains(names, candidate) {
			name = candidate
			args = args[n:]
			break
		}
	}
	if name == "" {
		return fmt.Errorf("capyctl %s: no such command", strings.Join(args, " "))
	}
	c, err := table[name]()
	if err != nil {
		return err
	}
	help := c.Help()
	for _, a := range args {
		if !strings.HasPrefix(a, "--") {
			continue
		}
		flag, _, _ := strings.Cut(a, "=")
		if !slices.Contains(globalFlags, flag) && !regexp.MustCompile(regexp.QuoteMeta(flag)+`\b`).MatchString(help) {
			return fmt.Errorf("capyctl %s takes no %s (its help does not name it)", name, flag)
		}
	}
	return nil
}

var (
	modelPathRe = regexp.MustCompile(`"path"\s*:\s*"([^"]+)"`)
	hclPathRe   = regexp.MustCompile(`(?m)^\s*path\s*=\s*"([^"]+)"`)
)

// TestRunnableExamples runs every ```sh run block, page by page, against
// one standalone role whose state is the default one of a fresh home
// (~/.local/state/capyctl) and whose models root is ~/models, as on a new
// machine. The pages' addresses 127.0.0.1:8443 and 127.0.0.1:7443 are the
// role's. The one substitution: the engine the pages register
// (llama-server, as "llamacpp") is the testkit's fake engine registered
// as a custom engine under that name, so no real engine is needed.
// Files the pages show (```hcl file=NAME) are written to the page's
// working directory before its run blocks.
func TestRunnableExamples(t *testing.T) {
	pages := loadPages(t)
	var runnable []*docs.Page
	models := map[string]bool{}
	for _, p := range pages {
		run := false
		for _, b := range p.Blocks() {
			if _, ok := b.Attrs["run"]; ok && (b.Lang == "sh" || b.Lang == "bash") {
				run = true
				for _, m := range modelPathRe.FindAllStringSubmatch(b.Code, -1) {
					models[m[1]] = true
				}
			}
			if b.Lang == "hcl" && b.Attrs["file"] != "" {
				for _, m := range hclPathRe.FindAllStringSubmatch(b.Code, -1) {
					models[m[1]] = true
				}
			}
		}
		if run {
			runnable = append(runnable, p)
		}
	}
	if len(runnable) == 0 {
		t.Fatal("no runnable example")
	}
	if _, err := exec.LookPath("bash"); err != nil {
		t.Skip("bash is not installed")
	}
	if _, err := exec.LookPath("curl"); err != nil {
		t.Skip("curl is not installed")
	}

	home := t.TempDir()
	state := filepath.Join(home, ".local", "state", "capyctl")
	r := harness.StartStandalone(t, harness.Options{StateDir: state, Args: []string{"--models-root", filepath.Join(home, "models")}})
	r.AddFakeEngine("llamacpp")
	for m := range models {
		dir := filepath.Join(home, "models", m)
		if err := os.MkdirAll(dir, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "README"), []byte("a model for the documentation test\n"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	bin := filepath.Dir(r.Bin)
	env := []string{"HOME=" + home, "PATH=" + bin + string(os.PathListSeparator) + os.Getenv("PATH"), "LANG=C.UTF-8", "TMPDIR=" + os.TempDir()}
	rewrite := strings.NewReplacer("http://127.0.0.1:8443", "http://"+r.Info.Inference, "http://127.0.0.1:7443", "http://"+r.Info.Management)

	for _, p := range runnable {
		work := t.TempDir()
		for _, b := range p.Blocks() {
			if f := b.Attrs["file"]; f != "" && (b.Lang == "hcl" || b.Lang == "json") {
				if err := os.WriteFile(filepath.Join(work, f), []byte(b.Code), 0o600); err != nil {
					t.Fatal(err)
				}
				continue
			}
			if _, ok := b.Attrs["run"]; !ok || (b.Lang != "sh" && b.Lang != "bash") {
				continue
			}
			script := "set -euo pipefail\n" + rewrite.Replace(b.Code)
			cmd := exec.Command("bash", "-c", script)
			cmd.Dir = work
			cmd.Env = env
			out, err := cmd.CombinedOutput()
			if err != nil {
				t.Fatalf("%s:%d: %v\n--- block\n%s--- output\n%s\n--- role\n%s", p.Path, b.Line, err, b.Code, out, r.Output())
			}
			t.Logf("%s:%d ran:\n%s", p.Path, b.Line, out)
		}
	}
}
