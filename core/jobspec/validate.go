// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package jobspec

import (
	"bytes"
	"encoding/json"
	"fmt"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/capyctl/capyctl/core/structs"
	"github.com/hashicorp/hcl/v2"
)

// Bounds a deployment must stay within.
const (
	MaxInstances = 64
	// MinLMCachePool is the smallest lmcache_pool: one GiB.
	MinLMCachePool           = structs.ByteSize(structs.GiB)
	MaxConcurrentRequests    = 1024
	MaxContextLength         = 1 << 24
	MaxWaiting               = 65536
	MaxEnvNames              = 64
	MaxEnvValueBytes         = 4096
	MaxRoutes                = 32
	maxExtraArgs             = 256
	maxChunkBytesUpperBound  = structs.ByteSize(64 * structs.MiB)
	minChunkBytesLowerBound  = structs.ByteSize(1 * structs.KiB)
	sizeUpperBound           = structs.ByteSize(64 * structs.TiB)
	durationUpperBoundString = "720h"
)

var (
	// NameRe is the syntax of deployment and engine names.
	NameRe = regexp.MustCompile(`^[a-z0-9][a-z0-9._-]{0,62}$`)
	// RouteRe is the syntax of a route (a public model name).
	RouteRe       = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._:/@+-]{0,127}$`)
	hfRe          = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,95}/[A-Za-z0-9][A-Za-z0-9._-]{0,95}$`)
	commitRe      = regexp.MustCompile(`^[0-9a-f]{40}$`)
	localRevRe    = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$`)
	fingerprintRe = regexp.MustCompile(`^sha256:[0-9a-f]{64}$`)
	tokenRe       = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$`)
	envRe         = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,127}$`)
	dtypes        = []string{"auto", "half", "float16", "bfloat16", "float", "float32"}
	durationMax   = mustDuration(durationUpperBoundString)
)

func mustDuration(s string) structs.Duration {
	d, err := structs.ParseDuration(s)
	if err != nil {
		panic(err)
	}
	return d
}

// checker collects diagnostics; pos places a field (nil: no positions),
// has says whether the operator set it (nil: unknown).
type checker struct {
	pos   func(path string) *hcl.Range
	has   func(path string) bool
	diags []Diagnostic
}

func (c *checker) bad(field, format string, args ...any) {
	var r *hcl.Range
	if c.pos != nil {
		r = c.pos(field)
	}
	c.diags = append(c.diags, diagAt(r, field, "invalid "+field, fmt.Sprintf(format, args...)))
}

func (c *checker) set(field string) bool { return c.has != nil && c.has(field) }

func (c *checker) oneOf(field, v string, allowed ...string) {
	if !slices.Contains(allowed, v) {
		c.bad(field, "%q is not one of %s", v, quoteList(allowed))
	}
}

func (c *checker) intRange(field string, v, lo, hi int) {
	if v < lo || v > hi {
		c.bad(field, "%d is outside %d..%d", v, lo, hi)
	}
}

func (c *checker) size(field string, v structs.ByteSize) {
	if v < 0 || v > sizeUpperBound {
		c.bad(field, "%d bytes is outside 0..%s", int64(v), sizeUpperBound)
	}
}

// positive refuses a duration that is negative, zero or absurdly long.
func (c *checker) positive(field string, v structs.Duration) {
	if v <= 0 {
		c.bad(field, "must be longer than 0s")
	} else if v > durationMax {
		c.bad(field, "%s is longer than %s", v, durationMax)
	}
}

// optional checks a duration where 0 means "derived" or "off": negative
// values are refused, and an explicit 0 when zeroIsOmission.
func (c *checker) optional(field string, v structs.Duration, zeroIsOmission bool) {
	switch {
	case v < 0:
		c.bad(field, "must not be negative")
	case v == 0 && zeroIsOmission && c.set(field):
		c.bad(field, "must be longer than 0s; leave it out to have it derived")
	case v > durationMax:
		c.bad(field, "%s is longer than %s", v, durationMax)
	}
}

func quoteList(vs []string) string {
	q := make([]string, len(vs))
	for i, v := range vs {
		q[i] = strconv.Quote(v)
	}
	return strings.Join(q, ", ")
}

// validate checks one completed deployment. pos places a field and has
// says whether the operator set it; either may be nil.
func validate(d *structs.Deployment, pos func(string) *hcl.Range, has func(string) bool) []Diagnostic {
	c := &checker{pos: pos, has: has}
	validateTop(c, d)
	validateModel(c, d)
	validateResources(c, d)
	validateLifecycle(c, d)
	validateEngineConfig(c, d)
	return c.diags
}

// hostNameRe is a host's name as its certificate carries it (core/pki).
var hostNameRe = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?(\.[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?)*$`)

