// Linear layers on AMX tiles, for bf16 weights in the AMX layout (CPUs with AMX-BF16).
#pragma once

#include <cpuid.h>
#include <omp.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "simd.h"

namespace {

// ---- Linear layers on AMX tiles (bfloat16 weights, Intel AMX-BF16). ----------------------
//
// Where the CPU has AMX, a bf16 weight packed for it is applied by one arithmetic path for
// every row count: the input row rounded to bfloat16 (round-to-nearest-even,
// vcvtneps2bf16), tdpbf16ps over k blocks of kAmxK values in k order into a float32 tile
// that starts at zero, then + bias[c] in float32. An element of a tile product depends only
// on its row of A and on B, so a row's y is the same in every row tile, at any position
// (the rows of a partial tile are zero), in any column grouping and on any thread. The
// layout, [M / 16][K / kAmxK][kAmxK / 2 pairs of k][16 columns][2], puts one tile of B
// (1 KB) after another along k: a column tile is one sequential stream. The rounded rows
// are laid out the same way, [rows / 16][K / kAmxK][16 rows][kAmxK], so that a tile of A
// is 1 KB in a row too (`python -m benchmarks.kernels.bench_amx_linear --rows 16,32,64,512`).
#if DG_AMX
constexpr int64_t kAmxK = 32;          // k values per tile of A or B (16 pairs)
constexpr int64_t kAmxRowBlock = 256;  // rows rounded to bf16 at a time, per thread
constexpr int kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;  // Linux arch_prctl

// Tiles 0-3: C (2 row tiles x 2 column tiles), 4-5: A, 6-7: B; each 16 rows of 64 bytes.
inline void amx_configure() {
  alignas(64) uint8_t cfg[64] = {};
  cfg[0] = 1;  // palette 1
  for (int t = 0; t < 8; ++t) {
    cfg[16 + 2 * t] = 64;  // bytes per row
    cfg[48 + t] = 16;      // rows
  }
  _tile_loadconfig(cfg);
}

// One row tile: `rows` (<= 16) rows of K floats rounded to bf16 (round to nearest even)
// into xb [K / kAmxK][16][kAmxK], the rows after them zero.
inline void amx_round_tile(const float* x, int64_t rows, int64_t K, uint16_t* xb) {
  for (int64_t r = 0; r < 16; ++r)
    for (int64_t k = 0; k < K; k += 16) {
      const __m512 v = r < rows ? _mm512_loadu_ps(x + r * K + k) : _mm512_setzero_ps();
      const __m256bh b = _mm512_cvtneps_pbh(v);
      uint16_t* out = xb + k / kAmxK * 16 * kAmxK + r * kAmxK + k % kAmxK;
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out), (__m256i)b);
    }
}

// The bias of column tile j counted from `bias` (null stays null: no bias).
inline const float* bias_at(const float* bias, int64_t j) {
  return bias != nullptr ? bias + 16 * j : nullptr;
}

// C tile T (0-3) to out, rows ld floats apart (the intrinsic takes the tile as a literal).
template <int T>
inline void amx_stored(float* out, int64_t ld) {
  const int64_t bytes = ld * static_cast<int64_t>(sizeof(float));
  if constexpr (T == 0) _tile_stored(0, out, bytes);
  if constexpr (T == 1) _tile_stored(1, out, bytes);
  if constexpr (T == 2) _tile_stored(2, out, bytes);
  if constexpr (T == 3) _tile_stored(3, out, bytes);
}

// C tile T to y: its first `rows` rows, + bias in float32 unless null. A full tile is
// stored straight into y, a partial one through c.
template <int T>
inline void amx_store(int64_t rows, const float* bias, float* y, int64_t ldy) {
  alignas(64) float c[16][16];
  float* const out = rows == 16 ? y : c[0];
  const int64_t ld = rows == 16 ? ldy : 16;
  amx_stored<T>(out, ld);
  if (rows == 16 && bias == nullptr) return;
  for (int64_t r = 0; r < rows; ++r) {
    __m512 v = _mm512_loadu_ps(out + r * ld);
    if (bias != nullptr) v = _mm512_add_ps(v, _mm512_loadu_ps(bias));
    _mm512_storeu_ps(y + r * ldy, v);
  }
}

