// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package formats

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"os"
	"runtime"
	"strings"
	"testing"
)

// Real files (testdata/README.md says where they come from).
const (
	storiesPath = "testdata/stories260K.gguf"
	tinyPath    = "testdata/llama-2-tiny-random.gguf"
)

// ggufWriter builds GGUF files for tests.
type ggufWriter struct {
	buf bytes.Buffer
	v1  bool
}

func (w *ggufWriter) u8(v uint8)   { w.buf.WriteByte(v) }
func (w *ggufWriter) u16(v uint16) { binary.Write(&w.buf, binary.LittleEndian, v) }
func (w *ggufWriter) u32(v uint32) { binary.Write(&w.buf, binary.LittleEndian, v) }
func (w *ggufWriter) u64(v uint64) { binary.Write(&w.buf, binary.LittleEndian, v) }
func (w *ggufWriter) count(n uint64) {
	if w.v1 {
		w.u32(uint32(n))
		return
	}
	w.u64(n)
}
func (w *ggufWriter) str(s string) { w.count(uint64(len(s))); w.buf.WriteString(s) }

// header writes the magic, the version and the counts.
func (w *ggufWriter) header(version uint32, tensors, kvs uint64) {
	w.u32(GGUFMagic)
	w.u32(version)
	w.count(tensors)
	w.count(kvs)
}

// kv writes one key and a value already encoded by enc.
func (w *ggufWriter) kv(key string, t GGUFValueType, enc func()) {
	w.str(key)
	w.u32(uint32(t))
	enc()
}

// tensor writes one tensor info.
func (w *ggufWriter) tensor(name string, dims []uint64, typ GGMLType, off uint64) {
	w.str(name)
	w.u32(uint32(len(dims)))
	for _, d := range dims {
		w.count(d)
	}
	w.u32(uint32(typ))
	w.u64(off)
}

// pad pads to the alignment and appends n bytes of tensor data.
func (w *ggufWriter) data(align, n int) []byte {
	for w.buf.Len()%align != 0 {
		w.buf.WriteByte(0)
	}
	w.buf.Write(make([]byte, n))
	return w.buf.Bytes()
}

// everyType builds a version-3 file with one key of every value type,
// nested arrays, a custom alignment and two tensors.
func everyType() []byte {
	w := &ggufWriter{}
	w.header(3, 2, 17)
	w.kv("general.architecture", GGUFString, func() { w.str("llama") })
	w.kv("general.alignment", GGUFUint32, func() { w.u32(64) })
	w.kv("k.u8", GGUFUint8, func() { w.u8(200) })
	w.kv("k.i8", GGUFInt8, func() { w.u8(0xff) })
	w.kv("k.u16", GGUFUint16, func() { w.u16(65000) })
	w.kv("k.i16", GGUFInt16, func() { w.u16(0xfffe) })
	w.kv("llama.block_count", GGUFUint32, func() { w.u32(2) })
	w.kv("k.i32", GGUFInt32, func() { w.u32(0xfffffffd) })
	w.kv("k.f32", GGUFFloat32, func() { w.u32(math.Float32bits(1.5)) })
	w.kv("k.bool", GGUFBool, func() { w.u8(1) })
	w.kv("llama.context_length", GGUFUint64, func() { w.u64(4096) })
	w.kv("k.i64", GGUFInt64, func() { w.u64(uint64(math.MaxUint64 - 4)) })
	w.kv("k.f64", GGUFFloat64, func() { w.u64(math.Float64bits(-2.25)) })
	w.kv("llama.attention.head_count", GGUFInt32, func() { w.u32(4) })
	w.kv("llama.attention.head_count_kv", GGUFArray, func() {
		w.u32(uint32(GGUFUint16))
		w.count(2)
		w.u16(2)
		w.u16(1)
	})
	w.kv("llama.embedding_length", GGUFUint32, func() { w.u32(32) })
	w.kv("k.nested", GGUFArray, func() {
		w.u32(uint32(GGUFArray))
		w.count(2)
		w.u32(uint32(GGUFString))
		w.count(2)
		w.str("a")
		w.str("bc")
		w.u32(uint32(GGUFBool))
		w.count(1)
		w.u8(0)
	})
	// 32 F16 elements (64 bytes) and 64 Q8_0 elements (2 blocks, 68 bytes).
	w.tensor("a", []uint64{32}, 1, 0)
	w.tensor("b", []uint64{32, 2}, 8, 64)
	return w.data(64, 64+68)
}