func validateTop(c *checker, d *structs.Deployment) {
	switch {
	case d.Name == "":
		c.bad("name", "a deployment needs a name")
	case !NameRe.MatchString(d.Name):
		c.bad("name", "%q must be 1-63 lowercase letters, digits, '.', '_' or '-', starting with a letter or digit", d.Name)
	}
	switch {
	case d.Engine == "":
		c.bad("engine", `engine is required: a registered engine name or a family (%s)`, quoteList(Families))
	case !NameRe.MatchString(d.Engine):
		c.bad("engine", "%q is not an engine name (lowercase letters, digits, '.', '_', '-')", d.Engine)
	}
	c.oneOf("api", d.API, structs.APIChat, structs.APIDecisions, structs.APIEmbeddings, structs.APIRerank)
	if d.Residency != "" {
		c.oneOf("residency", d.Residency, structs.ResidencyDeep, structs.ResidencyHostBacked, structs.ResidencyRestartOnly)
	}
	c.oneOf("lmcache", d.LMCache, structs.LMCacheAuto, structs.LMCacheOff, structs.LMCacheRequired)
	if d.LMCachePool < MinLMCachePool {
		c.bad("lmcache_pool", "lmcache_pool is %s: LMCache needs at least %s", d.LMCachePool, MinLMCachePool)
	}
	c.intRange("instances", d.Instances, 1, MaxInstances)
	c.positive("request_deadline", d.RequestDeadline)

	if len(d.Routes) == 0 {
		c.bad("routes", "a deployment serves at least one route; leave routes out to serve its name")
	} else if len(d.Routes) > MaxRoutes {
		c.bad("routes", "%d routes; at most %d", len(d.Routes), MaxRoutes)
	}
	seen := map[string]bool{}
	for _, r := range d.Routes {
		if r == d.Name && !NameRe.MatchString(d.Name) {
			continue // the name's own diagnostic covers its default route
		}
		if !RouteRe.MatchString(r) {
			c.bad("routes", "route %q must be 1-128 letters, digits or ._:/@+- starting with a letter or digit", r)
		}
		if seen[r] {
			c.bad("routes", "route %q is listed twice", r)
		}
		seen[r] = true
	}

	if p := d.Placement; p != nil {
		if len(p.Hosts) == 0 {
			c.bad("placement.hosts", "placement names no host; list the hosts the instances may run on, or leave the block out")
		}
		hosts := map[string]bool{}
		for _, h := range p.Hosts {
			if !hostNameRe.MatchString(h) {
				c.bad("placement.hosts", "%q is not a host name (lowercase letters, digits, '-' and '.'; capyctl list hosts)", h)
			}
			if hosts[h] {
				c.bad("placement.hosts", "host %q is listed twice", h)
			}
			hosts[h] = true
		}
	}

	c.group(d)

	t := d.Timeouts
	c.optional("timeouts.initialize", t.Initialize, true)
	c.optional("timeouts.wake", t.Wake, true)
	c.optional("timeouts.stop", t.Stop, true)

	l := d.Limits
	c.positive("limits.stream_idle", l.StreamIdle)
	c.positive("limits.client_read_idle", l.ClientReadIdle)
	if l.MaxChunkBytes < minChunkBytesLowerBound || l.MaxChunkBytes > maxChunkBytesUpperBound {
		c.bad("limits.max_chunk_bytes", "%s is outside %s..%s", l.MaxChunkBytes, minChunkBytesLowerBound, maxChunkBytesUpperBound)
	}
	c.intRange("limits.max_waiting", l.MaxWaiting, 0, MaxWaiting)
}

