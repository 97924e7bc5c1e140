package model

import (
	"strings"
	"testing"
)

// OpenBound opens and binds the tiny checkpoints the backends load; an
// unopenable directory is the checkpoint's error, naming it.
func TestOpenBound(t *testing.T) {
	for _, name := range []string{"tiny-f32", "tiny-bf16g"} {
		dir := "../../testdata/models/" + name
		cfg, err := LoadConfig(dir)
		if err != nil {
			t.Fatal(err)
		}
		ck, b, err := OpenBound(dir, cfg)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if err := b.Err(); err != nil {
			t.Errorf("%s: binding: %v", name, err)
		}
		if len(b.Tensors) == 0 || len(b.Tensors) > len(ck.Tensors) || b.Config != cfg {
			t.Errorf("%s: %d bound tensors of %d in the checkpoint", name, len(b.Tensors), len(ck.Tensors))
		}
		if err := ck.Close(); err != nil {
			t.Error(err)
		}
	}
	cfg, err := LoadConfig("../../testdata/models/tiny-f32")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if ck, b, err := OpenBound(dir, cfg); err == nil || ck != nil || b != nil || !strings.Contains(err.Error(), dir) {
		t.Errorf("empty dir: %v, %v, %v; want an error naming %s", ck, b, err, dir)
	}
}
