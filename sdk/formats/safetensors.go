// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package formats

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

// SafetensorsMaxHeader bounds a safetensors JSON header (the reference
// implementation refuses headers over 100 MB).
const SafetensorsMaxHeader = 100 << 20

// Bounds on what a header holds, whatever its size: the header's bytes are
// read whole (at most SafetensorsMaxHeader), and nothing decoded from them
// grows past these caps.
const (
	// SafetensorsMaxTensors bounds the tensors of one file. The largest
	// real checkpoints (unfused mixtures of experts with quantization
	// scales) have under 300,000 tensors in all, split across shards.
	SafetensorsMaxTensors = 1 << 20
	// SafetensorsMaxRank bounds a tensor's shape.
	SafetensorsMaxRank = 16
	// SafetensorsMaxMetadata bounds the "__metadata__" entries (writers
	// store a handful; training tools a few hundred).
	SafetensorsMaxMetadata = 1 << 14
)

// ErrSafetensorsLimit is wrapped by every refusal of a header over one of
// the caps above.
var ErrSafetensorsLimit = errors.New("over the reader's bound")

// safetensorsLimits are the caps one read applies; tests lower them to
// reach each with a small header.
type safetensorsLimits struct {
	tensors, metadata int
}

// defaultSafetensorsLimits are the exported caps.
var defaultSafetensorsLimits = safetensorsLimits{tensors: SafetensorsMaxTensors, metadata: SafetensorsMaxMetadata}

// SafetensorsIndexFile is the name of a sharded checkpoint's index.
const SafetensorsIndexFile = "model.safetensors.index.json"

// safetensorsMaxIndex bounds an index file.
const safetensorsMaxIndex = 64 << 20

// ErrNotSafetensors is returned for a file whose header is not a
// safetensors header.
var ErrNotSafetensors = errors.New("not a safetensors file")

// safetensorsBits is the size of one element of each dtype, in bits.
var safetensorsBits = map[string]uint64{
	"F64": 64, "F32": 32, "F16": 16, "BF16": 16,
	"I64": 64, "I32": 32, "I16": 16, "I8": 8,
	"U64": 64, "U32": 32, "U16": 16, "U8": 8,
	"BOOL": 8, "F8_E4M3": 8, "F8_E5M2": 8, "F8_E8M0": 8,
	"F6_E2M3": 6, "F6_E3M2": 6, "F4": 4,
}

// SafetensorsDTypeBits is the size of one element of a dtype in bits;
// false for a dtype the reader does not know.
func SafetensorsDTypeBits(dtype string) (uint64, bool) {
	b, ok := safetensorsBits[dtype]
	return b, ok
}

// SafetensorsTensor is one tensor of a safetensors header.
type SafetensorsTensor struct {
	Name  string
	DType string
	// Shape is in PyTorch order (outermost first).
	Shape []uint64
	// Begin and End are byte offsets into the data buffer (End exclusive).
	Begin, End uint64
}

// Bytes is the tensor's size in the file.
func (t SafetensorsTensor) Bytes() uint64 { return t.End - t.Begin }

// Elements is the product of the shape (1 for a scalar).
func (t SafetensorsTensor) Elements() uint64 {
	n := uint64(1)
	for _, d := range t.Shape {
		n *= d
	}
	return n
}

// KeptWhole reports whether every tensor-parallel rank holds the whole
// tensor rather than a shard of it: scalars and vectors (norms, biases of
// row-parallel layers, rotary frequencies) and the named small tensors
// engines replicate (layer norms, MoE router gates). It is the heuristic
// CapyCTL sizes a group member's share with.
func (t SafetensorsTensor) KeptWhole() bool {
	if len(t.Shape) <= 1 {
		return true
	}
	n := strings.ToLower(t.Name)
	for _, s := range []string{"norm", "layernorm", "ln_", ".ln", "rotary", "inv_freq", ".mlp.gate.weight", "router", "e_score_correction"} {
		if strings.Contains(n, s) {
			return true
		}
	}
	return false
}

// SafetensorsHeader is a safetensors file's header.
type SafetensorsHeader struct {
	// Tensors are sorted by Begin.
	Tensors []SafetensorsTensor
	// Metadata is the "__metadata__" map, nil when absent.
	Metadata map[string]string
	// HeaderSize is N, the JSON header's length; the data starts at 8+N.
	HeaderSize uint64
	// DataSize is the data buffer's length.
	DataSize uint64
}

