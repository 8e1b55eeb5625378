// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package llamacpp

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"

	"github.com/capyctl/capyctl/sdk/enginekit"
	"github.com/capyctl/capyctl/sdk/formats"
)

// Defaults of a llama.cpp deployment.
const (
	// DefaultSlots is llama-server's -np when max_concurrent_requests is
	// unset.
	DefaultSlots = 4
	// ContextPad rounds a slot's context up (llama.cpp pads n_ctx to 256).
	ContextPad = 256
	// HostOverheadBytes is llama-server's own host memory (HTTP threads,
	// tokenizer, staging buffers) until a start measures it.
	HostOverheadBytes = 256 << 20
	// DefaultKVType is the KV cache element type when kv_cache_dtype is
	// unset.
	DefaultKVType = "f16"
)

// KVTypes are the KV cache types llama-server takes (-ctk/-ctv).
var KVTypes = []string{"f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1"}

// splitRE matches the first part of a split GGUF ("x-00001-of-00003.gguf").
var splitRE = regexp.MustCompile(`^(.*)-00001-of-([0-9]{5})\.gguf$`)

// Sizing is the memory a llama-server launch holds, derived from the GGUF
// header: the weights, and a KV cache holding a full window for every
// slot.
type Sizing struct {
	// File is the GGUF file llama-server loads (the first part of a split
	// model); Parts are every file read.
	File  string
	Parts []string
	// Architecture, TrainContext and Layers come from the header.
	Architecture string
	TrainContext int64
	Layers       int64
	// Context is one slot's window (context_length, or the trained window,
	// padded to 256); Slots is -np; CtxSize is -c = Context × Slots.
	Context int64
	Slots   int
	CtxSize int64
	// GPULayers is how many layers are offloaded (Layers for "all").
	GPULayers int64
	// KVType is the KV cache type (-ctk and -ctv).
	KVType string
	// WeightsBytes is every tensor; DeviceWeights those offloaded,
	// HostWeights the rest.
	WeightsBytes, DeviceWeights, HostWeights int64
	// KVBytesPerToken is K and V of every layer for one token of context.
	KVBytesPerToken int64
	// KVCacheBytes is CtxSize × KVBytesPerToken; DeviceKV the offloaded
	// layers' share.
	KVCacheBytes, DeviceKV int64
	// MMProjBytes is the multimodal projector file, when one is named.
	MMProjBytes int64
}

// ReadyDeviceBytes is what the card holds once the model is loaded.
func (s *Sizing) ReadyDeviceBytes() int64 { return s.DeviceWeights + s.DeviceKV + s.MMProjBytes }

// ReadyHostBytes is what host RAM holds: llama-server's own overhead and
// the layers (and their KV) left on the CPU.
func (s *Sizing) ReadyHostBytes() int64 {
	return HostOverheadBytes + s.HostWeights + (s.KVCacheBytes - s.DeviceKV)
}

// SizeInput is what sizing needs from the deployment.
type SizeInput struct {
	// Dir is the model directory; File the GGUF file in it ("" when the
	// directory holds exactly one model file).
	Dir, File string
	// Context is context_length (0: the trained window).
	Context int64
	// Slots is max_concurrent_requests (0: DefaultSlots).
	Slots int
	// KVType is kv_cache_dtype ("": f16).
	KVType string
	// GPULayers is n_gpu_layers (-1: all).
	GPULayers int64
	// MMProj is mmproj_file, "" for none.
	MMProj string
}

