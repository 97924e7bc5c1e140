// weights.cu — checkpoint tensors by their real names (docs/model.md §2.2):
// the list of expected names with shapes, and the upload that fuses q|k|v and
// gate|up (keeping every part's own row scales), converts scales, norms and
// biases to FP32, and shards for tensor/expert parallelism (place_piece, the
// mapping synth.cu's generator follows too):
//   q/k/v rows by head, o_proj columns by head; dense gate/up rows and down
//   columns by intermediate slice; routed experts whole on rank e / E_l; the
//   shared expert whole on rank 0; lm_head rows by vocabulary slice; embedding,
//   norms and router replicated.
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "engine.h"

namespace glmrt {
namespace {

const char* dtype_name(int32_t dt) {
  switch (dt) {
    case GLMRT_DTYPE_F32: return "F32";
    case GLMRT_DTYPE_BF16: return "BF16";
    case GLMRT_DTYPE_F16: return "F16";
    case GLMRT_DTYPE_F8_E4M3: return "F8_E4M3";
    default: return "unknown";
  }
}

void add(Engine& e, const std::string& name, Role role, int layer, int expert, int64_t rows,
         int64_t cols, DClass dc) {
  e.names[name] = (int)e.pieces.size();
  e.pieces.push_back(Piece{role, layer, expert, rows, cols, dc, false});
}

// A linear: .weight [out, in] FP8 and .weight_scale [out, 1].
void add_linear(Engine& e, const std::string& p, Role w, Role s, int layer, int expert,
                int64_t out, int64_t in) {
  add(e, p + ".weight", w, layer, expert, out, in, kFp8);
  add(e, p + ".weight_scale", s, layer, expert, out, 1, kScale);
}

void add_layer(Engine& e, int l, bool skip) {
  const Dims& d = e.d;
  const glmrt_model_config& c = e.cfg;
  const std::string p = "model.layers." + std::to_string(l) + ".";
  auto R = [&](Role r) { return skip ? Role::MtpSkip : r; };
  add(e, p + "input_layernorm.weight", R(Role::InNorm), l, 0, d.H, 0, kHigh);
  add(e, p + "post_attention_layernorm.weight", R(Role::PostNorm), l, 0, d.H, 0, kHigh);
  const int64_t qo = (int64_t)d.nq * d.D, kvo = (int64_t)d.nkv * d.D;
  add_linear(e, p + "self_attn.q_proj", R(Role::QW), R(Role::QS), l, 0, qo, d.H);
  add_linear(e, p + "self_attn.k_proj", R(Role::KW), R(Role::KS), l, 0, kvo, d.H);
  add_linear(e, p + "self_attn.v_proj", R(Role::VW), R(Role::VS), l, 0, kvo, d.H);
  if (c.attention_bias) {
    add(e, p + "self_attn.q_proj.bias", R(Role::QB), l, 0, qo, 0, kHigh);
    add(e, p + "self_attn.k_proj.bias", R(Role::KB), l, 0, kvo, 0, kHigh);
    add(e, p + "self_attn.v_proj.bias", R(Role::VB), l, 0, kvo, 0, kHigh);
  }
  add_linear(e, p + "self_attn.o_proj", R(Role::OW), R(Role::OS), l, 0, d.H, qo);
  if (c.use_qk_norm) {
    add(e, p + "self_attn.q_norm.weight", R(Role::QNorm), l, 0, d.D, 0, kHigh);
    add(e, p + "self_attn.k_norm.weight", R(Role::KNorm), l, 0, d.D, 0, kHigh);
  }
  if (!skip && l < d.first_dense) {
    add_linear(e, p + "mlp.gate_proj", Role::DGateW, Role::DGateS, l, 0, d.I, d.H);
    add_linear(e, p + "mlp.up_proj", Role::DUpW, Role::DUpS, l, 0, d.I, d.H);
    add_linear(e, p + "mlp.down_proj", Role::DDownW, Role::DDownS, l, 0, d.H, d.I);
    return;
  }
  add(e, p + "mlp.gate.weight", R(Role::RouterW), l, 0, d.E, d.H, kHigh);
  add(e, p + "mlp.gate.e_score_correction_bias", R(Role::RouterB), l, 0, d.E, 0, kHigh);
  for (int x = 0; x <= d.E; ++x) {
    if (x == d.E && c.n_shared_experts == 0) break;
    const std::string q = x < d.E ? p + "mlp.experts." + std::to_string(x) + "."
                                  : p + "mlp.shared_experts.";
    add_linear(e, q + "gate_proj", R(Role::EGateW), R(Role::EGateS), l, x, d.MI, d.H);
    add_linear(e, q + "up_proj", R(Role::EUpW), R(Role::EUpS), l, x, d.MI, d.H);
    add_linear(e, q + "down_proj", R(Role::EDownW), R(Role::EDownS), l, x, d.H, d.MI);
  }
}

// Host conversion of F32/BF16 (any alignment) to FP32.
bool to_f32(int32_t dt, const void* src, size_t n, std::vector<float>& out) {
  out.resize(n);
  const unsigned char* p = static_cast<const unsigned char*>(src);
  if (dt == GLMRT_DTYPE_F32) {
    memcpy(out.data(), p, n * 4);
    return true;
  }
  if (dt == GLMRT_DTYPE_BF16) {
    for (size_t i = 0; i < n; ++i) {
      uint16_t b;
      memcpy(&b, p + 2 * i, 2);
      uint32_t u = (uint32_t)b << 16;
      memcpy(&out[i], &u, 4);
    }
    return true;
  }
  return false;
}

// Host conversion of F32/BF16 to BF16 bits (F32 rounded to nearest even).
bool to_bf16(int32_t dt, const void* src, size_t n, std::vector<uint16_t>& out) {
  out.resize(n);
  const unsigned char* p = static_cast<const unsigned char*>(src);
  if (dt == GLMRT_DTYPE_BF16) {
    memcpy(out.data(), p, n * 2);
    return true;
  }
  if (dt == GLMRT_DTYPE_F32) {
    for (size_t i = 0; i < n; ++i) {
      uint32_t u;
      memcpy(&u, p + 4 * i, 4);
      out[i] = (uint16_t)((u + 0x7fff + ((u >> 16) & 1)) >> 16);
    }
    return true;
  }
  return false;
}

int h2d(Rank& r, void* dst, const void* src, size_t bytes, const char* name) {
  GLMRT_CUDA(cudaSetDevice(r.device), "cudaSetDevice");
  cudaError_t err = cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice);
  if (err != cudaSuccess) {
    cudaGetLastError();
    return fail(GLMRT_ERR_CUDA, "tensor %s: upload to GPU %d: %s", name, r.device,
                cudaGetErrorString(err));
  }
  return GLMRT_OK;
}

// Column slice [c0, c0+w) of a row-major [rows, cols] matrix of elem bytes.
int h2d_cols(Rank& r, void* dst, const void* src, size_t rows, size_t cols, size_t c0, size_t w,
             size_t elem, const char* name) {
  GLMRT_CUDA(cudaSetDevice(r.device), "cudaSetDevice");
  cudaError_t err = cudaMemcpy2D(dst, w * elem, static_cast<const char*>(src) + c0 * elem,
                                 cols * elem, w * elem, rows, cudaMemcpyHostToDevice);
  if (err != cudaSuccess) {
    cudaGetLastError();
    return fail(GLMRT_ERR_CUDA, "tensor %s: upload (column slice) to GPU %d: %s", name, r.device,
                cudaGetErrorString(err));
  }
  return GLMRT_OK;
}

}  // namespace

