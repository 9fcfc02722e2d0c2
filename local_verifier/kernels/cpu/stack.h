// The layer stack of a step in one call (dg_stack_step's kernels).
#pragma once

#include <omp.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "attention.h"
#include "common.h"
#include "dot.h"
#include "linear.h"
#include "quant.h"
#include "stack_args.h"
#include "stack_rows.h"
#include "stack_table.h"

namespace {

// ---- The layer stack of a step in one call. ---------------------------------------------
//
// dg_stack_step runs what the per-op path (step_cpu.cpp's other functions, called op by op)
// runs, in the same order on the same values, so its logits and K/V are bitwise the same:
// per layer rms_norm, qkv linear (+ bias), the q/k heads' norms, rope_store, attention, wo
// linear, its post norm + residual, rms_norm, w13 linear, SwiGLU or GeGLU, w2 linear, its
// post norm + residual; then the picked rows' final norm and head. The weights' addresses
// sit in a table built once per model (stack_table.h); the activations in scratch owned by
// the table, grown to the largest step. One parallel region per layer (from the wo of the
// layer before to the rope of this one) plus attention's own.

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

// Attention of one layer by plan p: dg_attention with its arguments (its own parallel
// region, so it is called between the stack's regions, never inside one).
template <typename KV>
void attention(const float* qp, const KV* kc, const KV* vc, const DgPlan& p, const DgStepArgs& s,
               float* op, int64_t H, int64_t KVH, int64_t Dh) {
  attention_rows(qp, kc, vc, p.keys, p.key_start, p.row_start, p.ctx_len, p.masks, p.mask_start,
                 op, s.n_rows, p.n_seqs, H, KVH, Dh, s.threads);
}

// linear_team over a matrix of the table (quantized blocks: quant_linear_team); a matrix in
// runs apart computes each run's outputs by its own type's kernel, runs of one type in a row
// as parts of one call's work (x quantized once, one barrier). Each output's bits are those
// of its own rows' kernel, as op by op.
template <typename W>
void linear_team(const float* xp, const Matrix& w, const float* bp, float* yp, int64_t N,
                 int64_t K, int64_t M, QuantRows& rows) {
  if (w.n_more > 0) {
    Run runs[3] = {{0, w.w, w.layout}};
    std::copy(w.more, w.more + w.n_more, runs + 1);
    const int n = w.n_more + 1;
    for (int i = 0; i < n; ++i) {
      const bool first = i == 0 || runs[i - 1].layout != runs[i].layout;
      const bool last = i + 1 == n || runs[i + 1].layout != runs[i].layout;
      const LayerPart part = first ? (last ? LayerPart::kWhole : LayerPart::kFirst)
                                   : (last ? LayerPart::kLast : LayerPart::kMiddle);
      const int64_t row = runs[i].row, end = i + 1 < n ? runs[i + 1].row : M;
      quant_linear_team(runs[i].layout - kQuantBlocks, xp, static_cast<const uint8_t*>(runs[i].w),
                        bp != nullptr ? bp + row : nullptr, yp + row, N, K, end - row, M, rows,
                        0, part);
    }
    return;
  }
  if (w.layout >= kQuantBlocks)
    return quant_linear_team(w.layout - kQuantBlocks, xp, static_cast<const uint8_t*>(w.w), bp,
                             yp, N, K, M, M, rows);
#if DG_DOT
  if constexpr (std::is_same_v<W, uint16_t>)
    if (w.layout == kAmxPacked)
      return bf16_linear_team(xp, static_cast<const W*>(w.w), bp, yp, N, K, M);
#endif
  linear_team(xp, static_cast<const W*>(w.w), w.layout == kPacked, bp, yp, N, K, M);
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
  read_vectors<W>(m);

  // h, qkv, q and att (a layer's attention) share their memory with act (its MLP's): act is
  // written once w13 has read h and the attention's buffers are dead, and read by w2 before
  // the next layer writes h
  const int64_t sizes[] = {N * std::max(D + QKV + 2 * HD, F), N * D, N * 2 * F, P * D, P * D};
  int64_t total = 0;
  for (const int64_t n : sizes) total += n;
  if (static_cast<int64_t>(m.scratch.size()) < total) m.scratch.resize(total);
  float* buffers[5];
  float* next = m.scratch.data();
  for (int i = 0; i < 5; ++i) {
    buffers[i] = next;
    next += sizes[i];
  }
  float *h = buffers[0], *qkv = h + N * D, *q = qkv + N * QKV, *att = q + N * HD;
  float *act = buffers[0], *tmp = buffers[1], *gate_up = buffers[2];
  float *last = buffers[3], *normed = buffers[4];
  float* x = s.x;
  m.quant_rows.fit(N, std::max({D, HD, F}));
  Clock clock{s.seconds, s.seconds != nullptr ? omp_get_wtime() : 0.0};

  for (int64_t l = 0; l <= L; ++l) {
#pragma omp parallel num_threads(s.threads)
    {
      if (l > 0) {  // the rest of layer l - 1, after its attention
        const LayerWeights& w = m.layers[l - 1];
        const LayerVectors& v = m.vectors[l - 1];
        linear_team<W>(att, w.wo, nullptr, tmp, N, HD, D, m.quant_rows);
        clock.mark(kLinearTime);
#pragma omp for schedule(static)
        for (int64_t n = 0; n < N; ++n) {
          residual_row(x + n * D, tmp + n * D, v.post_attn_norm, w.eps[kPostAttnEps], D);
          rms_norm_row(x + n * D, v.ffn_norm, h + n * D, D, w.eps[kFfnEps]);
        }
        clock.mark(kRowOpsTime);
        linear_team<W>(h, w.w13, nullptr, gate_up, N, D, 2 * F, m.quant_rows);
        clock.mark(kLinearTime);
#pragma omp for schedule(static)
        for (int64_t n = 0; n < N; ++n)
          activation_row(w.activation, gate_up + n * 2 * F, act + n * F, F);
        clock.mark(kRowOpsTime);
        linear_team<W>(act, w.w2, nullptr, tmp, N, F, D, m.quant_rows);
        clock.mark(kLinearTime);
      }
      if (l < L) {  // layer l up to its attention
        const LayerWeights& w = m.layers[l];
        const LayerVectors& v = m.vectors[l];
        const float* post_ffn = l > 0 ? m.vectors[l - 1].post_ffn_norm : nullptr;
        const float post_eps = l > 0 ? m.layers[l - 1].eps[kPostFfnEps] : 0.0f;
#pragma omp for schedule(static)
        for (int64_t n = 0; n < N; ++n) {
          if (l > 0) residual_row(x + n * D, tmp + n * D, post_ffn, post_eps, D);
          rms_norm_row(x + n * D, v.attn_norm, h + n * D, D, w.eps[kAttnEps]);
        }
        clock.mark(kRowOpsTime);
        linear_team<W>(h, w.wqkv, v.bqkv, qkv, N, D, QKV, m.quant_rows);
        clock.mark(kLinearTime);
        const DgRope& rope = s.rope[w.rope];
#pragma omp for schedule(static)
        for (int64_t n = 0; n < N; ++n) {  // each row to its own slot (a step's are distinct)
          const int64_t slot = s.new_slots[n], layer = l * layer_kv;
          if (w.qk_pairs) rotate_half_order_row(qkv + n * QKV, H + KVH, Dh);
          qk_norm_row(qkv + n * QKV, v, w, H, KVH, Dh);
          rope_store_row(qkv + n * QKV, rope.cos + n * Dh, rope.sin + n * Dh,
                         kc + layer + key_offset(slot, kv_width), vc + layer + slot * kv_width,
                         q + n * HD, H, KVH, Dh);
        }
        clock.mark(kRowOpsTime);
      } else {  // the picked rows' final norm and the head
        const float* post_ffn = L > 0 ? m.vectors[L - 1].post_ffn_norm : nullptr;
        const float post_eps = L > 0 ? m.layers[L - 1].eps[kPostFfnEps] : 0.0f;
        float* const normed_out = s.hidden != nullptr ? s.hidden : normed;
#pragma omp for schedule(static)
        for (int64_t p = 0; p < P; ++p) {
          const int64_t r = s.picked[p];
          std::memcpy(last + p * D, x + r * D, D * sizeof(float));
          if (L > 0) {  // the last layer's residual (a post norm on a copy: a row may be
            float* t = tmp + r * D;  // picked twice)
            if (post_ffn != nullptr) {
              std::memcpy(normed_out + p * D, t, D * sizeof(float));
              t = normed_out + p * D;
            }
            residual_row(last + p * D, t, post_ffn, post_eps, D);
          }
          rms_norm_row(last + p * D, m.final_norm, normed_out + p * D, D, m.norm_eps);
        }
        clock.mark(kRowOpsTime);
        if (s.hidden == nullptr) {  // else the caller runs the head on those rows
          linear_team<W>(normed, m.head, nullptr, s.logits, P, D, m.V, m.quant_rows);
          clock.mark(kHeadTime);
        }
      }
    }
    if (l < L) {
      const int64_t layer = l * layer_kv;
      attention(q, kc + layer, vc + layer, s.plan[m.layers[l].plan], s, att, H, KVH, Dh);
      clock.mark(kAttentionTime);
    }
  }
}

}  // namespace
