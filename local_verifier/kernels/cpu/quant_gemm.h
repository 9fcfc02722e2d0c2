// The quantized linear layer for many rows (prompt chunks, drafted verification): one row
// per lane. A thread decodes a tile of kGemmCols columns once into bytes and float scales
// (cpu/quant_blocks.h), then every row vector of the step (cpu/quant_rows.h's layout by row
// vector) runs against it: per 4 values of k, the 4 weight bytes broadcast to every lane and
// multiplied with each lane's 4 activation bytes (vpdpbusd where the CPU has AVX512-VNNI,
// else vpmaddubsw + vpmaddwd), so a decoded weight byte serves every row, and a row's
// integer sums, scales and minimums are its lane's alone.
#pragma once

#include <omp.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "quant_blocks.h"
#include "quant_rows.h"
#include "simd.h"

namespace {

// ---- Integer vectors of one int32 lane per row. ----------------------------------------

#if DG_AVX512 && defined(__AVX512VNNI__)
#define DG_VNNI 1
#else
#define DG_VNNI 0
#endif

#if DG_AVX512
using IVec = __m512i;
inline IVec ibroadcast(const uint8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm512_set1_epi32(v);
}
inline IVec iset1(int32_t v) { return _mm512_set1_epi32(v); }
inline IVec iadd(IVec a, IVec b) { return _mm512_add_epi32(a, b); }
inline IVec iload(const int8_t* p) { return _mm512_loadu_si512(p); }
inline Vec to_float(IVec v) { return _mm512_cvtepi32_ps(v); }
inline void in_register(IVec& v) { __asm__("" : "+v"(v)); }  // loaded once, not per use
#else
using IVec = __m256i;
inline IVec ibroadcast(const uint8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm256_set1_epi32(v);
}
inline IVec iset1(int32_t v) { return _mm256_set1_epi32(v); }
inline IVec iadd(IVec a, IVec b) { return _mm256_add_epi32(a, b); }
inline IVec iload(const int8_t* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }
inline Vec to_float(IVec v) { return _mm256_cvtepi32_ps(v); }
inline void in_register(IVec& v) { __asm__("" : "+x"(v)); }  // loaded once, not per use
#endif

// Signed weights with VNNI: activations held as q + 128 (uint8, vpdpbusd's unsigned side),
// each group's sum starting from -128 times the sum of its weights.
constexpr bool kSignedOffset = DG_VNNI;

// acc + per lane the exact sum of the products of its 4 activation bytes x with the 4 weight
// bytes w (the same in every lane): Signed, int8 weights (x q + 128 with kSignedOffset);
// else uint8 weights 0-63 and int8 x (never -128).
template <bool Signed>
inline IVec dot4(IVec acc, IVec w, IVec x) {
#if DG_VNNI
  return Signed ? _mm512_dpbusd_epi32(acc, x, w) : _mm512_dpbusd_epi32(acc, w, x);
#elif DG_AVX512  // |pair sum| <= 2 * 128 * 127: no saturation
  if constexpr (Signed) {
    x = _mm512_mask_sub_epi8(x, _mm512_movepi8_mask(w), _mm512_setzero_si512(), x);
    w = _mm512_abs_epi8(w);
  }
  return _mm512_add_epi32(acc, _mm512_madd_epi16(_mm512_maddubs_epi16(w, x), _mm512_set1_epi16(1)));
#else
  if constexpr (Signed) {
    x = _mm256_sign_epi8(x, w);
    w = _mm256_sign_epi8(w, w);
  }
  return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(w, x), _mm256_set1_epi16(1)));
#endif
}

// ---- Decoded columns. --------------------------------------------------------------------

// Columns decoded together, a register tile's: with two integer sums per output, 12 (AVX-512)
// or 8 (AVX2) independent vpdpbusd chains, enough to hide its latency, in the registers.
constexpr int kGemmCols = DG_AVX512 ? 6 : 4;

// kGemmCols columns of K values each, decoded: values [c][K] bytes, scale [c][K / 32
// groups], min [c][K / 32] and, for signed types with kSignedOffset, init [c][groups] (-128
// times each group's weight sum).
struct DecodedCols {
  std::vector<uint8_t> values;
  std::vector<float> scale, min;
  std::vector<int32_t> init;
  void fit(int64_t cols, int64_t K) {
    if (static_cast<int64_t>(values.size()) < cols * K) {
      values.resize(cols * K);
      scale.resize(cols * K / 16);
      min.resize(cols * K / kQBlock);
      init.resize(cols * K / 16);
    }
  }
};
thread_local DecodedCols decoded_cols;

