// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

// Package formats reads the model-file headers a driver sizes a model
// from, without loading any weights: GGUF (llama.cpp), safetensors and
// their sharded index, and Hugging Face config.json. Every reader is bounded
// by the size of what it reads: a length or count field that claims more
// than the file holds is an error, never an allocation. What an honest file
// may hold is bounded too, whatever its size (GGUFMax*, SafetensorsMax*): a
// file over a bound is refused (ErrGGUFLimit, ErrSafetensorsLimit) before
// anything is allocated for what is over.
package formats

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"slices"
	"sort"
	"strings"
)

// GGUFMagic is "GGUF" read as a little-endian uint32.
const GGUFMagic = 0x46554747

// GGUFDefaultAlignment is the tensor data alignment when general.alignment
// is absent.
const GGUFDefaultAlignment = 32

// Bounds of what the GGUF reader accepts; a file beyond them is refused as
// hostile rather than read.
const (
	// ggufMaxKeyLen is the spec's bound on a metadata key.
	ggufMaxKeyLen = 65535
	// ggufMaxDims bounds a tensor's rank (the spec uses at most 4).
	ggufMaxDims = 8
	// ggufMaxNesting bounds arrays of arrays: 2 is an array of arrays of
	// scalars. llama.cpp's own reader (ggml/src/gguf.cpp) refuses any
	// array of arrays, so no file an engine loads goes deeper.
	ggufMaxNesting = 2
	// ggufMaxString bounds one string value (chat templates are the
	// longest, well under a megabyte).
	ggufMaxString = 16 << 20
	// ggufPrealloc bounds what is allocated ahead of reading for a count:
	// beyond it slices grow with what is actually read (see appendCounted).
	// It holds a real tokenizer's arrays (up to 262,144 entries) in one
	// allocation; what a lying count gets ahead is at most 6 MiB.
	ggufPrealloc = 1 << 18

	// The caps below hold whatever the file's size: an honest file of
	// 91 MiB of nested empty arrays once took 803 MiB of heap, because
	// every 12-byte empty array becomes a 48-byte value in memory. Real
	// files sit far below them: the largest tokenizers (Gemma 3, 262,144
	// tokens) store about a million metadata elements in all (tokens,
	// scores, token types, merges) and some 20 MiB as decoded here.
	// llama.cpp itself has no such caps (only SIZE_MAX overflow checks),
	// so these are CapyCTL's own, sized at 16x the largest real file.

	// GGUFMaxArrayLen bounds the elements of one array.
	GGUFMaxArrayLen = 1 << 22
	// GGUFMaxMetadataElements bounds the elements of every array of the
	// file together, nested ones included.
	GGUFMaxMetadataElements = 1 << 23
	// GGUFMaxArrays bounds the array values of the file, nested ones
	// included (a real file holds a handful).
	GGUFMaxArrays = 1 << 16
	// GGUFMaxMetadataBytes bounds the metadata as held in memory: keys,
	// values, string headers and array headers, counted at their decoded
	// size (which is never less than their size on disk).
	GGUFMaxMetadataBytes = 128 << 20
	// GGUFMaxKeys bounds the metadata key-value pairs (real files: about
	// fifty).
	GGUFMaxKeys = 1 << 16
	// GGUFMaxTensors bounds the tensor infos (real files: about a
	// thousand; GGUF stores a mixture's experts fused).
	GGUFMaxTensors = 1 << 16
)

// ggufLimits are the caps one read applies; ReadGGUF uses
// defaultGGUFLimits, tests smaller ones to reach each cap with a small
// file.
type ggufLimits struct {
	arrayLen, elements, arrays, bytes, keys, tensors uint64
}

// defaultGGUFLimits are the exported caps above.
var defaultGGUFLimits = ggufLimits{
	arrayLen: GGUFMaxArrayLen,
	elements: GGUFMaxMetadataElements,
	arrays:   GGUFMaxArrays,
	bytes:    GGUFMaxMetadataBytes,
	keys:     GGUFMaxKeys,
	tensors:  GGUFMaxTensors,
}

// In-memory cost of a decoded value, charged against GGUFMaxMetadataBytes.
const (
	// ggufStringCost is a Go string header.
	ggufStringCost = 16
	// ggufArrayCost is a GGUFArrayValue plus the boxed slice header its
	// Values holds.
	ggufArrayCost = 48
	// ggufKVCost is one key-value pair's share of Keys and Metadata (the
	// map entry, the boxed value) beside the key's own bytes.
	ggufKVCost = 64
)

// ErrGGUFLimit is wrapped by every refusal of a file over one of the caps
// above.
var ErrGGUFLimit = errors.New("over the reader's bound")

// ErrNotGGUF is returned for a file that does not start with the GGUF
// magic.
var ErrNotGGUF = errors.New("not a GGUF file")

// GGUFValueType is a metadata value's type (gguf_metadata_value_type).
type GGUFValueType uint32

