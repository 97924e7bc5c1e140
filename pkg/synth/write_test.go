package synth

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/glmctl/glmctl/pkg/model"
	"github.com/glmctl/glmctl/pkg/safetensors"
)

// A written 2-layer rank checkpoint (1 dense + 1 MoE layer, in several
// shards) parses, binds to its config with no problem and holds exactly the
// generator's bytes.
func TestWriteRankCheckpoint(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "ckpt")
	var calls int
	var last, total int64
	res, err := Write(context.Background(), dir, rank08, WriteOptions{
		MaxShardBytes: 128 << 20, // several shards; the 194 MB vocabulary tables alone
		Progress: func(done, tot int64) {
			if done < last {
				t.Errorf("progress went back from %d to %d", last, done)
			}
			calls, last, total = calls+1, done, tot
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	if res.Shards < 5 || res.Tensors != 167 || res.Bytes != 942137424 || res.Seed != rank08.EffectiveSeed() {
		t.Errorf("result %+v", res)
	}
	if calls < res.Tensors || last != total || total != res.Bytes {
		t.Errorf("progress: %d calls, last %d of %d", calls, last, total)
	}

	cfg, err := model.LoadConfig(dir)
	if err != nil {
		t.Fatal(err)
	}
	wantJSON, _ := rank08.ConfigJSON()
	if got, _ := os.ReadFile(filepath.Join(dir, model.ConfigFile)); !bytes.Equal(got, wantJSON) {
		t.Error("config.json is not the spec's ConfigJSON")
	}
	ck, err := safetensors.Open(dir, safetensors.OpenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer ck.Close()
	if n := len(ck.Index.Shards()); n != res.Shards {
		t.Errorf("index names %d shards, Write made %d", n, res.Shards)
	}
	if ts, ok := ck.Index.TotalSize(); !ok || ts != res.Bytes {
		t.Errorf("index total_size %d, %v", ts, ok)
	}
	b := model.Bind(cfg, ck.Tensors)
	if len(b.Problems) != 0 {
		t.Fatalf("%d binding problems: %v", len(b.Problems), b.Err())
	}
	ts, err := Tensors(cfg)
	if err != nil {
		t.Fatal(err)
	}
	seed := rank08.EffectiveSeed()
	for i := range ts {
		tt := &ts[i]
		info := ck.Tensors[tt.Name]
		if info == nil || info.DType != tt.DType {
			t.Fatalf("tensor %s: %+v", tt.Name, info)
		}
		if tt.ByteSize() > 32<<20 {
			continue // the big ones are covered by the golden hashes
		}
		data, err := ck.Data(tt.Name)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(data, tt.Bytes(seed, 0)) {
			t.Errorf("tensor %s: stored bytes differ from the generator's", tt.Name)
		}
	}
	var info Info
	raw, err := os.ReadFile(filepath.Join(dir, InfoFile))
	if err == nil {
		err = json.Unmarshal(raw, &info)
	}
	if err != nil || info.Generator != GeneratorVersion || info.EffectiveSeed != seed || info.Rank != 0 || info.Ranks != 8 || info.Layers != 2 || info.DenseLayers != 1 {
		t.Errorf("synthetic.json: %+v, %v", info, err)
	}
	if _, err := os.Stat(filepath.Join(dir, "generation_config.json")); err != nil {
		t.Error(err)
	}
}

func TestWriteErrors(t *testing.T) {
	if _, err := Write(context.Background(), t.TempDir(), Spec{Base: "glm-4.7", Rank: 0, Ranks: 5, DenseLayers: -1}, WriteOptions{}); err == nil {
		t.Error("rank 0/5 was written")
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	dir := t.TempDir()
	_, err := Write(ctx, dir, rank08, WriteOptions{})
	if !errors.Is(err, context.Canceled) {
		t.Errorf("canceled write: %v", err)
	}
	if _, err := os.Stat(filepath.Join(dir, safetensors.IndexFileName)); !errors.Is(err, os.ErrNotExist) {
		t.Error("a canceled write left an index behind")
	}
	file := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := Write(context.Background(), file, rank08, WriteOptions{}); err == nil {
		t.Error("wrote into a regular file")
	}
	plan := Plan([]Tensor{{Shape: []int64{10}}, {Shape: []int64{30}}, {Shape: []int64{5}}, {Shape: []int64{1}}}, 16)
	if len(plan) != 3 || len(plan[0]) != 1 || len(plan[1]) != 1 || len(plan[2]) != 2 {
		t.Errorf("Plan = %v", plan)
	}
}
