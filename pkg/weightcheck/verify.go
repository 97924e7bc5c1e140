package weightcheck

import (
	"cmp"
	"encoding/binary"
	"fmt"
	"math"
	"slices"
	"strings"

	"github.com/glmctl/glmctl/pkg/model"
	"github.com/glmctl/glmctl/pkg/safetensors"
)

// Finding is one problem Verify found in a tensor's values.
type Finding struct {
	Tensor string
	Shard  string
	// Kind: "non-finite" (NaN or Inf elements), "all-zero" (every element
	// is ±0), or "bad-scale" (a weight scale <= 0).
	Kind   string
	Detail string
	// Warning marks findings that do not make the checkpoint unusable: an
	// all-zero bias (zero-initialised biases are legitimate).
	Warning bool
}

func (f Finding) String() string {
	return fmt.Sprintf("%s (shard %s): %s: %s", f.Tensor, f.Shard, f.Kind, f.Detail)
}

// Progress is told how many bytes Verify has scanned of total.
type Progress func(done, total int64)

// Verify scans every tensor of ck (MTP layer included) and returns what it
// found, in shard then name order. b (may be nil) supplies the roles of
// scales and biases. It reads every byte once, in file order.
func Verify(ck *safetensors.Checkpoint, b *model.Binding, progress Progress) ([]Finding, error) {
	roles := map[string]Role{}
	if b != nil {
		for _, tg := range Targets(b, true) {
			roles[tg.Name] = tg.Role
		}
	}
	infos := make([]*safetensors.TensorInfo, 0, len(ck.Tensors))
	var total int64
	for _, t := range ck.Tensors {
		infos = append(infos, t)
		total += t.End - t.Begin
	}
	slices.SortFunc(infos, func(a, b *safetensors.TensorInfo) int {
		return cmp.Or(strings.Compare(a.File, b.File), cmp.Compare(a.Begin, b.Begin), strings.Compare(a.Name, b.Name))
	})
	var out []Finding
	var done int64
	if progress != nil {
		progress(0, total)
	}
	for _, t := range infos {
		data, err := ck.Data(t.Name)
		if err != nil {
			return out, err
		}
		role, hasRole := roles[t.Name]
		out = append(out, scanTensor(t, data, role, hasRole)...)
		done += int64(len(data))
		if progress != nil {
			progress(done, total)
		}
	}
	return out, nil
}

// scanTensor checks one tensor's bytes.
func scanTensor(t *safetensors.TensorInfo, data []byte, role Role, hasRole bool) []Finding {
	st := scanBytes(t.DType, data)
	if !st.known {
		return nil
	}
	var out []Finding
	f := func(kind, detail string, warn bool) {
		out = append(out, Finding{Tensor: t.Name, Shard: t.File, Kind: kind, Detail: detail, Warning: warn})
	}
	if st.nonFinite > 0 {
		f("non-finite", fmt.Sprintf("%d of %d elements are NaN or Inf (the first is element %d)", st.nonFinite, st.n, st.firstNonFinite), false)
	}
	if st.n > 0 && st.zero == st.n {
		bias := hasRole && role == RoleBias
		f("all-zero", fmt.Sprintf("all %d elements are 0", st.n), bias)
	}
	if hasRole && role == RoleScale && st.nonPositive > 0 && st.zero != st.n {
		f("bad-scale", fmt.Sprintf("%d of %d weight scales are <= 0 (the first is element %d)", st.nonPositive, st.n, st.firstNonPositive), false)
	}
	return out
}

type scanStats struct {
	known                            bool
	n, nonFinite, zero, nonPositive  int
	firstNonFinite, firstNonPositive int
}

// scanBytes classifies every element of a float tensor from its bits, with
// no float32 copy. Integer and unknown dtypes are not scanned (known false).
func scanBytes(dt safetensors.DType, data []byte) scanStats {
	st := scanStats{known: true, firstNonFinite: -1, firstNonPositive: -1}
	note := func(i int, nonFinite, zero, negative bool) {
		if nonFinite {
			if st.nonFinite == 0 {
				st.firstNonFinite = i
			}
			st.nonFinite++
		}
		if zero {
			st.zero++
		}
		if !nonFinite && (zero || negative) {
			if st.nonPositive == 0 {
				st.firstNonPositive = i
			}
			st.nonPositive++
		}
	}
	switch dt {
	case safetensors.F32:
		st.n = len(data) / 4
		for i := range st.n {
			u := binary.LittleEndian.Uint32(data[4*i:])
			note(i, u&0x7f800000 == 0x7f800000, u&0x7fffffff == 0, u>>31 == 1)
		}
	case safetensors.BF16:
		st.n = len(data) / 2
		for i := range st.n {
			u := binary.LittleEndian.Uint16(data[2*i:])
			note(i, u&0x7f80 == 0x7f80, u&0x7fff == 0, u>>15 == 1)
		}
	case safetensors.F16:
		st.n = len(data) / 2
		for i := range st.n {
			u := binary.LittleEndian.Uint16(data[2*i:])
			note(i, u&0x7c00 == 0x7c00, u&0x7fff == 0, u>>15 == 1)
		}
	case safetensors.F8_E4M3:
		st.n = len(data)
		for i, u := range data {
			note(i, u&0x7f == 0x7f, u&0x7f == 0, u>>7 == 1)
		}
	case safetensors.F64:
		st.n = len(data) / 8
		for i := range st.n {
			u := binary.LittleEndian.Uint64(data[8*i:])
			v := math.Float64frombits(u)
			note(i, math.IsNaN(v) || math.IsInf(v, 0), v == 0, u>>63 == 1)
		}
	default:
		st.known = false
	}
	return st
}