// Metadata value types.
const (
	GGUFUint8   GGUFValueType = 0
	GGUFInt8    GGUFValueType = 1
	GGUFUint16  GGUFValueType = 2
	GGUFInt16   GGUFValueType = 3
	GGUFUint32  GGUFValueType = 4
	GGUFInt32   GGUFValueType = 5
	GGUFFloat32 GGUFValueType = 6
	GGUFBool    GGUFValueType = 7
	GGUFString  GGUFValueType = 8
	GGUFArray   GGUFValueType = 9
	GGUFUint64  GGUFValueType = 10
	GGUFInt64   GGUFValueType = 11
	GGUFFloat64 GGUFValueType = 12
)

// String names the type.
func (t GGUFValueType) String() string {
	switch t {
	case GGUFUint8:
		return "uint8"
	case GGUFInt8:
		return "int8"
	case GGUFUint16:
		return "uint16"
	case GGUFInt16:
		return "int16"
	case GGUFUint32:
		return "uint32"
	case GGUFInt32:
		return "int32"
	case GGUFFloat32:
		return "float32"
	case GGUFBool:
		return "bool"
	case GGUFString:
		return "string"
	case GGUFArray:
		return "array"
	case GGUFUint64:
		return "uint64"
	case GGUFInt64:
		return "int64"
	case GGUFFloat64:
		return "float64"
	}
	return fmt.Sprintf("value_type_%d", uint32(t))
}

// fixedSize is the encoded size of a scalar type, 0 for string and array,
// -1 for an unknown type.
func (t GGUFValueType) fixedSize() int {
	switch t {
	case GGUFUint8, GGUFInt8, GGUFBool:
		return 1
	case GGUFUint16, GGUFInt16:
		return 2
	case GGUFUint32, GGUFInt32, GGUFFloat32:
		return 4
	case GGUFUint64, GGUFInt64, GGUFFloat64:
		return 8
	case GGUFString, GGUFArray:
		return 0
	}
	return -1
}

// minSize is the smallest encoding of one value of the type (a string is
// at least its 8-byte length, an array its 12-byte header).
func (t GGUFValueType) minSize() int {
	switch t {
	case GGUFString:
		return 8
	case GGUFArray:
		return 12
	}
	return t.fixedSize()
}

// GGUFValue is one metadata value. Value holds, by Type: uint8, int8,
// uint16, int16, uint32, int32, float32, bool, string, uint64, int64,
// float64, or a GGUFArrayValue.
type GGUFValue struct {
	Type  GGUFValueType
	Value any
}

// GGUFArrayValue is an array value. Values is a typed slice: []uint8,
// []int8, []uint16, []int16, []uint32, []int32, []float32, []bool,
// []string, []uint64, []int64, []float64, or []GGUFArrayValue for nested
// arrays.
type GGUFArrayValue struct {
	ElemType GGUFValueType
	Values   any
}

// Len is the number of elements.
func (a GGUFArrayValue) Len() int {
	switch v := a.Values.(type) {
	case []uint8:
		return len(v)
	case []int8:
		return len(v)
	case []uint16:
		return len(v)
	case []int16:
		return len(v)
	case []uint32:
		return len(v)
	case []int32:
		return len(v)
	case []float32:
		return len(v)
	case []bool:
		return len(v)
	case []string:
		return len(v)
	case []uint64:
		return len(v)
	case []int64:
		return len(v)
	case []float64:
		return len(v)
	case []GGUFArrayValue:
		return len(v)
	}
	return 0
}

// Ints returns an integer array's elements as int64 (false for other
// element types or an element over the int64 range).
func (a GGUFArrayValue) Ints() ([]int64, bool) {
	n := a.Len()
	out := make([]int64, 0, n)
	for i := 0; i < n; i++ {
		var v any
		switch s := a.Values.(type) {
		case []uint8:
			v = s[i]
		case []int8:
			v = s[i]
		case []uint16:
			v = s[i]
		case []int16:
			v = s[i]
		case []uint32:
			v = s[i]
		case []int32:
			v = s[i]
		case []uint64:
			v = s[i]
		case []int64:
			v = s[i]
		default:
			return nil, false
		}
		x, ok := asInt64(v)
		if !ok {
			return nil, false
		}
		out = append(out, x)
	}
	return out, true
}

// GGMLType is a tensor's element type (ggml_type).
type GGMLType uint32

// GGMLTypeInfo is the block layout of a ggml type: BlockSize elements take
// TypeSize bytes.
type GGMLTypeInfo struct {
	Name      string
	BlockSize uint64
	TypeSize  uint64
}

