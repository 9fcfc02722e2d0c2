// Linear layers on float32 or bfloat16 weights, row-major or packed (the float32 kernels).
#pragma once

#include <omp.h>

#include <algorithm>
#include <cstdint>

#include "simd.h"

namespace {

// ---- Linear layers. -----------------------------------------------------------------------
//
// A weight [M, K] is read in one of two layouts, the same values summed in the same order:
// row-major, or packed: tiles of kPack output columns, each tile's values in blocks of kPack
// values of k, [M / kPack][K / kPack][kPack columns][kPack k], so that a tile, and a thread's
// run of tiles, is one sequential stream (a decode row's tile in row-major order is kPack
// streams of K values, too short for the hardware prefetcher, bf16's most). Packed needs M
// and K multiples of kPack; one register tile's columns lie in one packed tile.
constexpr int64_t kPack = 16;
static_assert(kPack % kLanes == 0 && kPack % kWideColTile == 0 && kPack % kColTile == 0,
              "a register tile's columns and vectors lie within one packed tile");
constexpr int kRowBlock = 64;  // rows whose inputs stay in cache while W streams

// Bytes a packed decode row's stream is prefetched ahead (into L2): 256 B-4 KB measured
// alike for bf16 on Zen 4, a whole tile ahead slower (`python -m benchmarks.kernels.bench_gemv
// --baseline OTHER.cpp`, OTHER.cpp another distance).
constexpr int64_t kPackAhead = 512;

// Lines of the next column tile (or group) that a register tile prefetches into L2 while it
// runs, spread evenly over its k steps (`lines` 0: none).
struct Lookahead {
  const char* next;
  int64_t lines;
};

// A Lookahead's lines spread evenly over `steps` steps with no division per step: each call
// of `step` prefetches one step's share (a line whenever the lines owed reach `steps`), into
// L1 with `near`, else into L2.
struct LookaheadSpread {
  Lookahead ahead;
  int64_t steps, owed = 0;
  void step(bool near = false) {
    for (owed += ahead.lines; owed >= steps; owed -= steps, ahead.next += 64)
      near ? _mm_prefetch(ahead.next, _MM_HINT_T0) : _mm_prefetch(ahead.next, _MM_HINT_T1);
  }
};

// Column m of w (its first value).
template <bool Packed, typename W>
inline const W* column(const W* w, int64_t m, int64_t K) {
  return Packed ? w + m / kPack * kPack * K + m % kPack * kPack : w + m * K;
}

#if !DG_AVX512
// The AVX2 float 3 x 4 tile's whole k blocks (kPack = 16 values, two vectors each) in
// assembly: its 12 accumulators (ymm0-11), 3 inputs (ymm12-14) and 1 weight (ymm15) fill the
// 16 registers, which GCC's own allocation does not manage (it spills two accumulators to
// the stack, where their FMA chains wait on stores and loads). The same FMAs as the C++
// loop's, in its order for each accumulator, from zero, so the same bits; 0.84-0.95x its
// time at 16-64 rows on an AVX2-only CPU (`python -m benchmarks.kernels.bench_gemv --rows
// 16,32,64 --baseline OTHER.cpp`, OTHER.cpp the C++ loop). With Ahead, each block
// prefetches the line `ahead` values past each of its columns' first line, into L2; with
// Next, the two lines at `next` (then `next` moves `step` <= 128 bytes on), so that a row
// tile streams its share of the next column tile as it goes.
#define DG_TILE_STEP(OFF)                              \
  "vmovups " #OFF "(%[x]), %%ymm12\n\t"               \
  "vmovups " #OFF "(%[x],%[ldx],1), %%ymm13\n\t"      \
  "vmovups " #OFF "(%[x],%[ldx],2), %%ymm14\n\t"      \
  "vmovups " #OFF "(%[w]), %%ymm15\n\t"               \
  "vfmadd231ps %%ymm15, %%ymm12, %%ymm0\n\t"          \
  "vfmadd231ps %%ymm15, %%ymm13, %%ymm4\n\t"          \
  "vfmadd231ps %%ymm15, %%ymm14, %%ymm8\n\t"          \
  "vmovups " #OFF "(%[w],%[col],1), %%ymm15\n\t"      \
  "vfmadd231ps %%ymm15, %%ymm12, %%ymm1\n\t"          \
  "vfmadd231ps %%ymm15, %%ymm13, %%ymm5\n\t"          \
  "vfmadd231ps %%ymm15, %%ymm14, %%ymm9\n\t"          \
  "vmovups " #OFF "(%[w2]), %%ymm15\n\t"              \
  "vfmadd231ps %%ymm15, %%ymm12, %%ymm2\n\t"          \
  "vfmadd231ps %%ymm15, %%ymm13, %%ymm6\n\t"          \
  "vfmadd231ps %%ymm15, %%ymm14, %%ymm10\n\t"         \
  "vmovups " #OFF "(%[w2],%[col],1), %%ymm15\n\t"     \
  "vfmadd231ps %%ymm15, %%ymm12, %%ymm3\n\t"          \
  "vfmadd231ps %%ymm15, %%ymm13, %%ymm7\n\t"          \
  "vfmadd231ps %%ymm15, %%ymm14, %%ymm11\n\t"
#define DG_TILE_AHEAD                                  \
  "prefetcht1 (%[w],%[ahead],1)\n\t"                  \
  "lea (%[w],%[col],1), %[t]\n\t"                     \
  "prefetcht1 (%[t],%[ahead],1)\n\t"                  \
  "prefetcht1 (%[w2],%[ahead],1)\n\t"                 \
  "lea (%[w2],%[col],1), %[t]\n\t"                    \
  "prefetcht1 (%[t],%[ahead],1)\n\t"
#define DG_TILE_NEXT                                   \
  "prefetcht1 (%[next])\n\t"                          \
  "prefetcht1 64(%[next])\n\t"                        \
  "add %[step], %[next]\n\t"
#define DG_TILE_LOOP(AHEAD)                                                                \
  __asm__ volatile(                                                                        \
      "vxorps %%ymm0, %%ymm0, %%ymm0\n\t" "vxorps %%ymm1, %%ymm1, %%ymm1\n\t"              \
      "vxorps %%ymm2, %%ymm2, %%ymm2\n\t" "vxorps %%ymm3, %%ymm3, %%ymm3\n\t"              \
      "vxorps %%ymm4, %%ymm4, %%ymm4\n\t" "vxorps %%ymm5, %%ymm5, %%ymm5\n\t"              \
      "vxorps %%ymm6, %%ymm6, %%ymm6\n\t" "vxorps %%ymm7, %%ymm7, %%ymm7\n\t"              \
      "vxorps %%ymm8, %%ymm8, %%ymm8\n\t" "vxorps %%ymm9, %%ymm9, %%ymm9\n\t"              \
      "vxorps %%ymm10, %%ymm10, %%ymm10\n\t" "vxorps %%ymm11, %%ymm11, %%ymm11\n\t"        \
      "1:\n\t" AHEAD DG_TILE_STEP(0) DG_TILE_STEP(32)                                      \
      "add $64, %[x]\n\t" "add %[block], %[w]\n\t" "add %[block], %[w2]\n\t"               \
      "dec %[n]\n\t" "jnz 1b\n\t"                                                          \
      "vmovups %%ymm0, (%[acc])\n\t" "vmovups %%ymm1, 32(%[acc])\n\t"                      \
      "vmovups %%ymm2, 64(%[acc])\n\t" "vmovups %%ymm3, 96(%[acc])\n\t"                    \
      "vmovups %%ymm4, 128(%[acc])\n\t" "vmovups %%ymm5, 160(%[acc])\n\t"                  \
      "vmovups %%ymm6, 192(%[acc])\n\t" "vmovups %%ymm7, 224(%[acc])\n\t"                  \
      "vmovups %%ymm8, 256(%[acc])\n\t" "vmovups %%ymm9, 288(%[acc])\n\t"                  \
      "vmovups %%ymm10, 320(%[acc])\n\t" "vmovups %%ymm11, 352(%[acc])\n\t"                \
      : [x] "+r"(x), [w] "+r"(w), [w2] "+r"(w2), [n] "+r"(blocks), [t] "=&r"(t),         \
        [next] "+r"(next)                                                                  \
      : [ldx] "r"(ldx * 4), [col] "r"(col * 4), [block] "r"(block * 4),                    \
        [ahead] "r"(ahead * 4), [step] "r"(step), [acc] "r"(&acc[0][0])                    \
      : "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9",   \
        "xmm10", "xmm11", "xmm12", "xmm13", "xmm14", "xmm15", "memory", "cc")

// acc = the 3 x 4 tile's sums over `blocks` k blocks of x (rows ldx apart) and w (columns
// col apart, blocks block apart); blocks > 0. Next: after's lines, over the blocks.
template <bool Ahead, bool Next>
inline void tile_3x4_blocks(const float* x, int64_t ldx, const float* w, int64_t col,
                            int64_t block, int64_t blocks, int64_t ahead, Lookahead after,
                            Vec (&acc)[3][4]) {
  static_assert(!(Ahead && Next), "one prefetch plan per tile");
  const float* w2 = w + 2 * col;
  const char* next = after.next;
  const int64_t step = (after.lines * 64 + blocks - 1) / blocks;  // <= 128: two lines a block
  int64_t t;
  if constexpr (Ahead)
    DG_TILE_LOOP(DG_TILE_AHEAD);
  else if constexpr (Next)
    DG_TILE_LOOP(DG_TILE_NEXT);
  else
    DG_TILE_LOOP("");
}
#undef DG_TILE_LOOP
#undef DG_TILE_NEXT
#undef DG_TILE_AHEAD
#undef DG_TILE_STEP
#endif

// Whether the R x C tile on W runs the assembly loop (AVX2, float weights).
template <int R, int C, typename W>
constexpr bool kAsmTile =
    !DG_AVX512 && R == kRowTile && C == kColTile && std::is_same_v<W, float>;

// y[r][c] = sum_k x[r][k] * w[c][k] (+ bias[c]) for an R x C register tile whose first
// column is at w; W is float or uint16_t (bfloat16 bits): the same operations on the
// widened values. With Ahead, the lines `ahead` values past the ones read go to L2; with
// Next (the assembly tile only), after's lines.
template <int R, int C, bool Ahead, bool Packed, typename W, bool Next = false>
inline void linear_tile(const float* x, int64_t ldx, const W* w, int64_t K, int64_t ahead,
                        const float* bias, float* y, int64_t ldy, Lookahead after = {}) {
  static_assert(!Next || kAsmTile<R, C, W>, "only the assembly tile streams the next one");
  constexpr int64_t kBlock = Packed ? kPack * kPack : kPack;  // from k's block to the next
  const int64_t col = Packed ? kPack : K;                     // from a column to the next
  Vec acc[R][C];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) acc[r][c] = zero();
  int64_t k = 0;
#if !DG_AVX512
  if constexpr (kAsmTile<R, C, W>) {
    if (K >= kPack)
      tile_3x4_blocks<Ahead, Next>(x, ldx, w, col, kBlock, K / kPack, ahead, after, acc);
    k = K / kPack * kPack;
  }
#endif
  for (const W* wb = w + k / kPack * kBlock; k + kPack <= K; k += kPack, wb += kBlock)
    for (int s = 0; s < kPack; s += kLanes) {
      Vec xv[R];
      for (int r = 0; r < R; ++r) {
        xv[r] = load(x + r * ldx + k + s);
        in_register(xv[r]);
      }
      for (int c = 0; c < C; ++c) {
        const W* p = wb + c * col + s;
        // into L2: a decode row's tile (16 x 576 floats = 36 KB) does not fit the 32-48 KB
        // L1 beside the current one, and L1 prefetches evicted lines before their use
        if (Ahead && ((Packed ? c * kPack + s : k + s) * sizeof(W)) % 64 == 0)
          _mm_prefetch(reinterpret_cast<const char*>(p + ahead), _MM_HINT_T1);
        Vec wv = load(p);
        if constexpr (R > 1) in_register(wv);
        for (int r = 0; r < R; ++r) acc[r][c] = fmadd(xv[r], wv, acc[r][c]);
      }
    }
  for (; k + kLanes <= K; k += kLanes) {  // the rest of a row-major K
    Vec xv[R];
    for (int r = 0; r < R; ++r) {
      xv[r] = load(x + r * ldx + k);
      in_register(xv[r]);
    }
    for (int c = 0; c < C; ++c) {
      Vec wv = load(w + c * K + k);
      if constexpr (R > 1) in_register(wv);
      for (int r = 0; r < R; ++r) acc[r][c] = fmadd(xv[r], wv, acc[r][c]);
    }
  }
  if (k < K) {
    Vec xv[R];
    for (int r = 0; r < R; ++r) xv[r] = load_first(x + r * ldx + k, K - k);
    for (int c = 0; c < C; ++c) {
      const Vec wv = load_first(w + c * K + k, K - k);
      for (int r = 0; r < R; ++r) acc[r][c] = fmadd(xv[r], wv, acc[r][c]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) {
      const float s = lane_sum(acc[r][c]);
      y[r * ldy + c] = bias != nullptr ? s + bias[c] : s;
    }
}

// linear_tile over every row of x (R at a time, then the remainder in smaller tiles). The
// first row tile fetches the weights `ahead`, or, for the row-major assembly tile over two
// or more whole row tiles, each whole row tile prefetches its share of `next` (the next
// column tile), so that memory streams it while the later row tiles compute.
template <int R, int C, bool Packed, typename W>
inline void linear_cols(const float* x, int64_t ldx, int64_t rows, const W* w, int64_t K,
                        int64_t ahead, const float* bias, float* y, int64_t ldy,
                        Lookahead next = {}) {
  int64_t r = 0;
  const int64_t whole = rows / R;
  if constexpr (kAsmTile<R, C, W> && !Packed) {
    if (whole >= 2 && next.lines > 0 && K >= kPack) {
      for (int64_t i = 0; i < whole; ++i, r += R) {
        const int64_t from = next.lines * i / whole, to = next.lines * (i + 1) / whole;
        linear_tile<R, C, false, Packed, W, true>(x + r * ldx, ldx, w, K, ahead, bias,
                                                  y + r * ldy, ldy,
                                                  Lookahead{next.next + 64 * from, to - from});
      }
    }
  }
  if (r == 0 && R <= rows) {
    linear_tile<R, C, true, Packed>(x, ldx, w, K, ahead, bias, y, ldy);
    r = R;
  }
  for (; r + R <= rows; r += R)
    linear_tile<R, C, false, Packed>(x + r * ldx, ldx, w, K, ahead, bias, y + r * ldy, ldy);
  if constexpr (R > 1)
    if (r < rows)
      linear_cols<R - 1, C, Packed>(x + r * ldx, ldx, rows - r, w, K, ahead, bias, y + r * ldy,
                                    ldy);
}

// y [N, M] = x [N, K] @ w[M, K].T (+ bias [M] unless null), in row blocks of kRowBlock,
// the calling team (a team of one outside a parallel region) sharing each block's tiles of
// C output columns, an even run of tiles per thread, R rows per register tile (the tile's
// shape never changes a sum). The first row tile prefetches: row-major, the next column
// tile's values at the same k; packed, a decode row's stream kPackAhead bytes ahead, more
// rows' the next packed tile's values. The AVX2 float tile over 6 or more rows streams the
// thread's next column tile over all its row tiles instead (linear_cols). Ends with a barrier.
template <int R, int C, bool Packed, typename W>
void linear_blocks(const float* xp, const W* wp, const float* bp, float* yp, int64_t N,
                   int64_t K, int64_t M) {
  const int64_t tiles = (M + C - 1) / C, team = omp_get_num_threads(), me = omp_get_thread_num();
  const int64_t begin = tiles * me / team, end = tiles * (me + 1) / team;
  const int64_t ahead = !Packed ? C * K : R == 1 ? kPackAhead / int64_t{sizeof(W)} : kPack * K;
  for (int64_t r0 = 0; r0 < N; r0 += kRowBlock) {
    const int64_t rows = std::min<int64_t>(kRowBlock, N - r0);
    for (int64_t t = begin; t < end; ++t) {
      const int64_t m0 = t * C;
      const float* b = bp != nullptr ? bp + m0 : nullptr;
      const float* xr = xp + r0 * K;
      float* yr = yp + r0 * M + m0;
      if (m0 + C <= M) {
        // this thread's next tile, whole or partial (row-major: C columns in one run)
        const int64_t cols = !Packed && t + 1 < end ? std::min<int64_t>(C, M - m0 - C) : 0;
        const Lookahead next{reinterpret_cast<const char*>(wp + (m0 + C) * K),
                             cols * K * int64_t{sizeof(W)} / 64};
        linear_cols<R, C, Packed>(xr, K, rows, column<Packed>(wp, m0, K), K, ahead, b, yr, M,
                                  next);
      } else {  // row-major only (a packed M is a multiple of C)
        for (int64_t m = m0; m < M; ++m)
          linear_cols<R, 1, Packed>(xr, K, rows, column<Packed>(wp, m, K), K, ahead,
                                    b != nullptr ? bp + m : nullptr, yr + (m - m0), M);
      }
    }
  }
#pragma omp barrier
}

// A decode row reads kWideColTile weight columns at a time (more memory streams in flight,
// which a bf16 weight's short rows need to keep the memory bus busy); more rows, kColTile.
// Called by every thread of a team (or outside a parallel region); ends with a barrier.
template <typename W>
void linear_team(const float* xp, const W* wp, bool packed, const float* bp, float* yp,
                 int64_t N, int64_t K, int64_t M) {
  if (N == 1 && packed)
    linear_blocks<1, kWideColTile, true>(xp, wp, bp, yp, N, K, M);
  else if (N == 1)
    linear_blocks<1, kWideColTile, false>(xp, wp, bp, yp, N, K, M);
  else if (packed)
    linear_blocks<kRowTile, kColTile, true>(xp, wp, bp, yp, N, K, M);
  else
    linear_blocks<kRowTile, kColTile, false>(xp, wp, bp, yp, N, K, M);
}

template <typename W>
void linear(const float* xp, const W* wp, bool packed, const float* bp, float* yp, int64_t N,
            int64_t K, int64_t M, int threads) {
#pragma omp parallel num_threads(threads)
  linear_team(xp, wp, packed, bp, yp, N, K, M);
}

}  // namespace
