// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

// Package llamacpp is the driver of llama.cpp's llama-server (SPEC E3): a
// GGUF model directory served on a private loopback port, its memory
// derived from the GGUF header (the weights and a full-window KV cache for
// every slot), readiness proven by a real answer, the idle signal read from
// llama-server's metrics, and decision models on /v1/systemone.
// llama-server has no way to release its memory while running, so a
// llama.cpp model is restart only: CapyCTL stops it when it needs the
// memory and starts it on the next request. llama-server cancels a request
// whose connection closes (a streamed one at once, a non-streamed one
// within about a second when the server is otherwise quiet): there is no
// abort to send.
package llamacpp

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/capyctl/capyctl/drivers/internal/engine"
	"github.com/capyctl/capyctl/sdk"
	"github.com/capyctl/capyctl/sdk/enginekit"
)

// Family is this driver's engine family.
const Family = "llamacpp"

// codeVersionFailed is the catalogue code of a build whose version check
// fails.
const codeVersionFailed = "engine_version_failed"

// DecisionsMinVersion is the first llama.cpp release that answers decision
// requests.
const DecisionsMinVersion = "0.7.0"

// UnknownBuild is the version of a build that does not say which llama.cpp
// it is (`--version` prints "version: 0 (unknown)").
const UnknownBuild = "unknown build"

// Bounds of the version check `engine add` runs.
const (
	versionTimeout   = 10 * time.Second
	versionMaxOutput = 64 << 10
)

// Driver is the llama.cpp driver.
type Driver struct {
	enginekit.RestartOnly
	// Version is the driver\'s version in Describe: the capyctl build that
	// serves it sets its own (`capyctl driver <family>`); the driver does
	// not import the core to learn it.
	Version string
	reg     *enginekit.Registry[*handle]
	// stopGrace is the default grace period after SIGTERM.
	stopGrace time.Duration
	// systemConfig is a file llama-server would read besides its argv; a
	// host that has it is refused (tests point it elsewhere).
	systemConfig string
}

var (
	_ sdk.Driver     = (*Driver)(nil)
	_ sdk.ExitWaiter = (*Driver)(nil)
)

// New returns the driver.
func New() *Driver {
	return &Driver{reg: enginekit.NewRegistry[*handle](), stopGrace: 10 * time.Second, systemConfig: "/etc/llama.cpp/config.ini"}
}

// Describe implements sdk.Driver: restart only (no park tiers), chat,
// decisions, embeddings and rerank, aborts by closing the connection, an
// idle signal.
func (d *Driver) Describe(context.Context, *sdk.DescribeRequest) (*sdk.DescribeResponse, error) {
	return enginekit.Describe(Family, d.Version, &sdk.Capabilities{
		APIs:       []string{"chat", "decisions", "embeddings", "rerank"},
		AbortMode:  sdk.AbortModeCloseConnection,
		IdleSignal: true,
	}, configSchema), nil
}

// versionRE reads `llama-server --version`: "version: 4748 (c392e5094)" or
// "version: 0.7.0 (c392e5094)".
var versionRE = regexp.MustCompile(`(?m)^version: ([0-9A-Za-z.+-]+)(?: \(([0-9a-fA-F]+)\))?`)

// Detect implements sdk.Driver: the path must be an executable llama-server
// binary; its version comes from `--version`, run with a clean
// environment in its own process group and bounded in time and output.
// The digest is the binary's sha256. Every build is listed as custom.
func (d *Driver) Detect(ctx context.Context, req *sdk.DetectRequest) (*sdk.DetectResponse, error) {
	p := req.Path
	if p == "" {
		return nil, sdk.Errorf(enginekit.CodeEngineUnsupported, "no program named")
	}
	abs, err := filepath.Abs(p)
	if err != nil {
		return nil, sdk.Errorf(enginekit.CodeEngineUnsupported, "%s: %v", p, err)
	}
	st, err := os.Stat(abs)
	if err != nil {
		return nil, sdk.Errorf(enginekit.CodeEngineUnsupported, "%s: %v", p, enginekit.UnwrapPathErr(err))
	}
	// llama.cpp names the binary llama-server (older builds: server).
	if base := strings.ToLower(filepath.Base(abs)); st.IsDir() || !strings.Contains(base, "llama") && base != "server" {
		return nil, sdk.Errorf(enginekit.CodeEngineUnsupported, "%s is not a llama-server binary", p)
	}
	if st.Mode()&0o111 == 0 {
		return nil, sdk.Errorf(sdk.CodeEngineNotFound, "%s is not executable", p)
	}
	out, err := runBounded(ctx, abs, "--version")
	if err != nil {
		return nil, sdk.Errorf(codeVersionFailed, "%s --version: %v", p, err)
	}
	m := versionRE.FindStringSubmatch(out)
	if m == nil {
		return nil, sdk.Errorf(codeVersionFailed, "%s --version printed no version line: %q", p, clip(out, 200))
	}
	ver := m[1]
	unknown := ver == "0"
	switch {
	case unknown:
		// A build made without git (from a source tarball) prints
		// "version: 0 (unknown)": it does not say which llama.cpp it is.
		ver = UnknownBuild
	case isDigits(ver):
		ver = "b" + ver // a build number
	}
	digest, err := enginekit.FileDigest(abs)
	if err != nil {
		return nil, sdk.Errorf(sdk.CodeEngineNotFound, "read %s: %v", p, err)
	}
	notes := []string{
		"llama.cpp models run restart only: CapyCTL stops them when it needs the memory and starts them on the next request",
		"every llama.cpp build runs as custom (not verified)",
	}
	if unknown {
		notes = append(notes, "this build does not say which llama.cpp it is (`--version` prints \"version: 0 (unknown)\", a build made without git): it is listed as an "+UnknownBuild+" and the options CapyCTL renders are those its --help lists")
	}
	if !versionAtLeast(ver, DecisionsMinVersion) {
		notes = append(notes, "decision models (api = \"decisions\") need llama.cpp "+DecisionsMinVersion+" or newer; this build serves chat only")
	}
	details := map[string]string{}
	if m[2] != "" {
		details["commit"] = strings.ToLower(m[2])
	}
	// The options this build takes, so a plan renders only those of the
	// hardening flags the build knows (older builds lack --fit, --offline,
	// ...). Without a usable --help every flag is rendered.
	if help, err := runBounded(ctx, abs, "--help"); err == nil {
		if opts := helpOptions(help); len(opts) > 0 {
			details[detailOptions] = strings.Join(opts, " ")
		}
		if unixSocketRE.MatchString(help) {
			details[detailUnixSocket] = "true"
		}
	}
	if details[detailUnixSocket] != "true" {
		notes = append(notes, "this build cannot listen on a Unix socket: its models listen on a loopback port, where /health and /v1/models answer any local user")
	}
	return &sdk.DetectResponse{
		Family: Family, Version: ver, Verified: false, Digest: digest, Program: abs, Notes: notes, Details: details,
	}, nil
}