func validateModel(c *checker, d *structs.Deployment) {
	m := d.Model
	switch {
	case m.Path == "" && m.HF == "":
		c.bad("model", `a model needs path = "<dir>" (under the models root, absolute, or ~/...) or hf = "org/name"`)
	case m.Path != "" && m.HF != "":
		c.bad("model.hf", "path and hf exclude each other; keep one")
	case m.Path != "":
		checkModelPath(c, m.Path)
		if m.Revision != "" && !localRevRe.MatchString(m.Revision) {
			c.bad("model.revision", "%q: a local revision is a label of letters, digits, '.', '_' or '-'", m.Revision)
		}
	default:
		if !hfRe.MatchString(m.HF) {
			c.bad("model.hf", `%q is not a Hugging Face repository ("org/name")`, m.HF)
		}
		if m.Revision != "" && !commitRe.MatchString(m.Revision) {
			c.bad("model.revision", "%q: a Hugging Face revision is a 40-hex-digit commit (lowercase)", m.Revision)
		}
	}
	if fp := m.ContentFingerprint; fp != "measured" && !fingerprintRe.MatchString(fp) {
		c.bad("model.content_fingerprint", `%q is neither "measured" nor "sha256:<64 lowercase hex digits>"`, fp)
	}
}

func checkModelPath(c *checker, p string) {
	switch {
	case strings.ContainsRune(p, 0):
		c.bad("model.path", "the path contains a NUL byte")
	case p == "~" || (strings.HasPrefix(p, "~") && !strings.HasPrefix(p, "~/")):
		c.bad("model.path", "%q: only ~/ (the role's home) is expanded", p)
	case strings.HasPrefix(p, "~/") || filepath.IsAbs(p):
	default:
		if cl := path.Clean(p); cl == ".." || strings.HasPrefix(cl, "../") || cl == "." {
			c.bad("model.path", "%q leaves the models root; use an absolute path for a model elsewhere", p)
		}
	}
}

func validateResources(c *checker, d *structs.Deployment) {
	r := d.Resources
	if r == nil {
		return
	}
	c.size("resources.gpu", r.GPU)
	c.size("resources.ram", r.RAM)
	if len(r.Phases) > 0 && (r.GPU != 0 || r.RAM != 0) {
		c.bad("resources", "declare either gpu/ram (every phase) or startup/ready/parked blocks, not both")
	}
	if len(r.Phases) == 0 && r.GPU == 0 && r.RAM == 0 {
		c.bad("resources", "resources declares nothing; set gpu and ram, or per-phase blocks, or leave it out")
	}
	for _, name := range sortedKeys(r.Phases) {
		if !slices.Contains(Phases, name) {
			c.bad("resources", "phase %q is not one of %s", name, quoteList(Phases))
			continue
		}
		c.size("resources."+name+".gpu", r.Phases[name].GPU)
		c.size("resources."+name+".ram", r.Phases[name].RAM)
	}
	startup, hasStartup := r.Phases["startup"]
	ready, hasReady := r.Phases["ready"]
	parked, hasParked := r.Phases["parked"]
	if hasStartup && hasReady {
		if startup.GPU < ready.GPU {
			c.bad("resources.startup.gpu", "startup (%s) is smaller than ready (%s); a start peaks at least as high as the model serves", startup.GPU, ready.GPU)
		}
		if startup.RAM < ready.RAM {
			c.bad("resources.startup.ram", "startup (%s) is smaller than ready (%s); a start peaks at least as high as the model serves", startup.RAM, ready.RAM)
		}
	}
	if hasParked && hasReady && parked.GPU > ready.GPU {
		c.bad("resources.parked.gpu", "parked (%s) is larger than ready (%s); parking frees card memory", parked.GPU, ready.GPU)
	}
	if d.EngineConfig.Memory.Startup != 0 {
		c.bad("engine_config.memory.startup", "a resources block declares the charges; put the startup peak there (resources { startup { ... } })")
	}
}

func validateLifecycle(c *checker, d *structs.Deployment) {
	l := d.Lifecycle
	c.oneOf("lifecycle.activation", l.Activation, structs.ActivationOnDemand, structs.ActivationExplicit)
	c.optional("lifecycle.ready_idle_timeout", l.ReadyIdleTimeout, false)
	c.optional("lifecycle.parked_idle_timeout", l.ParkedIdleTimeout, false)
	if l.Warm && l.ReadyIdleTimeout > 0 {
		c.bad("lifecycle.ready_idle_timeout", "a warm deployment is never parked or stopped for idleness; drop warm or the timeout")
	}
}