// ggmlTypes are the live ggml types (llama.cpp gguf-py constants.py); ids
// 4, 5, 31–33 and 36–38 were removed.
var ggmlTypes = map[GGMLType]GGMLTypeInfo{
	0:  {"F32", 1, 4},
	1:  {"F16", 1, 2},
	2:  {"Q4_0", 32, 18},
	3:  {"Q4_1", 32, 20},
	6:  {"Q5_0", 32, 22},
	7:  {"Q5_1", 32, 24},
	8:  {"Q8_0", 32, 34},
	9:  {"Q8_1", 32, 40},
	10: {"Q2_K", 256, 84},
	11: {"Q3_K", 256, 110},
	12: {"Q4_K", 256, 144},
	13: {"Q5_K", 256, 176},
	14: {"Q6_K", 256, 210},
	15: {"Q8_K", 256, 292},
	16: {"IQ2_XXS", 256, 66},
	17: {"IQ2_XS", 256, 74},
	18: {"IQ3_XXS", 256, 98},
	19: {"IQ1_S", 256, 50},
	20: {"IQ4_NL", 32, 18},
	21: {"IQ3_S", 256, 110},
	22: {"IQ2_S", 256, 82},
	23: {"IQ4_XS", 256, 136},
	24: {"I8", 1, 1},
	25: {"I16", 1, 2},
	26: {"I32", 1, 4},
	27: {"I64", 1, 8},
	28: {"F64", 1, 8},
	29: {"IQ1_M", 256, 56},
	30: {"BF16", 1, 2},
	34: {"TQ1_0", 256, 54},
	35: {"TQ2_0", 256, 66},
	39: {"MXFP4", 32, 17},
}

// Info returns the type's block layout; false for an unknown or removed
// type.
func (t GGMLType) Info() (GGMLTypeInfo, bool) {
	info, ok := ggmlTypes[t]
	return info, ok
}

// String is the type's name ("Q4_K"), or "type_<id>" when unknown.
func (t GGMLType) String() string {
	if info, ok := ggmlTypes[t]; ok {
		return info.Name
	}
	return fmt.Sprintf("type_%d", uint32(t))
}

// GGMLTypeByName finds a type by its name, case-insensitively ("f16",
// "q8_0"): how llama.cpp's --cache-type-k names the KV cache type.
func GGMLTypeByName(name string) (GGMLType, bool) {
	for id, info := range ggmlTypes {
		if strings.EqualFold(info.Name, name) {
			return id, true
		}
	}
	return 0, false
}

// RowBytes is the size of n elements of the type; false when the type is
// unknown or n is not a whole number of blocks.
func (t GGMLType) RowBytes(n uint64) (uint64, bool) {
	info, ok := ggmlTypes[t]
	if !ok || n%info.BlockSize != 0 {
		return 0, false
	}
	blocks := n / info.BlockSize
	if blocks != 0 && info.TypeSize > math.MaxUint64/blocks {
		return 0, false
	}
	return blocks * info.TypeSize, true
}

// GGUFTensorInfo describes one tensor.
type GGUFTensorInfo struct {
	Name string
	// Dims are listed innermost (fastest-varying) first.
	Dims []uint64
	Type GGMLType
	// Offset is relative to the start of the tensor data.
	Offset uint64
	// Bytes is the tensor's size from its type and dimensions.
	Bytes uint64
}

// Elements is the product of the dimensions.
func (ti GGUFTensorInfo) Elements() uint64 {
	n := uint64(1)
	for _, d := range ti.Dims {
		n *= d
	}
	return n
}

// GGUFFile is a GGUF file's header: metadata and tensor infos.
type GGUFFile struct {
	Version uint32
	// Keys are the metadata keys in file order.
	Keys     []string
	Metadata map[string]GGUFValue
	Tensors  []GGUFTensorInfo
	// Alignment is general.alignment or GGUFDefaultAlignment.
	Alignment uint64
	// DataOffset is where the tensor data starts in the file.
	DataOffset uint64
	// Size is the file's size.
	Size uint64
}

// ReadGGUFFile reads the header of the GGUF file at path.
func ReadGGUFFile(path string) (*GGUFFile, error) {
	return readFile(path, "gguf", ReadGGUF)
}

// readFile opens path and reads it with read, which is given the file's
// size; read's errors name the format and the path.
func readFile[T any](path, format string, read func(io.Reader, int64) (T, error)) (T, error) {
	var zero T
	f, err := os.Open(path)
	if err != nil {
		return zero, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return zero, err
	}
	v, err := read(f, st.Size())
	if err != nil {
		return zero, fmt.Errorf("read %s %s: %w", format, path, err)
	}
	return v, nil
}

// ReadGGUF reads a GGUF header from r, whose whole size is size. Every
// length and count is checked against what is left of size before anything
// is allocated for it; the tensors must lie inside the file.
// Whatever the size, the metadata is bounded by the GGUFMax* caps, and a
// file over one is refused (ErrGGUFLimit) before anything is allocated for
// what is over.
func ReadGGUF(r io.Reader, size int64) (*GGUFFile, error) {
	return readGGUF(r, size, defaultGGUFLimits)
}

