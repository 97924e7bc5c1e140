package bench

import (
	"math"
	"strings"
	"testing"

	"github.com/glmctl/glmctl/pkg/model"
)

const (
	glm47Dir = "../../testdata/glm-4.7-fp8"
	tinyDir  = "../../testdata/models/tiny-f32"
)

func within(got, want, rel float64) bool { return math.Abs(got-want) <= rel*math.Abs(want) }

func TestExpectedDistinctExperts(t *testing.T) {
	tests := []struct {
		name     string
		e, k     int
		batch    float64
		want     float64
		relToler float64
	}{
		{"one token picks exactly k", 160, 8, 1, 8, 1e-12},
		{"B=16, hand-computed 160(1-0.95^16)", 160, 8, 16, 89.64, 1e-3},
		{"B=64: 160(1-0.95^64)", 160, 8, 64, 154.04, 1e-3},
		{"B=256 saturates", 160, 8, 256, 160, 1e-4},
		{"two tokens: 8+8·(1-8/160)", 160, 8, 2, 15.6, 1e-12},
		{"k = E touches all", 4, 4, 1, 4, 0},
		{"tiny model E=8 k=2 B=3: 8(1-0.75^3)", 8, 2, 3, 8 * (1 - 0.421875), 1e-12},
		{"no batch", 160, 8, 0, 0, 0},
		{"no experts", 0, 8, 4, 0, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := ExpectedDistinctExperts(tt.e, tt.k, tt.batch)
			if tt.relToler == 0 && got != tt.want || tt.relToler > 0 && !within(got, tt.want, tt.relToler) {
				t.Fatalf("ExpectedDistinctExperts(%d, %d, %g) = %g, want %g", tt.e, tt.k, tt.batch, got, tt.want)
			}
		})
	}
}

func glm47Floor(t *testing.T, kvElem int) FloorModel {
	t.Helper()
	m, cfg, err := LoadFloorModel(glm47Dir, FloorOptions{TP: 8, EP: 8, KVElemBytes: kvElem})
	if err != nil {
		t.Fatal(err)
	}
	if cfg.NRoutedExperts != 160 || !m.DTypesAssumed {
		t.Fatalf("config-only GLM-4.7: experts %d, dtypes assumed %v", cfg.NRoutedExperts, m.DTypesAssumed)
	}
	return m
}