// WeightsBytes is the sum of the tensors' sizes.
func (h *SafetensorsHeader) WeightsBytes() uint64 {
	var n uint64
	for _, t := range h.Tensors {
		n += t.Bytes()
	}
	return n
}

// WholeBytes is the size of the tensors every rank keeps whole.
func (h *SafetensorsHeader) WholeBytes() uint64 {
	var n uint64
	for _, t := range h.Tensors {
		if t.KeptWhole() {
			n += t.Bytes()
		}
	}
	return n
}

// ReadSafetensorsFile reads the header of the safetensors file at path and
// checks it against the file's size.
func ReadSafetensorsFile(path string) (*SafetensorsHeader, error) {
	return readFile(path, "safetensors", ReadSafetensors)
}

// ReadSafetensors reads a safetensors header from r, whose whole size is
// size. The header must be a JSON object mapping each tensor to its dtype,
// shape and data offsets (plus an optional "__metadata__" string map), no
// key twice; each tensor's offsets must match its dtype and shape, and the
// tensors must fill the data buffer with no hole or overlap.
func ReadSafetensors(r io.Reader, size int64) (*SafetensorsHeader, error) {
	return readSafetensors(r, size, defaultSafetensorsLimits)
}

// readSafetensors is ReadSafetensors under the given caps.
func readSafetensors(r io.Reader, size int64, lim safetensorsLimits) (*SafetensorsHeader, error) {
	if size < 8 {
		return nil, fmt.Errorf("%w: %d bytes is shorter than the 8-byte header length", ErrNotSafetensors, size)
	}
	var lenBuf [8]byte
	if _, err := io.ReadFull(r, lenBuf[:]); err != nil {
		return nil, fmt.Errorf("%w: header length: %v", ErrNotSafetensors, err)
	}
	n := binary.LittleEndian.Uint64(lenBuf[:])
	if n > SafetensorsMaxHeader {
		return nil, fmt.Errorf("%w: header of %d bytes is over the %d-byte bound", ErrNotSafetensors, n, SafetensorsMaxHeader)
	}
	if n > uint64(size)-8 {
		return nil, fmt.Errorf("%w: header of %d bytes does not fit in %d bytes", ErrNotSafetensors, n, size)
	}
	if n < 2 {
		return nil, fmt.Errorf("%w: header of %d bytes", ErrNotSafetensors, n)
	}
	raw := make([]byte, n)
	if _, err := io.ReadFull(r, raw); err != nil {
		return nil, fmt.Errorf("%w: header: unexpected end of file", ErrNotSafetensors)
	}
	h, err := parseSafetensorsHeader(raw, lim)
	if err != nil {
		return nil, err
	}
	h.HeaderSize = n
	h.DataSize = uint64(size) - 8 - n
	if err := h.checkLayout(); err != nil {
		return nil, err
	}
	return h, nil
}

// ParseSafetensorsHeader parses the JSON header alone (without the 8-byte
// length). It checks each tensor on its own but not the buffer layout,
// which needs the file's size.
func ParseSafetensorsHeader(raw []byte) (*SafetensorsHeader, error) {
	return parseSafetensorsHeader(raw, defaultSafetensorsLimits)
}

// parseSafetensorsHeader is ParseSafetensorsHeader under the given caps.
func parseSafetensorsHeader(raw []byte, lim safetensorsLimits) (*SafetensorsHeader, error) {
	trimmed := bytes.TrimRight(raw, " ")
	if len(trimmed) == 0 || trimmed[0] != '{' {
		return nil, fmt.Errorf("%w: the header does not start with '{'", ErrNotSafetensors)
	}
	dec := json.NewDecoder(bytes.NewReader(trimmed))
	dec.UseNumber()
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return nil, fmt.Errorf("%w: the header is not a JSON object", ErrNotSafetensors)
	}
	h := &SafetensorsHeader{}
	seen := map[string]bool{}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, fmt.Errorf("%w: header JSON: %v", ErrNotSafetensors, err)
		}
		key, ok := tok.(string)
		if !ok {
			return nil, fmt.Errorf("%w: header JSON: a key is not a string", ErrNotSafetensors)
		}
		if seen[key] {
			return nil, fmt.Errorf("%w: key %q appears twice", ErrNotSafetensors, key)
		}
		seen[key] = true
		if key == "__metadata__" {
			md, err := decodeMetadata(dec, lim.metadata)
			if err != nil {
				return nil, err
			}
			h.Metadata = md
			continue
		}
		if len(h.Tensors) == lim.tensors {
			return nil, fmt.Errorf("%w: more than %d tensors: %w", ErrNotSafetensors, lim.tensors, ErrSafetensorsLimit)
		}
		var entry struct {
			DType       string    `json:"dtype"`
			Shape       jsonUints `json:"shape"`
			DataOffsets jsonUints `json:"data_offsets"`
		}
		entry.Shape.max, entry.DataOffsets.max = SafetensorsMaxRank, 2
		if err := dec.Decode(&entry); err != nil {
			if errors.Is(err, ErrSafetensorsLimit) {
				return nil, fmt.Errorf("%w: tensor %q: %w", ErrNotSafetensors, key, err)
			}
			return nil, fmt.Errorf("%w: tensor %q: %v", ErrNotSafetensors, key, err)
		}
		t, err := entryTensor(key, entry.DType, entry.Shape.v, entry.DataOffsets.v)
		if err != nil {
			return nil, err
		}
		h.Tensors = append(h.Tensors, t)
	}
	if _, err := dec.Token(); err != nil {
		return nil, fmt.Errorf("%w: header JSON: %v", ErrNotSafetensors, err)
	}
	if dec.More() {
		return nil, fmt.Errorf("%w: trailing data after the header object", ErrNotSafetensors)
	}
	sort.Slice(h.Tensors, func(i, j int) bool {
		if h.Tensors[i].Begin != h.Tensors[j].Begin {
			return h.Tensors[i].Begin < h.Tensors[j].Begin
		}
		return h.Tensors[i].End < h.Tensors[j].End
	})
	return h, nil
}