// readGGUF is ReadGGUF under the given caps.
func readGGUF(r io.Reader, size int64, lim ggufLimits) (*GGUFFile, error) {
	if size < 0 {
		return nil, errors.New("negative size")
	}
	d := &ggufDecoder{r: bufio.NewReaderSize(io.LimitReader(r, size), 64<<10), left: uint64(size), lim: lim}
	magic, err := d.u32()
	if err != nil {
		return nil, ErrNotGGUF
	}
	if magic != GGUFMagic {
		return nil, ErrNotGGUF
	}
	g := &GGUFFile{Metadata: map[string]GGUFValue{}, Size: uint64(size), Alignment: GGUFDefaultAlignment}
	if g.Version, err = d.u32(); err != nil {
		return nil, d.wrap("version", err)
	}
	var nTensors, nKV uint64
	switch g.Version {
	case 1:
		// Version 1 used 32-bit counts and lengths.
		d.v1 = true
		a, err1 := d.u32()
		b, err2 := d.u32()
		if err := errors.Join(err1, err2); err != nil {
			return nil, d.wrap("counts", err)
		}
		nTensors, nKV = uint64(a), uint64(b)
	case 2, 3:
		a, err1 := d.u64()
		b, err2 := d.u64()
		if err := errors.Join(err1, err2); err != nil {
			return nil, d.wrap("counts", err)
		}
		nTensors, nKV = a, b
	default:
		return nil, fmt.Errorf("unsupported gguf version %d", g.Version)
	}
	// A key-value pair takes at least 8+1+4+1 bytes, a tensor info 8+1+4+4+8.
	if nKV > d.left/14 {
		return nil, fmt.Errorf("metadata count %d does not fit in %d bytes", nKV, size)
	}
	if nTensors > d.left/25 {
		return nil, fmt.Errorf("tensor count %d does not fit in %d bytes", nTensors, size)
	}
	if nTensors > lim.tensors {
		return nil, fmt.Errorf("%d tensors: %w of %d tensors", nTensors, ErrGGUFLimit, lim.tensors)
	}
	if nKV > lim.keys {
		return nil, fmt.Errorf("%d metadata keys: %w of %d keys", nKV, ErrGGUFLimit, lim.keys)
	}
	g.Keys = make([]string, 0, min(nKV, ggufPrealloc))
	for i := uint64(0); i < nKV; i++ {
		key, err := d.str()
		if err != nil {
			return nil, d.wrap(fmt.Sprintf("metadata key %d", i), err)
		}
		if len(key) > ggufMaxKeyLen {
			return nil, fmt.Errorf("metadata key %d is %d bytes long", i, len(key))
		}
		if _, dup := g.Metadata[key]; dup {
			return nil, fmt.Errorf("metadata key %q is repeated", key)
		}
		if err := d.charge(ggufKVCost); err != nil {
			return nil, d.wrap("metadata "+key, err)
		}
		t, err := d.u32()
		if err != nil {
			return nil, d.wrap("metadata "+key, err)
		}
		v, err := d.value(GGUFValueType(t), 0)
		if err != nil {
			return nil, d.wrap("metadata "+key, err)
		}
		g.Keys = append(g.Keys, key)
		g.Metadata[key] = GGUFValue{Type: GGUFValueType(t), Value: v}
	}
	if v, ok := g.Metadata["general.alignment"]; ok {
		a, ok := asUint64(v.Value)
		if !ok || a == 0 || a%8 != 0 || a > 1<<20 {
			return nil, fmt.Errorf("general.alignment %v is not a multiple of 8", v.Value)
		}
		g.Alignment = a
	}
	g.Tensors = make([]GGUFTensorInfo, 0, min(nTensors, ggufPrealloc))
	for i := uint64(0); i < nTensors; i++ {
		ti, err := d.tensorInfo()
		if err != nil {
			return nil, d.wrap(fmt.Sprintf("tensor info %d", i), err)
		}
		if err := d.charge(8 * uint64(len(ti.Dims))); err != nil {
			return nil, d.wrap(fmt.Sprintf("tensor info %d", i), err)
		}
		g.Tensors = append(g.Tensors, ti)
	}
	g.DataOffset = alignUp(d.off, g.Alignment)
	if g.DataOffset > g.Size {
		return nil, fmt.Errorf("tensor data starts at %d, past the end of the file (%d bytes)", g.DataOffset, g.Size)
	}
	dataLen := g.Size - g.DataOffset
	for _, ti := range g.Tensors {
		if ti.Offset%g.Alignment != 0 {
			return nil, fmt.Errorf("tensor %q: offset %d is not aligned to %d", ti.Name, ti.Offset, g.Alignment)
		}
		if ti.Offset > dataLen || ti.Bytes > dataLen-ti.Offset {
			return nil, fmt.Errorf("tensor %q: %d bytes at offset %d lie outside the %d bytes of tensor data (truncated file?)", ti.Name, ti.Bytes, ti.Offset, dataLen)
		}
	}
	return g, nil
}