func TestReadGGUF_EveryValueType(t *testing.T) {
	raw := everyType()
	g, err := ReadGGUF(bytes.NewReader(raw), int64(len(raw)))
	if err != nil {
		t.Fatalf("read: %v", err)
	}
	want := map[string]any{
		"k.u8": uint8(200), "k.i8": int8(-1), "k.u16": uint16(65000), "k.i16": int16(-2),
		"k.i32": int32(-3), "k.f32": float32(1.5), "k.bool": true, "k.i64": int64(-5), "k.f64": -2.25,
		"llama.context_length": uint64(4096),
	}
	for k, v := range want {
		if got := g.Metadata[k].Value; got != v {
			t.Errorf("%s = %#v, want %#v", k, got, v)
		}
	}
	nested, ok := g.Metadata["k.nested"].Value.(GGUFArrayValue)
	if !ok || nested.ElemType != GGUFArray || nested.Len() != 2 {
		t.Fatalf("k.nested = %#v", g.Metadata["k.nested"].Value)
	}
	inner := nested.Values.([]GGUFArrayValue)
	if s := inner[0].Values.([]string); len(s) != 2 || s[1] != "bc" {
		t.Errorf("nested strings = %v", s)
	}
	if g.Keys[0] != "general.architecture" || len(g.Keys) != 17 {
		t.Errorf("keys = %v", g.Keys)
	}
	if g.Alignment != 64 || g.DataOffset%64 != 0 {
		t.Errorf("alignment %d, data offset %d", g.Alignment, g.DataOffset)
	}
	if g.Tensors[1].Bytes != 68 || g.WeightsBytes() != 64+68 {
		t.Errorf("tensor bytes %d, weights %d", g.Tensors[1].Bytes, g.WeightsBytes())
	}
	// head_count_kv per layer (2, 1), key length 32/4 = 8: F16 K+V per
	// token = (2·8 + 2·8 + 1·8 + 1·8) · 2 bytes = 96.
	if kv, ok := g.KVBytesPerToken(1); !ok || kv != 96 {
		t.Errorf("kv per token = %d, %v; want 96", kv, ok)
	}
	if g.ContextLength() != 4096 || g.HeadCount() != 4 || g.HeadCountKV() != 2 {
		t.Errorf("ctx %d heads %d kv %d", g.ContextLength(), g.HeadCount(), g.HeadCountKV())
	}
}

func TestReadGGUF_Version1(t *testing.T) {
	w := &ggufWriter{v1: true}
	w.header(1, 1, 1)
	w.kv("general.architecture", GGUFString, func() { w.str("llama") })
	w.tensor("t", []uint64{4}, 0, 0)
	raw := w.data(32, 16)
	g, err := ReadGGUF(bytes.NewReader(raw), int64(len(raw)))
	if err != nil {
		t.Fatal(err)
	}
	if g.Version != 1 || g.Architecture() != "llama" || g.WeightsBytes() != 16 {
		t.Fatalf("got version %d arch %q weights %d", g.Version, g.Architecture(), g.WeightsBytes())
	}
}