// decodeMetadata reads the "__metadata__" object, a map of strings to
// strings of at most max entries, token by token so that an oversized or
// ill-typed one is refused as soon as it is seen.
func decodeMetadata(dec *json.Decoder, max int) (map[string]string, error) {
	bad := func(err error) error {
		return fmt.Errorf("%w: __metadata__ must map strings to strings: %v", ErrNotSafetensors, err)
	}
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return nil, bad(fmt.Errorf("not an object (%v)", tok))
	}
	md := map[string]string{}
	for dec.More() {
		if len(md) == max {
			return nil, fmt.Errorf("%w: __metadata__ has more than %d entries: %w", ErrNotSafetensors, max, ErrSafetensorsLimit)
		}
		k, err := dec.Token()
		if err != nil {
			return nil, bad(err)
		}
		v, err := dec.Token()
		if err != nil {
			return nil, bad(err)
		}
		vs, ok := v.(string)
		if !ok {
			return nil, bad(fmt.Errorf("%q is not a string", k))
		}
		md[k.(string)] = vs
	}
	if _, err := dec.Token(); err != nil {
		return nil, bad(err)
	}
	return md, nil
}

// jsonUints is a JSON array of non-negative integers of at most max
// elements, refused past max before anything is allocated for them (a
// []json.Number would hold every element of a 100 MB shape first).
type jsonUints struct {
	max int
	v   []uint64
}

// UnmarshalJSON parses the array; the decoder has already checked that
// raw is valid JSON.
func (u *jsonUints) UnmarshalJSON(raw []byte) error {
	raw = bytes.TrimSpace(raw)
	if string(raw) == "null" {
		return nil // as encoding/json leaves a null slice: absent
	}
	if len(raw) < 2 || raw[0] != '[' || raw[len(raw)-1] != ']' {
		return fmt.Errorf("%s is not an array", truncateJSON(raw))
	}
	inner := bytes.TrimSpace(raw[1 : len(raw)-1])
	if len(inner) == 0 {
		u.v = []uint64{}
		return nil
	}
	if n := bytes.Count(inner, []byte(",")) + 1; n > u.max {
		return fmt.Errorf("an array of %d elements: %w of %d", n, ErrSafetensorsLimit, u.max)
	}
	for _, e := range bytes.Split(inner, []byte(",")) {
		v, err := parseUint(json.Number(bytes.TrimSpace(e)))
		if err != nil {
			return err
		}
		u.v = append(u.v, v)
	}
	return nil
}

// truncateJSON quotes at most 32 bytes of raw for an error.
func truncateJSON(raw []byte) string {
	if len(raw) > 32 {
		return fmt.Sprintf("%q...", raw[:32])
	}
	return fmt.Sprintf("%q", raw)
}