// alignUp rounds o up to a multiple of a.
func alignUp(o, a uint64) uint64 { return o + (a-o%a)%a }

// ggufDecoder reads little-endian values, counting what is left.
type ggufDecoder struct {
	r    *bufio.Reader
	off  uint64
	left uint64
	v1   bool
	buf  [8]byte
	// scratch carries string bytes from r into the string being built.
	scratch [4096]byte
	lim     ggufLimits
	// mem, elems and arrays are what the metadata read so far holds,
	// against lim's bytes, elements and arrays.
	mem, elems, arrays uint64
}

// charge counts n more bytes of decoded metadata, refusing the file past
// GGUFMaxMetadataBytes. IMPORTANT: charge before allocating.
func (d *ggufDecoder) charge(n uint64) error {
	if n > d.lim.bytes-d.mem {
		return fmt.Errorf("metadata of more than %d bytes: %w", d.lim.bytes, ErrGGUFLimit)
	}
	d.mem += n
	return nil
}

// errTruncated is the cause of every read past the end.
var errTruncated = errors.New("unexpected end of file")

func (d *ggufDecoder) wrap(what string, err error) error {
	return fmt.Errorf("%s (at byte %d): %w", what, d.off, err)
}

func (d *ggufDecoder) read(n int) ([]byte, error) {
	if uint64(n) > d.left {
		return nil, errTruncated
	}
	b := d.buf[:n]
	if _, err := io.ReadFull(d.r, b); err != nil {
		return nil, errTruncated
	}
	d.off += uint64(n)
	d.left -= uint64(n)
	return b, nil
}

func (d *ggufDecoder) u8() (uint8, error) {
	b, err := d.read(1)
	if err != nil {
		return 0, err
	}
	return b[0], nil
}

func (d *ggufDecoder) u16() (uint16, error) {
	b, err := d.read(2)
	if err != nil {
		return 0, err
	}
	return binary.LittleEndian.Uint16(b), nil
}

func (d *ggufDecoder) u32() (uint32, error) {
	b, err := d.read(4)
	if err != nil {
		return 0, err
	}
	return binary.LittleEndian.Uint32(b), nil
}

func (d *ggufDecoder) u64() (uint64, error) {
	b, err := d.read(8)
	if err != nil {
		return 0, err
	}
	return binary.LittleEndian.Uint64(b), nil
}

// count reads a length or count (32-bit in version 1).
func (d *ggufDecoder) count() (uint64, error) {
	if d.v1 {
		v, err := d.u32()
		return uint64(v), err
	}
	return d.u64()
}

// str reads a gguf_string, refusing a length beyond the file; every
// string (key, value, tensor name) is charged to the metadata bytes.
func (d *ggufDecoder) str() (string, error) {
	n, err := d.count()
	if err != nil {
		return "", err
	}
	if n > d.left {
		return "", fmt.Errorf("string of %d bytes with %d bytes left: %w", n, d.left, errTruncated)
	}
	if n > ggufMaxString {
		return "", fmt.Errorf("string of %d bytes is longer than %d", n, ggufMaxString)
	}
	if err := d.charge(ggufStringCost + n); err != nil {
		return "", err
	}
	// One allocation, the string's own: the bytes pass through the
	// decoder's scratch buffer.
	var b strings.Builder
	b.Grow(int(n))
	for rest := n; rest > 0; {
		chunk := d.scratch[:min(rest, uint64(len(d.scratch)))]
		if _, err := io.ReadFull(d.r, chunk); err != nil {
			return "", errTruncated
		}
		b.Write(chunk)
		rest -= uint64(len(chunk))
	}
	d.off += n
	d.left -= n
	return b.String(), nil
}

// value reads one value of type t.
func (d *ggufDecoder) value(t GGUFValueType, depth int) (any, error) {
	switch t {
	case GGUFUint8:
		return d.u8()
	case GGUFInt8:
		v, err := d.u8()
		return int8(v), err
	case GGUFUint16:
		return d.u16()
	case GGUFInt16:
		v, err := d.u16()
		return int16(v), err
	case GGUFUint32:
		return d.u32()
	case GGUFInt32:
		v, err := d.u32()
		return int32(v), err
	case GGUFFloat32:
		v, err := d.u32()
		return math.Float32frombits(v), err
	case GGUFBool:
		v, err := d.u8()
		if err == nil && v > 1 {
			return nil, fmt.Errorf("bool value %d is neither 0 nor 1", v)
		}
		return v == 1, err
	case GGUFString:
		return d.str()
	case GGUFArray:
		return d.array(depth + 1)
	case GGUFUint64:
		return d.u64()
	case GGUFInt64:
		v, err := d.u64()
		return int64(v), err
	case GGUFFloat64:
		v, err := d.u64()
		return math.Float64frombits(v), err
	}
	return nil, fmt.Errorf("unknown value type %d", uint32(t))
}