// Size reads the GGUF header and derives the launch's memory.
func Size(in SizeInput) (*Sizing, error) {
	file, err := chooseGGUF(in.Dir, in.File)
	if err != nil {
		return nil, err
	}
	s := &Sizing{File: file, Slots: in.Slots, KVType: strings.ToLower(in.KVType)}
	if s.Slots <= 0 {
		s.Slots = DefaultSlots
	}
	if s.KVType == "" {
		s.KVType = DefaultKVType
	}
	kvType, ok := formats.GGMLTypeByName(s.KVType)
	if !ok || !contains(KVTypes, s.KVType) {
		return nil, fmt.Errorf("kv_cache_dtype %q is not a llama.cpp cache type (%s)", in.KVType, strings.Join(KVTypes, ", "))
	}
	g, err := formats.ReadGGUFFile(file)
	if err != nil {
		return nil, err
	}
	s.Parts = []string{file}
	s.Architecture = g.Architecture()
	s.TrainContext = int64(g.ContextLength())
	s.Layers = int64(g.BlockCount())
	if s.Architecture == "" || s.Layers == 0 {
		return nil, fmt.Errorf("%s names no architecture or layer count", filepath.Base(file))
	}
	tensors := append([]formats.GGUFTensorInfo(nil), g.Tensors...)
	if m := splitRE.FindStringSubmatch(filepath.Base(file)); m != nil {
		n := atoi(m[2])
		for i := 2; i <= n; i++ {
			part := filepath.Join(filepath.Dir(file), fmt.Sprintf("%s-%05d-of-%s.gguf", m[1], i, m[2]))
			pg, err := formats.ReadGGUFFile(part)
			if err != nil {
				return nil, fmt.Errorf("split part %d of %d: %w", i, n, err)
			}
			s.Parts = append(s.Parts, part)
			tensors = append(tensors, pg.Tensors...)
		}
	}
	perToken, ok := g.KVBytesPerToken(kvType)
	if !ok {
		return nil, fmt.Errorf("%s: the header lacks the attention figures the KV cache is sized from, or a %s row does not hold them", filepath.Base(file), s.KVType)
	}
	s.KVBytesPerToken = int64(perToken)

	s.Context = in.Context
	if s.Context <= 0 {
		s.Context = s.TrainContext
	}
	if s.Context <= 0 {
		return nil, fmt.Errorf("%s states no context length: set engine_config.context_length", filepath.Base(file))
	}
	s.Context = (s.Context + ContextPad - 1) / ContextPad * ContextPad
	s.CtxSize = s.Context * int64(s.Slots)
	s.KVCacheBytes = s.CtxSize * s.KVBytesPerToken

	s.GPULayers = in.GPULayers
	if s.GPULayers < 0 || s.GPULayers > s.Layers {
		s.GPULayers = s.Layers
	}
	// llama.cpp offloads the last GPULayers layers; the output layer goes
	// with them when all are offloaded. A full offload counts every tensor
	// on the card.
	for _, t := range tensors {
		b := int64(t.Bytes)
		s.WeightsBytes += b
		layer, isLayer := layerOf(t.Name)
		switch {
		case s.GPULayers == s.Layers:
			s.DeviceWeights += b
		case isLayer && layer >= s.Layers-s.GPULayers:
			s.DeviceWeights += b
		default:
			s.HostWeights += b
		}
	}
	s.DeviceKV = s.KVCacheBytes * s.GPULayers / s.Layers
	if in.MMProj != "" {
		p, err := inside(in.Dir, in.MMProj)
		if err != nil {
			return nil, fmt.Errorf("mmproj_file: %w", err)
		}
		st, err := os.Stat(p)
		if err != nil {
			return nil, fmt.Errorf("mmproj_file: %v", err)
		}
		s.MMProjBytes = st.Size()
	}
	return s, nil
}

// layerOf reads the layer of "blk.<n>.<...>".
func layerOf(name string) (int64, bool) {
	rest, ok := strings.CutPrefix(name, "blk.")
	if !ok {
		return 0, false
	}
	num, _, ok := strings.Cut(rest, ".")
	if !ok || num == "" {
		return 0, false
	}
	n := int64(0)
	for _, c := range num {
		if c < '0' || c > '9' {
			return 0, false
		}
		n = n*10 + int64(c-'0')
	}
	return n, true
}

// chooseGGUF finds the file to load: the one named (inside the directory),
// else the directory's only model file (projectors and later split parts
// set aside).
func chooseGGUF(dir, name string) (string, error) {
	if dir == "" {
		return "", fmt.Errorf("no model directory")
	}
	if name != "" {
		p, err := inside(dir, name)
		if err != nil {
			return "", fmt.Errorf("gguf_file: %w", err)
		}
		if _, err := os.Stat(p); err != nil {
			return "", fmt.Errorf("gguf_file %s: %v", name, enginekit.UnwrapPathErr(err))
		}
		return p, nil
	}
	matches, err := filepath.Glob(filepath.Join(dir, "*.gguf"))
	if err != nil {
		return "", err
	}
	var cands []string
	for _, m := range matches {
		b := strings.ToLower(filepath.Base(m))
		if strings.Contains(b, "mmproj") {
			continue
		}
		if strings.Contains(b, "-of-") && !strings.Contains(b, "-00001-of-") {
			continue
		}
		cands = append(cands, m)
	}
	sort.Strings(cands)
	switch len(cands) {
	case 1:
		return cands[0], nil
	case 0:
		return "", fmt.Errorf("%s holds no .gguf file", dir)
	}
	names := make([]string, len(cands))
	for i, c := range cands {
		names[i] = filepath.Base(c)
	}
	return "", fmt.Errorf("%s holds several models (%s): name one with engine_config.llamacpp.gguf_file", dir, strings.Join(names, ", "))
}

// inside joins a relative file name to dir, refusing one that leaves it.
func inside(dir, name string) (string, error) {
	if filepath.IsAbs(name) {
		return "", fmt.Errorf("%q must be a file name inside the model directory", name)
	}
	clean := filepath.Clean(name)
	if clean == "." || clean == ".." || strings.HasPrefix(clean, "../") {
		return "", fmt.Errorf("%q leaves the model directory", name)
	}
	return filepath.Join(dir, clean), nil
}

func atoi(s string) int {
	n := 0
	for _, c := range s {
		n = n*10 + int(c-'0')
	}
	return n
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}
