// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package jobspec

import (
	"encoding/json"
	"fmt"
	"math/big"
	"sort"
	"strings"

	"github.com/capyctl/capyctl/core/structs"
	"github.com/hashicorp/hcl/v2"
	"github.com/zclconf/go-cty/cty"
	"github.com/zclconf/go-cty/cty/convert"
	ctyjson "github.com/zclconf/go-cty/cty/json"
)

// spec is one deployment on its way through decoding, completion and
// validation, with the position of every field the operator set.
type spec struct {
	d     *structs.Deployment
	set   fieldSet
	block *hcl.Range
}

// fieldSet maps a field path the operator set to the range of its value.
type fieldSet map[string]hcl.Range

func (f fieldSet) has(path string) bool {
	_, ok := f[path]
	return ok
}

// pos returns the range of a field, else of its nearest enclosing block
// the operator wrote, else of the deployment block; nil when the spec did
// not come from a file.
func (s *spec) pos(path string) *hcl.Range {
	for p := path; p != ""; {
		if r, ok := s.set[p]; ok {
			return &r
		}
		i := strings.LastIndexByte(p, '.')
		if i < 0 {
			break
		}
		p = p[:i]
	}
	return s.block
}

// Families are the engine_config.<family> blocks.
var Families = []string{structs.FamilyVLLM, structs.FamilySGLang, structs.FamilyLlamaCpp, structs.FamilyTensorFold, structs.FamilyCustom}

// Phases are the per-phase blocks of resources.
var Phases = []string{"startup", "ready", "parked"}

var (
	fileSchema = &hcl.BodySchema{
		Blocks: []hcl.BlockHeaderSchema{{Type: "deployment", LabelNames: []string{"name"}}},
	}
	deploymentSchema = &hcl.BodySchema{
		Attributes: attrs("engine", "api", "routes", "residency", "lmcache", "lmcache_pool", "instances", "request_deadline"),
		Blocks:     blocks("model", "resources", "lifecycle", "timeouts", "limits", "engine_config", "placement", "topology"),
	}
	placementSchema = &hcl.BodySchema{Attributes: attrs("hosts")}
	topologySchema  = &hcl.BodySchema{Attributes: attrs("tensor_parallel", "pipeline_parallel")}
	modelSchema     = &hcl.BodySchema{Attributes: attrs("path", "hf", "revision", "content_fingerprint")}
	resourcesSchema = &hcl.BodySchema{Attributes: attrs("gpu", "ram"), Blocks: blocks(Phases...)}
	phaseSchema     = &hcl.BodySchema{Attributes: attrs("gpu", "ram")}
	lifecycleSchema = &hcl.BodySchema{Attributes: attrs("warm", "activation", "ready_idle_timeout", "parked_idle_timeout")}
	timeoutsSchema  = &hcl.BodySchema{Attributes: attrs("initialize", "wake", "stop")}
	limitsSchema    = &hcl.BodySchema{Attributes: attrs("stream_idle", "client_read_idle", "max_chunk_bytes", "max_waiting")}
	engineSchema    = &hcl.BodySchema{
		Attributes: attrs("max_concurrent_requests", "context_length", "dtype", "quantization", "kv_cache_dtype",
			"cuda_graphs", "trust_remote_code", "accept_extra_args", "extra_args", "env"),
		Blocks: blocks(append([]string{"memory"}, Families...)...),
	}
	memorySchema = &hcl.BodySchema{Attributes: attrs("request", "kv_cache", "startup")}
)

func attrs(names ...string) []hcl.AttributeSchema {
	out := make([]hcl.AttributeSchema, len(names))
	for i, n := range names {
		out[i] = hcl.AttributeSchema{Name: n}
	}
	return out
}

func blocks(names ...string) []hcl.BlockHeaderSchema {
	out := make([]hcl.BlockHeaderSchema, len(names))
	for i, n := range names {
		out[i] = hcl.BlockHeaderSchema{Type: n}
	}
	return out
}

// decoder reads attribute values into Go fields, collecting diagnostics
// and the position of every field set.
type decoder struct {
	diags hcl.Diagnostics
	set   fieldSet
}

func decodeFile(body hcl.Body) ([]*spec, hcl.Diagnostics) {
	content, diags := body.Content(fileSchema)
	if diags.HasErrors() {
		return nil, diags
	}
	if len(content.Blocks) == 0 {
		r := body.MissingItemRange()
		return nil, hcl.Diagnostics{{
			Severity: hcl.DiagError,
			Summary:  "no deployment",
			Detail:   `a job spec declares at least one deployment "<name>" { ... } block`,
			Subject:  &r,
		}}
	}
	var specs []*spec
	for _, b := range content.Blocks {
		s, d := decodeDeployment(b)
		diags = append(diags, d...)
		specs = append(specs, s)
	}
	return specs, diags
}