// detailOptions is the installation detail listing the build's options.
const detailOptions = "options"

// detailUnixSocket is the installation detail saying the build binds a
// Unix socket for a --host ending in .sock ("true"): its --help says
// "ip address to listen, or bind to an UNIX socket if the address ends
// with .sock" (common/arg.cpp, since ggml-org/llama.cpp#12613, March 2025).
const detailUnixSocket = "unix_socket"

// unixSocketRE finds that sentence in a --help text.
var unixSocketRE = regexp.MustCompile(`(?i)UNIX socket if the address ends with \.sock`)

// optionRE finds the long options of a --help text.
var optionRE = regexp.MustCompile(`(?:^|[\s,])(--[a-z0-9][a-z0-9-]*)`)

// helpOptions lists the long options a --help text names, sorted.
func helpOptions(help string) []string {
	seen := map[string]bool{}
	var out []string
	for _, m := range optionRE.FindAllStringSubmatch(help, -1) {
		if !seen[m[1]] {
			seen[m[1]] = true
			out = append(out, m[1])
		}
	}
	sort.Strings(out)
	return out
}

// runBounded runs `program arg` with a clean environment in its own
// process group, killing the group after versionTimeout, keeping at most
// versionMaxOutput bytes of its output (llama-server prints its version to
// stderr).
func runBounded(ctx context.Context, program, arg string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, versionTimeout)
	defer cancel()
	home, err := os.MkdirTemp("", "capyctl-llama-version-*")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(home)
	cmd := exec.Command(program, arg)
	cmd.Env = []string{"PATH=/usr/local/bin:/usr/bin:/bin", "HOME=" + home, "LANG=C.UTF-8"}
	cmd.Dir = home
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	var buf limitedBuffer
	buf.max = versionMaxOutput
	cmd.Stdout, cmd.Stderr = &buf, &buf
	if err := cmd.Start(); err != nil {
		return "", err
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err = <-done:
	case <-ctx.Done():
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		<-done
		return buf.String(), errors.New("no answer within " + versionTimeout.String())
	}
	if err != nil {
		return buf.String(), err
	}
	return buf.String(), nil
}

// limitedBuffer keeps the first max bytes written.
type limitedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
	max int
}

func (b *limitedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if room := b.max - b.buf.Len(); room > 0 {
		if len(p) > room {
			b.buf.Write(p[:room])
		} else {
			b.buf.Write(p)
		}
	}
	return len(p), nil
}

func (b *limitedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// versionAtLeast compares dotted release numbers; a build number ("b4748")
// or anything else that is not a release is never at least a release.
func versionAtLeast(v, min string) bool {
	a, ok1 := release(v)
	b, ok2 := release(min)
	return ok1 && ok2 && engine.ReleaseAtLeast(a, b)
}

// release reads "0.7.0" (a pre-release suffix is cut).
func release(v string) ([]int, bool) {
	v = strings.TrimPrefix(v, "v")
	if i := strings.IndexAny(v, "-+"); i >= 0 {
		v = v[:i]
	}
	parts := strings.Split(v, ".")
	if len(parts) < 2 {
		return nil, false
	}
	out := make([]int, len(parts))
	for i, p := range parts {
		n, err := strconv.Atoi(p)
		if err != nil {
			return nil, false
		}
		out[i] = n
	}
	return out, true
}

func isDigits(s string) bool {
	for _, c := range s {
		if c < '0' || c > '9' {
			return false
		}
	}
	return s != ""
}

func clip(s string, n int) string {
	if len(s) > n {
		return s[:n] + "…"
	}
	return s
}

// Flags implements sdk.Driver.
func (d *Driver) Flags(context.Context, *sdk.FlagsRequest) (*sdk.FlagsResponse, error) {
	return Table.Response(), nil
}