// array reads an array header and its elements into a typed slice.
func (d *ggufDecoder) array(depth int) (GGUFArrayValue, error) {
	if depth > ggufMaxNesting {
		return GGUFArrayValue{}, fmt.Errorf("arrays nested deeper than %d: %w", ggufMaxNesting, ErrGGUFLimit)
	}
	et, err := d.u32()
	if err != nil {
		return GGUFArrayValue{}, err
	}
	t := GGUFValueType(et)
	n, err := d.count()
	if err != nil {
		return GGUFArrayValue{}, err
	}
	minSize := t.minSize()
	if minSize < 0 {
		return GGUFArrayValue{}, fmt.Errorf("array of unknown value type %d", et)
	}
	if n > d.left/uint64(minSize) {
		return GGUFArrayValue{}, fmt.Errorf("array of %d %s does not fit in the %d bytes left: %w", n, t, d.left, errTruncated)
	}
	// Every cap is checked on the header's claim, before the elements are
	// read or anything is allocated for them.
	if n > d.lim.arrayLen {
		return GGUFArrayValue{}, fmt.Errorf("array of %d %s: %w of %d elements per array", n, t, ErrGGUFLimit, d.lim.arrayLen)
	}
	if d.arrays++; d.arrays > d.lim.arrays {
		return GGUFArrayValue{}, fmt.Errorf("more than %d arrays: %w", d.lim.arrays, ErrGGUFLimit)
	}
	if n > d.lim.elements-d.elems {
		return GGUFArrayValue{}, fmt.Errorf("more than %d array elements in all: %w", d.lim.elements, ErrGGUFLimit)
	}
	d.elems += n
	// Fixed-size elements are charged here at their in-memory size; strings
	// as they are read (their length is known only then), arrays in
	// their own header.
	if err := d.charge(ggufArrayCost + n*uint64(max(t.fixedSize(), 0))); err != nil {
		return GGUFArrayValue{}, err
	}
	out := GGUFArrayValue{ElemType: t}
	switch t {
	case GGUFUint8:
		out.Values, err = readFixed(d, n, func(b []byte) uint8 { return b[0] }, 1)
	case GGUFInt8:
		out.Values, err = readFixed(d, n, func(b []byte) int8 { return int8(b[0]) }, 1)
	case GGUFUint16:
		out.Values, err = readFixed(d, n, binary.LittleEndian.Uint16, 2)
	case GGUFInt16:
		out.Values, err = readFixed(d, n, func(b []byte) int16 { return int16(binary.LittleEndian.Uint16(b)) }, 2)
	case GGUFUint32:
		out.Values, err = readFixed(d, n, binary.LittleEndian.Uint32, 4)
	case GGUFInt32:
		out.Values, err = readFixed(d, n, func(b []byte) int32 { return int32(binary.LittleEndian.Uint32(b)) }, 4)
	case GGUFFloat32:
		out.Values, err = readFixed(d, n, func(b []byte) float32 { return math.Float32frombits(binary.LittleEndian.Uint32(b)) }, 4)
	case GGUFBool:
		out.Values, err = readFixed(d, n, func(b []byte) bool { return b[0] != 0 }, 1)
	case GGUFUint64:
		out.Values, err = readFixed(d, n, binary.LittleEndian.Uint64, 8)
	case GGUFInt64:
		out.Values, err = readFixed(d, n, func(b []byte) int64 { return int64(binary.LittleEndian.Uint64(b)) }, 8)
	case GGUFFloat64:
		out.Values, err = readFixed(d, n, func(b []byte) float64 { return math.Float64frombits(binary.LittleEndian.Uint64(b)) }, 8)
	case GGUFString:
		s := make([]string, 0, min(n, ggufPrealloc))
		for i := uint64(0); i < n; i++ {
			v, err := d.str()
			if err != nil {
				return GGUFArrayValue{}, fmt.Errorf("element %d: %w", i, err)
			}
			s = appendCounted(s, v, n)
		}
		out.Values = s
	case GGUFArray:
		s := make([]GGUFArrayValue, 0, min(n, ggufPrealloc))
		for i := uint64(0); i < n; i++ {
			v, err := d.array(depth + 1)
			if err != nil {
				return GGUFArrayValue{}, fmt.Errorf("element %d: %w", i, err)
			}
			s = appendCounted(s, v, n)
		}
		out.Values = s
	}
	return out, err
}

// appendCounted appends v to s, which is to hold n elements in all: when
// full it doubles (up to n) rather than growing by append's 1.25x steps for
// large slices, so a slice read to n elements has allocated at most twice
// its final size rather than five times.
func appendCounted[T any](s []T, v T, n uint64) []T {
	if len(s) == cap(s) {
		s = slices.Grow(s, int(min(uint64(max(cap(s), 1)), n-uint64(len(s)))))
	}
	return append(s, v)
}