// TestReadGGUF_RealFiles checks the shared real models against what their
// README and a real llama-server (llamaserver-observed.md: n_params
// 292800, size 1171200) report.
func TestReadGGUF_RealFiles(t *testing.T) {
	cases := []struct {
		name                                         string
		path, sha256                                 string
		ctx, layers, embd, heads, kvHeads, keyLen    uint64
		tensors                                      int
		weights, params, kvPerTokenF16, kvPerTokenQ8 uint64
		types                                        map[string]int
		vocab                                        int
	}{
		{
			name: "stories260K", path: storiesPath, sha256: "270cba1bd5109f42d03350f60406024560464db173c0e387d91f0426d3bd256d",
			ctx: 2048, layers: 5, embd: 64, heads: 8, kvHeads: 4, keyLen: 8, tensors: 48,
			// 292,800 F32 parameters × 4 bytes.
			weights: 1171200, params: 292800,
			// 5 layers × (4 KV heads × 8) × (K + V) × 2 bytes (F16) = 640.
			kvPerTokenF16: 640,
			// Q8_0: 32 elements per 34-byte block: 5 × 2 × 34 = 340.
			kvPerTokenQ8: 340,
			types:        map[string]int{"F32": 48}, vocab: 512,
		},
		{
			name: "llama-2-tiny-random", path: tinyPath, sha256: "81f226c62d28ed4a1a9b9fa080fcd9f0cc40e0f9d5680036583ff98fbcd035cb",
			ctx: 4096, layers: 1, embd: 8, heads: 2, kvHeads: 2, keyLen: 4, tensors: 12,
			// 2 × 32000 × 8 F16 (embeddings, output) + 4 × 64 + 3 × 256 F16
			// (attention, ffn) = 1,026,048 bytes, plus 3 × 8 F32 norms (96).
			weights: 1026144, params: 513048,
			// 1 layer × (2 × 4) × 2 × 2 bytes = 32; Q8_0 cannot hold a row of 8.
			kvPerTokenF16: 32, kvPerTokenQ8: 0,
			types: map[string]int{"F16": 9, "F32": 3}, vocab: 32000,
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			raw, err := os.ReadFile(c.path)
			if err != nil {
				t.Fatal(err)
			}
			if sum := sha256.Sum256(raw); hex.EncodeToString(sum[:]) != c.sha256 {
				t.Fatalf("%s is not the shared file", c.path)
			}
			g, err := ReadGGUFFile(c.path)
			if err != nil {
				t.Fatal(err)
			}
			if g.Version != 3 || g.Architecture() != "llama" || g.Alignment != 32 {
				t.Errorf("version %d arch %q alignment %d", g.Version, g.Architecture(), g.Alignment)
			}
			got := []uint64{g.ContextLength(), g.BlockCount(), g.EmbeddingLength(), g.HeadCount(), g.HeadCountKV(), g.KeyLength(), g.ValueLength()}
			want := []uint64{c.ctx, c.layers, c.embd, c.heads, c.kvHeads, c.keyLen, c.keyLen}
			for i := range got {
				if got[i] != want[i] {
					t.Errorf("ctx/layers/embd/heads/kv/klen/vlen = %v, want %v", got, want)
					break
				}
			}
			if len(g.Tensors) != c.tensors || g.WeightsBytes() != c.weights || g.Parameters() != c.params {
				t.Errorf("tensors %d weights %d params %d", len(g.Tensors), g.WeightsBytes(), g.Parameters())
			}
			// The tensor data ends exactly at the end of the file.
			last := g.Tensors[len(g.Tensors)-1]
			if g.DataOffset+last.Offset+last.Bytes != g.Size {
				t.Errorf("data %d + %d + %d != size %d", g.DataOffset, last.Offset, last.Bytes, g.Size)
			}
			kv, ok := g.KVBytesPerToken(1)
			if !ok || kv != c.kvPerTokenF16 {
				t.Errorf("kv per token (F16) = %d, %v", kv, ok)
			}
			q8, _ := GGMLTypeByName("q8_0")
			kv8, ok := g.KVBytesPerToken(q8)
			if (c.kvPerTokenQ8 == 0) == ok || kv8 != c.kvPerTokenQ8 {
				t.Errorf("kv per token (Q8_0) = %d, %v", kv8, ok)
			}
			for k, n := range c.types {
				if g.TensorTypes()[k] != n {
					t.Errorf("types = %v", g.TensorTypes())
				}
			}
			toks, _ := g.Metadata["tokenizer.ggml.tokens"].Value.(GGUFArrayValue)
			if toks.ElemType != GGUFString || toks.Len() != c.vocab {
				t.Errorf("vocab %d of %s", toks.Len(), toks.ElemType)
			}
		})
	}
}

