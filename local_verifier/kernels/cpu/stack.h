// The layer stack of a step in one call (dg_stack_step's kernels).
#pragma once

#include <omp.h>

#include <cstdint>
#include <cstring>
#include <mutex>
#include <type_traits>
#include <vector>

#include "attention.h"
#include "common.h"
#include "dot.h"
#include "linear.h"
#include "quant.h"

// The arguments of one dg_stack_step call: a plain C struct, mirrored field for field by
// step_args.py's StepArgs (a ctypes.Structure; dg_step_args_layout reports this side's
// layout, which cpp.build_library compares before it uses a library). The attention plan's
// arrays are dg_attention's. A field added here goes to StepArgs and to dg_step_args_layout
// in the same place.
struct DgStepArgs {
  float* x;  // [N, dim]: the rows' embeddings, then their hidden states
  const float* cos;  // [N, Dh]
  const float* sin;  // [N, Dh]
  const int64_t* new_slots;  // [N]: each row's K/V slot, all distinct
  int64_t n_rows;  // N
  void* k_cache;  // [L] x dg_rope_store's kc, of the weights' type
  void* v_cache;  // [L] x dg_rope_store's vc (float, or bfloat16 bits)
  int64_t n_slots;  // S, a multiple of kKeyTile
  const int64_t* keys;  // the attention plan (see dg_attention)
  const int64_t* key_start;
  const int64_t* row_start;
  const int64_t* ctx_len;
  const bool* masks;
  const int64_t* mask_start;
  int64_t n_seqs;
  const int64_t* picked;  // [P]: the rows that get logits
  int64_t n_picked;  // P
  float* logits;  // [P, V]
  int threads;
  double* seconds;  // null, or where the step adds its seconds per kind of kernel
};