func validateEngineConfig(c *checker, d *structs.Deployment) {
	e := d.EngineConfig
	if e.MaxConcurrentRequests != 0 || c.set("engine_config.max_concurrent_requests") {
		c.intRange("engine_config.max_concurrent_requests", e.MaxConcurrentRequests, 1, MaxConcurrentRequests)
	}
	if e.ContextLength != 0 || c.set("engine_config.context_length") {
		if e.ContextLength < 1 || e.ContextLength > MaxContextLength {
			c.bad("engine_config.context_length", "%d is outside 1..%d", e.ContextLength, MaxContextLength)
		}
	}
	if e.Dtype != "" {
		c.oneOf("engine_config.dtype", e.Dtype, dtypes...)
	}
	if e.Quantization != "" && !tokenRe.MatchString(e.Quantization) {
		c.bad("engine_config.quantization", "%q is not a quantization name", e.Quantization)
	}
	if e.KVCacheDtype != "" && !tokenRe.MatchString(e.KVCacheDtype) {
		c.bad("engine_config.kv_cache_dtype", "%q is not a cache type name", e.KVCacheDtype)
	}
	m := e.Memory
	c.size("engine_config.memory.request", m.Request)
	c.size("engine_config.memory.kv_cache", m.KVCache)
	c.size("engine_config.memory.startup", m.Startup)
	if m.Startup != 0 && m.Request != 0 && m.Startup < m.Request {
		c.bad("engine_config.memory.startup", "startup (%s) is smaller than request (%s)", m.Startup, m.Request)
	}
	if m.KVCache != 0 && m.Request != 0 && m.KVCache > m.Request {
		c.bad("engine_config.memory.kv_cache", "kv_cache (%s) is larger than the whole request (%s)", m.KVCache, m.Request)
	}
	checkExtraArgs(c, e)
	if len(e.Env) > MaxEnvNames {
		c.bad("engine_config.env", "%d variables; at most %d", len(e.Env), MaxEnvNames)
	}
	for _, k := range sortedKeys(e.Env) {
		if !envRe.MatchString(k) {
			c.bad("engine_config.env", "%q is not a variable name", k)
		}
		if len(e.Env[k]) > MaxEnvValueBytes {
			c.bad("engine_config.env", "the value of %s is %d bytes; at most %d", k, len(e.Env[k]), MaxEnvValueBytes)
		}
	}
	families := sortedKeys(e.Family)
	for i, f := range families {
		field := "engine_config." + f
		switch {
		case !slices.Contains(Families, f):
			c.bad("engine_config", "%q is not an engine family (%s)", f, quoteList(Families))
			continue
		case !isObject(e.Family[f]):
			c.bad(field, "the %s block must be an object of settings", f)
		}
		if slices.Contains(Families, d.Engine) && f != d.Engine {
			c.bad(field, "engine %q takes no %s block; use engine_config { %s { ... } }", d.Engine, f, d.Engine)
		} else if i > 0 {
			c.bad(field, "one family block per deployment (found %s)", quoteList(families))
		}
	}
}

func checkExtraArgs(c *checker, e structs.EngineConfig) {
	const field = "engine_config.extra_args"
	if len(e.ExtraArgs) == 0 {
		return
	}
	if !e.AcceptExtraArgs {
		c.bad(field, "extra_args are passed only with accept_extra_args = true (and the host's approval)")
	}
	if len(e.ExtraArgs) > maxExtraArgs {
		c.bad(field, "%d arguments; at most %d", len(e.ExtraArgs), maxExtraArgs)
	}
	for i, a := range e.ExtraArgs {
		switch {
		case a == "" || a == "--":
			c.bad(field, "argument %d is %q", i+1, a)
		case i == 0 && !strings.HasPrefix(a, "--"):
			c.bad(field, "the first argument %q is not a long option (--name)", a)
		case strings.HasPrefix(a, "-") && !strings.HasPrefix(a, "--") && !isNumber(a):
			c.bad(field, "short option %q: use the long form (--name)", a)
		}
	}
}