// The per-GPU column of docs/hardware.md §4.2 (whole model / 8, FP8 KV at
// C=2048) and the H200 column of §4.3 (4.8 TB/s spec bandwidth).
func TestGLM47FloorMatchesPerfAnchors(t *testing.T) {
	fp8 := glm47Floor(t, 1)
	bf16 := glm47Floor(t, 2)
	// Shapes by hand: one expert is 3 × 5120 × 1536 FP8 bytes (+ row scales);
	// KV per token per GPU at TP8 is 92 layers × K,V × 1 head × 128 × elem.
	if !within(fp8.ExpertBytes, 3*5120*1536, 0.002) {
		t.Errorf("expert bytes %g, want ~%d", fp8.ExpertBytes, 3*5120*1536)
	}
	if fp8.KVBytesPerTokenGPU != 92*2*128 || bf16.KVBytesPerTokenGPU != 92*2*128*2 {
		t.Errorf("KV bytes/token/GPU fp8 %d bf16 %d, want %d and %d", fp8.KVBytesPerTokenGPU, bf16.KVBytesPerTokenGPU, 92*2*128, 92*2*128*2)
	}
	// The table spreads everything 8 ways; model.Plan replicates the router
	// (BF16 weight + F32 bias, 0.146 GB) on every GPU, so each GPU reads 7/8
	// of it more than the table says. Compare net of that surcharge.
	cfg, err := model.LoadConfig(glm47Dir)
	if err != nil {
		t.Fatal(err)
	}
	var router float64
	for _, c := range model.Account(cfg, nil).Components {
		if c.Component == model.CompRouter {
			router = float64(c.Bytes)
		}
	}
	if !within(router, 0.146e9, 0.01) {
		t.Fatalf("router bytes %g, want ~0.146 GB", router)
	}
	surcharge := router * 7 / 8
	// Fixed 16.9 GB for the whole model (attention, dense, shared, BF16
	// lm_head and router), so ~2.11 GB per GPU.
	if !within(float64(fp8.FixedBytesPerGPU)-surcharge, 16.9e9/8, 0.01) {
		t.Errorf("fixed bytes per GPU %d (net of router replication %g), want ~%g", fp8.FixedBytesPerGPU, surcharge, 16.9e9/8)
	}
	tests := []struct {
		m        FloorModel
		batch    float64
		wantGB   float64 // per GPU
		wantH200 float64 // ms at 4.8 TB/s
	}{
		{fp8, 1, 34.1 / 8, 0.89},
		{fp8, 16, 211.0 / 8, 5.5},
		{fp8, 64, 365.0 / 8, 9.5},
		{fp8, 256, 452.0 / 8, 11.8},
		{bf16, 256, 550.0 / 8, 0},
	}
	for _, tt := range tests {
		f, err := tt.m.Floor(tt.batch, 2048, H200SpecBandwidth)
		if err != nil {
			t.Fatal(err)
		}
		// Net of the replication surcharge the table is matched to its
		// rounding; with it, within a few percent.
		if !within(f.Bytes.Total-surcharge, tt.wantGB*1e9, 0.01) || !within(f.Bytes.Total, tt.wantGB*1e9, 0.035) {
			t.Errorf("KV %d bytes, B=%g: %.3f GB per GPU (%.3f net of router replication), want %.3f (docs/hardware.md §4.2)",
				tt.m.Options.KVElemBytes, tt.batch, f.Bytes.Total/1e9, (f.Bytes.Total-surcharge)/1e9, tt.wantGB)
		}
		if tt.wantH200 > 0 && !within(f.StepMs, tt.wantH200, 0.035) {
			t.Errorf("B=%g: floor %.3f ms on H200 spec bandwidth, want %.2f (docs/hardware.md §4.3)", tt.batch, f.StepMs, tt.wantH200)
		}
		if !within(f.TokensPerSecond, tt.batch/(f.StepMs/1e3), 1e-12) {
			t.Errorf("B=%g: tok/s %g inconsistent with step %g ms", tt.batch, f.TokensPerSecond, f.StepMs)
		}
	}
}

// TP only (EP=1): experts split TP ways, so the per-GPU expert bytes are the
// same under the even-spread model; KV and fixed bytes do not depend on EP.
func TestGLM47FloorTPOnlyAndSingleGPU(t *testing.T) {
	ep8 := glm47Floor(t, 1)
	ep1, _, err := LoadFloorModel(glm47Dir, FloorOptions{TP: 8, EP: 1, KVElemBytes: 1})
	if err != nil {
		t.Fatal(err)
	}
	a, b := ep8.StepBytes(16, 2048), ep1.StepBytes(16, 2048)
	if !within(b.RoutedExperts, a.RoutedExperts, 1e-9) || !within(b.Total, a.Total, 0.02) {
		t.Errorf("EP1 %+v vs EP8 %+v", b, a)
	}
	one, _, err := LoadFloorModel(glm47Dir, FloorOptions{TP: 1, KVElemBytes: 1})
	if err != nil {
		t.Fatal(err)
	}
	// One GPU reads the whole model's step: 34.1 GB at B=1 (docs/hardware.md §4.2).
	if s := one.StepBytes(1, 2048); !within(s.Total, 34.1e9, 0.03) {
		t.Errorf("TP1 B=1: %.2f GB, want ~34.1", s.Total/1e9)
	}
	if one.Options.EP != 1 || one.Options.TP != 1 {
		t.Errorf("EP defaults to TP: %+v", one.Options)
	}
}

