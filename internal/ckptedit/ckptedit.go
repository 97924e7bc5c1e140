// Package ckptedit makes damaged copies of small checkpoints for tests: copy
// a model directory, then overwrite chosen elements of one tensor (a NaN in a
// weight scale, an all-zero weight, ...) in whichever shard holds it.
package ckptedit

import (
	"encoding/binary"
	"fmt"
	"math"
	"os"
	"path/filepath"

	"github.com/glmctl/glmctl/pkg/safetensors"
)

// Copy copies the regular files of model directory src into dst (created if
// needed); subdirectories are skipped.
func Copy(dst, src string) error {
	if err := os.MkdirAll(dst, 0o755); err != nil {
		return err
	}
	ents, err := os.ReadDir(src)
	if err != nil {
		return err
	}
	for _, e := range ents {
		if !e.Type().IsRegular() {
			continue
		}
		b, err := os.ReadFile(filepath.Join(src, e.Name()))
		if err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(dst, e.Name()), b, 0o644); err != nil {
			return err
		}
	}
	return nil
}

// ShardOf returns the shard file (base name) of dir that holds tensor.
func ShardOf(dir, tensor string) (string, error) {
	ix, err := safetensors.ReadIndex(filepath.Join(dir, safetensors.IndexFileName))
	if err != nil {
		if _, serr := os.Stat(filepath.Join(dir, safetensors.SingleFileName)); serr == nil {
			return safetensors.SingleFileName, nil
		}
		return "", err
	}
	s, ok := ix.WeightMap[tensor]
	if !ok {
		return "", fmt.Errorf("%s: tensor %q is not in the index", dir, tensor)
	}
	return s, nil
}

// Set overwrites elements of tensor in dir's checkpoint with v, encoded in the
// tensor's dtype (F32, BF16, F16 or F8_E4M3, where NaN is 0x7F). elems nil
// means every element.
func Set(dir, tensor string, elems []int, v float32) error {
	shard, err := ShardOf(dir, tensor)
	if err != nil {
		return err
	}
	path := filepath.Join(dir, shard)
	f, err := safetensors.OpenFile(path)
	if err != nil {
		return err
	}
	var ts []safetensors.WriteTensor
	for _, n := range f.Header.Order {
		info := f.Header.Tensors[n]
		d, err := f.Data(n)
		if err != nil {
			f.Close()
			return err
		}
		ts = append(ts, safetensors.WriteTensor{Name: n, DType: info.DType, Shape: info.Shape, Data: append([]byte(nil), d...)})
	}
	meta := f.Header.Metadata
	if err := f.Close(); err != nil {
		return err
	}
	found := false
	for i := range ts {
		t := &ts[i]
		if t.Name != tensor {
			continue
		}
		found = true
		size := t.DType.Size()
		n := len(t.Data) / max(size, 1)
		if elems == nil {
			elems = make([]int, n)
			for j := range elems {
				elems[j] = j
			}
		}
		for _, j := range elems {
			if j < 0 || j >= n {
				return fmt.Errorf("%s: element %d of %d", tensor, j, n)
			}
			if err := encode(t.DType, t.Data[j*size:(j+1)*size], v); err != nil {
				return fmt.Errorf("%s: %w", tensor, err)
			}
		}
	}
	if !found {
		return fmt.Errorf("%s: tensor %q not found", path, tensor)
	}
	return safetensors.WriteFile(path, ts, meta)
}

func encode(dt safetensors.DType, dst []byte, v float32) error {
	switch dt {
	case safetensors.F32:
		binary.LittleEndian.PutUint32(dst, math.Float32bits(v))
	case safetensors.BF16:
		binary.LittleEndian.PutUint16(dst, uint16(math.Float32bits(v)>>16))
	case safetensors.F16:
		var h uint16
		switch {
		case v != v:
			h = 0x7e00
		case math.IsInf(float64(v), 1):
			h = 0x7c00
		case math.IsInf(float64(v), -1):
			h = 0xfc00
		case v == 0:
			h = 0
		default:
			return fmt.Errorf("F16: only 0, NaN and ±Inf can be written, not %v", v)
		}
		binary.LittleEndian.PutUint16(dst, h)
	case safetensors.F8_E4M3:
		if v != v || math.IsInf(float64(v), 0) {
			dst[0] = 0x7f // E4M3 has no Inf: NaN
		} else {
			dst[0] = safetensors.Float32ToF8E4M3(v)
		}
	default:
		return fmt.Errorf("cannot write %s", dt)
	}
	return nil
}