// RT row tiles of xb x CT column tiles (w: the first one's stream) over all of K, into y:
// 16 rows of each row tile but the last's `last`. Each load of the next k block is issued
// right after the last product that reads its tile, so it overlaps the products still to
// run (measured faster than four loads then four products). Unless pf is null, the next
// column pair's streams (pf) are prefetched into L2 as this one's are read, so that a
// weight streamed from memory arrives ahead of its products (beyond the weight's end for
// an odd number of column tiles: a prefetch never faults).
template <int RT, int CT>
inline void amx_tile(const uint16_t* xb, int64_t K, const uint16_t* w, int64_t last,
                     const float* bias, float* y, int64_t ldy, const uint16_t* pf) {
  const int64_t stride = K * 16;  // values from a row or column tile's stream to the next
  _tile_zero(0);
  if (CT > 1) _tile_zero(1);
  if (RT > 1) _tile_zero(2);
  if (RT > 1 && CT > 1) _tile_zero(3);
  _tile_loadd(4, xb, 64);
  _tile_loadd(6, w, 64);
  if (CT > 1) _tile_loadd(7, w + stride, 64);
  if (RT > 1) _tile_loadd(5, xb + stride, 64);
  for (int64_t k = kAmxK;; k += kAmxK) {
    const bool more = k < K;
    const int64_t next = k * 16;  // the next k block's tiles
    if (pf != nullptr)
      for (int64_t i = next - 16 * kAmxK; i < next; i += 32) {
        _mm_prefetch(reinterpret_cast<const char*>(pf + i), _MM_HINT_T1);
        _mm_prefetch(reinterpret_cast<const char*>(pf + stride + i), _MM_HINT_T1);
      }
    _tile_dpbf16ps(0, 4, 6);
    if (CT > 1) _tile_dpbf16ps(1, 4, 7);
    if (more) _tile_loadd(4, xb + next, 64);
    if (RT > 1) _tile_dpbf16ps(2, 5, 6);
    if (more) _tile_loadd(6, w + next, 64);
    if (RT > 1 && CT > 1) _tile_dpbf16ps(3, 5, 7);
    if (!more) break;
    if (CT > 1) _tile_loadd(7, w + stride + next, 64);
    if (RT > 1) _tile_loadd(5, xb + stride + next, 64);
  }
  const int64_t first = RT > 1 ? 16 : last;
  amx_store<0>(first, bias, y, ldy);
  if (CT > 1) amx_store<1>(first, bias_at(bias, 1), y + 16, ldy);
  if (RT > 1) amx_store<2>(last, bias, y + 16 * ldy, ldy);
  if (RT > 1 && CT > 1)
    amx_store<3>(last, bias_at(bias, 1), y + 16 * ldy + 16, ldy);
}

thread_local std::vector<uint16_t> amx_rows;  // a row block rounded to bf16, per thread

// Prefetches the tile of B (1 KB, 16 lines) at b into L1: tileloadd alone keeps too few
// misses in flight when memory is slow (1 row: ~30% below a plain read of the same bytes).
inline void amx_prefetch_tile(const uint16_t* b) {
  const char* p = reinterpret_cast<const char*>(b);
  for (int line = 0; line < 1024; line += 64) _mm_prefetch(p + line, _MM_HINT_T0);
}

// One row tile (xb, in tile order; rows <= 16, the rest zero) x CT column tiles (w: the
// first one's stream) over all of K, into y (+ bias): tiles 0 to CT - 1 are C, 7 is A, and
// 5 and 6 take turns as B, so the CT chains of tdpbf16ps overlap and each A load serves CT
// of them. Each stream's next k block is prefetched (past the last one: the next stream's
// first, harmless).
template <int CT>
inline void amx_row_tile(const uint16_t* xb, int64_t K, const uint16_t* w, int64_t rows,
                         const float* bias, float* y, int64_t ldy) {
  static_assert(CT >= 1 && CT <= 4, "tiles 0-3 hold C");
  const int64_t stride = K * 16;  // values from a column tile's stream to the next
  _tile_zero(0);
  if constexpr (CT > 1) _tile_zero(1);
  if constexpr (CT > 2) _tile_zero(2);
  if constexpr (CT > 3) _tile_zero(3);
  for (int64_t k = 0; k < K; k += kAmxK) {
    const uint16_t* b = w + k * 16;
    for (int j = 0; j < CT; ++j) amx_prefetch_tile(b + j * stride + kAmxK * 16);
    _tile_loadd(7, xb + k * 16, 64);
    _tile_loadd(5, b, 64);
    _tile_dpbf16ps(0, 7, 5);
    if constexpr (CT > 1) {
      _tile_loadd(6, b + stride, 64);
      _tile_dpbf16ps(1, 7, 6);
    }
    if constexpr (CT > 2) {
      _tile_loadd(5, b + 2 * stride, 64);
      _tile_dpbf16ps(2, 7, 5);
    }
    if constexpr (CT > 3) {
      _tile_loadd(6, b + 3 * stride, 64);
      _tile_dpbf16ps(3, 7, 6);
    }
  }
  amx_store<0>(rows, bias, y, ldy);
  if constexpr (CT > 1) amx_store<1>(rows, bias_at(bias, 1), y + 16, ldy);
  if constexpr (CT > 2) amx_store<2>(rows, bias_at(bias, 2), y + 32, ldy);
  if constexpr (CT > 3) amx_store<3>(rows, bias_at(bias, 3), y + 48, ldy);
}

