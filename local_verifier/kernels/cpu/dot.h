// Linear layers on AVX512-BF16 dot products, for bf16 weights in the AMX layout (CPUs
// without usable AMX), and the choice between them and the AMX tiles.
#pragma once

#include <omp.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "amx.h"
#include "linear.h"
#include "simd.h"

namespace {

// ---- Linear layers on bf16 dot products (AVX512-BF16, CPUs without usable AMX). ---------
//
// The same AMX-packed weight, [M / 16][K / 32][16 pairs of k][16 columns][2]:
// along a column tile's stream, pair i of k is one 64-byte row of 16 columns x 2 values, a
// vector that vdpbf16ps takes as is. One arithmetic path for every row count: the input row
// rounded to bfloat16 (vcvtneps2bf16, as the AMX kernels do), then per 16 output columns one
// chain acc = vdpbf16ps(acc, broadcast(x pair i), B pair i) over i = 0 .. K/2 - 1 in order
// from zero, then + bias[c] in float32. Each lane is one output element: no horizontal sum,
// and nothing in an element's chain depends on the register tile's shape, the other rows,
// the row count or the thread, so rows agree bitwise in any call. (AMX's tdpbf16ps may
// round differently, so the two CPUs' bits may differ, as the two vector builds' do.)
//
// Register tiles of R rows x CT column tiles (R * CT chains in flight, each B vector used R
// times, each broadcast CT times); a thread takes an even share of the column tiles and
// runs every row over one group of CT column tiles before the next, so the group's streams
// are read from memory once and from L2 for the later rows. Rows <= 2 take CT = 8 (enough
// chains to hide vdpbf16ps' latency at 1 row), more rows R = 6 x CT = 4. Above one row tile,
// the tiles of a group also prefetch the next group into L2, so that memory keeps streaming
// while the later row tiles compute (8-32 rows: 0.75-0.89x the time of waiting on memory in
// the first row tile only on an AVX512-BF16 CPU without AMX, `python -m
// benchmarks.kernels.bench_amx_linear --rows 8,12,16,32 --repeats 1 --passes 15 --baseline
// OTHER.cpp`, OTHER.cpp without the next group's prefetch).
#if DG_DOT
// Bytes a first row tile prefetches each stream ahead, into L2: at 1 row, 512 B-1 KB measured
// alike, 256 B slower, and into L1 (T0) 30-50% slower (`python -m
// benchmarks.kernels.bench_amx_linear --rows 1 --baseline OTHER.cpp`).
constexpr int64_t kDotAhead = 1024;
thread_local std::vector<uint16_t> dot_rows;  // the input rows rounded to bf16, per thread

// rows x K floats (K a multiple of 16) rounded to bf16 (round to nearest even) into xb.
inline void dot_round(const float* x, int64_t rows, int64_t K, uint16_t* xb) {
  for (int64_t i = 0; i < rows * K; i += 16) {
    const __m256bh b = _mm512_cvtneps_pbh(_mm512_loadu_ps(x + i));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(xb + i), (__m256i)b);
  }
}

// The pair i of k of a rounded row, broadcast to all 16 lanes.
inline __m512bh dot_pair(const uint16_t* xr, int64_t i) {
  int32_t pair;
  std::memcpy(&pair, xr + 2 * i, sizeof(pair));
  return (__m512bh)_mm512_set1_epi32(pair);
}