// TestReadGGUF_Truncated cuts the real file at every length up to the end
// of its header and some inside its data: every cut is an error.
func TestReadGGUF_Truncated(t *testing.T) {
	raw, err := os.ReadFile(storiesPath)
	if err != nil {
		t.Fatal(err)
	}
	g, err := ReadGGUF(bytes.NewReader(raw), int64(len(raw)))
	if err != nil {
		t.Fatal(err)
	}
	cuts := []int{}
	for n := 0; n < int(g.DataOffset)+64; n++ {
		cuts = append(cuts, n)
	}
	cuts = append(cuts, len(raw)/2, len(raw)-1)
	for _, n := range cuts {
		if _, err := ReadGGUF(bytes.NewReader(raw[:n]), int64(n)); err == nil {
			t.Fatalf("a file cut at %d of %d bytes was read without error", n, len(raw))
		}
	}
	// A reader that ends before the size it claims is an error too.
	if _, err := ReadGGUF(bytes.NewReader(raw[:1000]), int64(len(raw))); err == nil {
		t.Fatal("a short reader was read without error")
	}
}

func TestReadGGUF_Hostile(t *testing.T) {
	huge := uint64(1) << 62
	cases := []struct {
		name  string
		build func(w *ggufWriter) []byte
		want  string
	}{
		{"not gguf", func(w *ggufWriter) []byte { w.u32(0x12345678); w.u32(3); return w.buf.Bytes() }, "not a GGUF"},
		{"version 4", func(w *ggufWriter) []byte { w.header(4, 0, 0); return w.buf.Bytes() }, "unsupported gguf version"},
		{"huge kv count", func(w *ggufWriter) []byte { w.header(3, 0, huge); return w.buf.Bytes() }, "does not fit"},
		{"huge tensor count", func(w *ggufWriter) []byte { w.header(3, huge, 0); return w.buf.Bytes() }, "does not fit"},
		{"huge string", func(w *ggufWriter) []byte {
			w.header(3, 0, 1)
			w.count(huge)
			w.buf.Write(make([]byte, 64))
			return w.buf.Bytes()
		}, "bytes left"},
		{"huge array", func(w *ggufWriter) []byte {
			w.header(3, 0, 1)
			w.kv("a", GGUFArray, func() { w.u32(uint32(GGUFUint64)); w.count(huge) })
			return w.buf.Bytes()
		}, "does not fit"},
		{"huge array of strings", func(w *ggufWriter) []byte {
			w.header(3, 0, 1)
			w.kv("a", GGUFArray, func() { w.u32(uint32(GGUFString)); w.count(huge) })
			return w.buf.Bytes()
		}, "does not fit"},
		{"deep nesting", func(w *ggufWriter) []byte {
			w.header(3, 0, 1)
			w.kv("a", GGUFArray, func() {
				for i := 0; i < 10; i++ {
					w.u32(uint32(GGUFArray))
					w.count(1)
				}
				w.buf.Write(make([]byte, 64))
			})
			return w.buf.Bytes()
		}, "nested deeper"},
		{"unknown value type", func(w *ggufWriter) []byte {
			w.header(3, 0, 1)
			w.kv("a", 99, func() { w.u64(0) })
			return w.buf.Bytes()
		}, "unknown value type"},
		{"bad bool", func(w *ggufWriter) []byte {
			w.header(3, 0, 1)
			w.kv("a", GGUFBool, func() { w.u8(7) })
			return w.buf.Bytes()
		}, "neither 0 nor 1"},
		{"repeated key", func(w *ggufWriter) []byte {
			w.header(3, 0, 2)
			w.kv("a", GGUFUint8, func() { w.u8(1) })
			w.kv("a", GGUFUint8, func() { w.u8(1) })
			return w.buf.Bytes()
		}, "repeated"},
		{"bad alignment", func(w *ggufWriter) []byte {
			w.header(3, 0, 1)
			w.kv("general.alignment", GGUFUint32, func() { w.u32(12) })
			return w.buf.Bytes()
		}, "multiple of 8"},
		{"too many dims", func(w *ggufWriter) []byte {
			w.header(3, 1, 0)
			w.tensor("t", make([]uint64, 9), 0, 0)
			return w.data(32, 0)
		}, "dimensions"},
		{"dims overflow", func(w *ggufWriter) []byte {
			w.header(3, 1, 0)
			w.tensor("t", []uint64{1 << 40, 1 << 40}, 0, 0)
			return w.data(32, 0)
		}, "overflows"},
		{"unknown ggml type", func(w *ggufWriter) []byte {
			w.header(3, 1, 0)
			w.tensor("t", []uint64{4}, 4, 0)
			return w.data(32, 16)
		}, "unknown ggml type"},
		{"partial block", func(w *ggufWriter) []byte {
			w.header(3, 1, 0)
			w.tensor("t", []uint64{33}, 2, 0)
			return w.data(32, 64)
		}, "whole number"},
		{"tensor past the end", func(w *ggufWriter) []byte {
			w.header(3, 1, 0)
			w.tensor("t", []uint64{1024}, 0, 0)
			return w.data(32, 16)
		}, "outside"},
		{"unaligned tensor", func(w *ggufWriter) []byte {
			w.header(3, 1, 0)
			w.tensor("t", []uint64{4}, 0, 4)
			return w.data(32, 64)
		}, "not aligned"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			raw := c.build(&ggufWriter{})
			_, err := ReadGGUF(bytes.NewReader(raw), int64(len(raw)))
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("err = %v, want it to say %q", err, c.want)
			}
		})
	}
}