// entryTensor checks one header entry.
func entryTensor(name, dtype string, shape, offsets []uint64) (SafetensorsTensor, error) {
	t := SafetensorsTensor{Name: name, DType: dtype}
	bits, ok := safetensorsBits[dtype]
	if !ok {
		return t, fmt.Errorf("%w: tensor %q: unknown dtype %q", ErrNotSafetensors, name, dtype)
	}
	elems := uint64(1)
	for _, d := range shape {
		if d != 0 && elems > math.MaxUint64/d {
			return t, fmt.Errorf("%w: tensor %q: shape overflows", ErrNotSafetensors, name)
		}
		elems *= d
		t.Shape = append(t.Shape, d)
	}
	if len(offsets) != 2 {
		return t, fmt.Errorf("%w: tensor %q: data_offsets must be [begin, end]", ErrNotSafetensors, name)
	}
	t.Begin, t.End = offsets[0], offsets[1]
	if t.End < t.Begin {
		return t, fmt.Errorf("%w: tensor %q: data_offsets end %d before begin %d", ErrNotSafetensors, name, t.End, t.Begin)
	}
	if elems > math.MaxUint64/bits {
		return t, fmt.Errorf("%w: tensor %q: size overflows", ErrNotSafetensors, name)
	}
	want := (elems*bits + 7) / 8
	if t.End-t.Begin != want {
		return t, fmt.Errorf("%w: tensor %q: %s%v needs %d bytes, its offsets span %d", ErrNotSafetensors, name, dtype, t.Shape, want, t.End-t.Begin)
	}
	return t, nil
}

// parseUint reads a non-negative JSON integer.
func parseUint(n json.Number) (uint64, error) {
	s := n.String()
	var v uint64
	if s == "" {
		return 0, errors.New("empty number")
	}
	for _, c := range s {
		if c < '0' || c > '9' {
			return 0, fmt.Errorf("%q is not a non-negative integer", s)
		}
		d := uint64(c - '0')
		if v > (math.MaxUint64-d)/10 {
			return 0, fmt.Errorf("%q overflows", s)
		}
		v = v*10 + d
	}
	return v, nil
}

// checkLayout proves the tensors fill the data buffer exactly.
func (h *SafetensorsHeader) checkLayout() error {
	var at uint64
	for _, t := range h.Tensors {
		if t.Begin == t.End {
			continue // empty tensors take no room
		}
		switch {
		case t.Begin < at:
			return fmt.Errorf("%w: tensor %q overlaps the one before it", ErrNotSafetensors, t.Name)
		case t.Begin > at:
			return fmt.Errorf("%w: a hole of %d bytes before tensor %q", ErrNotSafetensors, t.Begin-at, t.Name)
		}
		at = t.End
	}
	if at != h.DataSize {
		if at > h.DataSize {
			return fmt.Errorf("%w: tensors end at byte %d of a %d-byte data buffer (truncated file?)", ErrNotSafetensors, at, h.DataSize)
		}
		return fmt.Errorf("%w: %d bytes after the last tensor", ErrNotSafetensors, h.DataSize-at)
	}
	return nil
}

// SafetensorsIndex is a sharded checkpoint's index
// (model.safetensors.index.json).
type SafetensorsIndex struct {
	// TotalSize is metadata.total_size, 0 when absent.
	TotalSize uint64
	// WeightMap maps each tensor to the shard file holding it.
	WeightMap map[string]string
	// Files are the shard files, sorted.
	Files []string
}

// ReadSafetensorsIndex reads and checks an index: every shard is a plain
// *.safetensors file name in the index's own directory.
func ReadSafetensorsIndex(path string) (*SafetensorsIndex, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	raw, err := io.ReadAll(io.LimitReader(f, safetensorsMaxIndex+1))
	if err != nil {
		return nil, err
	}
	if len(raw) > safetensorsMaxIndex {
		return nil, fmt.Errorf("index %s is over %d bytes", path, safetensorsMaxIndex)
	}
	idx, err := ParseSafetensorsIndex(raw)
	if err != nil {
		return nil, fmt.Errorf("index %s: %w", path, err)
	}
	return idx, nil
}

