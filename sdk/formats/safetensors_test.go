// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package formats

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// stFile builds a safetensors file from a JSON header and a data length;
// pad appends spaces to the header, as writers may.
func stFile(header string, data int, pad int) []byte {
	h := header + strings.Repeat(" ", pad)
	var b bytes.Buffer
	binary.Write(&b, binary.LittleEndian, uint64(len(h)))
	b.WriteString(h)
	b.Write(make([]byte, data))
	return b.Bytes()
}

// goodHeader has a matrix, a vector, a scalar, an empty tensor, a sub-byte
// dtype and metadata; its data is 2·3·2 + 3·4 + 8 + 0 + 2 = 34 bytes.
const goodHeader = `{"__metadata__":{"format":"pt"},
 "model.layers.0.self_attn.q_proj.weight":{"dtype":"BF16","shape":[2,3],"data_offsets":[0,12]},
 "model.layers.0.input_layernorm.weight":{"dtype":"F32","shape":[3],"data_offsets":[12,24]},
 "step":{"dtype":"I64","shape":[],"data_offsets":[24,32]},
 "empty":{"dtype":"F16","shape":[0,4],"data_offsets":[32,32]},
 "packed":{"dtype":"F4","shape":[4],"data_offsets":[32,34]}}`

func TestReadSafetensors_Good(t *testing.T) {
	raw := stFile(goodHeader, 34, 5)
	h, err := ReadSafetensors(bytes.NewReader(raw), int64(len(raw)))
	if err != nil {
		t.Fatal(err)
	}
	if h.Metadata["format"] != "pt" || len(h.Tensors) != 5 {
		t.Fatalf("metadata %v, %d tensors", h.Metadata, len(h.Tensors))
	}
	if h.WeightsBytes() != 34 || h.DataSize != 34 {
		t.Errorf("weights %d, data %d", h.WeightsBytes(), h.DataSize)
	}
	// Kept whole: the norm vector, the scalar, the packed vector and the
	// empty "norm-less" 2-D tensor is not: 12 + 8 + 2 = 22.
	if h.WholeBytes() != 22 {
		t.Errorf("whole bytes %d, want 22", h.WholeBytes())
	}
	if h.Tensors[0].Name != "model.layers.0.self_attn.q_proj.weight" || h.Tensors[0].Elements() != 6 {
		t.Errorf("first tensor %+v", h.Tensors[0])
	}
	if s := h.Tensors[2]; s.Name != "step" || len(s.Shape) != 0 || s.Elements() != 1 {
		t.Errorf("scalar %+v", s)
	}
}

func TestReadSafetensors_Bad(t *testing.T) {
	one := func(entry string, data int) []byte { return stFile(`{"t":`+entry+`}`, data, 0) }
	cases := []struct {
		name string
		raw  []byte
		want string
	}{
		{"short", []byte{1, 2, 3}, "shorter than"},
		{"huge header length", func() []byte {
			b := make([]byte, 16)
			binary.LittleEndian.PutUint64(b, 1<<62)
			return b
		}(), "bound"},
		{"header past the end", func() []byte {
			b := make([]byte, 16)
			binary.LittleEndian.PutUint64(b, 100)
			return b
		}(), "does not fit"},
		{"not an object", stFile(`["x"]`, 0, 0), "start with '{'"},
		{"bad json", stFile(`{"t":{"dtype":"F32",}`, 0, 0), "invalid character"},
		{"repeated key", stFile(`{"t":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"t":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}}`, 2, 0), "twice"},
		{"unknown dtype", one(`{"dtype":"Q4","shape":[1],"data_offsets":[0,1]}`, 1), "unknown dtype"},
		{"negative dim", one(`{"dtype":"U8","shape":[-1],"data_offsets":[0,1]}`, 1), "non-negative"},
		{"float dim", one(`{"dtype":"U8","shape":[1.5],"data_offsets":[0,1]}`, 1), "non-negative"},
		{"huge dims", one(`{"dtype":"F32","shape":[4294967296,4294967296,16],"data_offsets":[0,1]}`, 1), "overflows"},
		{"offsets mismatch", one(`{"dtype":"F32","shape":[2],"data_offsets":[0,4]}`, 4), "needs 8 bytes"},
		{"offsets reversed", one(`{"dtype":"U8","shape":[0],"data_offsets":[4,0]}`, 4), "before begin"},
		{"one offset", one(`{"dtype":"U8","shape":[1],"data_offsets":[0]}`, 1), "[begin, end]"},
		{"hole", one(`{"dtype":"U8","shape":[1],"data_offsets":[1,2]}`, 2), "hole"},
		{"overlap", stFile(`{"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},"b":{"dtype":"U8","shape":[2],"data_offsets":[1,3]}}`, 3, 0), "overlaps"},
		{"truncated data", one(`{"dtype":"U8","shape":[8],"data_offsets":[0,8]}`, 4), "truncated"},
		{"trailing data", one(`{"dtype":"U8","shape":[1],"data_offsets":[0,1]}`, 5), "after the last"},
		{"metadata not strings", stFile(`{"__metadata__":{"a":1}}`, 0, 0), "__metadata__"},
		{"trailing json", stFile(`{}{}`, 0, 0), "trailing"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := ReadSafetensors(bytes.NewReader(c.raw), int64(len(c.raw)))
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("err = %v, want it to say %q", err, c.want)
			}
		})
	}
}