namespace {

// ---- The layer stack of a step in one call. ---------------------------------------------
//
// dg_stack_step runs what the per-op path (step_cpu.cpp's other functions, called op by op)
// runs, in the same order on the same values, so its logits and K/V are bitwise the same:
// per layer rms_norm, qkv linear (+ bias), rope_store, attention, wo linear + residual,
// rms_norm, w13 linear, silu_mul, w2 linear + residual; then the picked rows' final norm and
// head. The
// weights' addresses sit in a table built once per model; the activations in scratch owned
// by the table, grown to the largest step. One parallel region per layer (from the wo of
// the layer before to the rope of this one) plus attention's own.

// as fused.py's LAYOUT_CODES; kQuantBlocks + a GGML type code: rows of that type's blocks
enum Layout { kRowMajor = 0, kPacked = 1, kAmxPacked = 2, kQuantBlocks = 100 };

struct Matrix {  // a linear layer's weight and its layout (cpu/linear.h, cpu/quant.h)
  const void* w;
  int layout;
};

struct LayerWeights {  // float or bfloat16 (uint16_t bits), as the table's `bf16` says
  const void *attn_norm, *bqkv, *ffn_norm;  // bqkv may be null
  Matrix wqkv, wo, w13, w2;
  float attn_eps, ffn_eps;
};

struct Stack {
  int64_t dim, H, KVH, Dh, F, V;
  bool bf16;
  const void* norm;
  Matrix head;
  float norm_eps;
  std::vector<LayerWeights> layers;
  std::vector<float> widened;         // bf16: the norms' and biases' float32 values, per step
  std::vector<const float*> vectors;  // per layer attn_norm, ffn_norm, bqkv; then the norm
  std::vector<float> scratch;         // a step's activations
  QuantRows quant_rows;               // a quantized linear's input rows
  std::mutex busy;                    // one step at a time uses the scratch
};


enum Kind { kLinearTime, kHeadTime, kAttentionTime, kRowOpsTime };

// Seconds since the last mark added to seconds[kind], by the calling team's first thread.
struct Clock {
  double* seconds;
  double last;
  void mark(Kind kind) {
    if (seconds == nullptr || omp_get_thread_num() != 0) return;
    const double now = omp_get_wtime();
    seconds[kind] += now - last;
    last = now;
  }
};

// Attention of one layer: dg_attention with its arguments (its own parallel region, so it
// is called between the stack's regions, never inside one).
template <typename KV>
void attention(const float* qp, const KV* kc, const KV* vc, const DgStepArgs& s, float* op,
               int64_t H, int64_t KVH, int64_t Dh) {
  attention_rows(qp, kc, vc, s.keys, s.key_start, s.row_start, s.ctx_len, s.masks, s.mask_start,
                 op, s.n_rows, s.n_seqs, H, KVH, Dh, s.threads);
}

// linear_team over a matrix of the table (quantized blocks: quant_linear_team).
template <typename W>
void linear_team(const float* xp, const Matrix& w, const float* bp, float* yp, int64_t N,
                 int64_t K, int64_t M, QuantRows& rows) {
  if (w.layout >= kQuantBlocks)
    return quant_linear_team(w.layout - kQuantBlocks, xp, static_cast<const uint8_t*>(w.w), bp,
                             yp, N, K, M, rows);
#if DG_DOT
  if constexpr (std::is_same_v<W, uint16_t>)
    if (w.layout == kAmxPacked)
      return bf16_linear_team(xp, static_cast<const W*>(w.w), bp, yp, N, K, M);
#endif
  linear_team(xp, static_cast<const W*>(w.w), w.layout == kPacked, bp, yp, N, K, M);
}

// The float32 values of a parameter vector of n values (a bf16 one widened into out).
template <typename W>
const float* as_float(const void* p, int64_t n, float* out) {
  if constexpr (std::is_same_v<W, float>) {
    return static_cast<const float*>(p);
  } else {
    const uint16_t* bits = static_cast<const uint16_t*>(p);
    for (int64_t i = 0; i < n; ++i) {
      const uint32_t wide = static_cast<uint32_t>(bits[i]) << 16;
      std::memcpy(out + i, &wide, sizeof(float));
    }
    return out;
  }
}

inline void add_row(float* x, const float* t, int64_t D) {  // x + t, as torch's x + t
  for (int64_t d = 0; d < D; ++d) x[d] = x[d] + t[d];
}

// W: the weights' type, and the K/V's (float, or uint16_t for bfloat16 bits).
template <typename W>
void stack_step(Stack& m, const DgStepArgs& s) {
  W* const kc = static_cast<W*>(s.k_cache);
  W* const vc = static_cast<W*>(s.v_cache);
  const int64_t N = s.n_rows, P = s.n_picked, D = m.dim, H = m.H, KVH = m.KVH, Dh = m.Dh, F = m.F;
  const int64_t L = static_cast<int64_t>(m.layers.size());
  const int64_t QKV = (H + 2 * KVH) * Dh, HD = H * Dh, kv_width = KVH * Dh;
  const int64_t layer_kv = s.n_slots * kv_width;
  // the norms and biases as float32, re-read every step (a bf16 one widened)
  int64_t used = 0;
  for (int64_t l = 0; l < L; ++l) {
    const LayerWeights& w = m.layers[l];
    m.vectors[3 * l] = as_float<W>(w.attn_norm, D, m.widened.data() + used);
    m.vectors[3 * l + 1] = as_float<W>(w.ffn_norm, D, m.widened.data() + used + D);
    m.vectors[3 * l + 2] =
        w.bqkv != nullptr ? as_float<W>(w.bqkv, QKV, m.widened.data() + used + 2 * D) : nullptr;
    used += 2 * D + QKV;
  }
  m.vectors[3 * L] = as_float<W>(m.norm, D, m.widened.data() + used);

  const int64_t sizes[] = {N * D, N * QKV, N * HD, N * HD, N * D, N * 2 * F, N * F, P * D, P * D};
  int64_t total = 0;
  for (const int64_t n : sizes) total += n;
  if (static_cast<int64_t>(m.scratch.size()) < total) m.scratch.resize(total);
  float* buffers[9];
  float* next = m.scratch.data();
  for (int i = 0; i < 9; ++i) {
    buffers[i] = next;
    next += sizes[i];
  }
  float *h = buffers[0], *qkv = buffers[1], *q = buffers[2], *att = buffers[3];
  float *tmp = buffers[4], *gate_up = buffers[5], *act = buffers[6];
  float *last = buffers[7], *normed = buffers[8];
  float* x = s.x;
  m.quant_rows.fit(N, std::max({D, HD, F}));
  Clock clock{s.seconds, s.seconds != nullptr ? omp_get_wtime() : 0.0};

  for (int64_t l = 0; l <= L; ++l) {
#pragma omp parallel num_threads(s.threads)
    {
      if (l > 0) {  // the rest of layer l - 1, after its attention
        const LayerWeights& w = m.layers[l - 1];
        linear_team<W>(att, w.wo, nullptr, tmp, N, HD, D, m.quant_rows);
        clock.mark(kLinearTime);
#pragma omp for schedule(static)
        for (int64_t n = 0; n < N; ++n) {
          add_row(x + n * D, tmp + n * D, D);
          rms_norm_row(x + n * D, m.vectors[3 * (l - 1) + 1], h + n * D, D, w.ffn_eps);
        }
        clock.mark(kRowOpsTime);
        linear_team<W>(h, w.w13, nullptr, gate_up, N, D, 2 * F, m.quant_rows);
        clock.mark(kLinearTime);
#pragma omp for schedule(static)
        for (int64_t n = 0; n < N; ++n) silu_mul_row(gate_up + n * 2 * F, act + n * F, F);
        clock.mark(kRowOpsTime);
        linear_team<W>(act, w.w2, nullptr, tmp, N, F, D, m.quant_rows);
        clock.mark(kLinearTime);
      }
      if (l < L) {  // layer l up to its attention
        const LayerWeights& w = m.layers[l];
#pragma omp for schedule(static)
        for (int64_t n = 0; n < N; ++n) {
          if (l > 0) add_row(x + n * D, tmp + n * D, D);
          rms_norm_row(x + n * D, m.vectors[3 * l], h + n * D, D, w.attn_eps);
        }
        clock.mark(kRowOpsTime);
        linear_team<W>(h, w.wqkv, m.vectors[3 * l + 2], qkv, N, D, QKV, m.quant_rows);
        clock.mark(kLinearTime);
#pragma omp for schedule(static)
        for (int64_t n = 0; n < N; ++n) {  // each row to its own slot (a step's are distinct)
          const int64_t slot = s.new_slots[n], layer = l * layer_kv;
          rope_store_row(qkv + n * QKV, s.cos + n * Dh, s.sin + n * Dh,
                         kc + layer + key_offset(slot, kv_width), vc + layer + slot * kv_width,
                         q + n * HD, H, KVH, Dh);
        }
        clock.mark(kRowOpsTime);
      } else {  // the picked rows' final norm and the head
#pragma omp for schedule(static)
        for (int64_t p = 0; p < P; ++p) {
          const int64_t r = s.picked[p];
          std::memcpy(last + p * D, x + r * D, D * sizeof(float));
          if (L > 0) add_row(last + p * D, tmp + r * D, D);
          rms_norm_row(last + p * D, m.vectors[3 * L], normed + p * D, D, m.norm_eps);
        }
        clock.mark(kRowOpsTime);
        linear_team<W>(normed, m.head, nullptr, s.logits, P, D, m.V, m.quant_rows);
        clock.mark(kHeadTime);
      }
    }
    if (l < L) {
      attention(q, kc + l * layer_kv, vc + l * layer_kv, s, att, H, KVH, Dh);
      clock.mark(kAttentionTime);
    }
  }
}

}  // namespace
