// A quantized linear layer's input rows, quantized per block of 32 values to int8 as
// llama.cpp's Q8_0 activations, in the layout its kernel reads.
#pragma once

#include <omp.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "quant_blocks.h"
#include "quant_tiles.h"
#include "simd.h"

namespace {

// Rows per pass of the many-row kernel (cpu/quant_gemm.h) over a decoded tile: each row's
// float sums and integer sums are registers (2 x 8 of 32 on AVX-512, 2 x 4 of 16 on AVX2).
constexpr int64_t kPassRows = DG_AVX512 ? 8 : 4;

// q int8, d (the block's scale) and sums (d times the sum of its q) float32, and corr
// (-kHeldOffset times the sum of q per 16 values for Q6_K, per 32 for Q8_0: the offset of
// int8 weights held as uint8), in one of two layouts: by row (q [N][K], d and sums
// [N][K / 32]) or by pass, kPassRows rows interleaved 4 values at a time (q [P][K / 4]
// [kPassRows][4], d, sums and corr32 [P][K / 32][kPassRows], corr16 [P][K / 16][kPassRows],
// P = N / kPassRows rounded up).
struct QuantRows {
  std::vector<int8_t> q;
  std::vector<float> d, sums;
  std::vector<int32_t> corr16, corr32;
  // Room for N rows of K values in either layout (outside a parallel region).
  void fit(int64_t N, int64_t K) {
    const int64_t rows = (N + kPassRows - 1) / kPassRows * kPassRows;
    if (static_cast<int64_t>(q.size()) < rows * K) {
      q.resize(rows * K);
      d.resize(rows * K / kQBlock);
      sums.resize(rows * K / kQBlock);
      corr32.resize(rows * K / kQBlock);
      corr16.resize(rows * K / 16);
    }
  }
};

// One block of 32 values: d = max|x| / 127, q = round-to-nearest-even(x / d) (the
// conversion's rounding under the default MXCSR), sum = d sum q; halves (unless null) the
// integer sums of q over values 0-15 and 16-31.
inline void quantize_block(const float* v, int8_t* q, float* d, float* sum,
                           int32_t* halves = nullptr) {
  const __m256 sign = _mm256_set1_ps(-0.0f);
  __m256 x[4], top = _mm256_setzero_ps();
  for (int i = 0; i < 4; ++i) {
    x[i] = _mm256_loadu_ps(v + 8 * i);
    top = _mm256_max_ps(top, _mm256_andnot_ps(sign, x[i]));
  }
  __m128 t = _mm_max_ps(_mm256_castps256_ps128(top), _mm256_extractf128_ps(top, 1));
  t = _mm_max_ps(t, _mm_movehl_ps(t, t));
  t = _mm_max_ss(t, _mm_movehdup_ps(t));
  const float scale = _mm_cvtss_f32(t) / 127.0f, inverse = scale != 0.0f ? 1.0f / scale : 0.0f;
  __m256i ints[4];
  for (int i = 0; i < 4; ++i)
    ints[i] = _mm256_cvtps_epi32(_mm256_mul_ps(x[i], _mm256_set1_ps(inverse)));
  const __m256i words = _mm256_packs_epi32(ints[0], ints[1]);
  const __m256i more = _mm256_packs_epi32(ints[2], ints[3]);
  const __m256i bytes = _mm256_permutevar8x32_epi32(_mm256_packs_epi16(words, more),
                                                    _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(q), bytes);
  const auto lanes_sum = [](__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
    return _mm_cvtsi128_si32(s);
  };
  const int32_t first = lanes_sum(_mm256_add_epi32(ints[0], ints[1]));
  const int32_t second = lanes_sum(_mm256_add_epi32(ints[2], ints[3]));
  *d = scale;
  *sum = scale * static_cast<float>(first + second);
  if (halves != nullptr) {
    halves[0] = first;
    halves[1] = second;
  }
}

// The part of a layer's outputs a team's call computes, for a layer whose rows of one type lie
// in several places: the first quantizes x into the rows and ends without a barrier (the team
// goes on to the next part's columns), a middle one and the last take the rows as the first
// left them, and only the last ends with the barrier; a whole layer does both.
enum class LayerPart { kWhole, kFirst, kMiddle, kLast };

inline bool quantizes(LayerPart part) {
  return part == LayerPart::kWhole || part == LayerPart::kFirst;
}
inline bool ends_team(LayerPart part) {
  return part == LayerPart::kWhole || part == LayerPart::kLast;
}

// x [N, K] into rows by row; called by every thread of a team, ends with a barrier.
inline void quantize_by_row(const float* x, int64_t N, int64_t K, QuantRows& rows) {
  const int64_t nb = K / kQBlock;
#pragma omp for schedule(static)
  for (int64_t n = 0; n < N; ++n)
    for (int64_t b = 0; b < nb; ++b)
      quantize_block(x + n * K + b * kQBlock, rows.q.data() + n * K + b * kQBlock,
                     rows.d.data() + n * nb + b, rows.sums.data() + n * nb + b);
}

// x [N, K] into rows by pass; called by every thread of a team, ends with a barrier.
inline void quantize_by_pass(const float* x, int64_t N, int64_t K, QuantRows& rows) {
  const int64_t nb = K / kQBlock;
#pragma omp for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    const int64_t p = n / kPassRows, lane = n % kPassRows;
    uint32_t* q = reinterpret_cast<uint32_t*>(rows.q.data()) + p * (K / 4) * kPassRows + lane;
    const int64_t at = p * nb * kPassRows + lane;  // block 0's d, sums, corr32
    int32_t* corr16 = rows.corr16.data() + 2 * p * nb * kPassRows + lane;
    for (int64_t b = 0; b < nb; ++b) {
      alignas(32) int8_t block[kQBlock];
      int32_t halves[2];
      quantize_block(x + n * K + b * kQBlock, block, rows.d.data() + at + b * kPassRows,
                     rows.sums.data() + at + b * kPassRows, halves);
      for (int j = 0; j < kQBlock / 4; ++j)
        std::memcpy(q + (b * kQBlock / 4 + j) * kPassRows, block + 4 * j, 4);
      corr16[2 * b * kPassRows] = -kHeldOffset<kQ6_K> * halves[0];
      corr16[(2 * b + 1) * kPassRows] = -kHeldOffset<kQ6_K> * halves[1];
      rows.corr32[at + b * kPassRows] = -kHeldOffset<kQ8_0> * (halves[0] + halves[1]);
    }
  }
}

}  // namespace