// amx_linear_team for N <= 16 (decoding): one row tile, so the step streams the weights
// once; each thread takes an even share of the column tiles (contiguous in w), four at a
// time. Same tdpbf16ps sequence per element as amx_tile, so rows agree bitwise with N > 16.
inline void amx_linear_rows16(const float* xp, const uint16_t* wp, const float* bp, float* yp,
                              int64_t N, int64_t K, int64_t M) {
  if (static_cast<int64_t>(amx_rows.size()) < 16 * K) amx_rows.resize(16 * K);
  uint16_t* xb = amx_rows.data();
  amx_round_tile(xp, N, K, xb);
  const int64_t tiles = M / 16, team = omp_get_num_threads(), me = omp_get_thread_num();
  const int64_t end = tiles * (me + 1) / team;
  for (int64_t t = tiles * me / team; t < end; t += 4) {
    const uint16_t* w = wp + t * 16 * K;
    const float* b = bias_at(bp, t);
    float* y = yp + t * 16;
    switch (std::min<int64_t>(4, end - t)) {
      case 4: amx_row_tile<4>(xb, K, w, N, b, y, M); break;
      case 3: amx_row_tile<3>(xb, K, w, N, b, y, M); break;
      case 2: amx_row_tile<2>(xb, K, w, N, b, y, M); break;
      default: amx_row_tile<1>(xb, K, w, N, b, y, M);
    }
  }
  _tile_release();
#pragma omp barrier
}

// y [N, M] = bf16(x) [N, K] @ w.T (+ bias [M] unless null) for an AMX-packed w (M a
// multiple of 16, K of kAmxK): each thread rounds a block of rows itself (no barrier to
// share it), then the team shares out (column pair, row pair) units in column order, so a
// thread's run of units reads each column pair's stream of B once for all its row pairs.
// Called by every thread of a team (or outside a parallel region); ends with a barrier.
inline void amx_linear_team(const float* xp, const uint16_t* wp, const float* bp, float* yp,
                            int64_t N, int64_t K, int64_t M) {
  amx_configure();
  if (N <= 16) return amx_linear_rows16(xp, wp, bp, yp, N, K, M);
  const int64_t tiles = M / 16, col_pairs = (tiles + 1) / 2;
  const int64_t size = (std::min(kAmxRowBlock, N) + 15) / 16 * 16 * K;
  if (static_cast<int64_t>(amx_rows.size()) < size) amx_rows.resize(size);
  uint16_t* xb = amx_rows.data();
  for (int64_t r0 = 0; r0 < N; r0 += kAmxRowBlock) {
    const int64_t rows = std::min(kAmxRowBlock, N - r0), row_tiles = (rows + 15) / 16;
    const int64_t row_pairs = (row_tiles + 1) / 2;
    for (int64_t rt = 0; rt < row_tiles; ++rt)
      amx_round_tile(xp + (r0 + 16 * rt) * K, std::min<int64_t>(16, rows - 16 * rt), K,
                     xb + rt * 16 * K);
#pragma omp for schedule(static)
    for (int64_t u = 0; u < col_pairs * row_pairs; ++u) {
      const int64_t t = 2 * (u / row_pairs), r = 32 * (u % row_pairs);
      const uint16_t* w = wp + t * 16 * K;
      const uint16_t* xr = xb + r * K;
      const float* b = bias_at(bp, t);
      float* yr = yp + (r0 + r) * M + t * 16;
      const uint16_t* pf = r + 32 >= rows && t + 2 < tiles ? w + 32 * K : nullptr;
      if (r + 16 < rows) {
        const int64_t last = std::min<int64_t>(16, rows - r - 16);
        if (t + 1 < tiles)
          amx_tile<2, 2>(xr, K, w, last, b, yr, M, pf);
        else
          amx_tile<2, 1>(xr, K, w, last, b, yr, M, pf);
      } else if (t + 1 < tiles) {
        amx_tile<1, 2>(xr, K, w, rows - r, b, yr, M, pf);
      } else {
        amx_tile<1, 1>(xr, K, w, rows - r, b, yr, M, pf);
      }
    }
  }
  _tile_release();
}

// Whether this process may run the AMX kernels: built with them, the CPU has AMX-BF16,
// and Linux grants the tile state (asked once).
bool amx_usable() {
  static const bool usable = [] {
    unsigned a = 0, b = 0, c = 0, d = 0;
    if (__get_cpuid_count(7, 0, &a, &b, &c, &d) == 0) return false;
    if ((d & (1u << 22)) == 0 || (d & (1u << 24)) == 0) return false;  // AMX-BF16, AMX-TILE
    return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
  }();
  return usable;
}
#endif

}  // namespace
