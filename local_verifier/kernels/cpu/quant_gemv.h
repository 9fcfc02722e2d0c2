// The quantized linear layer for a single row (a decode step): a weight sub-block's 32 values
// decoded in registers and multiplied with the row's 32 int8 as 8 int32 lanes of 4
// products, the lanes of 8 columns summed into one vector of the columns' integer sums,
// then the float arithmetic of cpu/quant.h on 8 columns at once, each column's scales and
// minimums decoded into one lane.
#pragma once

#include <omp.h>

#include <algorithm>
#include <cstdint>

#include "linear.h"
#include "quant_blocks.h"
#include "quant_decode.h"
#include "quant_rows.h"
#include "simd.h"

namespace {

// Lane i: the exact sum of products 4i..4i+3 of w (uint8 values 0-63) and x (int8).
inline __m256i dot_unsigned(__m256i w, __m256i x) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
  return _mm256_dpbusd_epi32(_mm256_setzero_si256(), w, x);
#else  // |pair sum| <= 2 * 63 * 128: no saturation
  return _mm256_madd_epi16(_mm256_maddubs_epi16(w, x), _mm256_set1_epi16(1));
#endif
}

// Lane i: the exact sum of products 4i..4i+3 of two int8 vectors (x never -128).
inline __m256i dot_signed(__m256i w, __m256i x) {
  const __m256i magnitude = _mm256_sign_epi8(w, w);  // |w| as uint8 (-128 -> 128)
  const __m256i signed_x = _mm256_sign_epi8(x, w);
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
  return _mm256_dpbusd_epi32(_mm256_setzero_si256(), magnitude, signed_x);
#else  // |pair sum| <= 2 * 128 * 127: no saturation
  return _mm256_madd_epi16(_mm256_maddubs_epi16(magnitude, signed_x), _mm256_set1_epi16(1));
#endif
}

// The integer sums of 8 columns' lane vectors v[c]: lane c of `first` the sum of v[c]'s
// lanes 0-3 (values 0-15), of `second` lanes 4-7 (values 16-31).
inline void column_sums(const __m256i (&v)[8], __m256i* first, __m256i* second) {
  const __m256i a = _mm256_hadd_epi32(v[0], v[1]), b = _mm256_hadd_epi32(v[2], v[3]);
  const __m256i c = _mm256_hadd_epi32(v[4], v[5]), d = _mm256_hadd_epi32(v[6], v[7]);
  const __m256i low = _mm256_hadd_epi32(a, b), high = _mm256_hadd_epi32(c, d);
  *first = _mm256_permute2x128_si256(low, high, 0x20);
  *second = _mm256_permute2x128_si256(low, high, 0x31);
}

constexpr int64_t kGemvCols = 8;  // columns whose integer sums share one vector

// Block b's scales (kSubs x kGroups, in k order) and minimums (kSubs) of the 8 columns whose
// rows start at w[c], lane c each (at: w[c] - w[0]): one gather for the 32-value types; the
// many-row kernel's decoders where a tile is 8 columns (AVX2: about half the time of a
// decode step's Q4_K layer goes to decoding the scales column by column); else by column.
template <int T>
inline void gemv_scales(const uint8_t* const (&w)[kGemvCols], int64_t b, __m256i at,
                        __m256 (&scale)[QuantTraits<T>::kSubs * QuantTraits<T>::kGroups],
                        __m256 (&min)[QuantTraits<T>::kSubs]) {
  using Q = QuantTraits<T>;
  constexpr int kScales = Q::kSubs * Q::kGroups;
  if constexpr (Q::kValues == kQBlock) {
    min[0] = _mm256_setzero_ps();
    Q::scales8(w[0] + b * Q::kBytes, at, &scale[0], &min[0]);
  } else if constexpr (kTileCols == kGemvCols) {
    const uint8_t* blocks[kTileCols];
    for (int c = 0; c < kGemvCols; ++c) blocks[c] = w[c] + b * Q::kBytes;
    TileDecoder<T>::scales(blocks, scale, min);
  } else {
    alignas(32) float s[kScales][kGemvCols], m[Q::kSubs][kGemvCols] = {};
    for (int c = 0; c < kGemvCols; ++c) {
      float cs[kScales], cm[Q::kSubs];
      Q::scales(w[c] + b * Q::kBytes, cs, cm);
      for (int i = 0; i < kScales; ++i) s[i][c] = cs[i];
      if constexpr (Q::kMin)
        for (int i = 0; i < Q::kSubs; ++i) m[i][c] = cm[i];
    }
    for (int i = 0; i < kScales; ++i) scale[i] = _mm256_load_ps(s[i]);
    for (int i = 0; i < Q::kSubs; ++i) min[i] = _mm256_load_ps(m[i]);
  }
}