// Block b of one column's row (w, its first block) decoded into values, scale, min, init
// (that column's rows of DecodedCols).
template <int T>
inline void decode_block(const uint8_t* w, int64_t b, uint8_t* values, float* scale,
                         float* min, int32_t* init) {
  using Q = QuantTraits<T>;
  w += b * Q::kBytes;
  Q::scales(w, scale + b * Q::kSubs * Q::kGroups, min + b * Q::kSubs);
  for (int s = 0; s < Q::kSubs; ++s) {
    const int64_t at = b * Q::kSubs + s;
    const __m256i v = Q::values(w, s);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(values + at * kQBlock), v);
    if constexpr (Q::kSigned && kSignedOffset) {  // sums of 8 values + 128 each
      alignas(32) int64_t eights[4];
      _mm256_store_si256(reinterpret_cast<__m256i*>(eights),
                         _mm256_sad_epu8(_mm256_xor_si256(v, _mm256_set1_epi8(-128)),
                                         _mm256_setzero_si256()));
      if constexpr (Q::kGroups == 1) {
        init[at] = -128 * static_cast<int32_t>(eights[0] + eights[1] + eights[2] + eights[3] - 32 * 128);
      } else {
        init[2 * at] = -128 * static_cast<int32_t>(eights[0] + eights[1] - 16 * 128);
        init[2 * at + 1] = -128 * static_cast<int32_t>(eights[2] + eights[3] - 16 * 128);
      }
    }
  }
}

// The kGemmCols columns whose rows of nb blocks start at w[c] decoded into dc, block by
// block across the columns (their streams read side by side).
template <int T>
inline void decode_cols(const uint8_t* const (&w)[kGemmCols], int64_t nb, int64_t K,
                        DecodedCols& dc) {
  using Q = QuantTraits<T>;
  const int64_t nb32 = K / kQBlock, groups = nb32 * Q::kGroups;
  for (int64_t b = 0; b < nb; ++b)
    for (int c = 0; c < kGemmCols; ++c)
      decode_block<T>(w[c], b, dc.values.data() + c * K, dc.scale.data() + c * groups,
                      dc.min.data() + c * nb32, dc.init.data() + c * groups);
}

// ---- The register tile: RV row vectors x C decoded columns. -------------------------------

constexpr int kGemmRowVectors = 1;  // row vectors per register tile (2: no faster)

// out[v][c] = row vectors v of the quantized rows (xq, xd, xs at the first one's) against
// decoded columns c (K values apart; scale, min and init their rows' strides apart), before
// the bias: per activation block, in k order, the minimum term, then per scale group its
// integer sums (from 0, or init) folded in by one FMA with the product of the two scales.
template <int T, int RV, int C>
inline void gemm_tile(const DecodedCols& cols, const int8_t* xq, const float* xd,
                      const float* xs, int64_t K, Vec (&out)[RV][C]) {
  using Q = QuantTraits<T>;
  constexpr int kGroups = Q::kGroups, kWords = kQBlock / 4 / kGroups;  // 4-byte words per group
  constexpr bool kOffset = Q::kSigned && kSignedOffset;
  const int64_t nb = K / kQBlock, groups = nb * kGroups;
  const int64_t qstride = K * kRowLanes, fstride = nb * kRowLanes;  // row vector to the next
  Vec acc[RV][C];
  for (int v = 0; v < RV; ++v)
    for (int c = 0; c < C; ++c) acc[v][c] = zero();
  for (int64_t b = 0; b < nb; ++b) {
    Vec xdv[RV];
    for (int v = 0; v < RV; ++v) xdv[v] = load(xd + v * fstride + b * kRowLanes);
    if constexpr (Q::kMin)
      for (int v = 0; v < RV; ++v) {
        const Vec xsv = load(xs + v * fstride + b * kRowLanes);
        for (int c = 0; c < C; ++c) acc[v][c] = fmadd(set1(cols.min[c * nb + b]), xsv, acc[v][c]);
      }
    for (int g = 0; g < kGroups; ++g) {
      const int64_t group = b * kGroups + g;
      // two interleaved integer sums per output (words j even and odd), added at the end
      // (exact): twice the independent vpdpbusd chains
      IVec sums[2][RV][C];
      for (int c = 0; c < C; ++c) {
        const IVec start = kOffset ? iset1(cols.init[c * groups + group]) : iset1(0);
        for (int v = 0; v < RV; ++v) {
          sums[0][v][c] = start;
          sums[1][v][c] = iset1(0);
        }
      }
#pragma GCC unroll 8
      for (int j = 0; j < kWords; ++j) {
        const int64_t word = group * kWords + j;
        IVec xv[RV];
        for (int v = 0; v < RV; ++v) {
          xv[v] = iload(xq + v * qstride + word * 4 * kRowLanes);
          in_register(xv[v]);
        }
        for (int c = 0; c < C; ++c) {
          const IVec wv = ibroadcast(cols.values.data() + c * K + word * 4);
          for (int v = 0; v < RV; ++v)
            sums[j % 2][v][c] = dot4<Q::kSigned>(sums[j % 2][v][c], wv, xv[v]);
        }
      }
      for (int v = 0; v < RV; ++v)
        for (int c = 0; c < C; ++c) sums[0][v][c] = iadd(sums[0][v][c], sums[1][v][c]);
      for (int c = 0; c < C; ++c) {
        const Vec ws = set1(cols.scale[c * groups + group]);
        for (int v = 0; v < RV; ++v)
          acc[v][c] = fmadd(to_float(sums[0][v][c]), mul(ws, xdv[v]), acc[v][c]);
      }
    }
  }
  for (int v = 0; v < RV; ++v)
    for (int c = 0; c < C; ++c) out[v][c] = acc[v][c];
}