func isNumber(s string) bool {
	_, err := strconv.ParseFloat(s, 64)
	return err == nil
}

func isObject(raw json.RawMessage) bool {
	t := bytes.TrimSpace(raw)
	if len(t) == 0 || t[0] != '{' {
		return false
	}
	var m map[string]json.RawMessage
	return json.Unmarshal(t, &m) == nil
}

// objectKeys returns the keys of a JSON object, sorted; none when it is not
// one.
func objectKeys(raw json.RawMessage) []string {
	var m map[string]json.RawMessage
	if json.Unmarshal(raw, &m) != nil {
		return nil
	}
	return sortedKeys(m)
}

// conflicts refuses two deployments with one name, or one route served by
// two deployments.
func conflicts(specs []*spec) []Diagnostic {
	var out []Diagnostic
	where := func(s *spec, field string) *hcl.Range {
		if s.block == nil {
			return nil
		}
		return s.pos(field)
	}
	at := func(s *spec) string {
		if s.d.Source != "" {
			return " at " + s.d.Source
		}
		return ""
	}
	names := map[string]*spec{}
	routes := map[string]*spec{}
	for _, s := range specs {
		if prev, ok := names[s.d.Name]; ok {
			out = append(out, diagAt(where(s, "name"), "name", "duplicate deployment",
				fmt.Sprintf("deployment %q is already declared%s", s.d.Name, at(prev))))
			continue
		}
		names[s.d.Name] = s
		for _, r := range s.d.Routes {
			if prev, ok := routes[r]; ok && prev != s {
				out = append(out, diagAt(where(s, "routes"), "routes", "route conflict",
					fmt.Sprintf("route %q is already served by deployment %q%s", r, prev.d.Name, at(prev))))
				continue
			}
			routes[r] = s
		}
	}
	return out
}

// MaxParallel bounds topology.tensor_parallel and pipeline_parallel.
const MaxParallel = 256

// coded adds a diagnostic with a catalogue code of its own.
func (c *checker) coded(code structs.Code, field, format string, args ...any) {
	c.bad(field, format, args...)
	c.diags[len(c.diags)-1].Code = code
}

// group checks a topology (one model across machines) and the member a
// server set for one host.
func (c *checker) group(d *structs.Deployment) {
	if t := d.Topology; t != nil {
		c.intRange("topology.tensor_parallel", t.TensorParallel, 1, MaxParallel)
		c.intRange("topology.pipeline_parallel", t.PipelineParallel, 1, MaxParallel)
		n := 0
		if d.Placement != nil {
			n = len(d.Placement.Hosts)
		}
		switch {
		case n < 2:
			c.coded(structs.CodeGroupPlacementRequired, "placement.hosts",
				"a topology runs one engine rank per machine: placement.hosts must name at least two hosts (capyctl list hosts)")
		case t.TensorParallel >= 1 && t.PipelineParallel >= 1 && t.World()%n != 0:
			c.coded(structs.CodeGroupTopologyInvalid, "topology",
				"tensor_parallel %d × pipeline_parallel %d = %d ranks do not divide over %d hosts: name a number of hosts that divides %d",
				t.TensorParallel, t.PipelineParallel, t.World(), n, t.World())
		}
		if d.Instances > 1 {
			c.coded(structs.CodeGroupInstancesUnsupported, "instances",
				"a group runs one instance across its hosts: leave instances unset or 1")
		}
	}
	g := d.Group
	if g == nil {
		return
	}
	switch {
	case d.Topology == nil:
		c.bad("group", "a group member needs the deployment's topology")
	case g.Size < 2 || g.Rank < 0 || g.Rank >= g.Size:
		c.bad("group", "rank %d of %d: want a size of at least 2 and a rank below it", g.Rank, g.Size)
	case len(g.Hosts) != g.Size:
		c.bad("group.hosts", "%d hosts for a group of %d", len(g.Hosts), g.Size)
	case g.Rank > 0 && (g.HeadAddress == "" || g.RendezvousPort <= 0 || g.RendezvousPort > 65535):
		c.bad("group", "a worker needs the head's address and rendezvous port")
	}
}