// readFixed reads n fixed-size elements; n was checked against the bytes
// left.
func readFixed[T any](d *ggufDecoder, n uint64, conv func([]byte) T, size int) ([]T, error) {
	out := make([]T, 0, min(n, ggufPrealloc))
	for i := uint64(0); i < n; i++ {
		b, err := d.read(size)
		if err != nil {
			return nil, err
		}
		out = appendCounted(out, conv(b), n)
	}
	return out, nil
}

// tensorInfo reads one tensor info and computes its size.
func (d *ggufDecoder) tensorInfo() (GGUFTensorInfo, error) {
	var ti GGUFTensorInfo
	var err error
	if ti.Name, err = d.str(); err != nil {
		return ti, err
	}
	nd, err := d.u32()
	if err != nil {
		return ti, err
	}
	if nd > ggufMaxDims {
		return ti, fmt.Errorf("tensor %q has %d dimensions", ti.Name, nd)
	}
	ti.Dims = make([]uint64, 0, nd)
	elems := uint64(1)
	for i := uint32(0); i < nd; i++ {
		v, err := d.count()
		if err != nil {
			return ti, err
		}
		if v != 0 && elems > math.MaxUint64/v {
			return ti, fmt.Errorf("tensor %q: element count overflows", ti.Name)
		}
		elems *= v
		ti.Dims = append(ti.Dims, v)
	}
	t, err := d.u32()
	if err != nil {
		return ti, err
	}
	ti.Type = GGMLType(t)
	if ti.Offset, err = d.u64(); err != nil {
		return ti, err
	}
	if _, ok := ti.Type.Info(); !ok {
		return ti, fmt.Errorf("tensor %q has unknown ggml type %d", ti.Name, t)
	}
	var rowLen uint64 = 1
	if len(ti.Dims) > 0 {
		rowLen = ti.Dims[0]
	}
	info, _ := ti.Type.Info()
	if rowLen%info.BlockSize != 0 {
		return ti, fmt.Errorf("tensor %q: row of %d elements is not a whole number of %s blocks (%d)", ti.Name, rowLen, info.Name, info.BlockSize)
	}
	b, ok := ti.Type.RowBytes(elems)
	if !ok {
		return ti, fmt.Errorf("tensor %q: size overflows", ti.Name)
	}
	ti.Bytes = b
	return ti, nil
}

// asUint64 converts a non-negative integer value.
func asUint64(v any) (uint64, bool) {
	x, ok := asInt64(v)
	if ok && x >= 0 {
		return uint64(x), true
	}
	if u, ok := v.(uint64); ok {
		return u, true
	}
	return 0, false
}

// asInt64 converts any integer value that fits int64.
func asInt64(v any) (int64, bool) {
	switch x := v.(type) {
	case uint8:
		return int64(x), true
	case int8:
		return int64(x), true
	case uint16:
		return int64(x), true
	case int16:
		return int64(x), true
	case uint32:
		return int64(x), true
	case int32:
		return int64(x), true
	case uint64:
		if x > math.MaxInt64 {
			return 0, false
		}
		return int64(x), true
	case int64:
		return x, true
	}
	return 0, false
}

// String returns a string value; false when absent or of another type.
func (g *GGUFFile) String(key string) (string, bool) {
	v, ok := g.Metadata[key]
	if !ok {
		return "", false
	}
	s, ok := v.Value.(string)
	return s, ok
}

// Uint returns an integer value of any width and signedness (writers use
// uint32 or uint64 for counts); false when absent, negative or not an
// integer.
func (g *GGUFFile) Uint(key string) (uint64, bool) {
	v, ok := g.Metadata[key]
	if !ok {
		return 0, false
	}
	return asUint64(v.Value)
}

// Float returns a float value (or an integer one as a float).
func (g *GGUFFile) Float(key string) (float64, bool) {
	v, ok := g.Metadata[key]
	if !ok {
		return 0, false
	}
	switch x := v.Value.(type) {
	case float32:
		return float64(x), true
	case float64:
		return x, true
	}
	if i, ok := asInt64(v.Value); ok {
		return float64(i), true
	}
	return 0, false
}

// Architecture is general.architecture ("llama").
func (g *GGUFFile) Architecture() string {
	s, _ := g.String("general.architecture")
	return s
}

// Name is general.name, when set.
func (g *GGUFFile) Name() string {
	s, _ := g.String("general.name")
	return s
}

// archUint reads "<arch>.<suffix>".
func (g *GGUFFile) archUint(suffix string) (uint64, bool) {
	return g.Uint(g.Architecture() + "." + suffix)
}

// ContextLength is <arch>.context_length: the window the model was
// trained with (0 when absent).
func (g *GGUFFile) ContextLength() uint64 {
	v, _ := g.archUint("context_length")
	return v
}