func decodeDeployment(b *hcl.Block) (*spec, hcl.Diagnostics) {
	d := &structs.Deployment{Name: b.Labels[0]}
	block := b.DefRange
	d.Source = fmt.Sprintf("%s:%d", block.Filename, block.Start.Line)
	dc := &decoder{set: fieldSet{"name": b.LabelRanges[0]}}
	content, diags := b.Body.Content(deploymentSchema)
	dc.diags = diags
	a := content.Attributes
	dc.str(a, "engine", "engine", &d.Engine)
	dc.str(a, "api", "api", &d.API)
	dc.strList(a, "routes", "routes", &d.Routes)
	dc.str(a, "residency", "residency", &d.Residency)
	dc.str(a, "lmcache", "lmcache", &d.LMCache)
	dc.size(a, "lmcache_pool", "lmcache_pool", &d.LMCachePool)
	dc.integer(a, "instances", "instances", &d.Instances)
	dc.duration(a, "request_deadline", "request_deadline", &d.RequestDeadline)

	for typ, list := range dc.byType(content.Blocks) {
		blk := list[0]
		dc.set[typ] = blk.DefRange
		switch typ {
		case "model":
			dc.decodeModel(blk.Body, &d.Model)
		case "resources":
			d.Resources = &structs.ResourceSpec{}
			dc.decodeResources(blk.Body, d.Resources)
		case "lifecycle":
			dc.decodeLifecycle(blk.Body, &d.Lifecycle)
		case "timeouts":
			c := dc.content(blk.Body, timeoutsSchema)
			dc.duration(c, "initialize", "timeouts.initialize", &d.Timeouts.Initialize)
			dc.duration(c, "wake", "timeouts.wake", &d.Timeouts.Wake)
			dc.duration(c, "stop", "timeouts.stop", &d.Timeouts.Stop)
		case "limits":
			c := dc.content(blk.Body, limitsSchema)
			dc.duration(c, "stream_idle", "limits.stream_idle", &d.Limits.StreamIdle)
			dc.duration(c, "client_read_idle", "limits.client_read_idle", &d.Limits.ClientReadIdle)
			dc.size(c, "max_chunk_bytes", "limits.max_chunk_bytes", &d.Limits.MaxChunkBytes)
			dc.integer(c, "max_waiting", "limits.max_waiting", &d.Limits.MaxWaiting)
		case "engine_config":
			dc.decodeEngineConfig(blk.Body, &d.EngineConfig)
		case "placement":
			c := dc.content(blk.Body, placementSchema)
			d.Placement = &structs.PlacementSpec{}
			dc.strList(c, "hosts", "placement.hosts", &d.Placement.Hosts)
		case "topology":
			c := dc.content(blk.Body, topologySchema)
			d.Topology = &structs.TopologySpec{TensorParallel: 1, PipelineParallel: 1}
			dc.integer(c, "tensor_parallel", "topology.tensor_parallel", &d.Topology.TensorParallel)
			dc.integer(c, "pipeline_parallel", "topology.pipeline_parallel", &d.Topology.PipelineParallel)
		}
	}
	return &spec{d: d, set: dc.set, block: &block}, dc.diags
}

// byType groups blocks by type, refusing repeats.
func (dc *decoder) byType(bs hcl.Blocks) map[string]hcl.Blocks {
	out := map[string]hcl.Blocks{}
	for _, b := range bs {
		if prev, ok := out[b.Type]; ok {
			r := b.DefRange
			dc.diags = append(dc.diags, &hcl.Diagnostic{
				Severity: hcl.DiagError,
				Summary:  fmt.Sprintf("duplicate %s block", b.Type),
				Detail: fmt.Sprintf("a %s block is already declared at %s:%d; merge them",
					b.Type, prev[0].DefRange.Filename, prev[0].DefRange.Start.Line),
				Subject: &r,
			})
			continue
		}
		out[b.Type] = hcl.Blocks{b}
	}
	return out
}

func (dc *decoder) content(body hcl.Body, schema *hcl.BodySchema) hcl.Attributes {
	c, diags := body.Content(schema)
	dc.diags = append(dc.diags, diags...)
	return c.Attributes
}

func (dc *decoder) decodeModel(body hcl.Body, m *structs.ModelSpec) {
	c := dc.content(body, modelSchema)
	dc.str(c, "path", "model.path", &m.Path)
	dc.str(c, "hf", "model.hf", &m.HF)
	dc.str(c, "revision", "model.revision", &m.Revision)
	dc.str(c, "content_fingerprint", "model.content_fingerprint", &m.ContentFingerprint)
}