int build_expected_names(Engine& e) {
  const Dims& d = e.d;
  e.names.clear();
  e.pieces.clear();
  add(e, "model.embed_tokens.weight", Role::Embed, -1, 0, d.V, d.H, kHigh);
  add(e, "lm_head.weight", Role::LmHead, -1, 0, d.V, d.H, kHigh);
  add(e, "model.norm.weight", Role::FinalNorm, -1, 0, d.H, 0, kHigh);
  for (int l = 0; l < d.L; ++l) add_layer(e, l, false);
  if (e.cfg.num_nextn_predict_layers > 0) {
    // The MTP layer: uploaded when it drafts (draft_tokens > 0), else only
    // shape-checked. Its own embed_tokens and shared_head.head copies are
    // never used: the main embedding and lm_head serve (docs/speculative.md).
    const int l = d.L;
    const bool skip = e.draft_k == 0;
    auto R = [&](Role r) { return skip ? Role::MtpSkip : r; };
    const std::string p = "model.layers." + std::to_string(l) + ".";
    add_layer(e, l, skip);
    add(e, p + "enorm.weight", R(Role::MtpENorm), l, 0, d.H, 0, kHigh);
    add(e, p + "hnorm.weight", R(Role::MtpHNorm), l, 0, d.H, 0, kHigh);
    add(e, p + "eh_proj.weight", R(Role::MtpEhProj), l, 0, d.H, 2 * (int64_t)d.H, kHigh);
    add(e, p + "shared_head.norm.weight", R(Role::MtpHeadNorm), l, 0, d.H, 0, kHigh);
    add_linear(e, p + "shared_head.head", Role::MtpSkip, Role::MtpSkip, l, 0, d.V, d.H);
    add(e, p + "embed_tokens.weight", Role::MtpSkip, l, 0, d.V, d.H, kHigh);
  }
  return GLMRT_OK;
}

