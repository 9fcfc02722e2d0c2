// A quantized linear layer's input rows, quantized per block of 32 values to int8 as
// llama.cpp's Q8_0 activations, in the layout its kernel reads.
#pragma once

#include <omp.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "quant_blocks.h"
#include "simd.h"

namespace {

// Rows per row vector of the many-row kernel (cpu/quant_gemm.h): one row per float lane.
constexpr int64_t kRowLanes = kLanes;

// q int8, d (the block's scale) and sums (d times the sum of its q) float32, in one of two
// layouts: by row (q [N][K], d and sums [N][K / 32]) or by row vector, kRowLanes rows
// interleaved 4 values at a time (q [V][K / 4][kRowLanes][4], d and sums
// [V][K / 32][kRowLanes], V = N / kRowLanes rounded up, the missing rows' values 0).
struct QuantRows {
  std::vector<int8_t> q;
  std::vector<float> d, sums;
  // Room for N rows of K values in either layout (outside a parallel region).
  void fit(int64_t N, int64_t K) {
    const int64_t rows = (N + kRowLanes - 1) / kRowLanes * kRowLanes;
    if (static_cast<int64_t>(q.size()) < rows * K) {
      q.resize(rows * K);
      d.resize(rows * K / kQBlock);
      sums.resize(rows * K / kQBlock);
    }
  }
};

// One block of 32 values: d = max|x| / 127, q = round-to-nearest-even(x / d) (the
// conversion's rounding under the default MXCSR), sum = d sum q.
inline void quantize_block(const float* v, int8_t* q, float* d, float* sum) {
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
  __m256i total = _mm256_setzero_si256();
  __m256i ints[4];
  for (int i = 0; i < 4; ++i) {
    ints[i] = _mm256_cvtps_epi32(_mm256_mul_ps(x[i], _mm256_set1_ps(inverse)));
    total = _mm256_add_epi32(total, ints[i]);
  }
  const __m256i words = _mm256_packs_epi32(ints[0], ints[1]), more = _mm256_packs_epi32(ints[2], ints[3]);
  const __m256i bytes = _mm256_permutevar8x32_epi32(_mm256_packs_epi16(words, more),
                                                    _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(q), bytes);
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(total), _mm256_extracti128_si256(total, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
  *d = scale;
  *sum = scale * static_cast<float>(_mm_cvtsi128_si32(s));
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

// x [N, K] into rows by row vector, each q byte xor `flip` (0x80: q + 128 as uint8);
// called by every thread of a team, ends with a barrier.
inline void quantize_by_vector(const float* x, int64_t N, int64_t K, uint8_t flip,
                               QuantRows& rows) {
  const int64_t nb = K / kQBlock, padded = (N + kRowLanes - 1) / kRowLanes * kRowLanes;
  const uint32_t mask = 0x01010101u * flip;
#pragma omp for schedule(static)
  for (int64_t n = 0; n < padded; ++n) {
    const int64_t v = n / kRowLanes, lane = n % kRowLanes;
    uint32_t* q = reinterpret_cast<uint32_t*>(rows.q.data()) + v * (K / 4) * kRowLanes + lane;
    float* d = rows.d.data() + v * nb * kRowLanes + lane;
    float* sums = rows.sums.data() + v * nb * kRowLanes + lane;
    for (int64_t b = 0; b < nb; ++b) {
      alignas(32) int8_t block[kQBlock] = {};
      float scale = 0.0f, sum = 0.0f;
      if (n < N) quantize_block(x + n * K + b * kQBlock, block, &scale, &sum);
      for (int j = 0; j < kQBlock / 4; ++j) {
        uint32_t four;
        std::memcpy(&four, block + 4 * j, 4);
        q[(b * kQBlock / 4 + j) * kRowLanes] = four ^ mask;
      }
      d[b * kRowLanes] = scale;
      sums[b * kRowLanes] = sum;
    }
  }
}

}  // namespace