// TestReadGGUF_NoHugeAllocation proves a lying count in a large (claimed)
// file allocates in proportion to what is read, not to what is claimed.
func TestReadGGUF_NoHugeAllocation(t *testing.T) {
	w := &ggufWriter{}
	w.header(3, 0, 1)
	w.kv("a", GGUFArray, func() { w.u32(uint32(GGUFString)); w.count(GGUFMaxArrayLen) })
	w.buf.Write(make([]byte, 4096))
	raw := w.buf.Bytes()
	// The reader is told the file is 64 GiB: the count fits that size and
	// the per-array cap.
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	_, err := ReadGGUF(bytes.NewReader(raw), 64<<30)
	runtime.ReadMemStats(&after)
	if err == nil {
		t.Fatal("a short file was read without error")
	}
	if got := after.TotalAlloc - before.TotalAlloc; got > 16<<20 {
		t.Fatalf("reading a lying %d-element array allocated %d bytes", GGUFMaxArrayLen, got)
	}
	if !errors.Is(err, errTruncated) {
		t.Fatalf("err = %v, want a truncation", err)
	}
}

func TestGGMLType_RowBytes(t *testing.T) {
	cases := []struct {
		name string
		n    uint64
		want uint64
		ok   bool
	}{
		{"F32", 10, 40, true},
		{"F16", 10, 20, true},
		{"BF16", 3, 6, true},
		{"Q4_0", 64, 36, true},
		{"Q8_0", 32, 34, true},
		{"Q4_K", 512, 288, true},
		{"MXFP4", 32, 17, true},
		{"IQ4_NL", 32, 18, true},
		{"Q8_0", 33, 0, false},
	}
	for _, c := range cases {
		typ, ok := GGMLTypeByName(c.name)
		if !ok {
			t.Fatalf("no type %s", c.name)
		}
		got, ok := typ.RowBytes(c.n)
		if got != c.want || ok != c.ok {
			t.Errorf("%s × %d = %d, %v; want %d, %v", c.name, c.n, got, ok, c.want, c.ok)
		}
	}
	if _, ok := GGMLType(4).Info(); ok {
		t.Error("removed type 4 is known")
	}
}