func (dc *decoder) decodeResources(body hcl.Body, r *structs.ResourceSpec) {
	c, diags := body.Content(resourcesSchema)
	dc.diags = append(dc.diags, diags...)
	dc.size(c.Attributes, "gpu", "resources.gpu", &r.GPU)
	dc.size(c.Attributes, "ram", "resources.ram", &r.RAM)
	for phase, list := range dc.byType(c.Blocks) {
		blk := list[0]
		dc.set["resources."+phase] = blk.DefRange
		var pc structs.PhaseCharge
		a := dc.content(blk.Body, phaseSchema)
		dc.size(a, "gpu", "resources."+phase+".gpu", &pc.GPU)
		dc.size(a, "ram", "resources."+phase+".ram", &pc.RAM)
		if r.Phases == nil {
			r.Phases = map[string]structs.PhaseCharge{}
		}
		r.Phases[phase] = pc
	}
}

func (dc *decoder) decodeLifecycle(body hcl.Body, l *structs.LifecycleSpec) {
	c := dc.content(body, lifecycleSchema)
	dc.boolean(c, "warm", "lifecycle.warm", &l.Warm)
	dc.str(c, "activation", "lifecycle.activation", &l.Activation)
	dc.duration(c, "ready_idle_timeout", "lifecycle.ready_idle_timeout", &l.ReadyIdleTimeout)
	dc.duration(c, "parked_idle_timeout", "lifecycle.parked_idle_timeout", &l.ParkedIdleTimeout)
}

func (dc *decoder) decodeEngineConfig(body hcl.Body, e *structs.EngineConfig) {
	c, diags := body.Content(engineSchema)
	dc.diags = append(dc.diags, diags...)
	a := c.Attributes
	dc.integer(a, "max_concurrent_requests", "engine_config.max_concurrent_requests", &e.MaxConcurrentRequests)
	var ctx int
	if dc.integer(a, "context_length", "engine_config.context_length", &ctx) {
		e.ContextLength = int64(ctx)
	}
	dc.str(a, "dtype", "engine_config.dtype", &e.Dtype)
	dc.str(a, "quantization", "engine_config.quantization", &e.Quantization)
	dc.str(a, "kv_cache_dtype", "engine_config.kv_cache_dtype", &e.KVCacheDtype)
	var graphs bool
	if dc.boolean(a, "cuda_graphs", "engine_config.cuda_graphs", &graphs) {
		e.CUDAGraphs = &graphs
	}
	dc.boolean(a, "trust_remote_code", "engine_config.trust_remote_code", &e.TrustRemoteCode)
	dc.boolean(a, "accept_extra_args", "engine_config.accept_extra_args", &e.AcceptExtraArgs)
	dc.strList(a, "extra_args", "engine_config.extra_args", &e.ExtraArgs)
	dc.strMap(a, "env", "engine_config.env", &e.Env)
	for typ, list := range dc.byType(c.Blocks) {
		blk := list[0]
		dc.set["engine_config."+typ] = blk.DefRange
		if typ == "memory" {
			m := dc.content(blk.Body, memorySchema)
			dc.size(m, "request", "engine_config.memory.request", &e.Memory.Request)
			dc.size(m, "kv_cache", "engine_config.memory.kv_cache", &e.Memory.KVCache)
			dc.size(m, "startup", "engine_config.memory.startup", &e.Memory.Startup)
			continue
		}
		raw, ok := dc.family(blk, "engine_config."+typ)
		if !ok {
			continue
		}
		if e.Family == nil {
			e.Family = map[string]json.RawMessage{}
		}
		e.Family[typ] = raw
	}
}

// family reads an engine_config.<family> block generically: attributes of
// any name and type, as a JSON object, for the family's driver to check.
func (dc *decoder) family(blk *hcl.Block, path string) (json.RawMessage, bool) {
	attrs, diags := blk.Body.JustAttributes()
	dc.diags = append(dc.diags, diags...)
	if diags.HasErrors() {
		return nil, false
	}
	obj := map[string]json.RawMessage{}
	for name, attr := range attrs {
		v, ok := dc.value(attr, path+"."+name)
		if !ok || v.IsNull() {
			continue
		}
		data, err := ctyjson.Marshal(v, v.Type())
		if err != nil {
			dc.errorAt(attr.Expr.Range(), "invalid "+path+"."+name, err.Error())
			continue
		}
		obj[name] = data
	}
	data, err := json.Marshal(obj)
	if err != nil {
		dc.errorAt(blk.DefRange, "invalid "+path, err.Error())
		return nil, false
	}
	return data, true
}

func (dc *decoder) errorAt(r hcl.Range, summary, detail string) {
	dc.diags = append(dc.diags, &hcl.Diagnostic{Severity: hcl.DiagError, Summary: summary, Detail: detail, Subject: &r})
}