// TestReadSafetensors_Truncated cuts a good file at every length.
func TestReadSafetensors_Truncated(t *testing.T) {
	raw := stFile(goodHeader, 34, 0)
	for n := 0; n < len(raw); n++ {
		if _, err := ReadSafetensors(bytes.NewReader(raw[:n]), int64(n)); err == nil {
			t.Fatalf("a file cut at %d of %d bytes was read without error", n, len(raw))
		}
	}
}

// TestReadSafetensors_NoHugeAllocation: a header length that the claimed
// size allows but the reader does not hold allocates at most the bound.
func TestReadSafetensors_NoHugeAllocation(t *testing.T) {
	b := make([]byte, 64)
	binary.LittleEndian.PutUint64(b, 1<<40)
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	_, err := ReadSafetensors(bytes.NewReader(b), 1<<50)
	runtime.ReadMemStats(&after)
	if err == nil {
		t.Fatal("read without error")
	}
	if got := after.TotalAlloc - before.TotalAlloc; got > 1<<20 {
		t.Fatalf("allocated %d bytes for a lying header length", got)
	}
}

// writeShards writes a sharded checkpoint: two shards and their index.
func writeShards(t *testing.T, dir string, index string) {
	t.Helper()
	shard1 := stFile(`{"model.embed_tokens.weight":{"dtype":"F16","shape":[4,2],"data_offsets":[0,16]},"model.norm.weight":{"dtype":"F16","shape":[2],"data_offsets":[16,20]}}`, 20, 3)
	shard2 := stFile(`{"lm_head.weight":{"dtype":"F16","shape":[4,2],"data_offsets":[0,16]}}`, 16, 0)
	for name, b := range map[string][]byte{"model-00001-of-00002.safetensors": shard1, "model-00002-of-00002.safetensors": shard2, SafetensorsIndexFile: []byte(index)} {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
}

const goodIndex = `{"metadata":{"total_size":36},"weight_map":{
 "model.embed_tokens.weight":"model-00001-of-00002.safetensors",
 "model.norm.weight":"model-00001-of-00002.safetensors",
 "lm_head.weight":"model-00002-of-00002.safetensors"}}`

func TestReadSafetensorsDir(t *testing.T) {
	t.Run("sharded", func(t *testing.T) {
		dir := t.TempDir()
		writeShards(t, dir, goodIndex)
		m, err := ReadSafetensorsDir(dir)
		if err != nil {
			t.Fatal(err)
		}
		if m.Index == nil || m.Index.TotalSize != 36 || len(m.Files) != 2 {
			t.Fatalf("index %+v files %v", m.Index, m.Files)
		}
		// 16 + 4 + 16 bytes; the norm (4) is kept whole; at tp 2 a rank
		// holds ceil(32/2) + 4 = 20.
		if m.WeightsBytes() != 36 || m.WholeBytes() != 4 || m.RankBytes(2) != 20 || m.RankBytes(1) != 36 {
			t.Fatalf("weights %d whole %d rank(2) %d", m.WeightsBytes(), m.WholeBytes(), m.RankBytes(2))
		}
	})
	t.Run("single file", func(t *testing.T) {
		dir := t.TempDir()
		raw := stFile(goodHeader, 34, 0)
		if err := os.WriteFile(filepath.Join(dir, "model.safetensors"), raw, 0o600); err != nil {
			t.Fatal(err)
		}
		m, err := ReadSafetensorsDir(dir)
		if err != nil || m.WeightsBytes() != 34 || m.Index != nil {
			t.Fatalf("m %+v err %v", m, err)
		}
	})
	bad := []struct {
		name, index, want string
	}{
		{"missing tensor", strings.Replace(goodIndex, `"lm_head.weight"`, `"other.weight"`, 1), "in no shard"},
		{"wrong shard", `{"weight_map":{"model.embed_tokens.weight":"model-00002-of-00002.safetensors","model.norm.weight":"model-00002-of-00002.safetensors","lm_head.weight":"model-00001-of-00002.safetensors"}}`, "the index says"},
		{"path escape", strings.Replace(goodIndex, `"model-00002-of-00002.safetensors"`, `"../evil.safetensors"`, 1), "beside the index"},
		{"not json", `{"weight_map":`, "parse"},
		{"empty map", `{"weight_map":{}}`, "empty"},
	}
	for _, c := range bad {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			writeShards(t, dir, c.index)
			_, err := ReadSafetensorsDir(dir)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("err = %v, want %q", err, c.want)
			}
		})
	}
	t.Run("no weights", func(t *testing.T) {
		if _, err := ReadSafetensorsDir(t.TempDir()); err == nil {
			t.Fatal("an empty directory has weights")
		}
	})
}

