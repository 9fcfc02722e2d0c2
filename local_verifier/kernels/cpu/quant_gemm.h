// The quantized linear layer for two rows or more (drafted verification, prompt chunks): one
// column per lane. A thread decodes a tile of kTileCols columns block by block
// (cpu/quant_decode.h, cpu/quant_tiles.h) and runs up to kPassRows rows against each block as
// it is decoded, each row's sums in registers; more rows take further passes over the decoded
// tile, kept for them. Per 4 values of k, a row's 4 activation bytes broadcast to every lane
// multiply the tile's 4 weight bytes of each column (vpdpbusd where the CPU has AVX512-VNNI,
// else vpmaddubsw + vpmaddwd), so a decoded weight serves every row, and a row fills every
// lane whatever the row count.
#pragma once

#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "linear.h"
#include "quant_blocks.h"
#include "quant_decode.h"
#include "quant_rows.h"
#include "quant_tiles.h"
#include "simd.h"

namespace {

// Whether the products take type T's weights as int8 (through their magnitudes, the signs
// moved onto the activations in pair_sums); else as held, uint8.
template <int T>
constexpr bool kInt8Products = QuantTraits<T>::kSigned && kHeldOffset<T> == 0;

// The weight word as the products take it.
template <int T>
DG_TILE_INLINE IVec magnitudes(IVec w) {
  if constexpr (!kInt8Products<T>) return w;
#if DG_AVX512
  return _mm512_abs_epi8(w);
#else
  return _mm256_sign_epi8(w, w);
#endif
}

#if DG_VNNI
// acc + per lane the exact sum of the products of its 4 weight bytes (m: uint8 weights 0-63,
// or int8 weights held as value + 128) with the row's 4 activation bytes x (the same in
// every lane, int8).
DG_TILE_INLINE IVec dot4(IVec acc, IVec m, IVec x) { return _mm512_dpbusd_epi32(acc, m, x); }
#else
// Per 16-bit lane the sum of 2 products of its weight bytes (w as held, m their magnitudes)
// with the row's activation bytes x (the same 4 in every lane, int8, never -128): exact,
// |sum| <= 2 * 128 * 127.
template <bool Signed>
DG_TILE_INLINE IVec pair_sums(IVec w, IVec m, IVec x) {
#if DG_AVX512
  if constexpr (Signed)
    x = _mm512_mask_sub_epi8(x, _mm512_movepi8_mask(w), _mm512_setzero_si512(), x);
  return _mm512_maddubs_epi16(m, x);
#else
  if constexpr (Signed) x = _mm256_sign_epi8(x, w);
  return _mm256_maddubs_epi16(m, x);
#endif
}
#if DG_AVX512
DG_TILE_INLINE IVec iadd16(IVec a, IVec b) { return _mm512_add_epi16(a, b); }
DG_TILE_INLINE IVec iadd32(IVec a, IVec b) { return _mm512_add_epi32(a, b); }
DG_TILE_INLINE IVec widen(IVec v) { return _mm512_madd_epi16(v, _mm512_set1_epi16(1)); }
#else
DG_TILE_INLINE IVec iadd16(IVec a, IVec b) { return _mm256_add_epi16(a, b); }
DG_TILE_INLINE IVec iadd32(IVec a, IVec b) { return _mm256_add_epi32(a, b); }
DG_TILE_INLINE IVec widen(IVec v) { return _mm256_madd_epi16(v, _mm256_set1_epi16(1)); }
#endif

// Words of a scale group whose pair sums add up exactly in 16 bits (each at most 2 x 127
// times the largest weight byte: kTop, or a held offset's largest code): a divisor of the
// group's words, so runs end with it. A run's sums widen to 32 bits by one vpmaddwd instead
// of one per word.
template <int T>
constexpr int kRunWords = [] {
  using Q = QuantTraits<T>;
  const int words = kQBlock / 4 / Q::kGroups;
  const int top = kHeldOffset<T> != 0 ? Q::kTop + kHeldOffset<T> - 1 : Q::kTop;
  int run = 32767 / (2 * top * 127);
  while (words % run != 0) --run;
  return run < words ? run : words;
}();

// A row's 16-bit sums held in a register from one word of a run to the next, in AVX2's 16
// registers where a pass has 3 rows or more and a run more than 2 words. Left free, GCC
// adds a run's products as a tree, every product live at once, and spills them to the stack
// (Zen 3, Q4_K and Q4_1 at 3-64 rows: 0.82-0.88x the time held); runs of 2 words, and 2
// rows, were as fast or faster left free.
template <int T, int R>
DG_TILE_INLINE void hold_sums(IVec& pairs) {
  if constexpr (!DG_AVX512 && kRunWords<T> > 2 && R > 2) __asm__("" : "+x"(pairs));
}
#endif

// ---- R rows of one pass against one decoded block. ---------------------------------------

// One pass's rows (cpu/quant_rows.h's layout by pass): q [K / 4][kPassRows][4], d and sums
// [K / 32][kPassRows], corr [K / 16 or K / 32][kPassRows].
struct PassRows {
  const int8_t* q;
  const float* d;
  const float* sums;
  const int32_t* corr;  // per scale group: corr16 for Q6_K, else corr32
};

// acc[r] (row r's outputs of the tile's columns) through activation block `block` (32 values
// of k): the minimum term, then per scale group its integer sum (from 0, or corr) folded in by
// one FMA with the product of the two scales. words: the sub-block's words, scale its groups'.
template <int T, int R>
DG_TILE_INLINE void rows_sub_block(const IVec* words, const Vec* scale, Vec min, int64_t block,
                                   const PassRows& x, Vec (&acc)[R]) {
  using Q = QuantTraits<T>;
  constexpr int kWords = kQBlock / 4 / Q::kGroups;  // 4-byte words per scale group
  constexpr bool kOffset = kHeldOffset<T> != 0;
  const float* xd = x.d + block * kPassRows;
  if constexpr (Q::kMin) {
    const float* xs = x.sums + block * kPassRows;
    for (int r = 0; r < R; ++r) acc[r] = fmadd(min, set1(xs[r]), acc[r]);
  }
  for (int g = 0; g < Q::kGroups; ++g) {
    const int64_t group = block * Q::kGroups + g;
    IVec sums[R];
    for (int r = 0; r < R; ++r)
      sums[r] = kOffset ? ibroadcast(x.corr + group * kPassRows + r) : izero();
#if DG_VNNI
#pragma GCC unroll 8
    for (int j = 0; j < kWords; ++j) {
      const int8_t* xq = x.q + (group * kWords + j) * 4 * kPassRows;
      const IVec m = words[g * kWords + j];
      for (int r = 0; r < R; ++r) sums[r] = dot4(sums[r], m, ibroadcast(xq + 4 * r));
    }
#else
#pragma GCC unroll 8
    for (int j0 = 0; j0 < kWords; j0 += kRunWords<T>) {
      IVec pairs[R];
#pragma GCC unroll 8
      for (int j = j0; j < j0 + kRunWords<T>; ++j) {
        const IVec w = words[g * kWords + j];
        const IVec m = magnitudes<T>(w);
        const int8_t* xq = x.q + (group * kWords + j) * 4 * kPassRows;
        for (int r = 0; r < R; ++r) {
          const IVec p = pair_sums<kInt8Products<T>>(w, m, ibroadcast(xq + 4 * r));
          pairs[r] = j == j0 ? p : iadd16(pairs[r], p);
          hold_sums<T, R>(pairs[r]);
        }
      }
      for (int r = 0; r < R; ++r)
        sums[r] = j0 == 0 && !kOffset ? widen(pairs[r]) : iadd32(sums[r], widen(pairs[r]));
    }
#endif
    for (int r = 0; r < R; ++r)
      acc[r] = fmadd(to_float(sums[r]), mul(scale[g], set1(xd[r])), acc[r]);
  }
}

// acc[r] through block b of k: its sub-blocks in order.
template <int T, int R>
DG_TILE_INLINE void rows_block(const TileBlock<QuantTraits<T>>& tile, int64_t b, const PassRows& x,
                       Vec (&acc)[R]) {
  using Q = QuantTraits<T>;
  constexpr int kWords = kQBlock / 4;  // per sub-block
  for (int s = 0; s < Q::kSubs; ++s)
    rows_sub_block<T, R>(tile.words + s * kWords, tile.scale + s * Q::kGroups,
                         Q::kMin ? tile.min[s] : zero(), b * Q::kSubs + s, x, acc);
}

// Whether TileDecoder<T> streams a block (kChunkSubs: scales, then chunks of sub-blocks).
template <int T, typename = void>
struct Streamed {
  static constexpr bool value = false;
};
template <int T>
struct Streamed<T, std::void_t<decltype(TileDecoder<T>::kChunkSubs)>> {
  static constexpr bool value = true;
};

// rows_block on block b decoded as it is multiplied (a streamed type, one pass): the same
// sub-blocks in the same order, the block's words never all held at once.
template <int T, int R>
DG_TILE_INLINE void rows_block_streamed(const uint8_t* const (&col)[kTileCols], int64_t b,
                                        const PassRows& x, Vec (&acc)[R]) {
  using Q = QuantTraits<T>;
  constexpr int kChunk = TileDecoder<T>::kChunkSubs, kWords = kQBlock / 4;
  const uint8_t* at[kTileCols];
  block_columns<T>(col, b, at);
  Vec scale[Q::kSubs * Q::kGroups], min[Q::kSubs];
  TileDecoder<T>::scales(at, scale, min);
  for (int i = 0; i < Q::kSubs / kChunk; ++i) {
    IVec words[kChunk * kWords];
    TileDecoder<T>::chunk(at, i, words);
    for (int h = 0; h < kChunk; ++h) {
      const int s = kChunk * i + h;
      rows_sub_block<T, R>(words + kWords * h, scale + s * Q::kGroups,
                           Q::kMin ? min[s] : zero(), b * Q::kSubs + s, x, acc);
    }
  }
}

// ---- Passes of rows over a tile. -----------------------------------------------------------

// Where a pass's outputs go: y's rows (ldy apart) at the tile's first column, `cols` of them
// live, bias (those columns', unless null).
struct TileOut {
  float* y;
  int64_t ldy, cols;
  const float* bias;
};

// Whether the next tile's lines go to L1 (else L2) in a step of `rows` rows whose tiles are
// `tile_bytes` of blocks: for one row on AVX-512, where two tiles fit in three quarters of
// the L1 data cache. A next tile in L1 evicts the current one's lines where the two do not
// fit (on Zen 4's 32 KiB, 1.1-1.35x the one-row step of a 1.1B model's files); where they
// do, a one-row pass, which soon needs the next tile, is spared L2's latency (on Zen 5's 48
// KiB: the one-row step of a 1B model's Q4_K_M file, tiles of 18 KiB, 0.93-0.97x the time
// in 4 runs; of the 1.1B's, SmolLM2's and Gemma 3's 0.97-1.0x), while longer passes gain
// nothing (4-8 rows: 1.0-1.04x) and the AVX2 build's 8-column tiles took 1.0-1.08x the time
// at 2-16 rows with L1 (Zen 4).
inline bool next_tile_in_l1(int64_t rows, int64_t tile_bytes) {
  static const int64_t l1 = sysconf(_SC_LEVEL1_DCACHE_SIZE);
  return DG_AVX512 && rows == 1 && 8 * tile_bytes <= 3 * l1;
}

// R rows (x) against the tile's nb blocks: with Decode, each block decoded from the columns
// col as it comes (and kept in tile[b] with Keep), the next two tiles' lines (next, far)
// prefetched over the blocks, the next tile's into L1 with `near` (next_tile_in_l1), the
// rest into L2; else the tile's kept blocks, next's lines prefetched into L2 over them.
template <int T, int R, bool Decode, bool Keep>
inline void tile_pass(const uint8_t* const (&col)[kTileCols], int64_t nb,
                      TileBlock<QuantTraits<T>>* tile, const PassRows& x, const TileOut& out,
                      bool near, Lookahead next, Lookahead far = {}) {
  Vec acc[R];
  for (int r = 0; r < R; ++r) acc[r] = zero();
  LookaheadSpread next_lines{next, nb}, far_lines{far, nb};
  for (int64_t b = 0; b < nb; ++b) {
    if constexpr (Decode) {
      next_lines.step(near);
      far_lines.step();
      if constexpr (Keep) {  // decoded straight into the kept tile (a block is not copied)
        TileDecoder<T>::decode(col, b, tile[b]);
        rows_block<T, R>(tile[b], b, x, acc);
      } else if constexpr (Streamed<T>::value) {
        rows_block_streamed<T, R>(col, b, x, acc);
      } else {
        TileBlock<QuantTraits<T>> block;  // in registers where it fits (no store to load)
        TileDecoder<T>::decode(col, b, block);
        rows_block<T, R>(block, b, x, acc);
      }
    } else {
      next_lines.step();
      rows_block<T, R>(tile[b], b, x, acc);
    }
  }
  const Mask live = first_lanes(out.cols);
  const Vec bias = out.bias != nullptr ? load(out.bias, live) : zero();
  for (int r = 0; r < R; ++r) {
    const Vec v = out.bias != nullptr ? add(acc[r], bias) : acc[r];
    if (out.cols == kTileCols)
      store(out.y + r * out.ldy, v);
    else
      store(out.y + r * out.ldy, live, v);
  }
}

// tile_pass for `rows` <= kPassRows rows.
template <int T, bool Decode, bool Keep, int R = kPassRows>
inline void tile_pass_upto(int64_t rows, const uint8_t* const (&col)[kTileCols], int64_t nb,
                           TileBlock<QuantTraits<T>>* tile, const PassRows& x,
                           const TileOut& out, bool near, Lookahead next, Lookahead far = {}) {
  if constexpr (R > 1)
    if (rows < R)
      return tile_pass_upto<T, Decode, Keep, R - 1>(rows, col, nb, tile, x, out, near, next,
                                                    far);
  tile_pass<T, R, Decode, Keep>(col, nb, tile, x, out, near, next, far);
}

template <int T>
thread_local TileBuffer<QuantTraits<T>> tile_buffer;
thread_local std::vector<uint8_t> last_row;  // a copy of w's last row (tile decoders over-read)

// y [N, M] (rows ldy apart) = x [N, K] @ w.T (+ bias) for w [M, K / values per block] blocks
// of type T: the calling team quantizes x by pass into `rows` (grown beforehand: fit; for
// `part` kWhole and kFirst), then shares tiles of kTileCols columns, an even run per thread;
// the first pass of rows over a tile decodes it, keeping it for the others, and the run's next
// two tiles are prefetched over the passes (the second one's lines shared out among them
// all). Ends with a barrier (for kWhole and kLast). Runs rather than tiles claimed as threads
// come free: a run streams its weights in order (claimed in chunks of 8-32 tiles, a 1.1B
// Q4_K_M file's 1-row step took 1.17-1.2x the time on Zen 4), and a thread waiting at the
// barrier waits for memory, not for work (one that took the other's last tiles left 1-, 16-
// and 128-row steps unchanged).
template <int T>
void quant_gemm_team(const float* x, const uint8_t* w, const float* bias, float* y, int64_t N,
                     int64_t K, int64_t M, int64_t ldy, QuantRows& rows, LayerPart part) {
  using Q = QuantTraits<T>;
  const int64_t nb = K / Q::kValues, row_bytes = nb * Q::kBytes, blocks32 = K / kQBlock;
  if (quantizes(part)) quantize_by_pass(x, N, K, rows);
  // rows per pass; a full single pass on AVX-512 runs as two passes of half its rows, the
  // second over the kept tile while the tile after next streams in (the 1.1B Q4_K_M file's
  // 8-row step on the Intel Xeon with AMX: 0.91-0.92x the time; 5-7 rows in halves
  // 0.97-1.03x, so they stay one pass)
  const int64_t pass = DG_AVX512 && N == kPassRows ? N / 2 : kPassRows;
  const int64_t passes = (N + pass - 1) / pass;
  TileBlock<Q>* tile = tile_buffer<T>.fit(passes > 1 ? nb : 1);
  const auto rows_from = [&](int64_t r) {  // a pass's rows from row r (a lane of its block)
    const int64_t block = r / kPassRows * blocks32 * kPassRows, lane = r % kPassRows;
    const int32_t* corr = Q::kGroups == 2 ? rows.corr16.data() + 2 * block + lane
                                          : rows.corr32.data() + block + lane;
    return PassRows{rows.q.data() + r / kPassRows * K * kPassRows + 4 * lane,
                    rows.d.data() + block + lane, rows.sums.data() + block + lane, corr};
  };
  const int64_t tiles = (M + kTileCols - 1) / kTileCols;
  const int64_t team = omp_get_num_threads(), me = omp_get_thread_num();
  const int64_t end = tiles * (me + 1) / team;
  const bool near = next_tile_in_l1(N, kTileCols * row_bytes);
  for (int64_t t = tiles * me / team; t < end; ++t) {
    const int64_t m0 = t * kTileCols, cols = std::min<int64_t>(kTileCols, M - m0);
    const uint8_t* col[kTileCols];  // a last partial tile repeats its last column
    for (int c = 0; c < kTileCols; ++c)
      col[c] = w + (m0 + std::min<int64_t>(c, cols - 1)) * row_bytes;
    if (m0 + kTileCols >= M) {  // w's last row through a copy with room for kTileSlack
      last_row.assign(row_bytes + kTileSlack, 0);
      std::memcpy(last_row.data(), w + (M - 1) * row_bytes, row_bytes);
      for (int c = 0; c < kTileCols; ++c)
        if (col[c] == w + (M - 1) * row_bytes) col[c] = last_row.data();
    }
    const int64_t after = t + 1 < end ? std::min<int64_t>(kTileCols, M - m0 - kTileCols) : 0;
    const Lookahead next{reinterpret_cast<const char*>(w + (m0 + kTileCols) * row_bytes),
                         after * row_bytes / 64};
    const int64_t beyond = t + 2 < end ? std::min<int64_t>(kTileCols, M - m0 - 2 * kTileCols) : 0;
    const Lookahead far{reinterpret_cast<const char*>(w + (m0 + 2 * kTileCols) * row_bytes),
                        beyond * row_bytes / 64};
    const float* b = bias != nullptr ? bias + m0 : nullptr;
    if (passes == 1) {
      tile_pass_upto<T, true, false>(N, col, nb, tile, rows_from(0), TileOut{y + m0, ldy, cols, b},
                                     near, next, far);
      continue;
    }
    // the tile after next streams in over all the passes, not the first alone: memory keeps
    // busy while later passes multiply the kept tile (a 1.1B Q4_K_M file's steps on the
    // Intel Xeon with AMX: 16 and 32 rows 0.86-0.88x the time, 24 rows 0.81-0.83x, 12 rows
    // 0.89-0.92x, 64 and 128 rows 0.93-0.98x)
    for (int64_t p = 0; p < passes; ++p) {
      const int64_t r = p * pass, n = std::min(pass, N - r);
      const int64_t shared = far.lines * p / passes, share_end = far.lines * (p + 1) / passes;
      const Lookahead share{far.next + 64 * shared, share_end - shared};  // pass p's part of far
      const TileOut out{y + r * ldy + m0, ldy, cols, b};
      if (p == 0)  // decodes the tile into the kept one
        tile_pass_upto<T, true, true>(n, col, nb, tile, rows_from(r), out, false, next, share);
      else
        tile_pass_upto<T, false, true>(n, col, nb, tile, rows_from(r), out, false, share);
    }
  }
  if (ends_team(part)) {
#pragma omp barrier
  }
}

}  // namespace