// FuzzGGUF feeds arbitrary bytes to the reader: it must never panic, and
// whatever it accepts must be self-consistent.
func FuzzGGUF(f *testing.F) {
	if raw, err := os.ReadFile(storiesPath); err == nil {
		g, err := ReadGGUF(bytes.NewReader(raw), int64(len(raw)))
		if err == nil {
			// The header, and the header with a little data.
			f.Add(raw[:g.DataOffset])
			f.Add(raw[:g.DataOffset+256])
		}
	}
	f.Add(everyType())
	w := &ggufWriter{v1: true}
	w.header(1, 1, 1)
	w.kv("general.architecture", GGUFString, func() { w.str("llama") })
	w.tensor("t", []uint64{4}, 0, 0)
	f.Add(w.data(32, 16))
	f.Fuzz(func(t *testing.T, raw []byte) {
		g, err := ReadGGUF(bytes.NewReader(raw), int64(len(raw)))
		if err != nil {
			return
		}
		if g.DataOffset > uint64(len(raw)) {
			t.Fatalf("data offset %d past %d bytes", g.DataOffset, len(raw))
		}
		for _, ti := range g.Tensors {
			if g.DataOffset+ti.Offset+ti.Bytes > uint64(len(raw)) {
				t.Fatalf("tensor %q outside the file", ti.Name)
			}
		}
		_ = g.WeightsBytes()
		_, _ = g.KVBytesPerToken(1)
		_ = g.HeadCountKV()
	})
}

// allocated is what f allocates on the heap, in bytes (TotalAlloc counts
// every allocation, freed or not, so a collection during f hides nothing).
func allocated(f func()) uint64 {
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	f()
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc
}

// tokenizerFile is an honest file shaped like the largest real tokenizers
// (Gemma 3: 262,144 tokens): tokens, scores, token types and merges.
func tokenizerFile() []byte {
	const vocab = 262144
	w := &ggufWriter{}
	w.header(3, 0, 5)
	w.kv("general.architecture", GGUFString, func() { w.str("llama") })
	w.kv("tokenizer.ggml.tokens", GGUFArray, func() {
		w.u32(uint32(GGUFString))
		w.count(vocab)
		for i := 0; i < vocab; i++ {
			w.str(fmt.Sprintf("tok%05d", i))
		}
	})
	w.kv("tokenizer.ggml.scores", GGUFArray, func() {
		w.u32(uint32(GGUFFloat32))
		w.count(vocab)
		w.buf.Write(make([]byte, 4*vocab))
	})
	w.kv("tokenizer.ggml.token_type", GGUFArray, func() {
		w.u32(uint32(GGUFInt32))
		w.count(vocab)
		w.buf.Write(make([]byte, 4*vocab))
	})
	w.kv("tokenizer.ggml.merges", GGUFArray, func() {
		w.u32(uint32(GGUFString))
		w.count(vocab)
		for i := 0; i < vocab; i++ {
			w.str(fmt.Sprintf("t%05d u%05d", i, i))
		}
	})
	return w.data(32, 0)
}