// BlockCount is <arch>.block_count: the number of layers.
func (g *GGUFFile) BlockCount() uint64 {
	v, _ := g.archUint("block_count")
	return v
}

// EmbeddingLength is <arch>.embedding_length (n_embd).
func (g *GGUFFile) EmbeddingLength() uint64 {
	v, _ := g.archUint("embedding_length")
	return v
}

// layerValues reads a per-layer count that is either one integer or an
// array with one entry per layer.
func (g *GGUFFile) layerValues(suffix string) ([]uint64, bool) {
	v, ok := g.Metadata[g.Architecture()+"."+suffix]
	if !ok {
		return nil, false
	}
	n := g.BlockCount()
	if arr, ok := v.Value.(GGUFArrayValue); ok {
		xs, ok := arr.Ints()
		if !ok || uint64(len(xs)) != n {
			return nil, false
		}
		out := make([]uint64, len(xs))
		for i, x := range xs {
			if x < 0 {
				return nil, false
			}
			out[i] = uint64(x)
		}
		return out, true
	}
	x, ok := asUint64(v.Value)
	if !ok || n > 1<<20 {
		return nil, false
	}
	out := make([]uint64, n)
	for i := range out {
		out[i] = x
	}
	return out, true
}

// HeadCount is attention.head_count (of the first layer when per layer).
func (g *GGUFFile) HeadCount() uint64 {
	if hs, ok := g.layerValues("attention.head_count"); ok && len(hs) > 0 {
		return hs[0]
	}
	return 0
}

// HeadCountKV is attention.head_count_kv (of the first layer when per
// layer), or HeadCount when absent (no grouped-query attention).
func (g *GGUFFile) HeadCountKV() uint64 {
	if hs, ok := g.layerValues("attention.head_count_kv"); ok && len(hs) > 0 {
		return hs[0]
	}
	return g.HeadCount()
}

// KeyLength is attention.key_length, or n_embd / n_head.
func (g *GGUFFile) KeyLength() uint64 {
	if v, ok := g.archUint("attention.key_length"); ok {
		return v
	}
	if h := g.HeadCount(); h > 0 {
		return g.EmbeddingLength() / h
	}
	return 0
}

// ValueLength is attention.value_length, or n_embd / n_head.
func (g *GGUFFile) ValueLength() uint64 {
	if v, ok := g.archUint("attention.value_length"); ok {
		return v
	}
	if h := g.HeadCount(); h > 0 {
		return g.EmbeddingLength() / h
	}
	return 0
}

// FileType is general.file_type (0 all F32, 1 mostly F16, ...), -1 when
// absent.
func (g *GGUFFile) FileType() int64 {
	if v, ok := g.Uint("general.file_type"); ok && v <= math.MaxInt32 {
		return int64(v)
	}
	return -1
}

// WeightsBytes is the sum of every tensor's size: what loading the model
// holds in memory.
func (g *GGUFFile) WeightsBytes() uint64 {
	var n uint64
	for _, t := range g.Tensors {
		n += t.Bytes
	}
	return n
}

// Parameters is the sum of every tensor's elements.
func (g *GGUFFile) Parameters() uint64 {
	var n uint64
	for _, t := range g.Tensors {
		n += t.Elements()
	}
	return n
}

// TensorTypes counts the tensors of each ggml type, by name.
func (g *GGUFFile) TensorTypes() map[string]int {
	out := map[string]int{}
	for _, t := range g.Tensors {
		out[t.Type.String()]++
	}
	return out
}

// KVBytesPerToken is what llama.cpp's KV cache holds per token of context
// when K and V are stored as kvType (F16 by default): for every layer,
// n_head_kv × key_length elements of K and n_head_kv × value_length of V.
// It is false when the header lacks what the formula needs or kvType's
// blocks do not divide a row.
func (g *GGUFFile) KVBytesPerToken(kvType GGMLType) (uint64, bool) {
	layers := g.BlockCount()
	if layers == 0 {
		return 0, false
	}
	kvHeads, ok := g.layerValues("attention.head_count_kv")
	if !ok {
		kvHeads, ok = g.layerValues("attention.head_count")
		if !ok {
			return 0, false
		}
	}
	kLen, vLen := g.KeyLength(), g.ValueLength()
	if kLen == 0 || vLen == 0 {
		return 0, false
	}
	var total uint64
	for _, h := range kvHeads {
		k, ok1 := kvType.RowBytes(h * kLen)
		v, ok2 := kvType.RowBytes(h * vLen)
		if !ok1 || !ok2 {
			return 0, false
		}
		total += k + v
	}
	return total, true
}

// SortedKeys returns the metadata keys sorted, for stable output.
func (g *GGUFFile) SortedKeys() []string {
	keys := append([]string(nil), g.Keys...)
	sort.Strings(keys)
	return keys
}