// y[r][16 c + j] = chain over k pairs (+ bias) for R rows of xb (K apart) x CT column tiles
// (w: the first one's stream, K * 16 values to the next). With Ahead, each stream's line
// kDotAhead bytes ahead is prefetched (past a stream's end: the next one's start, harmless);
// with Next, the region `after` as well (without, none of that work is compiled in).
template <int R, int CT, bool Ahead, bool Next>
inline void dot_tile(const uint16_t* xb, int64_t K, const uint16_t* w, const float* bias,
                     float* y, int64_t ldy, Lookahead after) {
  const int64_t stride = K * 16, pairs = K / 2;
  __m512 acc[R][CT];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < CT; ++c) acc[r][c] = _mm512_setzero_ps();
  LookaheadSpread after_lines{after, pairs};
  for (int64_t i = 0; i < pairs; ++i) {
    if constexpr (Next) after_lines.step();
    __m512bh b[CT];
    for (int c = 0; c < CT; ++c) {
      const uint16_t* p = w + c * stride + i * 32;
      if constexpr (Ahead)
        _mm_prefetch(reinterpret_cast<const char*>(p) + kDotAhead, _MM_HINT_T1);
      b[c] = (__m512bh)_mm512_loadu_si512(p);
    }
    for (int r = 0; r < R; ++r) {
      const __m512bh xv = dot_pair(xb + r * K, i);
      for (int c = 0; c < CT; ++c) acc[r][c] = _mm512_dpbf16_ps(acc[r][c], xv, b[c]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < CT; ++c) {
      __m512 v = acc[r][c];
      if (bias != nullptr) v = _mm512_add_ps(v, _mm512_loadu_ps(bias + 16 * c));
      _mm512_storeu_ps(y + r * ldy + 16 * c, v);
    }
}

// dot_tile over `rows` rows of one group of CT column tiles: R at a time, then the remainder
// in one smaller tile. With Ahead, the first tile prefetches the group's own streams. With
// Next, `next` (the following group's lines) is prefetched over all the tiles in proportion
// to their rows, so that the memory streams it while the group's later row tiles compute.
template <int R, int CT, bool Ahead, bool Next>
inline void dot_cols(const uint16_t* xb, int64_t K, int64_t rows, const uint16_t* w,
                     const float* bias, float* y, int64_t ldy, Lookahead next) {
  const auto share = [&](int64_t r, int64_t n) {  // next's lines for rows r .. r + n - 1
    const int64_t from = next.lines * r / rows, to = next.lines * (r + n) / rows;
    return Lookahead{next.next + 64 * from, to - from};
  };
  int64_t r = 0;
  if (R <= rows) {
    dot_tile<R, CT, Ahead, Next>(xb, K, w, bias, y, ldy, share(0, R));
    r = R;
  }
  for (; r + R <= rows; r += R)
    dot_tile<R, CT, false, Next>(xb + r * K, K, w, bias, y + r * ldy, ldy, share(r, R));
  if constexpr (R > 1)
    if (r < rows) {
      dot_cols<R - 1, CT, Ahead, Next>(xb + r * K, K, rows - r, w, bias, y + r * ldy, ldy,
                                       share(r, rows - r));
    }
}

// dot_cols for a group of ct <= CT column tiles.
template <int R, int CT, bool Ahead, bool Next>
inline void dot_group(int64_t ct, const uint16_t* xb, int64_t K, int64_t rows,
                      const uint16_t* w, const float* bias, float* y, int64_t ldy,
                      Lookahead next) {
  if constexpr (CT > 1)
    if (ct < CT) return dot_group<R, CT - 1, Ahead, Next>(ct, xb, K, rows, w, bias, y, ldy, next);
  dot_cols<R, CT, Ahead, Next>(xb, K, rows, w, bias, y, ldy, next);
}

// y [N, M] = bf16(x) [N, K] @ w.T (+ bias [M] unless null) for an AMX-packed w (M a
// multiple of 16, K of 32): each thread rounds all rows itself (no barrier to share
// them), then runs its share of the column tiles, CT at a time, over all rows.
// One row tile (N <= 6) streams each group's weights as it goes. More rows stream the next
// group while the row tiles run: only a thread's first group waits on memory alone.
// Called by every thread of a team (or outside a parallel region); ends with a barrier.
inline void dot_linear_team(const float* xp, const uint16_t* wp, const float* bp, float* yp,
                            int64_t N, int64_t K, int64_t M) {
  constexpr int R = 6;
  if (static_cast<int64_t>(dot_rows.size()) < N * K) dot_rows.resize(N * K);
  uint16_t* xb = dot_rows.data();
  dot_round(xp, N, K, xb);
  const int64_t tiles = M / 16, team = omp_get_num_threads(), me = omp_get_thread_num();
  const int64_t begin = tiles * me / team, end = tiles * (me + 1) / team, ct = N <= 2 ? 8 : 4;
  for (int64_t t = begin; t < end; t += ct) {
    const uint16_t* w = wp + t * 16 * K;
    const float* b = bp != nullptr ? bp + 16 * t : nullptr;
    const int64_t n = std::min(ct, end - t);  // the next group: up to ct tiles after these
    const Lookahead next{reinterpret_cast<const char*>(w + n * 16 * K),
                         std::min(ct, end - t - n) * 16 * K * 2 / 64};
    if (N <= 2)
      dot_group<2, 8, true, false>(n, xb, K, N, w, b, yp + 16 * t, M, next);
    else if (N <= R)
      dot_group<R, 4, true, false>(n, xb, K, N, w, b, yp + 16 * t, M, next);
    else if (t == begin)
      dot_group<R, 4, true, true>(n, xb, K, N, w, b, yp + 16 * t, M, next);
    else
      dot_group<R, 4, false, true>(n, xb, K, N, w, b, yp + 16 * t, M, next);
  }
#pragma omp barrier
}
#endif

#if DG_DOT
// An AMX-packed bf16 weight's linear layer on AMX tiles where usable, else dot products.
inline void bf16_linear_team(const float* xp, const uint16_t* wp, const float* bp, float* yp,
                             int64_t N, int64_t K, int64_t M) {
#if DG_AMX
  if (amx_usable()) return amx_linear_team(xp, wp, bp, yp, N, K, M);
#endif
  dot_linear_team(xp, wp, bp, yp, N, K, M);
}
#endif

}  // namespace