// nestedEmptyArrays is an honest file whose one key holds n empty arrays:
// 12 bytes each on disk, the shape of the 91 MiB file that took the
// llama.cpp driver to 803 MiB of heap.
func nestedEmptyArrays(n uint64) []byte {
	w := &ggufWriter{}
	w.header(3, 0, 1)
	w.kv("a", GGUFArray, func() {
		w.u32(uint32(GGUFArray))
		w.count(n)
		for i := uint64(0); i < n; i++ {
			w.u32(uint32(GGUFUint8))
			w.count(0)
		}
	})
	return w.data(32, 0)
}

// TestReadGGUF_Bounds builds honest files over each metadata cap and
// checks each is refused, naming the bound, and that refusing it
// allocates, per byte on disk, at most twice what reading an honest
// tokenizer does (the baseline, measured in the same run).
func TestReadGGUF_Bounds(t *testing.T) {
	tok := tokenizerFile()
	var g *GGUFFile
	var err error
	baseline := allocated(func() { g, err = ReadGGUF(bytes.NewReader(tok), int64(len(tok))) })
	if err != nil {
		t.Fatalf("the largest real tokenizer's shape is refused: %v", err)
	}
	if arr := g.Metadata["tokenizer.ggml.merges"].Value.(GGUFArrayValue); arr.Len() != 262144 {
		t.Fatalf("merges: %d", arr.Len())
	}
	t.Logf("honest tokenizer: %d bytes on disk, %d bytes allocated", len(tok), baseline)

	// Hostile files at the real caps, at least as large on disk as the
	// tokenizer.
	nested := nestedEmptyArrays(uint64(len(tok))/12 + 1)
	u8 := func(n uint64) func(w *ggufWriter) {
		return func(w *ggufWriter) {
			w.u32(uint32(GGUFUint8))
			w.count(n)
			w.buf.Write(make([]byte, n))
		}
	}
	w := &ggufWriter{}
	w.header(3, 0, 1)
	w.kv("a", GGUFArray, func() { u8(GGUFMaxArrayLen + 1)(w) })
	longArray := w.data(32, 0)
	w = &ggufWriter{}
	w.header(3, 0, 3)
	for _, k := range []string{"a", "b", "c"} {
		w.kv(k, GGUFArray, func() { u8(GGUFMaxMetadataElements / 2)(w) })
	}
	manyElements := w.data(32, 0)

	cases := []struct {
		name string
		raw  []byte
		want string
	}{
		{"nested empty arrays", nested, fmt.Sprintf("more than %d arrays", GGUFMaxArrays)},
		{"one array over the per-array cap", longArray, fmt.Sprintf("of %d elements per array", GGUFMaxArrayLen)},
		{"arrays over the total element cap", manyElements, fmt.Sprintf("more than %d array elements", GGUFMaxMetadataElements)},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var err error
			got := allocated(func() { _, err = ReadGGUF(bytes.NewReader(c.raw), int64(len(c.raw))) })
			if !errors.Is(err, ErrGGUFLimit) || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("err = %v, want %v saying %q", err, ErrGGUFLimit, c.want)
			}
			t.Logf("%d bytes on disk, %d bytes allocated", len(c.raw), got)
			// Per byte on disk, at most twice what the honest file costs.
			// Before the caps the nested arrays took 164 MB for 12 MB (13
			// bytes per byte), and were accepted.
			if limit := 2 * baseline / uint64(len(tok)) * uint64(len(c.raw)); got > limit {
				t.Fatalf("refusing a %d-byte hostile file allocated %d bytes, over %d: twice what reading an honest tokenizer costs per byte (%d bytes for %d)", len(c.raw), got, limit, baseline, len(tok))
			}
		})
	}
}