int place_piece(const Engine& e, const Piece& pc, const char* name, int rank, Placement& p, bool& held) {
  const Dims& d = e.d;
  const Rank& r = e.ranks[rank];
  const int l = pc.layer;
  held = true;
  // A contiguous run of n elements of the tensor from element off.
  auto run = [&](void* dst, int elem, int64_t n, int64_t off) { p = Placement{dst, elem, n, n, n, off}; };
  // Columns [c0, c0 + w) of each of the rows rows of an FP8 [rows, ncols] tensor.
  auto cols = [&](void* dst, int64_t rows, int64_t ncols, int64_t c0, int64_t w) {
    p = Placement{dst, kElemU8, rows * w, w, ncols, c0};
  };
  switch (pc.role) {
    case Role::LmHead: {  // rows by vocabulary slice
      const int64_t n = (int64_t)d.V_l * d.H, off = (int64_t)rank * n;
      if (e.f32kv) run(r.lm_head_f32, kElemF32, n, off);
      else run(r.lm_head, kElemBF16, n, off);
      return GLMRT_OK;
    }
    case Role::Embed:
      run(r.embed, kElemBF16, (int64_t)d.V * d.H, 0);
      return GLMRT_OK;
    case Role::MtpEhProj:  // replicated, BF16 (one GPU drafts: draft_tokens needs TP 1)
      run(r.mtp_eh_proj, kElemBF16, (int64_t)d.H * 2 * d.H, 0);
      return GLMRT_OK;
    case Role::MtpENorm:
    case Role::MtpHNorm:
    case Role::MtpHeadNorm:
      run(pc.role == Role::MtpENorm ? r.mtp_enorm : pc.role == Role::MtpHNorm ? r.mtp_hnorm : r.mtp_head_norm,
          kElemF32, d.H, 0);
      return GLMRT_OK;
    case Role::FinalNorm:
    case Role::InNorm:
    case Role::PostNorm:
    case Role::QNorm:
    case Role::KNorm:
    case Role::RouterW:
    case Role::RouterB: {  // replicated, FP32
      const LayerDev* L = l >= 0 ? &r.layers[l] : nullptr;
      float* dst = pc.role == Role::FinalNorm ? r.final_norm
                   : pc.role == Role::InNorm  ? L->in_norm
                   : pc.role == Role::PostNorm ? L->post_norm
                   : pc.role == Role::QNorm   ? L->q_norm
                   : pc.role == Role::KNorm   ? L->k_norm
                   : pc.role == Role::RouterW ? L->router
                                              : L->router_bias;
      run(dst, kElemF32, pc.rows * (pc.cols > 0 ? pc.cols : 1), 0);
      return GLMRT_OK;
    }
    case Role::QW:
    case Role::KW:
    case Role::VW:
    case Role::QS:
    case Role::KS:
    case Role::VS:
    case Role::QB:
    case Role::KB:
    case Role::VB: {  // rows by head, into the rank's q | k | v rows
      const bool is_q = pc.role == Role::QW || pc.role == Role::QS || pc.role == Role::QB;
      const bool is_k = pc.role == Role::KW || pc.role == Role::KS || pc.role == Role::KB;
      const int heads_l = is_q ? d.nq_l : d.nkv_l;
      const int64_t dst_row0 = is_q ? 0 : is_k ? (int64_t)d.nq_l * d.D : (int64_t)(d.nq_l + d.nkv_l) * d.D;
      const int64_t rows_l = (int64_t)heads_l * d.D;
      const bool weight = pc.role == Role::QW || pc.role == Role::KW || pc.role == Role::VW;
      const bool scale = pc.role == Role::QS || pc.role == Role::KS || pc.role == Role::VS;
      const LayerDev& L = r.layers[l];
      const int64_t src_row0 = (int64_t)rank * rows_l;
      if (weight) run(L.qkv + dst_row0 * d.H, kElemU8, rows_l * d.H, src_row0 * d.H);
      else run((scale ? L.qkv_scale : L.qkv_bias) + dst_row0, kElemF32, rows_l, src_row0);
      return GLMRT_OK;
    }
    case Role::OW:
    case Role::OS: {  // columns by head; the row scales replicated
      const int64_t w = (int64_t)d.nq_l * d.D;
      const LayerDev& L = r.layers[l];
      if (pc.role == Role::OW) cols(L.o, d.H, (int64_t)d.nq * d.D, rank * w, w);
      else run(L.o_scale, kElemF32, d.H, 0);
      return GLMRT_OK;
    }
    case Role::DGateW:
    case Role::DUpW:
    case Role::DGateS:
    case Role::DUpS: {  // rows by intermediate slice, into the rank's gate | up rows
      const bool up = pc.role == Role::DUpW || pc.role == Role::DUpS;
      const bool weight = pc.role == Role::DGateW || pc.role == Role::DUpW;
      const LayerDev& L = r.layers[l];
      const int64_t s0 = (int64_t)rank * d.I_l, d0 = up ? d.I_l : 0;
      if (weight) run(L.gu + d0 * d.H, kElemU8, (int64_t)d.I_l * d.H, s0 * d.H);
      else run(L.gu_scale + d0, kElemF32, d.I_l, s0);
      return GLMRT_OK;
    }
    case Role::DDownW:
    case Role::DDownS: {  // columns by intermediate slice; the row scales replicated
      const LayerDev& L = r.layers[l];
      if (pc.role == Role::DDownW) cols(L.down, d.H, d.I, (int64_t)rank * d.I_l, d.I_l);
      else run(L.down_scale, kElemF32, d.H, 0);
      return GLMRT_OK;
    }
    case Role::EGateW:
    case Role::EGateS:
    case Role::EUpW:
    case Role::EUpS:
    case Role::EDownW:
    case Role::EDownS: {  // whole, in group g of the owner: routed e on rank e / E_l, shared on 0
      const bool shared = pc.expert == d.E;
      const int owner = shared ? 0 : pc.expert / d.E_l;
      if (rank != owner) break;
      const int g = shared ? r.shared_local : pc.expert - r.expert_begin;
      if (g < 0)
        return fail(GLMRT_ERR_INVALID, "tensor %s: no local expert group on GPU %d", name, r.device);
      const LayerDev& L = r.layers[l];
      const int64_t MI = d.MI, H = d.H;
      switch (pc.role) {
        case Role::EGateW: run(L.e_gu + (int64_t)g * 2 * MI * H, kElemU8, MI * H, 0); break;
        case Role::EUpW: run(L.e_gu + ((int64_t)g * 2 + 1) * MI * H, kElemU8, MI * H, 0); break;
        case Role::EDownW: run(L.e_down + (int64_t)g * H * MI, kElemU8, H * MI, 0); break;
        case Role::EGateS: run(L.e_gu_scale + (int64_t)g * 2 * MI, kElemF32, MI, 0); break;
        case Role::EUpS: run(L.e_gu_scale + ((int64_t)g * 2 + 1) * MI, kElemF32, MI, 0); break;
        default: run(L.e_down_scale + (int64_t)g * H, kElemF32, H, 0); break;
      }
      return GLMRT_OK;
    }
    case Role::MtpSkip:
      break;
  }
  held = false;
  return GLMRT_OK;
}

