// Batch-invariant CPU kernels for one forward step (float32 activations; linear weights and
// the K/V storage in float32 or bfloat16, a bf16 value widened to float32 by a 16-bit shift,
// a K/V value rounded to bf16 as it is stored). One source for two instruction sets, chosen
// at compile time (-march=native): AVX-512 (16 float lanes) where the CPU has it, else
// AVX2 + FMA (8 lanes). The kernels are written once against a small vector layer; the two
// builds may give different bits from each other. A bf16 weight packed in the AMX tiles'
// pair layout runs on its own kernels, which round each linear's input to bf16: AMX tiles
// where the CPU has AMX-BF16, else AVX512-BF16 dot products.
//
// Every output element is computed by one fixed sequence of IEEE operations that depends
// only on that element's own inputs: never on the number of rows in the call, on a row's
// position, on the other rows, or on the thread count. Reductions run kLanes-lane partial
// sums in index order, then one fixed lane tree (lane_sum); an attention score is one FMA
// chain in head_dim order, or on bf16 K/V one bf16 dot-product chain (cpu/attention.h).
// Built with -ffp-contract=off, so the only fused multiply-adds are the explicit ones, used
// identically on every path.
//
// This file is the C ABI; the kernels live in its parts, one translation unit:
//   cpu/simd.h       the vector layer (instruction set, kLanes-lane vectors)
//   cpu/common.h     the K storage's tiles, exp on vectors, the row-wise operations
//   cpu/linear.h     linear layers on float32/bf16 weights, row-major or packed
//   cpu/amx.h        linear layers on AMX tiles (bf16 weights in the AMX layout)
//   cpu/dot.h        linear layers on AVX512-BF16 dot products (the same layout)
//   cpu/quant.h      linear layers on GGUF quantized blocks (integer dot products): the
//                    fixed order of an output's arithmetic and the choice of kernel
//   cpu/quant_blocks.h  the block formats, decoded to bytes and float scales
//   cpu/quant_rows.h    activations quantized per block of 32, by row or by pass of rows
//   cpu/quant_gemv.h    one row (lanes over k, integer sums per column)
//   cpu/quant_gemm.h    two rows or more (one column per lane, the rows' bytes broadcast)
//   cpu/quant_tiles.h   a tile of columns decoded, one column per lane
//   cpu/quant_decode.h  each type's blocks decoded into a tile
//   cpu/attention.h  attention over each row's own key list
//   cpu/activation.h the MLP's gated activations (SwiGLU, GeGLU)
//   cpu/stack_args.h dg_stack_step's argument structs
//   cpu/stack_table.h   a model's table: weights, layouts, each layer's norms and switches
//   cpu/stack_rows.h    the row-wise parts of a layer beyond the Llama layer's
//   cpu/stack.h      the layer stack of a step in one call (dg_stack_step)
//
// A plain C ABI over raw float32/int64 pointers (loaded with ctypes): no torch headers, so
// the build takes seconds. Callers pass contiguous tensors and allocate the outputs.

#include "cpu/activation.h"
#include "cpu/attention.h"
#include "cpu/common.h"
#include "cpu/dot.h"
#include "cpu/linear.h"
#include "cpu/quant.h"
#include "cpu/stack.h"

#include <omp.h>

#include <cstddef>
#include <cstdint>
#include <mutex>