// TestReadGGUF_EachLimit reaches every cap with a small file under
// smaller caps: each refusal names its bound and wraps ErrGGUFLimit.
func TestReadGGUF_EachLimit(t *testing.T) {
	small := ggufLimits{arrayLen: 100, elements: 150, arrays: 10, bytes: 900, keys: 20, tensors: 5}
	cases := []struct {
		name  string
		build func(w *ggufWriter) []byte
		want  string
	}{
		{"tensors", func(w *ggufWriter) []byte {
			w.header(3, 6, 0)
			for i := 0; i < 6; i++ {
				w.tensor(fmt.Sprintf("t%d", i), []uint64{4}, 0, uint64(32*i))
			}
			return w.data(32, 6*32)
		}, "of 5 tensors"},
		{"keys", func(w *ggufWriter) []byte {
			w.header(3, 0, 21)
			for i := 0; i < 21; i++ {
				w.kv(fmt.Sprintf("k%d", i), GGUFUint8, func() { w.u8(1) })
			}
			return w.buf.Bytes()
		}, "of 20 keys"},
		{"array length", func(w *ggufWriter) []byte {
			w.header(3, 0, 1)
			w.kv("a", GGUFArray, func() { w.u32(uint32(GGUFUint8)); w.count(101); w.buf.Write(make([]byte, 101)) })
			return w.buf.Bytes()
		}, "of 100 elements per array"},
		{"elements in all", func(w *ggufWriter) []byte {
			w.header(3, 0, 2)
			for _, k := range []string{"a", "b"} {
				w.kv(k, GGUFArray, func() { w.u32(uint32(GGUFUint8)); w.count(80); w.buf.Write(make([]byte, 80)) })
			}
			return w.buf.Bytes()
		}, "more than 150 array elements"},
		{"arrays", func(w *ggufWriter) []byte {
			w.header(3, 0, 1)
			w.kv("a", GGUFArray, func() {
				w.u32(uint32(GGUFArray))
				w.count(10)
				for i := 0; i < 10; i++ { // 1 + 10 arrays, 11 × 48 bytes
					w.u32(uint32(GGUFUint8))
					w.count(0)
				}
			})
			return w.buf.Bytes()
		}, "more than 10 arrays"},
		{"metadata bytes in strings", func(w *ggufWriter) []byte {
			w.header(3, 0, 3)
			for _, k := range []string{"a", "b", "c"} {
				w.kv(k, GGUFString, func() { w.str(strings.Repeat("x", 400)) })
			}
			return w.buf.Bytes()
		}, "more than 900 bytes"},
		{"metadata bytes in a fixed-size array", func(w *ggufWriter) []byte {
			w.header(3, 0, 1)
			w.kv("a", GGUFArray, func() { w.u32(uint32(GGUFUint64)); w.count(100); w.buf.Write(make([]byte, 8*100)) })
			return w.buf.Bytes()
		}, "more than 900 bytes"},
		{"nesting", func(w *ggufWriter) []byte {
			w.header(3, 0, 1)
			w.kv("a", GGUFArray, func() {
				for i := 0; i < 2; i++ {
					w.u32(uint32(GGUFArray))
					w.count(1)
				}
				w.u32(uint32(GGUFUint8))
				w.count(0)
			})
			return w.buf.Bytes()
		}, "nested deeper than 2"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			raw := c.build(&ggufWriter{})
			_, err := readGGUF(bytes.NewReader(raw), int64(len(raw)), small)
			if !errors.Is(err, ErrGGUFLimit) || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("err = %v, want %v saying %q", err, ErrGGUFLimit, c.want)
			}
		})
	}
	// The same caps read a file just under each of them.
	w := &ggufWriter{}
	w.header(3, 0, 2)
	w.kv("a", GGUFArray, func() { w.u32(uint32(GGUFUint8)); w.count(100); w.buf.Write(make([]byte, 100)) })
	w.kv("b", GGUFArray, func() { w.u32(uint32(GGUFUint8)); w.count(50); w.buf.Write(make([]byte, 50)) })
	raw := w.buf.Bytes()
	if _, err := readGGUF(bytes.NewReader(raw), int64(len(raw)), small); err != nil {
		t.Fatalf("a file at the caps is refused: %v", err)
	}
}