// value evaluates an attribute (no variables, no functions) and records
// the field as set unless it is null. ok is false on a diagnostic.
func (dc *decoder) value(attr *hcl.Attribute, path string) (cty.Value, bool) {
	v, diags := attr.Expr.Value(nil)
	dc.diags = append(dc.diags, diags...)
	if diags.HasErrors() {
		return cty.NilVal, false
	}
	if !v.IsWhollyKnown() {
		dc.errorAt(attr.Expr.Range(), "invalid "+path, "the value must be a constant")
		return cty.NilVal, false
	}
	if !v.IsNull() {
		dc.set[path] = attr.Expr.Range()
	}
	return v, true
}

// conv converts an attribute to typ; ok is false when it is absent, null
// or does not convert.
func (dc *decoder) conv(a hcl.Attributes, name, path string, typ cty.Type, what string) (cty.Value, *hcl.Attribute, bool) {
	attr, ok := a[name]
	if !ok {
		return cty.NilVal, nil, false
	}
	v, ok := dc.value(attr, path)
	if !ok || v.IsNull() {
		return cty.NilVal, attr, false
	}
	out, err := convert.Convert(v, typ)
	if err != nil {
		dc.errorAt(attr.Expr.Range(), "invalid "+path, what+" required")
		delete(dc.set, path)
		return cty.NilVal, attr, false
	}
	if !out.IsWhollyKnown() || (typ.IsCollectionType() && hasNullElement(out)) {
		dc.errorAt(attr.Expr.Range(), "invalid "+path, what+" required; null elements are not allowed")
		delete(dc.set, path)
		return cty.NilVal, attr, false
	}
	return out, attr, true
}

func hasNullElement(v cty.Value) bool {
	for it := v.ElementIterator(); it.Next(); {
		_, e := it.Element()
		if e.IsNull() {
			return true
		}
	}
	return false
}

func (dc *decoder) str(a hcl.Attributes, name, path string, dst *string) bool {
	v, _, ok := dc.conv(a, name, path, cty.String, "a string")
	if ok {
		*dst = v.AsString()
	}
	return ok
}

func (dc *decoder) boolean(a hcl.Attributes, name, path string, dst *bool) bool {
	v, _, ok := dc.conv(a, name, path, cty.Bool, "true or false")
	if ok {
		*dst = v.True()
	}
	return ok
}

func (dc *decoder) integer(a hcl.Attributes, name, path string, dst *int) bool {
	v, attr, ok := dc.conv(a, name, path, cty.Number, "a whole number")
	if !ok {
		return false
	}
	bf := v.AsBigFloat()
	if !bf.IsInt() {
		dc.errorAt(attr.Expr.Range(), "invalid "+path, fmt.Sprintf("%s is not a whole number", bf.Text('g', -1)))
		delete(dc.set, path)
		return false
	}
	n, acc := bf.Int64()
	if acc != big.Exact || n > 1<<40 || n < -(1<<40) {
		dc.errorAt(attr.Expr.Range(), "invalid "+path, fmt.Sprintf("%s is out of range", bf.Text('g', -1)))
		delete(dc.set, path)
		return false
	}
	*dst = int(n)
	return true
}

func (dc *decoder) size(a hcl.Attributes, name, path string, dst *structs.ByteSize) bool {
	var s string
	if !dc.str(a, name, path, &s) {
		return false
	}
	v, err := structs.ParseByteSize(s)
	if err != nil {
		dc.errorAt(a[name].Expr.Range(), "invalid "+path, err.Error())
		delete(dc.set, path)
		return false
	}
	*dst = v
	return true
}

func (dc *decoder) duration(a hcl.Attributes, name, path string, dst *structs.Duration) bool {
	var s string
	if !dc.str(a, name, path, &s) {
		return false
	}
	v, err := structs.ParseDuration(s)
	if err != nil {
		dc.errorAt(a[name].Expr.Range(), "invalid "+path, err.Error())
		delete(dc.set, path)
		return false
	}
	*dst = v
	return true
}

func (dc *decoder) strList(a hcl.Attributes, name, path string, dst *[]string) bool {
	v, _, ok := dc.conv(a, name, path, cty.List(cty.String), "a list of strings")
	if !ok {
		return false
	}
	out := []string{}
	for it := v.ElementIterator(); it.Next(); {
		_, e := it.Element()
		out = append(out, e.AsString())
	}
	*dst = out
	return true
}

func (dc *decoder) strMap(a hcl.Attributes, name, path string, dst *map[string]string) bool {
	v, _, ok := dc.conv(a, name, path, cty.Map(cty.String), "a map of strings")
	if !ok {
		return false
	}
	out := map[string]string{}
	for it := v.ElementIterator(); it.Next(); {
		k, e := it.Element()
		out[k.AsString()] = e.AsString()
	}
	*dst = out
	return true
}

// sortedKeys returns a map's keys in order.
func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