extern "C" {

// y [N, M] = x [N, K] @ w[M, K].T (+ bias [M] unless null), w float32.
void dg_linear(const float* xp, const float* wp, const float* bp, float* yp, int64_t N, int64_t K,
               int64_t M, int threads) {
  linear(xp, wp, false, bp, yp, N, K, M, threads);
}

// The same with w bfloat16 (raw bits): bitwise what dg_linear gives on w widened to float32.
void dg_linear_bf16(const float* xp, const uint16_t* wp, const float* bp, float* yp, int64_t N,
                    int64_t K, int64_t M, int threads) {
  linear(xp, wp, false, bp, yp, N, K, M, threads);
}

// dg_linear and dg_linear_bf16 on a packed w (cpu/linear.h): bitwise the same y.
void dg_linear_packed(const float* xp, const float* wp, const float* bp, float* yp, int64_t N,
                      int64_t K, int64_t M, int threads) {
  linear(xp, wp, true, bp, yp, N, K, M, threads);
}

void dg_linear_packed_bf16(const float* xp, const uint16_t* wp, const float* bp, float* yp,
                           int64_t N, int64_t K, int64_t M, int threads) {
  linear(xp, wp, true, bp, yp, N, K, M, threads);
}

// y [N, M] = x [N, K] @ w.T (+ bias [M] unless null) for w [M, K / block] GGUF blocks of GGML
// type `type` (cpu/quant.h): x quantized per block of 32, integer sums per sub-block. Returns
// 0, or -1 (nothing written) for a type it does not run or a K not a multiple of its block.
int dg_linear_quant(const float* xp, const uint8_t* wp, const float* bp, float* yp, int64_t N,
                    int64_t K, int64_t M, int type, int threads) {
  const int64_t block = type == kQ4_K || type == kQ5_K || type == kQ6_K ? 256 : kQBlock;
  if (!quant_type_known(type) || K % block != 0) return -1;
  QuantRows rows;
  rows.fit(N, K);
#pragma omp parallel num_threads(threads)
  quant_linear_team(type, xp, wp, bp, yp, N, K, M, M, rows);
  return 0;
}

// dg_linear_quant through the one-row kernel (cpu/quant_gemv.h) row by row, whatever N: the
// same bits (the tests hold the many-row kernel to it).
int dg_linear_quant_one_row(const float* xp, const uint8_t* wp, const float* bp, float* yp,
                            int64_t N, int64_t K, int64_t M, int type, int threads) {
  const int64_t block = type == kQ4_K || type == kQ5_K || type == kQ6_K ? 256 : kQBlock;
  if (!quant_type_known(type) || K % block != 0) return -1;
  QuantRows rows;
  rows.fit(N, K);
#pragma omp parallel num_threads(threads)
  quant_linear_team(type, xp, wp, bp, yp, N, K, M, M, rows, INT64_MAX);
  return 0;
}

// Frees the calling thread's OpenMP team (torch's threads too: the process has one OpenMP
// runtime); the thread's next parallel region builds one again.
void dg_release_threads() { omp_pause_resource_all(omp_pause_soft); }

// The kernels that run AMX-packed bf16 weights here (dg_linear_amx and the stack's): 2 AMX
// tiles, 1 AVX512-BF16 dot products (no usable AMX), 0 none (the layout is not used).
int dg_bf16_kernels() {
#if DG_AMX
  if (amx_usable()) return 2;
#endif
  return DG_DOT;
}

#if DG_DOT
// y [N, M] = bf16(x) [N, K] @ w.T (+ bias [M] unless null) for an AMX-packed bf16 w, on the
// kernels dg_bf16_kernels() names; only where it is not 0.
void dg_linear_amx(const float* xp, const uint16_t* wp, const float* bp, float* yp, int64_t N,
                   int64_t K, int64_t M, int threads) {
#pragma omp parallel num_threads(threads)
  bf16_linear_team(xp, wp, bp, yp, N, K, M);
}
#endif

// Root-mean-square norm of each row of x [N, D]: w * (x / sqrt(mean(x^2) + eps)).
void dg_rms_norm(const float* xp, const float* wp, float* yp, int64_t N, int64_t D, float eps) {
  for (int64_t n = 0; n < N; ++n) rms_norm_row(xp + n * D, wp, yp + n * D, D, eps);
}

// Rotates the q and k heads of qkv [N, (H + 2 KVH) * Dh] by cos/sin [N, Dh] (the sign of
// rotate_half folded into sin), writes k and v to slots new_slots of kc [S / kKeyTile, KVH,
// Dh, kKeyTile] (see kKeyTile) and vc [S, KVH, Dh] and the rotated q to qp [N, H, Dh].
void dg_rope_store(const float* src, const float* cp, const float* sp, float* kc, float* vc,
                   const int64_t* slots, float* qp, int64_t N, int64_t n_heads,
                   int64_t n_kv_heads, int64_t Dh) {
  rope_store_rows(src, cp, sp, kc, vc, slots, qp, N, n_heads, n_kv_heads, Dh);
}

// The same into bfloat16 K/V (each value rounded: see put).
void dg_rope_store_bf16(const float* src, const float* cp, const float* sp, uint16_t* kc,
                        uint16_t* vc, const int64_t* slots, float* qp, int64_t N,
                        int64_t n_heads, int64_t n_kv_heads, int64_t Dh) {
  rope_store_rows(src, cp, sp, kc, vc, slots, qp, N, n_heads, n_kv_heads, Dh);
}

// yp [N, F] = silu(gate) * up for gp = gate_up [N, 2 * F] (gate first).
void dg_silu_mul(const float* gp, float* yp, int64_t N, int64_t F) {
  for (int64_t n = 0; n < N; ++n) silu_mul_row(gp + n * 2 * F, yp + n * F, F);
}

// yp [N, F] = gelu_tanh(gate) * up for gp = gate_up [N, 2 * F] (gate first).
void dg_gelu_tanh_mul(const float* gp, float* yp, int64_t N, int64_t F) {
  for (int64_t n = 0; n < N; ++n) gelu_tanh_mul_row(gp + n * 2 * F, yp + n * F, F);
}

// Grouped-query attention of each row over its own key list, in that list's order.
//
// q [N, H, Dh] -> out [N, H, Dh]; kc and vc as dg_rope_store's. Sequence s (of n_seqs) owns rows
// [row_start[s], row_start[s+1]) and keys[key_start[s] : key_start[s+1]] = its context
// slots (ctx_len[s] of them) then its new rows' slots. Row i of s attends to every context
// key, then to new row j when mask[i, j] (masks[mask_start[s] + i * T + j]) or, with
// mask_start[s] < 0, when j <= i. A row's allowed keys, in list order, are cut into blocks
// of kKeyBlock, each folded into an online softmax (cpu/attention.h): the same
// operations for that row whatever else the call holds. Rows of one sequence are taken
// in tiles of up to kQueryTile per kv head: a block of the list that several rows of the tile
// allow (a prefix of it for each: the context, and every block under the causal mask) is
// folded into all of them, its keys read from their stored tiles where they fill them in
// order from the first, else gathered once; a masked row's own keys after the context's
// whole blocks are gathered and folded into it alone.
// Needs head_dim <= kMaxHeadDim (checked by the caller).
void dg_attention(const float* qp, const float* kc, const float* vc, const int64_t* kp,
                  const int64_t* ks, const int64_t* rs, const int64_t* cl, const bool* mp,
                  const int64_t* ms, float* op, int64_t N, int64_t n_seqs, int64_t H,
                  int64_t KVH, int64_t Dh, int threads) {
  attention_rows(qp, kc, vc, kp, ks, rs, cl, mp, ms, op, N, n_seqs, H, KVH, Dh, threads);
}

// The same over bfloat16 K/V (raw bits, widened exactly as read).
void dg_attention_bf16(const float* qp, const uint16_t* kc, const uint16_t* vc,
                       const int64_t* kp, const int64_t* ks, const int64_t* rs, const int64_t* cl,
                       const bool* mp, const int64_t* ms, float* op, int64_t N, int64_t n_seqs,
                       int64_t H, int64_t KVH, int64_t Dh, int threads) {
  attention_rows(qp, kc, vc, kp, ks, rs, cl, mp, ms, op, N, n_seqs, H, KVH, Dh, threads);
}

}  // extern "C"

