// The row-wise parts of a layer of the stack beyond the Llama layer's, one row at a time:
// what the per-op path does with whole tensors (model.py's Attention and Block), on the same
// values in the same order.
#pragma once

#include <algorithm>
#include <cstdint>

#include "activation.h"
#include "attention.h"
#include "common.h"
#include "stack_table.h"

namespace {

inline void add_row(float* x, const float* t, int64_t D) {  // x + t, as torch's x + t
  for (int64_t d = 0; d < D; ++d) x[d] = x[d] + t[d];
}

// x + norm(t) (with post_norm: Gemma's norm of a sublayer's output), else x + t, for one row;
// t is overwritten by its norm (rms_norm_row in place: each value read before it is written).
inline void residual_row(float* x, float* t, const float* post_norm, float eps, int64_t D) {
  if (post_norm != nullptr) rms_norm_row(t, post_norm, t, D, eps);
  add_row(x, t, D);
}

// The first `heads` heads of Dh values of one row of qkv from a GGUF llama file's order
// (value 2i + j of a head rotated with 2i + 1 - j) into rotate-half order (to i + j Dh / 2),
// in place: values moved, none computed.
inline void rotate_half_order_row(float* qkv, int64_t heads, int64_t Dh) {
  float pairs[kMaxHeadDim];
  const int64_t half = Dh / 2;
  for (int64_t h = 0; h < heads; ++h) {
    float* head = qkv + h * Dh;
    std::copy(head, head + Dh, pairs);
    for (int64_t i = 0; i < half; ++i) {
      head[i] = pairs[2 * i];
      head[half + i] = pairs[2 * i + 1];
    }
  }
}

// One row of qkv [(H + 2 KVH) Dh] with each query head and each key head RMS-normed in place
// (Qwen3's and Gemma's q/k norms; nothing without them).
inline void qk_norm_row(float* qkv, const LayerVectors& v, const LayerWeights& w, int64_t H,
                        int64_t KVH, int64_t Dh) {
  if (v.q_norm != nullptr)
    for (int64_t h = 0; h < H; ++h)
      rms_norm_row(qkv + h * Dh, v.q_norm, qkv + h * Dh, Dh, w.eps[kQEps]);
  if (v.k_norm != nullptr)
    for (int64_t h = H; h < H + KVH; ++h)
      rms_norm_row(qkv + h * Dh, v.k_norm, qkv + h * Dh, Dh, w.eps[kKEps]);
}

// The gated activation of one row of gate_up [2 F] into out [F].
inline void activation_row(int activation, const float* gate_up, float* out, int64_t F) {
  if (activation == kGeluTanh)
    gelu_tanh_mul_row(gate_up, out, F);
  else
    silu_mul_row(gate_up, out, F);
}

}  // namespace
