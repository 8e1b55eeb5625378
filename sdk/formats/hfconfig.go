// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package formats

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// HFConfigFile is the name of a Hugging Face checkpoint's configuration.
const HFConfigFile = "config.json"

// hfMaxConfigBytes bounds what ReadHFConfig reads.
const hfMaxConfigBytes = 16 << 20

// HFConfig is what CapyCTL reads from a Hugging Face config.json: the
// family, the attention geometry that sizes the KV cache, and the dtype.
// Multimodal checkpoints keep the language model's figures in
// "text_config" (or "llm_config"); ParseHFConfig reads them from there.
type HFConfig struct {
	// ModelType is "model_type", lower case ("qwen3", "llama").
	ModelType string
	// Architectures are the model classes ("Qwen3ForCausalLM").
	Architectures []string
	// NumLayers is num_hidden_layers (n_layer, num_layers).
	NumLayers int
	// NumAttentionHeads is num_attention_heads (n_head).
	NumAttentionHeads int
	// NumKVHeads is the first of n_head_kv, num_kv_heads,
	// num_key_value_heads, multi_query_group_num; 1 for multi_query;
	// else NumAttentionHeads.
	NumKVHeads int
	// HeadDim is head_dim when present and not null, else
	// hidden_size_per_head, else HiddenSize / NumAttentionHeads.
	HeadDim int
	// HiddenSize is hidden_size (n_embd, d_model).
	HiddenSize int
	// Dtype is torch_dtype (or dtype), "" when absent.
	Dtype string
	// MaxPositionEmbeddings is the model's maximum context, 0 when absent.
	MaxPositionEmbeddings int64
	// SlidingWindow is the sliding-window size, 0 when none.
	SlidingWindow int64
	// KVLoraRank and QKRopeHeadDim are set for multi-head latent attention
	// (DeepSeek-V2/V3), which caches one latent per layer.
	KVLoraRank    int
	QKRopeHeadDim int
}

