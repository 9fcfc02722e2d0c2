// Linear layers on GGUF quantized weights, applied as they lie in the file: row-major rows
// of blocks (cpu/quant_blocks.h), activations quantized per block of 32 values
// (cpu/quant_rows.h), one row on cpu/quant_gemv.h, more on cpu/quant_gemm.h (tiles decoded by
// cpu/quant_decode.h into cpu/quant_tiles.h's layout).
#pragma once

#include <cstdint>

#include "quant_blocks.h"
#include "quant_gemm.h"
#include "quant_gemv.h"
#include "quant_rows.h"

namespace {

// ---- Quantized linear layers. ---------------------------------------------------------------
//
// y[n][m] = sum over k of w[m][k] x[n][k], with x quantized per block of 32 values to int8
// (llama.cpp's Q8_0 activations: d = max|x| / 127, q = round-to-nearest-even(x / d), and
// xs = d * sum q for the types with a minimum) and w's values as bytes (the nibbles, fifth
// and sixth bits; Q4_0's and Q5_0's offsets of -8 and -16 as minimum terms; Q8_0 and Q6_K
// signed) with a float scale per group of 32 values (16 for Q6_K) and, for the types with
// one, a float minimum per 32. The fixed order of one output's arithmetic, whatever the
// kernel, row count, tile or thread:
//   acc = 0; for each block of 32 values of k in order:
//     acc = fma(min, xs, acc)                                  (types with a minimum)
//     for each scale group in it, in order:
//       acc = fma(float(sum of the group's products), scale * d, acc)
//   y = acc, + bias (if any).
// The sum of a group's products is an integer computed exactly (any grouping of the
// additions gives the same value); every float operation above is on this row's and this
// column's values alone, so an output has the same bits for any row count, tiling and
// thread count. The one-row kernel (lanes over k, the integer lanes summed per column) and
// the many-row kernel (one column per lane, the rows in registers) reach the same integers
// and then run these operations.

// Rows from which a step takes the many-row kernel for type T: every row count on AVX-512
// (one row through it takes 0.8-0.9x the one-row kernel's time on Zen 4: the tiles stream
// their weights from memory better); on AVX2 two rows for Q4_K, Q5_K, Q4_1 and Q8_0 (one row
// through it takes 1.0-1.3x the one-row kernel's time), one for Q6_K, Q4_0 and Q5_0
// (0.78-0.86x). Measured on Zen 3 with layers of a 1B model's shapes from memory, two threads.
template <int T>
constexpr int64_t kGemmMinRows = DG_AVX512 || T == kQ6_K || T == kQ4_0 || T == kQ5_0 ? 1 : 2;

// y [N, M] (rows ldy apart) = x [N, K] @ w.T (+ bias) for w [M, K / values per block] blocks
// of type T; the calling team quantizes x into `rows` (grown beforehand by the caller: fit;
// as the first part of the layer left them for `part` kMiddle and kLast); the many-row kernel
// from gemm_rows rows (0: kGemmMinRows<T>). Ends with a barrier (for kWhole and kLast).
template <int T>
void quant_linear_team_of(const float* x, const uint8_t* w, const float* bias, float* y,
                          int64_t N, int64_t K, int64_t M, int64_t ldy, QuantRows& rows,
                          int64_t gemm_rows, LayerPart part) {
  if (N >= (gemm_rows > 0 ? gemm_rows : kGemmMinRows<T>))
    return quant_gemm_team<T>(x, w, bias, y, N, K, M, ldy, rows, part);
  quant_gemv_team<T>(x, w, bias, y, N, K, M, ldy, rows, part);
}

// quant_linear_team_of for a GGML type code (quant_type_known), K a multiple of its block.
inline void quant_linear_team(int type, const float* x, const uint8_t* w, const float* bias,
                              float* y, int64_t N, int64_t K, int64_t M, int64_t ldy,
                              QuantRows& rows, int64_t gemm_rows = 0,
                              LayerPart part = LayerPart::kWhole) {
  const auto run = [&](auto kernel) { kernel(x, w, bias, y, N, K, M, ldy, rows, gemm_rows, part); };
  switch (type) {
    case kQ4_0: return run(quant_linear_team_of<kQ4_0>);
    case kQ4_1: return run(quant_linear_team_of<kQ4_1>);
    case kQ5_0: return run(quant_linear_team_of<kQ5_0>);
    case kQ8_0: return run(quant_linear_team_of<kQ8_0>);
    case kQ4_K: return run(quant_linear_team_of<kQ4_K>);
    case kQ5_K: return run(quant_linear_team_of<kQ5_K>);
    case kQ6_K: return run(quant_linear_team_of<kQ6_K>);
    default: return;
  }
}

}  // namespace