// Row vectors v0 .. v0 + RV - 1 against the decoded columns m0 .. m0 + cols - 1: out plus
// the bias into y (the rows that exist).
template <int T, int RV>
inline void gemm_rows(const DecodedCols& dc, const QuantRows& rows, int64_t v0, int64_t N,
                      int64_t K, int64_t M, int64_t m0, int64_t cols, const float* bias,
                      float* y) {
  const int64_t nb = K / kQBlock;
  Vec out[RV][kGemmCols];
  gemm_tile<T, RV, kGemmCols>(dc, rows.q.data() + v0 * K * kRowLanes,
                              rows.d.data() + v0 * nb * kRowLanes,
                              rows.sums.data() + v0 * nb * kRowLanes, K, out);
  for (int v = 0; v < RV; ++v) {
    const int64_t r0 = (v0 + v) * kRowLanes, live = std::min(kRowLanes, N - r0);
    for (int64_t c = 0; c < cols; ++c) {
      alignas(64) float lanes[kRowLanes];
      store(lanes, bias != nullptr ? add(out[v][c], set1(bias[m0 + c])) : out[v][c]);
      for (int64_t r = 0; r < live; ++r) y[(r0 + r) * M + m0 + c] = lanes[r];
    }
  }
}

// gemm_rows for count <= RV row vectors.
template <int T, int RV>
inline void gemm_rows_upto(int64_t count, const DecodedCols& dc, const QuantRows& rows,
                           int64_t v0, int64_t N, int64_t K, int64_t M, int64_t m0,
                           int64_t cols, const float* bias, float* y) {
  if constexpr (RV > 1)
    if (count < RV)
      return gemm_rows_upto<T, RV - 1>(count, dc, rows, v0, N, K, M, m0, cols, bias, y);
  gemm_rows<T, RV>(dc, rows, v0, N, K, M, m0, cols, bias, y);
}

// y [N, M] = x [N, K] @ w.T (+ bias) for w [M, K / values per block] blocks of type T: the
// calling team quantizes x by row vector into `rows` (grown beforehand: fit), then shares
// tiles of kGemmCols columns, an even run per thread; each tile is decoded once and runs
// against every row vector. Ends with a barrier.
template <int T>
void quant_gemm_team(const float* x, const uint8_t* w, const float* bias, float* y, int64_t N,
                     int64_t K, int64_t M, QuantRows& rows) {
  using Q = QuantTraits<T>;
  const int64_t nb = K / Q::kValues, row_bytes = nb * Q::kBytes;
  quantize_by_vector(x, N, K, Q::kSigned && kSignedOffset ? 0x80 : 0, rows);
  DecodedCols& dc = decoded_cols;
  dc.fit(kGemmCols, K);
  const int64_t vectors = (N + kRowLanes - 1) / kRowLanes;
  const int64_t tiles = (M + kGemmCols - 1) / kGemmCols;
  const int64_t team = omp_get_num_threads(), me = omp_get_thread_num();
  for (int64_t t = tiles * me / team; t < tiles * (me + 1) / team; ++t) {
    const int64_t m0 = t * kGemmCols, cols = std::min<int64_t>(kGemmCols, M - m0);
    const uint8_t* columns[kGemmCols];  // a last partial tile repeats its last column
    for (int c = 0; c < kGemmCols; ++c) columns[c] = w + (m0 + std::min<int64_t>(c, cols - 1)) * row_bytes;
    decode_cols<T>(columns, nb, K, dc);
    // the next tile's blocks (one run of rows) into L2 while this one's rows compute
    const int64_t ahead = std::min<int64_t>(kGemmCols, M - m0 - kGemmCols) * row_bytes;
    const char* next = reinterpret_cast<const char*>(w + (m0 + kGemmCols) * row_bytes);
    for (int64_t at = 0; at < ahead; at += 64) _mm_prefetch(next + at, _MM_HINT_T1);
    for (int64_t v = 0; v < vectors; v += kGemmRowVectors)
      gemm_rows_upto<T, kGemmRowVectors>(std::min<int64_t>(kGemmRowVectors, vectors - v), dc,
                                         rows, v, N, K, M, m0, cols, bias, y);
  }
#pragma omp barrier
}

}  // namespace
