// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package formats

import (
	"os"
	"path/filepath"
	"testing"
)

func TestParseHFConfig_KVBytesPerToken(t *testing.T) {
	cases := []struct {
		name      string
		json      string
		tp        int
		kvDtype   string
		wantType  string
		wantKV    int64
		wantHeads int
		wantDim   int
	}{
		{
			name:     "llama-3-8b",
			json:     `{"model_type":"llama","num_hidden_layers":32,"num_attention_heads":32,"num_key_value_heads":8,"hidden_size":4096,"torch_dtype":"bfloat16","max_position_embeddings":8192}`,
			wantType: "llama", wantKV: 131072, wantHeads: 8, wantDim: 128,
		},
		{
			name:     "fp8 kv cache",
			json:     `{"model_type":"llama","num_hidden_layers":32,"num_attention_heads":32,"num_key_value_heads":8,"hidden_size":4096,"torch_dtype":"bfloat16"}`,
			kvDtype:  "fp8",
			wantType: "llama", wantKV: 65536, wantHeads: 8, wantDim: 128,
		},
		{
			name:     "tensor parallel halves the heads",
			json:     `{"model_type":"llama","num_hidden_layers":32,"num_attention_heads":32,"num_key_value_heads":8,"hidden_size":4096,"torch_dtype":"bfloat16"}`,
			tp:       2,
			wantType: "llama", wantKV: 65536, wantHeads: 8, wantDim: 128,
		},
		{
			name:     "explicit head_dim (qwen3)",
			json:     `{"model_type":"Qwen3","architectures":["Qwen3ForCausalLM"],"num_hidden_layers":28,"num_attention_heads":16,"num_key_value_heads":8,"hidden_size":1024,"head_dim":128,"torch_dtype":"bfloat16"}`,
			wantType: "qwen3", wantKV: 2 * 28 * 8 * 128 * 2, wantHeads: 8, wantDim: 128,
		},
		{
			name:     "null head_dim falls back",
			json:     `{"model_type":"m","num_hidden_layers":2,"num_attention_heads":4,"hidden_size":256,"head_dim":null,"dtype":"float32"}`,
			wantType: "m", wantKV: 2 * 2 * 4 * 64 * 4, wantHeads: 4, wantDim: 64,
		},
		{
			name:     "multi query",
			json:     `{"model_type":"falcon","n_layer":4,"n_head":8,"hidden_size":512,"multi_query":true,"torch_dtype":"float16"}`,
			wantType: "falcon", wantKV: 2 * 4 * 1 * 64 * 2, wantHeads: 1, wantDim: 64,
		},
		{
			name:     "multi-head latent attention",
			json:     `{"model_type":"deepseek_v3","num_hidden_layers":61,"num_attention_heads":128,"num_key_value_heads":128,"hidden_size":7168,"kv_lora_rank":512,"qk_rope_head_dim":64,"torch_dtype":"bfloat16"}`,
			wantType: "deepseek_v3", wantKV: 61 * (512 + 64) * 2, wantHeads: 128, wantDim: 56,
		},
		{
			name:     "text_config of a multimodal checkpoint",
			json:     `{"model_type":"qwen3_5_vl","torch_dtype":"bfloat16","text_config":{"model_type":"qwen3_5","num_hidden_layers":10,"num_attention_heads":8,"num_key_value_heads":2,"hidden_size":1024,"head_dim":64}}`,
			wantType: "qwen3_5_vl", wantKV: 2 * 10 * 2 * 64 * 2, wantHeads: 2, wantDim: 64,
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cfg, err := ParseHFConfig([]byte(c.json))
			if err != nil {
				t.Fatal(err)
			}
			if cfg.ModelType != c.wantType || cfg.NumKVHeads != c.wantHeads || cfg.HeadDim != c.wantDim {
				t.Fatalf("parsed %+v", cfg)
			}
			if got := cfg.KVBytesPerToken(c.tp, c.kvDtype); got != c.wantKV {
				t.Fatalf("KVBytesPerToken = %d, want %d", got, c.wantKV)
			}
		})
	}
}

func TestParseHFConfig_Errors(t *testing.T) {
	for _, doc := range []string{`not json`, `[]`, `{"model_type":"x"}`} {
		if _, err := ParseHFConfig([]byte(doc)); err == nil {
			t.Errorf("ParseHFConfig(%s): no error", doc)
		}
	}
	var nilCfg *HFConfig
	if nilCfg.KVBytesPerToken(1, "") != 0 {
		t.Fatal("nil config has a KV size")
	}
}

func TestReadHFConfig(t *testing.T) {
	dir := t.TempDir()
	if _, err := ReadHFConfig(dir); err == nil {
		t.Fatal("missing config.json: no error")
	}
	doc := `{"model_type":"qwen3","num_hidden_layers":2,"num_attention_heads":2,"num_key_value_heads":1,"hidden_size":64,"torch_dtype":"bfloat16","max_position_embeddings":40960}`
	if err := os.WriteFile(filepath.Join(dir, HFConfigFile), []byte(doc), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := ReadHFConfig(dir)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.MaxPositionEmbeddings != 40960 || cfg.Dtype != "bfloat16" {
		t.Fatalf("read %+v", cfg)
	}
}

func TestHFChatTemplate(t *testing.T) {
	cases := []struct {
		name  string
		files map[string]string
		want  string
	}{
		{name: "none", want: ""},
		{name: "jinja file wins", files: map[string]string{"chat_template.jinja": "J", "tokenizer_config.json": `{"chat_template":"T"}`}, want: "J"},
		{name: "string", files: map[string]string{"tokenizer_config.json": `{"chat_template":"<think>"}`}, want: "<think>"},
		{name: "named list", files: map[string]string{"tokenizer_config.json": `{"chat_template":[{"name":"tool_use","template":"A"},{"name":"default","template":"B"}]}`}, want: "B"},
		{name: "no template", files: map[string]string{"tokenizer_config.json": `{"bos_token":"x"}`}, want: ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			for n, s := range c.files {
				if err := os.WriteFile(filepath.Join(dir, n), []byte(s), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			got, err := HFChatTemplate(dir)
			if err != nil || got != c.want {
				t.Fatalf("HFChatTemplate = %q, %v; want %q", got, err, c.want)
			}
		})
	}
}

func TestHFDtypeBytes(t *testing.T) {
	for in, want := range map[string]int{"bfloat16": 2, "torch.float16": 2, "float32": 4, "fp8_e4m3": 1, "weird": 0} {
		if got := HFDtypeBytes(in); got != want {
			t.Errorf("HFDtypeBytes(%q) = %d, want %d", in, got, want)
		}
	}
}