// FuzzSafetensors feeds arbitrary bytes to the header reader: no panic, and
// an accepted header fills its data buffer exactly.
func FuzzSafetensors(f *testing.F) {
	f.Add(stFile(goodHeader, 34, 2))
	f.Add(stFile(`{"t":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}`, 1, 0))
	f.Add(stFile(`{"__metadata__":{"a":"b"}}`, 0, 0))
	f.Fuzz(func(t *testing.T, raw []byte) {
		h, err := ReadSafetensors(bytes.NewReader(raw), int64(len(raw)))
		if err != nil {
			return
		}
		if h.WeightsBytes() != h.DataSize || 8+h.HeaderSize+h.DataSize != uint64(len(raw)) {
			panic(fmt.Sprintf("accepted a header whose tensors (%d bytes) do not fill its %d-byte buffer", h.WeightsBytes(), h.DataSize))
		}
	})
}

// honestHeader is a header of n tensors of one U8 element each, with its
// data length.
func honestHeader(n int) (string, int) {
	var b strings.Builder
	b.WriteString("{")
	for i := 0; i < n; i++ {
		if i > 0 {
			b.WriteString(",")
		}
		fmt.Fprintf(&b, `"model.layers.%d.mlp.experts.0.down_proj.weight":{"dtype":"U8","shape":[1,1],"data_offsets":[%d,%d]}`, i, i, i+1)
	}
	b.WriteString("}")
	return b.String(), n
}

// TestReadSafetensors_Bounds: a header within SafetensorsMaxHeader whose
// shape lists millions of dimensions is refused, allocating per byte at
// most what an honest header of the same size costs (measured in the same
// run); each cap is reached with a small header under smaller
// caps.
func TestReadSafetensors_Bounds(t *testing.T) {
	honest, data := honestHeader(100000)
	honestRaw := stFile(honest, data, 0)
	var err error
	baseline := allocated(func() { _, err = ReadSafetensors(bytes.NewReader(honestRaw), int64(len(honestRaw))) })
	if err != nil {
		t.Fatalf("honest header: %v", err)
	}
	t.Logf("honest header: %d bytes, %d bytes allocated", len(honestRaw), baseline)

	dims := (len(honest) - 64) / 2
	hostile := `{"t":{"dtype":"U8","shape":[` + strings.TrimSuffix(strings.Repeat("1,", dims), ",") + `],"data_offsets":[0,1]}}`
	hostileRaw := stFile(hostile, 1, 0)
	got := allocated(func() { _, err = ReadSafetensors(bytes.NewReader(hostileRaw), int64(len(hostileRaw))) })
	if !errors.Is(err, ErrSafetensorsLimit) || !strings.Contains(err.Error(), fmt.Sprintf("of %d", SafetensorsMaxRank)) {
		t.Fatalf("err = %v, want %v naming the rank cap", err, ErrSafetensorsLimit)
	}
	t.Logf("a shape of %d dimensions: %d bytes, %d bytes allocated", dims, len(hostileRaw), got)
	// Before the cap: 573 MB for this 11 MB header (52 bytes per byte).
	if limit := baseline / uint64(len(honestRaw)) * uint64(len(hostileRaw)); got > limit {
		t.Fatalf("refusing a %d-byte hostile header allocated %d bytes, over %d", len(hostileRaw), got, limit)
	}

	small := safetensorsLimits{tensors: 3, metadata: 2}
	four, _ := honestHeader(4)
	cases := []struct {
		name   string
		header string
		data   int
		want   string
	}{
		{"tensors", four, 4, "more than 3 tensors"},
		{"metadata entries", `{"__metadata__":{"a":"1","b":"2","c":"3"}}`, 0, "more than 2 entries"},
		{"rank", `{"t":{"dtype":"U8","shape":[1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1],"data_offsets":[0,1]}}`, 1, "of 16"},
		{"offsets", `{"t":{"dtype":"U8","shape":[1],"data_offsets":[0,1,2]}}`, 1, "of 2"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			raw := stFile(c.header, c.data, 0)
			_, err := readSafetensors(bytes.NewReader(raw), int64(len(raw)), small)
			if !errors.Is(err, ErrSafetensorsLimit) || !errors.Is(err, ErrNotSafetensors) || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("err = %v, want %v saying %q", err, ErrSafetensorsLimit, c.want)
			}
		})
	}
	three, _ := honestHeader(3)
	raw := stFile(`{"__metadata__":{"a":"1","b":"2"},`+three[1:], 3, 0)
	if _, err := readSafetensors(bytes.NewReader(raw), int64(len(raw)), small); err != nil {
		t.Fatalf("a header at the caps is refused: %v", err)
	}
}
