// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package pyengine

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
)

// MakeVenv writes a minimal environment under dir for tests and fakes:
// bin/python (a copy of interpreter, or an empty executable when it is
// ""), and one *.dist-info per name=version in dists, with any extra files
// (paths relative to site-packages). It returns the root.
func MakeVenv(dir, interpreter string, dists map[string]string, extra map[string]string) (string, error) {
	sp := filepath.Join(dir, "lib", "python3.12", "site-packages")
	if err := os.MkdirAll(filepath.Join(dir, "bin"), 0o755); err != nil {
		return "", err
	}
	py := filepath.Join(dir, "bin", "python")
	var data []byte
	if interpreter != "" {
		b, err := os.ReadFile(interpreter)
		if err != nil {
			return "", err
		}
		data = b
	}
	if err := os.WriteFile(py, data, 0o755); err != nil {
		return "", err
	}
	names := make([]string, 0, len(dists))
	for n := range dists {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, name := range names {
		ver := dists[name]
		di := filepath.Join(sp, NormalizeDistName(name)+"-"+ver+".dist-info")
		if err := os.MkdirAll(di, 0o755); err != nil {
			return "", err
		}
		meta := fmt.Sprintf("Metadata-Version: 2.1\nName: %s\nVersion: %s\nSummary: test\n\nA description.\n", name, ver)
		if err := os.WriteFile(filepath.Join(di, "METADATA"), []byte(meta), 0o644); err != nil {
			return "", err
		}
		record := fmt.Sprintf("%s/__init__.py,sha256=x,1\n%s-%s.dist-info/METADATA,,\n", NormalizeDistName(name), NormalizeDistName(name), ver)
		if err := os.WriteFile(filepath.Join(di, "RECORD"), []byte(record), 0o644); err != nil {
			return "", err
		}
	}
	for rel, s := range extra {
		p := filepath.Join(sp, rel)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return "", err
		}
		if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
			return "", err
		}
	}
	return dir, nil
}

// MakeModel writes a checkpoint under dir for tests: config.json,
// tokenizer_config.json (when tokenizer is not ""), and a sparse
// model.safetensors of weights bytes.
func MakeModel(dir, config, tokenizer string, weights int64) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "config.json"), []byte(config), 0o644); err != nil {
		return err
	}
	if tokenizer != "" {
		if err := os.WriteFile(filepath.Join(dir, "tokenizer_config.json"), []byte(tokenizer), 0o644); err != nil {
			return err
		}
	}
	f, err := os.Create(filepath.Join(dir, "model.safetensors"))
	if err != nil {
		return err
	}
	defer f.Close()
	return f.Truncate(weights)
}
