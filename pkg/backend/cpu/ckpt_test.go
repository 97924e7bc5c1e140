package cpu_test

import (
	"encoding/binary"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/glmctl/glmctl/pkg/safetensors"
)

// Checkpoint surgery for the loader's error tests.

// linkCheckpoint makes dst a copy of checkpoint src whose shards and index
// are symlinks and whose config.json is src's edited by edit.
func linkCheckpoint(t *testing.T, src, dst string, edit func(cfg map[string]any)) {
	t.Helper()
	entries, err := os.ReadDir(src)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		name := e.Name()
		if name == "config.json" {
			continue
		}
		abs, err := filepath.Abs(filepath.Join(src, name))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(abs, filepath.Join(dst, name)); err != nil {
			t.Fatal(err)
		}
	}
	writeConfig(t, src, dst, edit)
}

func writeConfig(t *testing.T, src, dst string, edit func(cfg map[string]any)) {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(src, "config.json"))
	if err != nil {
		t.Fatal(err)
	}
	var cfg map[string]any
	if err := json.Unmarshal(raw, &cfg); err != nil {
		t.Fatal(err)
	}
	if edit != nil {
		edit(cfg)
	}
	out, err := json.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dst, "config.json"), out, 0o644); err != nil {
		t.Fatal(err)
	}
}

// copyWithout writes checkpoint src to dst as one model.safetensors
// without the named tensors.
func copyWithout(t *testing.T, src, dst string, drop ...string) {
	t.Helper()
	ck, err := safetensors.Open(src, safetensors.OpenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer ck.Close()
	var names []string
	for name := range ck.Tensors {
		if !slices.Contains(drop, name) {
			names = append(names, name)
		}
	}
	slices.Sort(names)
	type entry struct {
		DType   string  `json:"dtype"`
		Shape   []int64 `json:"shape"`
		Offsets [2]int  `json:"data_offsets"`
	}
	header := map[string]entry{}
	var data []byte
	for _, name := range names {
		b, err := ck.Data(name)
		if err != nil {
			t.Fatal(err)
		}
		info := ck.Tensors[name]
		header[name] = entry{DType: string(info.DType), Shape: info.Shape, Offsets: [2]int{len(data), len(data) + len(b)}}
		data = append(data, b...)
	}
	hj, err := json.Marshal(header)
	if err != nil {
		t.Fatal(err)
	}
	for len(hj)%8 != 0 {
		hj = append(hj, ' ')
	}
	out := binary.LittleEndian.AppendUint64(nil, uint64(len(hj)))
	out = append(append(out, hj...), data...)
	if err := os.WriteFile(filepath.Join(dst, safetensors.SingleFileName), out, 0o644); err != nil {
		t.Fatal(err)
	}
	writeConfig(t, src, dst, nil)
}