// ReadHFConfig reads dir/config.json.
func ReadHFConfig(dir string) (*HFConfig, error) {
	p := filepath.Join(dir, HFConfigFile)
	f, err := os.Open(p)
	if err != nil {
		return nil, fmt.Errorf("read hf config: %w", err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("read hf config: %w", err)
	}
	if st.Size() > hfMaxConfigBytes {
		return nil, fmt.Errorf("read hf config %s: %d bytes is too large", p, st.Size())
	}
	data := make([]byte, st.Size())
	if _, err := f.ReadAt(data, 0); err != nil && st.Size() > 0 {
		return nil, fmt.Errorf("read hf config %s: %w", p, err)
	}
	c, err := ParseHFConfig(data)
	if err != nil {
		return nil, fmt.Errorf("read hf config %s: %w", p, err)
	}
	return c, nil
}

// ParseHFConfig parses a config.json document.
func ParseHFConfig(data []byte) (*HFConfig, error) {
	var top map[string]json.RawMessage
	if err := json.Unmarshal(data, &top); err != nil {
		return nil, fmt.Errorf("parse hf config: %w", err)
	}
	c := &HFConfig{}
	c.ModelType = strings.ToLower(hfString(top, "model_type"))
	_ = json.Unmarshal(top["architectures"], &c.Architectures)
	c.Dtype = hfString(top, "torch_dtype", "dtype")
	// The language model of a multimodal checkpoint.
	attn := top
	for _, key := range []string{"text_config", "llm_config", "language_config"} {
		var sub map[string]json.RawMessage
		if json.Unmarshal(top[key], &sub) == nil && len(sub) > 0 {
			if _, ok := hfInt(sub, "num_hidden_layers", "n_layer", "num_layers"); ok {
				attn = sub
				if c.Dtype == "" {
					c.Dtype = hfString(sub, "torch_dtype", "dtype")
				}
				break
			}
		}
	}
	c.NumLayers, _ = hfInt(attn, "num_hidden_layers", "n_layer", "num_layers")
	c.NumAttentionHeads, _ = hfInt(attn, "num_attention_heads", "n_head")
	c.HiddenSize, _ = hfInt(attn, "hidden_size", "n_embd", "d_model")
	if kv, ok := hfInt(attn, "n_head_kv", "num_kv_heads", "num_key_value_heads", "multi_query_group_num"); ok && kv > 0 {
		c.NumKVHeads = kv
	} else if mq, ok := hfBool(attn, "multi_query"); ok && mq {
		c.NumKVHeads = 1
	} else {
		c.NumKVHeads = c.NumAttentionHeads
	}
	if hd, ok := hfInt(attn, "head_dim", "hidden_size_per_head"); ok && hd > 0 {
		c.HeadDim = hd
	} else if c.NumAttentionHeads > 0 {
		c.HeadDim = c.HiddenSize / c.NumAttentionHeads
	}
	if n, ok := hfInt(attn, "max_position_embeddings", "n_positions", "seq_length"); ok {
		c.MaxPositionEmbeddings = int64(n)
	}
	if n, ok := hfInt(attn, "sliding_window"); ok {
		c.SlidingWindow = int64(n)
	}
	c.KVLoraRank, _ = hfInt(attn, "kv_lora_rank")
	c.QKRopeHeadDim, _ = hfInt(attn, "qk_rope_head_dim")
	if c.NumLayers <= 0 {
		return c, errors.New("parse hf config: no num_hidden_layers")
	}
	return c, nil
}

// HFDtypeBytes is the element size of a dtype name as config.json and the
// engines' --dtype and --kv-cache-dtype spell them; 0 when unknown.
func HFDtypeBytes(dtype string) int {
	switch strings.ToLower(strings.TrimPrefix(strings.ToLower(dtype), "torch.")) {
	case "bfloat16", "bf16", "float16", "fp16", "half":
		return 2
	case "float32", "fp32", "float":
		return 4
	case "fp8", "fp8_e4m3", "fp8_e5m2", "fp8_inc", "float8_e4m3fn", "float8_e5m2", "int8", "uint8":
		return 1
	}
	return 0
}

// KVBytesPerToken is the KV cache one token takes on one card: 2 (K and V)
// × layers × KV heads per card × head dim × element size; for multi-head
// latent attention, layers × (kv_lora_rank + qk_rope_head_dim) × element
// size. tensorParallel (≥ 1) divides the KV heads (at least one per card);
// kvCacheDtype overrides the element size ("fp8": 1 byte; "" or "auto": the
// model's dtype, bfloat16 when unknown). It returns 0 when the geometry is
// unknown.
func (c *HFConfig) KVBytesPerToken(tensorParallel int, kvCacheDtype string) int64 {
	if c == nil || c.NumLayers <= 0 {
		return 0
	}
	if tensorParallel < 1 {
		tensorParallel = 1
	}
	elem := 0
	if kvCacheDtype != "" && kvCacheDtype != "auto" {
		elem = HFDtypeBytes(kvCacheDtype)
	}
	if elem == 0 {
		elem = HFDtypeBytes(c.Dtype)
	}
	if elem == 0 {
		elem = 2
	}
	if c.KVLoraRank > 0 {
		return int64(c.NumLayers) * int64(c.KVLoraRank+c.QKRopeHeadDim) * int64(elem)
	}
	if c.NumKVHeads <= 0 || c.HeadDim <= 0 {
		return 0
	}
	heads := max(1, c.NumKVHeads/tensorParallel)
	return 2 * int64(c.NumLayers) * int64(heads) * int64(c.HeadDim) * int64(elem)
}

// HFChatTemplate returns the checkpoint's chat template: chat_template.jinja
// when present, else tokenizer_config.json's "chat_template" (a string, or
// the "default" entry of a list of named templates). It returns "" when the
// checkpoint has none.
func HFChatTemplate(dir string) (string, error) {
	if b, err := os.ReadFile(filepath.Join(dir, "chat_template.jinja")); err == nil {
		return string(b), nil
	} else if !errors.Is(err, os.ErrNotExist) {
		return "", fmt.Errorf("read chat template: %w", err)
	}
	b, err := os.ReadFile(filepath.Join(dir, "tokenizer_config.json"))
	if errors.Is(err, os.ErrNotExist) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("read chat template: %w", err)
	}
	var tc struct {
		ChatTemplate json.RawMessage `json:"chat_template"`
	}
	if err := json.Unmarshal(b, &tc); err != nil {
		return "", fmt.Errorf("read chat template: tokenizer_config.json: %w", err)
	}
	var s string
	if json.Unmarshal(tc.ChatTemplate, &s) == nil {
		return s, nil
	}
	var named []struct {
		Name     string `json:"name"`
		Template string `json:"template"`
	}
	if json.Unmarshal(tc.ChatTemplate, &named) == nil {
		for _, n := range named {
			if n.Name == "default" {
				return n.Template, nil
			}
		}
		if len(named) > 0 {
			return named[0].Template, nil
		}
	}
	return "", nil
}

// hfString returns the first of keys that holds a string.
func hfString(m map[string]json.RawMessage, keys ...string) string {
	for _, k := range keys {
		var s string
		if json.Unmarshal(m[k], &s) == nil && s != "" {
			return s
		}
	}
	return ""
}

// hfInt returns the first of keys that holds a number (null is absent).
func hfInt(m map[string]json.RawMessage, keys ...string) (int, bool) {
	for _, k := range keys {
		var f float64
		if raw, ok := m[k]; ok && json.Unmarshal(raw, &f) == nil && string(raw) != "null" {
			return int(f), true
		}
	}
	return 0, false
}

// hfBool returns the boolean under key.
func hfBool(m map[string]json.RawMessage, key string) (bool, bool) {
	var b bool
	if raw, ok := m[key]; ok && json.Unmarshal(raw, &b) == nil {
		return b, true
	}
	return false, false
}