// out[c] for the 8 columns whose rows of nb blocks start at w[c], against one quantized row
// (xq, its blocks' d and sums); bias (8 values) unless null. Block b prefetches its share of
// `next` (the following group's rows, one run) into L1, so that the memory streams one run
// instead of 8 short ones.
template <int T>
inline void gemv_cols(const uint8_t* const (&w)[kGemvCols], int64_t nb, const int8_t* xq,
                      const float* xd, const float* xs, const float* bias, float* out,
                      Lookahead next) {
  using Q = QuantTraits<T>;
  __m256i at;  // each column's first block from the first's
  for (int c = 0; c < kGemvCols; ++c)
    reinterpret_cast<int32_t*>(&at)[c] = static_cast<int32_t>(w[c] - w[0]);
  __m256 acc = _mm256_setzero_ps();
  // no division per block: on Zen 3 the two a block took were 7-11% of the 32-value types'
  // one-row time
  LookaheadSpread lines{next, nb};
  for (int64_t b = 0; b < nb; ++b) {
    lines.step(true);  // into L1 (into L2: 1.3x the time)
    __m256 scale[Q::kSubs * Q::kGroups], min[Q::kSubs];
    gemv_scales<T>(w, b, at, scale, min);
    for (int s = 0; s < Q::kSubs; ++s) {
      const int64_t block = b * Q::kSubs + s;  // the activation block
      const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq + block * kQBlock));
      __m256i lanes[kGemvCols];
      for (int c = 0; c < kGemvCols; ++c) {
        const __m256i v = Q::values(w[c] + b * Q::kBytes, s);
        lanes[c] = Q::kSigned ? dot_signed(v, x) : dot_unsigned(v, x);
      }
      __m256i first, second;
      column_sums(lanes, &first, &second);
      if constexpr (Q::kMin)
        acc = _mm256_fmadd_ps(min[s], _mm256_set1_ps(xs[block]), acc);
      const __m256 xdv = _mm256_set1_ps(xd[block]);
      if constexpr (Q::kGroups == 1) {
        const __m256 sums = _mm256_cvtepi32_ps(_mm256_add_epi32(first, second));
        acc = _mm256_fmadd_ps(sums, _mm256_mul_ps(scale[s], xdv), acc);
      } else {
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(first), _mm256_mul_ps(scale[2 * s], xdv), acc);
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(second), _mm256_mul_ps(scale[2 * s + 1], xdv),
                              acc);
      }
    }
  }
  __m256 total = acc;
  if (bias != nullptr) total = _mm256_add_ps(total, _mm256_loadu_ps(bias));
  _mm256_storeu_ps(out, total);
}

// y [N, M] (rows ldy apart) = x [N, K] @ w.T (+ bias) for w [M, K / values per block] blocks
// of type T, row by row: the calling team quantizes x by row into `rows` (grown beforehand:
// fit; for `part` kWhole and kFirst), then shares groups of kGemvCols columns, an even run
// per thread. Ends with a barrier (for kWhole and kLast).
template <int T>
void quant_gemv_team(const float* x, const uint8_t* w, const float* bias, float* y, int64_t N,
                     int64_t K, int64_t M, int64_t ldy, QuantRows& rows, LayerPart part) {
  using Q = QuantTraits<T>;
  const int64_t ldb = K / kQBlock, nb = K / Q::kValues, row_bytes = nb * Q::kBytes;
  if (quantizes(part)) quantize_by_row(x, N, K, rows);
  const int64_t groups = (M + kGemvCols - 1) / kGemvCols;
  const int64_t team = omp_get_num_threads(), me = omp_get_thread_num();
  for (int64_t g = groups * me / team; g < groups * (me + 1) / team; ++g) {
    const int64_t m0 = g * kGemvCols, cols = std::min(kGemvCols, M - m0);
    const uint8_t* columns[kGemvCols];  // a last partial group repeats its last column
    alignas(32) float b[kGemvCols] = {}, out[kGemvCols];
    for (int c = 0; c < kGemvCols; ++c) {
      const int64_t m = m0 + std::min<int64_t>(c, cols - 1);
      columns[c] = w + m * row_bytes;
      if (bias != nullptr) b[c] = bias[m];
    }
    const int64_t after = std::max<int64_t>(0, std::min(kGemvCols, M - m0 - kGemvCols));
    const Lookahead next{reinterpret_cast<const char*>(w + (m0 + kGemvCols) * row_bytes),
                         after * row_bytes / 64};
    for (int64_t n = 0; n < N; ++n) {
      gemv_cols<T>(columns, nb, rows.q.data() + n * K, rows.d.data() + n * ldb,
                   rows.sums.data() + n * ldb, bias != nullptr ? b : nullptr, out,
                   n == 0 ? next : Lookahead{});
      std::copy(out, out + cols, y + n * ldy + m0);
    }
  }
  if (ends_team(part)) {
#pragma omp barrier
  }
}

}  // namespace