// The tiny checkpoint by hand, from its shard dtypes: every linear is FP8
// with F32 row scales (bias BF16), lm_head BF16, router BF16, correction
// bias F32, norms BF16.
func TestTinyFloorByHand(t *testing.T) {
	m, cfg, err := LoadFloorModel(tinyDir, FloorOptions{TP: 1})
	if err != nil {
		t.Fatal(err)
	}
	if m.DTypesAssumed {
		t.Error("tiny-f32 has shards: dtypes must come from headers")
	}
	H, I := int64(cfg.HiddenSize), int64(cfg.MoEIntermediateSize)
	// One routed expert: gate, up [I,H] and down [H,I] FP8 + F32 row scales.
	expert := float64(3*I*H + (2*I+H)*4)
	if m.ExpertBytes != expert {
		t.Errorf("expert bytes %g, want %g", m.ExpertBytes, expert)
	}
	if m.KVBytesPerTokenGPU != cfg.KVBytesPerToken(2) {
		t.Errorf("KV bytes/token %d, want %d", m.KVBytesPerTokenGPU, cfg.KVBytesPerToken(2))
	}
	// On one GPU the fixed part is the whole of every component but
	// embedding and routed experts, as the accounting counts them.
	var fixed int64
	for _, c := range model.Account(cfg, nil).Components {
		switch c.Component {
		case model.CompEmbedding, model.CompExperts, model.CompMTP:
		default:
			fixed += c.Bytes
		}
	}
	if m.FixedBytesPerGPU != fixed {
		t.Errorf("fixed bytes %d, want %d", m.FixedBytesPerGPU, fixed)
	}
	if m.EmbeddingRowBytes != float64(H*2) { // BF16 row
		t.Errorf("embedding row bytes %g, want %d", m.EmbeddingRowBytes, H*2)
	}
	s := m.StepBytes(2, 100)
	wantExperts := ExpectedDistinctExperts(8, 2, 2) * float64(cfg.NumMoELayers()) * expert
	if s.RoutedExperts != wantExperts {
		t.Errorf("routed bytes %g, want %g", s.RoutedExperts, wantExperts)
	}
	if s.KV != 2*100*float64(cfg.KVBytesPerToken(2)) {
		t.Errorf("KV bytes %g", s.KV)
	}
	if s.Total != s.Fixed+s.RoutedExperts+s.Embedding+s.KV || s.Fixed <= 0 {
		t.Errorf("parts do not add up: %+v", s)
	}
}

func TestFloorRejectsBadInput(t *testing.T) {
	m, _, err := LoadFloorModel(tinyDir, FloorOptions{TP: 1})
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name              string
		batch, ctx, bw    float64
		wantErrSubstrings string
	}{
		{"zero bandwidth", 1, 10, 0, "bandwidth"},
		{"NaN bandwidth", 1, 10, math.NaN(), "bandwidth"},
		{"zero batch", 0, 10, 1e9, "batch"},
		{"negative context", 1, -1, 1e9, "context"},
	}
	for _, tt := range tests {
		if _, err := m.Floor(tt.batch, tt.ctx, tt.bw); err == nil || !strings.Contains(err.Error(), tt.wantErrSubstrings) {
			t.Errorf("%s: err %v, want one naming %q", tt.name, err, tt.wantErrSubstrings)
		}
	}
	if _, _, err := LoadFloorModel(glm47Dir, FloorOptions{TP: 8, EP: 3}); err == nil || !strings.Contains(err.Error(), "ep") {
		t.Errorf("EP 3 of TP 8: err %v", err)
	}
	if _, _, err := LoadFloorModel(glm47Dir, FloorOptions{TP: 1, KVElemBytes: 9}); err == nil || !strings.Contains(err.Error(), "KV element") {
		t.Errorf("KV elem 9: err %v", err)
	}
	if _, _, err := LoadFloorModel(t.TempDir(), FloorOptions{TP: 1}); err == nil || !strings.Contains(err.Error(), "config") {
		t.Errorf("empty dir: err %v", err)
	}
}

func TestDefaultBandwidth(t *testing.T) {
	tests := []struct {
		backend, device string
		want            float64
		wantErr         bool
	}{
		{"cuda", "NVIDIA H200 (sm_90, 140 GiB) x8", 4.46e12, false},
		{"cuda", "NVIDIA H100 80GB HBM3 (sm_90, 79 GiB) x1", 3.35e12 * 4.46 / 4.8, false},
		{"cpu", "CPU, 2 threads, pure Go (exact float32)", 20e9, false},
		{"cuda", "NVIDIA A100-SXM4-80GB", 0, true},
	}
	for _, tt := range tests {
		bw, err := DefaultBandwidth(tt.backend, tt.device)
		if (err != nil) != tt.wantErr || !within(bw.BytesPerSecond, tt.want, 1e-12) {
			t.Errorf("%s %q: %+v, %v", tt.backend, tt.device, bw, err)
		}
		if err == nil && bw.Source == "" {
			t.Errorf("%q: no source stated", tt.device)
		}
	}
}