// ParseSafetensorsIndex parses an index file's content.
func ParseSafetensorsIndex(raw []byte) (*SafetensorsIndex, error) {
	var doc struct {
		Metadata  map[string]json.RawMessage `json:"metadata"`
		WeightMap map[string]string          `json:"weight_map"`
	}
	if err := json.Unmarshal(raw, &doc); err != nil {
		return nil, fmt.Errorf("parse: %w", err)
	}
	if len(doc.WeightMap) == 0 {
		return nil, errors.New("weight_map is empty")
	}
	idx := &SafetensorsIndex{WeightMap: doc.WeightMap}
	if ts, ok := doc.Metadata["total_size"]; ok {
		var n json.Number
		if err := json.Unmarshal(ts, &n); err == nil {
			// Some writers emit a float ("1.5e9"); keep what parses exactly.
			if v, err := parseUint(n); err == nil {
				idx.TotalSize = v
			} else if fv, err := n.Float64(); err == nil && fv >= 0 && fv < math.MaxUint64 {
				idx.TotalSize = uint64(fv)
			}
		}
	}
	files := map[string]bool{}
	for tensor, file := range doc.WeightMap {
		if file == "" || file != filepath.Base(file) || file == ".." || strings.ContainsAny(file, `/\`) || !strings.HasSuffix(file, ".safetensors") {
			return nil, fmt.Errorf("tensor %q names shard %q: a shard must be a .safetensors file beside the index", tensor, file)
		}
		files[file] = true
	}
	for f := range files {
		idx.Files = append(idx.Files, f)
	}
	sort.Strings(idx.Files)
	return idx, nil
}

// SafetensorsModel is a checkpoint directory's weights: one
// model.safetensors, a sharded set named by its index, or every
// *.safetensors file in the directory.
type SafetensorsModel struct {
	// Files are the weight files read, relative to the directory.
	Files []string
	// Headers are the files' headers, in the order of Files.
	Headers []*SafetensorsHeader
	// Index is the sharded index, nil without one.
	Index *SafetensorsIndex
}

// WeightsBytes is the sum of every tensor of every file.
func (m *SafetensorsModel) WeightsBytes() uint64 {
	var n uint64
	for _, h := range m.Headers {
		n += h.WeightsBytes()
	}
	return n
}

// WholeBytes is the size of the tensors every tensor-parallel rank keeps
// whole (see SafetensorsTensor.KeptWhole).
func (m *SafetensorsModel) WholeBytes() uint64 {
	var n uint64
	for _, h := range m.Headers {
		n += h.WholeBytes()
	}
	return n
}

// RankBytes is one rank's share of the weights at a tensor-parallel size:
// the sharded tensors divided (rounded up) plus the whole ones.
func (m *SafetensorsModel) RankBytes(tp int) uint64 {
	if tp < 1 {
		tp = 1
	}
	whole := m.WholeBytes()
	sharded := m.WeightsBytes() - whole
	return (sharded+uint64(tp)-1)/uint64(tp) + whole
}

// ReadSafetensorsDir reads the weights of a checkpoint directory: with an
// index, every shard it names, each of which must hold exactly the tensors
// the index maps to it; else every *.safetensors file. A directory without
// any is an error.
func ReadSafetensorsDir(dir string) (*SafetensorsModel, error) {
	m := &SafetensorsModel{}
	idxPath := filepath.Join(dir, SafetensorsIndexFile)
	if _, err := os.Stat(idxPath); err == nil {
		idx, err := ReadSafetensorsIndex(idxPath)
		if err != nil {
			return nil, err
		}
		m.Index = idx
		m.Files = idx.Files
	} else {
		matches, err := filepath.Glob(filepath.Join(dir, "*.safetensors"))
		if err != nil {
			return nil, err
		}
		for _, p := range matches {
			m.Files = append(m.Files, filepath.Base(p))
		}
		sort.Strings(m.Files)
	}
	if len(m.Files) == 0 {
		return nil, fmt.Errorf("no safetensors weights in %s", dir)
	}
	for _, f := range m.Files {
		h, err := ReadSafetensorsFile(filepath.Join(dir, f))
		if err != nil {
			return nil, err
		}
		m.Headers = append(m.Headers, h)
	}
	if m.Index != nil {
		if err := m.checkIndex(); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// checkIndex proves that the shards hold what the index says.
func (m *SafetensorsModel) checkIndex() error {
	inFile := map[string]string{}
	for i, h := range m.Headers {
		for _, t := range h.Tensors {
			if prev, dup := inFile[t.Name]; dup {
				return fmt.Errorf("tensor %q is in both %s and %s", t.Name, prev, m.Files[i])
			}
			inFile[t.Name] = m.Files[i]
		}
	}
	for tensor, file := range m.Index.WeightMap {
		got, ok := inFile[tensor]
		switch {
		case !ok:
			return fmt.Errorf("tensor %q of the index is in no shard (expected in %s)", tensor, file)
		case got != file:
			return fmt.Errorf("tensor %q is in %s, the index says %s", tensor, got, file)
		}
	}
	if len(inFile) != len(m.Index.WeightMap) {
		return fmt.Errorf("the shards hold %d tensors, the index names %d", len(inFile), len(m.Index.WeightMap))
	}
	return nil
}