int load_tensor(Engine& e, const char* name, int32_t dtype, const int64_t* shape, int32_t ndim,
                const void* data, uint64_t nbytes) {
  auto it = e.names.find(name);
  if (it == e.names.end())
    return fail(GLMRT_ERR_INVALID, "tensor %s: not a tensor of this model (unknown name)", name);
  Piece& pc = e.pieces[it->second];
  if (pc.loaded) return fail(GLMRT_ERR_INVALID, "tensor %s: loaded twice", name);
  // dtype
  bool dt_ok = false;
  switch (pc.dclass) {
    case kFp8: dt_ok = dtype == GLMRT_DTYPE_F8_E4M3; break;
    case kScale:
    case kHigh: dt_ok = dtype == GLMRT_DTYPE_F32 || dtype == GLMRT_DTYPE_BF16; break;
  }
  if (!dt_ok)
    return fail(GLMRT_ERR_INVALID, "tensor %s: dtype %s, want %s", name, dtype_name(dtype),
                pc.dclass == kFp8 ? "F8_E4M3 (this runtime needs the FP8 checkpoint)" : "F32 or BF16");
  // shape
  char want[64];
  if (pc.cols == 0) snprintf(want, sizeof want, "[%lld]", (long long)pc.rows);
  else snprintf(want, sizeof want, "[%lld, %lld]", (long long)pc.rows, (long long)pc.cols);
  bool shape_ok;
  if (pc.cols == 0) shape_ok = ndim == 1 && shape[0] == pc.rows;
  else if (pc.dclass == kScale)
    shape_ok = (ndim == 2 && shape[0] == pc.rows && shape[1] == 1) || (ndim == 1 && shape[0] == pc.rows);
  else shape_ok = ndim == 2 && shape[0] == pc.rows && shape[1] == pc.cols;
  if (!shape_ok) {
    std::string got = "[";
    for (int i = 0; i < ndim; ++i) got += (i ? ", " : "") + std::to_string(shape[i]);
    got += "]";
    return fail(GLMRT_ERR_INVALID, "tensor %s: shape %s, want %s", name, got.c_str(), want);
  }
  const int64_t elems = pc.rows * (pc.cols > 0 ? pc.cols : 1);
  const int64_t esize = dtype == GLMRT_DTYPE_F32 ? 4 : dtype == GLMRT_DTYPE_F8_E4M3 ? 1 : 2;
  if ((int64_t)nbytes != elems * esize)
    return fail(GLMRT_ERR_INVALID, "tensor %s: %llu bytes, want %lld for %s %s", name,
                (unsigned long long)nbytes, (long long)(elems * esize), dtype_name(dtype), want);
  if (pc.role == Role::MtpSkip) {  // checked; not used (no drafting, or a copy never read)
    pc.loaded = true;
    return GLMRT_OK;
  }

  // Each rank's part, from the data converted to the device's element type
  // (once per tensor).
  std::vector<float> f;
  std::vector<uint16_t> b16;
  bool have_f = false, have_b16 = false;
  for (int ri = 0; ri < (int)e.ranks.size(); ++ri) {
    Placement p;
    bool held;
    GLMRT_TRY(place_piece(e, pc, name, ri, p, held));
    if (!held) continue;
    const void* host = data;
    size_t esize_dev = 1;
    if (p.elem == kElemF32) {
      if (!have_f && !to_f32(dtype, data, (size_t)elems, f))
        return fail(GLMRT_ERR_INVALID, "tensor %s: cannot convert %s", name, dtype_name(dtype));
      have_f = true;
      host = f.data();
      esize_dev = 4;
    } else if (p.elem == kElemBF16) {
      if (!have_b16 && !to_bf16(dtype, data, (size_t)elems, b16))
        return fail(GLMRT_ERR_INVALID, "tensor %s: cannot convert %s", name, dtype_name(dtype));
      have_b16 = true;
      host = b16.data();
      esize_dev = 2;
    }
    Rank& r = e.ranks[ri];
    if (p.w >= p.n)
      GLMRT_TRY(h2d(r, p.dst, static_cast<const char*>(host) + (size_t)p.src_off * esize_dev,
                    (size_t)p.n * esize_dev, name));
    else
      GLMRT_TRY(h2d_cols(r, p.dst, host, (size_t)(p.n / p.w), (size_t)p.src_ld, (size_t)p.src_off,
                         (size_t)p.w, esize_dev, name));
  }
  pc.loaded = true;
  return GLMRT_OK;
}

int check_complete(Engine& e) {
  int missing = 0;
  std::string first;
  for (const auto& kv : e.names) {
    const Piece& p = e.pieces[kv.second];
    if (p.loaded || p.role == Role::MtpSkip) continue;
    if (missing == 0 || kv.first < first) first = kv.first;
    ++missing;
  }
  if (missing)
    return fail(GLMRT_ERR_INVALID, "%d tensor(s) never loaded, e.g. %s", missing, first.c_str());
  for (Rank& r : e.ranks) {
    GLMRT_CUDA(cudaSetDevice(r.device), "cudaSetDevice");
    GLMRT_CUDA(cudaDeviceSynchronize(), "finalize: device synchronize");
  }
  return GLMRT_OK;
}

}  // namespace glmrt