extern "C" {

// A layer stack's table (cpu/stack_table.h): n_layers layers of dim, n_heads / n_kv_heads
// heads of head_dim, hidden_dim and vocab; weights (float32, or bf16 bits when bf16) = the
// final norm, the head, then per layer its kLayerTensors in LayerTensor order (a norm or bias
// absent: null; wqkv's and w13's tails: their last part in blocks of another type, or null);
// layouts[i]: the Layout of weights[i] (a linear layer's; kAmxPacked only where
// dg_bf16_kernels; kQuantBlocks + a GGML type for rows of its blocks); eps = per layer its
// kLayerNorms, then the final norm's; switches = per layer its kLayerSwitches (Activation,
// plan and rope slot of DgStepArgs). Null for a quantized type not run here, a tail beside
// weights that are not blocks, or a switch out of range. The weights must outlive the table.
void* dg_stack_new(int64_t n_layers, int64_t dim, int64_t n_heads, int64_t n_kv_heads,
                   int64_t head_dim, int64_t hidden_dim, int64_t vocab, int bf16,
                   const void* const* weights, const int* layouts, const float* eps,
                   const int* switches) {
  return new_stack(n_layers, dim, n_heads, n_kv_heads, head_dim, hidden_dim, vocab, bf16 != 0,
                   weights, layouts, eps, switches);
}

void dg_stack_free(void* stack) { delete static_cast<Stack*>(stack); }

// One forward step of the stack (see DgStepArgs, cpu/stack.h): writes every row's K/V to its
// slot in each layer of k_cache/v_cache (of the weights' type: float32, or bfloat16 bits for
// a bf16 stack) and the picked rows' logits; x is overwritten. seconds, unless null, gets
// the step's seconds added per kind: linear layers, the head, attention, the row-wise
// operations.
void dg_stack_step(void* stack, const DgStepArgs* args) {
  Stack& m = *static_cast<Stack*>(stack);
  const std::lock_guard<std::mutex> hold(m.busy);
  if (m.bf16)
    stack_step<uint16_t>(m, *args);
  else
    stack_step<float>(m, *args);
}

// DgStepArgs' layout (and its parts'), for cpp.build_library to compare with its ctypes
// mirror: see step_args_layout. Returns the number of values written.
int64_t dg_step_args_layout(int64_t* out) { return step_args_layout(out); }

}  // extern "C"
