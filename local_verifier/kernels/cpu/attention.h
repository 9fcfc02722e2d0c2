// Attention of each row over its own key list (an online softmax in key order), on float32
// or bfloat16 K/V.
#pragma once

#include <omp.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <limits>
#include <utility>
#include <vector>

#include "common.h"
#include "dot.h"
#include "simd.h"

namespace {

// ---- Attention. ---------------------------------------------------------------------------
//
// A row's attention is one fixed function of its query and its allowed keys in list order.
// The keys are cut into blocks of kKeyBlock; for each block, in order:
//   score[j] = scale * (((q[0] k_j[0] + 0) + q[1] k_j[1]) + ...)  (FMAs in head_dim order;
//     bf16 K/V of an even head_dim where the CPU has AVX512-BF16: q rounded to bf16, and one
//     vdpbf16ps per pair of dimensions (2i, 2i + 1), in order)
//   m' = max(m, max_j score[j]),  corr = exp(m - m'),  p[j] = exp(score[j] - m')
//   sum = sum corr + p[0:kLanes] + p[kLanes:2 kLanes] + ...  (kLanes partial sums)
//   acc = acc corr, then acc += p[j] v_j key by key (FMAs)
// and the output is acc / lane_sum(sum). Lanes never mix except in max (exact) and the
// final lane_sum, so neither the rows sharing a block nor where a row sits in its vectors
// change a bit of the row.

constexpr int kKeyBlock = 32;  // keys per online-softmax block (in a row's key order)
constexpr int kBlockTiles = kKeyBlock / kKeyTile;
constexpr int kTileVecs = kKeyTile / kLanes;
static_assert(kKeyBlock % kKeyTile == 0 && kKeyTile % kLanes == 0,
              "a block is whole key tiles, a tile whole vectors");
constexpr int kQueryTile = 64;  // the most rows of one sequence sharing each key block
constexpr int kMinQueryTile = 8;
constexpr int kMaxHeadDim = 256;
constexpr int kMaxChunks = kMaxHeadDim / kLanes;  // vectors per head

// What the attention kernels need of the call: the K/V storage (KV: float, or uint16_t for
// bfloat16 bits, widened exactly as read) and the head geometry.
template <typename KV>
struct Heads {
  const KV* kc;
  const KV* vc;
  int64_t KVH, Dh, G, chunks;  // G query heads per kv head; chunks of kLanes per head
  float scale;
  Mask tail;       // the lanes of head_dim's last chunk (all of them when it is full)
  int64_t tail_n;  // their count

  // slot's K of kv head g: dimension d at key(slot, g)[d kKeyTile] (see key_offset)
  const KV* key(int64_t slot, int64_t g) const {
    return kc + key_offset(slot, KVH * Dh) + g * Dh * kKeyTile;
  }
};

// Chunk c of a head of CH chunks at p: the last one masked to head_dim unless it is full.
template <int CH, typename KV>
inline Vec load_chunk(const Heads<KV>& a, const KV* p, int c) {
  if (c + 1 < CH || a.tail_n == kLanes) return load(p + c * kLanes);
  if constexpr (std::is_same_v<KV, float>)
    return load(p + c * kLanes, a.tail);
  else
    return load_first(p + c * kLanes, a.tail_n);
}

// The cache lines of the next key block (its K tiles, then its V rows), asked for while this
// block is computed, spread over it: a K tile row's lines per head dimension of a score tile,
// a V row's lines per key of a value tile. A decode row's blocks lie scattered over the pool,
// each a few short streams: left to the hardware prefetchers, or asked for faster, its loads
// wait on memory. Into L2: asked into L1, a block's lines wait on L1's few miss buffers, and
// 8 decode rows' attention took 1.2-1.35x the time (both measured by `python -m
// benchmarks.kernels.bench_attention --serving --kv-dtype bfloat16 --baseline OTHER.cpp`).
class Ahead {
 public:
  // The lines of kv head g's K tiles and V rows of keys[0..n) (n = 0: none).
  template <typename KV>
  void plan(const Heads<KV>& a, int64_t g, const int64_t* keys, int64_t n) {
    constexpr int64_t kLine = 64 / sizeof(KV);  // values per cache line
    const int64_t kv_width = a.KVH * a.Dh, tile = a.Dh * kKeyTile;
    count_ = next_ = 0;
    per_dim_ = std::max<int64_t>(1, kBlockTiles * kKeyTile / kLine);
    per_key_ = (a.Dh + kLine - 1) / kLine;
    for (int64_t j = 0; j < n; j += kKeyTile) {
      const KV* k = a.key(keys[j] / kKeyTile * kKeyTile, g);
      for (int64_t i = 0; i < tile; i += kLine) line_[count_++] = k + i;
    }
    for (int64_t j = 0; j < n; ++j) {
      const KV* v = a.vc + keys[j] * kv_width + g * a.Dh;
      for (int64_t i = 0; i < a.Dh; i += kLine) line_[count_++] = v + i;
    }
  }
  void per_dim() { issue(per_dim_); }
  void per_key() { issue(per_key_); }

 private:
  void issue(int64_t count) {  // the next count lines not yet asked for
    const int64_t end = std::min(count_, next_ + count);
    for (int64_t i = next_; i < end; ++i)
      _mm_prefetch(static_cast<const char*>(line_[i]), _MM_HINT_T1);
    next_ = end;
  }

  static constexpr int64_t kMaxLines = 2 * kKeyBlock * kMaxHeadDim * sizeof(float) / 64;
  const void* line_[kMaxLines];
  int64_t count_ = 0, next_ = 0, per_dim_ = 1, per_key_ = 1;
};

// The calling thread's Ahead, behind a call that is not inlined, so that a work item takes its
// address once: inlined, GCC asks the dynamic linker (__tls_get_addr) for a thread_local's
// address again for every line planned (under perf, 4% of 8 decode rows' attention).
__attribute__((noinline)) Ahead& thread_ahead() {
  static thread_local Ahead ahead;
  return ahead;
}

// The online-softmax state of the rows of a tile (rows of one sequence, one kv head): query
// vector v = t G + h is query head h of row t; a vector of a head is width floats.
template <typename KV>
struct Tile {
  int64_t width;  // chunks * kLanes
  float* q;       // [rows G][width] the queries, zero past head_dim
  uint16_t* qb;   // [rows G][width] the same rounded to bf16 (bf16 K/V on dot products)
  float* acc;     // [rows G][width] the output accumulators
  float* m;       // [rows G] the running max
  float* corr;    // [rows G] this block's new max, then its rescaling
  float* sum;     // [rows G][kLanes] the partial sums of the probabilities
  float* p;       // [rows G][kKeyBlock] this block's scores, then probabilities
  KV* gathered;   // [kBlockTiles][Dh][kKeyTile] key tiles gathered for this block
  Ahead* ahead;   // the next block's cache lines, asked for while this one is computed
};

constexpr int kKeyVecs = kKeyBlock / kLanes;

// tiles[t] = the keys block[t kKeyTile ..) of kv head g as one tile [Dh][kKeyTile] (key j of
// the tile in lane j): the stored tile itself where those keys are its slots in order from its
// first (lanes past the live keys then hold other slots' keys), else their dimensions gathered
// into gathered's tile t. A tile of no live key (t kKeyTile >= nb) is the one before it. Lanes
// of keys j >= nb are never read into a row (attend_block masks them out of the max, the
// probabilities and the sums, and folds values b < live only).
template <typename KV>
void key_tiles(const Heads<KV>& a, int64_t g, const int64_t* block, int64_t nb, KV* gathered,
               const KV* tiles[kBlockTiles]) {
  for (int t = 0; t < kBlockTiles; ++t) {
    const int64_t j0 = t * kKeyTile, n = std::min<int64_t>(kKeyTile, nb - j0);
    if (n <= 0) {
      tiles[t] = tiles[t - 1];  // nb >= 1: tile 0 holds a live key
      continue;
    }
    bool stored = block[j0] % kKeyTile == 0;
    for (int64_t j = 1; stored && j < n; ++j) stored = block[j0 + j] == block[j0] + j;
    if (stored) {
      tiles[t] = a.key(block[j0], g);
      continue;
    }
    KV* out = gathered + t * a.Dh * kKeyTile;
    for (int64_t j = 0; j < n; ++j) {
      const KV* key = a.key(block[j0 + j], g);
      for (int64_t d = 0; d < a.Dh; ++d) out[d * kKeyTile + j] = key[d * kKeyTile];
    }
    tiles[t] = out;
  }
}

// p[n][j] = scale * sum over d in order of q[n][d] k_j[d] for N query vectors, key j of the
// block in lane j % kKeyTile of tiles[j / kKeyTile].
template <int N, typename KV>
inline void score_tile(const float* q, int64_t width, const KV* const* tiles, int64_t Dh,
                       float scale, float* p, Ahead& ahead) {
  Vec acc[N][kKeyVecs];
  for (int n = 0; n < N; ++n)
    for (int k = 0; k < kKeyVecs; ++k) acc[n][k] = zero();
  for (int64_t d = 0; d < Dh; ++d) {
    ahead.per_dim();
    Vec kv[kKeyVecs];
    for (int k = 0; k < kKeyVecs; ++k) {
      kv[k] = load(tiles[k / kTileVecs] + d * kKeyTile + k % kTileVecs * kLanes);
      if constexpr (N > 1) in_register(kv[k]);
    }
    for (int n = 0; n < N; ++n) {
      const Vec qd = set1(q[n * width + d]);
      for (int k = 0; k < kKeyVecs; ++k) acc[n][k] = fmadd(qd, kv[k], acc[n][k]);
    }
  }
  const Vec sv = set1(scale);
  for (int n = 0; n < N; ++n)
    for (int k = 0; k < kKeyVecs; ++k) store(p + n * kKeyBlock + k * kLanes, mul(acc[n][k], sv));
}

// score_tile over count query vectors, N at a time, then the rest in smaller tiles.
template <int N, typename KV>
void scores(const float* q, int64_t width, const KV* const* tiles, int64_t Dh, float scale,
            float* p, int64_t count, Ahead& ahead) {
  int64_t n = 0;
  for (; n + N <= count; n += N)
    score_tile<N>(q + n * width, width, tiles, Dh, scale, p + n * kKeyBlock, ahead);
  if constexpr (N > 1)
    if (n < count)
      scores<N - 1>(q + n * width, width, tiles, Dh, scale, p + n * kKeyBlock, count - n, ahead);
}

#if DG_DOT
// Rows 2i and 2i + 1 of a bf16 key tile [Dh][kKeyTile], interleaved key by key: lane j holds
// key j's dimensions 2i and 2i + 1, the pair that vdpbf16ps multiplies with a query's pair i.
inline __m512bh key_pair(const uint16_t* tile, int64_t i) {
  const __m512i interleave = _mm512_set_epi16(
      31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8,
      23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);  // word 31 first
  return (__m512bh)_mm512_permutexvar_epi16(interleave,
                                            _mm512_loadu_si512(tile + 2 * i * kKeyTile));
}

// score_tile on bf16 K: the queries rounded to bf16 (qb), each score one vdpbf16ps chain
// over the pairs of head_dim in order, then scaled.
template <int N>
inline void dot_score_tile(const uint16_t* qb, int64_t width, const uint16_t* const* tiles,
                           int64_t Dh, float scale, float* p, Ahead& ahead) {
  static_assert(kTileVecs == 1, "a key vector is one whole tile");
  Vec acc[N][kKeyVecs];
  for (int n = 0; n < N; ++n)
    for (int k = 0; k < kKeyVecs; ++k) acc[n][k] = zero();
  for (int64_t i = 0; i < Dh / 2; ++i) {
    ahead.per_dim();
    ahead.per_dim();
    __m512bh kv[kKeyVecs];
    for (int k = 0; k < kKeyVecs; ++k) kv[k] = key_pair(tiles[k], i);
    for (int n = 0; n < N; ++n) {
      const __m512bh qd = dot_pair(qb + n * width, i);
      for (int k = 0; k < kKeyVecs; ++k) acc[n][k] = _mm512_dpbf16_ps(acc[n][k], kv[k], qd);
    }
  }
  const Vec sv = set1(scale);
  for (int n = 0; n < N; ++n)
    for (int k = 0; k < kKeyVecs; ++k) store(p + n * kKeyBlock + k * kLanes, mul(acc[n][k], sv));
}

// dot_score_tile over count query vectors, N at a time, then the rest in smaller tiles.
template <int N>
void dot_scores(const uint16_t* qb, int64_t width, const uint16_t* const* tiles, int64_t Dh,
                float scale, float* p, int64_t count, Ahead& ahead) {
  int64_t n = 0;
  for (; n + N <= count; n += N)
    dot_score_tile<N>(qb + n * width, width, tiles, Dh, scale, p + n * kKeyBlock, ahead);
  if constexpr (N > 1)
    if (n < count)
      dot_scores<N - 1>(qb + n * width, width, tiles, Dh, scale, p + n * kKeyBlock, count - n,
                        ahead);
}
#endif

// acc[n] = acc[n] corr[n], then += p[n][b] v_b for b < nb (>= 1) in order, for N query
// vectors of one row (its keys are slots block[0..nb)).
template <int N, int CH, typename KV>
inline void value_tile(const Heads<KV>& a, int64_t g, const int64_t* block, int64_t nb,
                       const float* p, const float* corr, float* acc, int64_t width,
                       Ahead& ahead) {
  Vec o[N][CH];
  for (int n = 0; n < N; ++n) {
    const Vec cv = set1(corr[n]);
    for (int c = 0; c < CH; ++c) o[n][c] = mul(load(acc + n * width + c * kLanes), cv);
  }
  const KV* vc = a.vc + g * a.Dh;
  const int64_t stride = a.KVH * a.Dh;
  int64_t b = 0;
  do {  // nb >= 1; no zero-trip path, so that GCC keeps o in registers, unspilled
    ahead.per_key();
    const KV* vr = vc + block[b] * stride;
    Vec vv[CH];
    for (int c = 0; c < CH; ++c) {
      vv[c] = load_chunk<CH>(a, vr, c);
      if constexpr (N > 1) in_register(vv[c]);
    }
    for (int n = 0; n < N; ++n) {
      const Vec pb = set1(p[n * kKeyBlock + b]);
      for (int c = 0; c < CH; ++c) o[n][c] = fmadd(pb, vv[c], o[n][c]);
    }
  } while (++b < nb);
  for (int n = 0; n < N; ++n)
    for (int c = 0; c < CH; ++c) store(acc + n * width + c * kLanes, o[n][c]);
}

// value_tile over count query vectors of one row, N at a time, then the rest.
template <int N, int CH, typename KV>
void values(const Heads<KV>& a, int64_t g, const int64_t* block, int64_t nb, const float* p,
            const float* corr, float* acc, int64_t width, int64_t count, Ahead& ahead) {
  int64_t n = 0;
  for (; n + N <= count; n += N)
    value_tile<N, CH>(a, g, block, nb, p + n * kKeyBlock, corr + n, acc + n * width, width,
                      ahead);
  if constexpr (N > 1)
    if (n < count)
      values<N - 1, CH>(a, g, block, nb, p + n * kKeyBlock, corr + n, acc + n * width, width,
                        count - n, ahead);
}

// Folds the key block of slots block[0..nb) into rows [t0, t1) of the tile, row t allowing
// the first live[t] (1..nb) keys of it: every row's scores computed from the block's key
// tiles kScoreTile query vectors at a time.
template <int CH, typename KV>
void attend_block(const Heads<KV>& a, int64_t g, const Tile<KV>& tile, int64_t t0, int64_t t1,
                  const int64_t* block, int64_t nb, const int64_t* live) {
  const int64_t G = a.G, width = tile.width, v0 = t0 * G, v1 = t1 * G;
  const KV* tiles[kBlockTiles];
  key_tiles(a, g, block, nb, tile.gathered, tiles);
  bool dotted = false;  // bf16 K of an even head_dim: scores on dot products
#if DG_DOT
  if constexpr (std::is_same_v<KV, uint16_t>)
    if ((dotted = a.Dh % 2 == 0))
      dot_scores<kScoreTile>(tile.qb + v0 * width, width, tiles, a.Dh, a.scale,
                             tile.p + v0 * kKeyBlock, v1 - v0, *tile.ahead);
#endif
  if (!dotted)
    scores<kScoreTile>(tile.q + v0 * width, width, tiles, a.Dh, a.scale, tile.p + v0 * kKeyBlock,
                       v1 - v0, *tile.ahead);
  const auto keys = [&](int64_t v, int k) {  // the live lanes of vector k of v's scores
    return first_lanes(std::clamp<int64_t>(live[v / G] - k * kLanes, 0, kLanes));
  };
  for (int64_t v = v0; v < v1; ++v) {  // the new max (exact in any order)
    Vec top = set1(tile.m[v]);
    for (int k = 0; k < kKeyVecs; ++k)
      top = max_masked(top, keys(v, k), load(tile.p + v * kKeyBlock + k * kLanes));
    tile.corr[v] = max_lane(top);
  }
  for (int64_t v = v0; v < v1; v += kLanes) {  // corr = exp(m - m'), then m = m'
    const Mask in = first_lanes(std::min<int64_t>(kLanes, v1 - v));
    const Vec m_new = load(tile.corr + v, in);
    store(tile.corr + v, in, vexp(sub(load(tile.m + v, in), m_new)));
    store(tile.m + v, in, m_new);
  }
  for (int64_t v = v0; v < v1; ++v) {
    const Vec mv = set1(tile.m[v]);
    Vec s = mul(load(tile.sum + v * kLanes), set1(tile.corr[v]));
    for (int k = 0; k * kLanes < live[v / G]; ++k) {  // vectors of no live key would add 0
      float* pk = tile.p + v * kKeyBlock + k * kLanes;
      const Vec prob = keep(keys(v, k), vexp(sub(load(pk), mv)));
      store(pk, prob);
      s = add(s, prob);
    }
    store(tile.sum + v * kLanes, s);
  }
  // Rows in runs that allow the same keys (all of a context block's rows), each run's vectors
  // together, so that a value row is read once per run (a vector's FMAs are the same).
  constexpr int kValueTile = std::max(1, (kValueRegs - CH) / CH);  // + the CH chunks of v
  for (int64_t t = t0, end; t < t1; t = end) {
    for (end = t + 1; end < t1 && live[end] == live[t];) ++end;
    values<kValueTile, CH>(a, g, block, live[t], tile.p + t * G * kKeyBlock, tile.corr + t * G,
                           tile.acc + t * G * width, width, (end - t) * G, *tile.ahead);
  }
}

template <typename KV>
using AttendBlock = void (*)(const Heads<KV>&, int64_t, const Tile<KV>&, int64_t, int64_t,
                             const int64_t*, int64_t, const int64_t*);

template <typename KV, int... CH>
constexpr std::array<AttendBlock<KV>, sizeof...(CH)> attend_blocks(
    std::integer_sequence<int, CH...>) {
  return {&attend_block<CH + 1, KV>...};
}

// attend_block<chunks> for chunks = 1..kMaxChunks (head_dim up to kMaxHeadDim)
template <typename KV>
constexpr auto kAttendBlock = attend_blocks<KV>(std::make_integer_sequence<int, kMaxChunks>{});

template <typename KV>
void attention_rows(const float* qp, const KV* kc, const KV* vc, const int64_t* kp,
                    const int64_t* ks, const int64_t* rs, const int64_t* cl, const bool* mp,
                    const int64_t* ms, float* op, int64_t N, int64_t n_seqs, int64_t H,
                    int64_t KVH, int64_t Dh, int threads) {
  Heads<KV> a;
  a.kc = kc;
  a.vc = vc;
  a.KVH = KVH;
  a.Dh = Dh;
  a.G = H / KVH;
  a.chunks = (Dh + kLanes - 1) / kLanes;
  a.scale = 1.0f / std::sqrt(static_cast<float>(Dh));
  a.tail_n = Dh - (a.chunks - 1) * kLanes;
  a.tail = first_lanes(a.tail_n);
  // Work items (no bit depends on them): rows [first, last) of sequence s, kv heads [g0, g1).
  // A sequence's rows in tiles of about 2 per thread; with sequences enough to keep every
  // thread busy, one item takes all kv heads of its rows, so that one thread reads all of a
  // sequence's K tiles and V rows (0.9x the time of one item per kv head at 8 sequences of
  // 1-2 rows: `python -m benchmarks.kernels.bench_attention --serving --kv-dtype bfloat16
  // --baseline OTHER.cpp`).
  struct Item {
    int64_t s, g0, g1, first, last;
  };
  const bool whole_heads = n_seqs >= 2 * threads;
  std::vector<Item> items;
  for (int64_t s = 0; s < n_seqs; ++s) {
    const int64_t tile = std::clamp<int64_t>((rs[s + 1] - rs[s]) / (2 * std::max(threads, 1)),
                                             kMinQueryTile, kQueryTile);
    for (int64_t r = rs[s]; r < rs[s + 1]; r += tile) {
      const int64_t last = std::min<int64_t>(r + tile, rs[s + 1]);
      if (whole_heads)
        items.push_back({s, 0, KVH, r, last});
      else
        for (int64_t g = 0; g < KVH; ++g) items.push_back({s, g, g + 1, r, last});
    }
  }
  // Costliest first (keys read times rows, plus the reading), so that the last items, run
  // while the other threads may already wait, are the cheap ones.
  const auto cost = [&](const Item& i) {
    return (i.g1 - i.g0) * (cl[i.s] + i.last - rs[i.s]) * (i.last - i.first + 2);
  };
  std::stable_sort(items.begin(), items.end(),
                   [&](const Item& x, const Item& y) { return cost(x) > cost(y); });
  const int64_t G = a.G, width = a.chunks * kLanes;
  const AttendBlock<KV> attend_block = kAttendBlock<KV>[a.chunks - 1];
  const auto lanes = [&](int64_t c) { return c + 1 < a.chunks ? first_lanes(kLanes) : a.tail; };

#pragma omp parallel for schedule(dynamic, 1) num_threads(threads)
  for (size_t it = 0; it < items.size(); ++it) {
    const Item& item = items[it];
    const int64_t s = item.s, rows = item.last - item.first, n = rows * G;
    const int64_t T = rs[s + 1] - rs[s], C = cl[s], end = C + T;
    const int64_t first_i = item.first - rs[s];
    const int64_t* list = kp + ks[s];
    // The thread's scratch, kept across items and calls (at most kQueryTile rows' worth):
    // acc, m and sum get their start values per kv head; q, corr and p are written before
    // they are read; gathered's lanes of no live key keep earlier keys, never read into a row.
    static thread_local std::vector<float> scratch;
    static thread_local std::vector<KV> gathered(kBlockTiles * kMaxHeadDim * kKeyTile);
    static thread_local std::vector<uint16_t> rounded;  // q in bf16 (bf16 K/V, dot products)
    Ahead& ahead = thread_ahead();
    const size_t need = n * (2 * width + 2 + kLanes + kKeyBlock);
    if (scratch.size() < need) scratch.resize(need);
    if (rounded.size() < static_cast<size_t>(n * width)) rounded.resize(n * width);
    Tile<KV> tile;
    tile.width = width;
    tile.q = scratch.data();
    tile.qb = rounded.data();
    tile.acc = tile.q + n * width;
    tile.m = tile.acc + n * width;
    tile.corr = tile.m + n;
    tile.sum = tile.corr + n;
    tile.p = tile.sum + n * kLanes;
    tile.gathered = gathered.data();
    tile.ahead = &ahead;
    for (int64_t g = item.g0; g < item.g1; ++g) {
      std::fill(tile.acc, tile.acc + n * width, 0.0f);
      std::fill(tile.m, tile.m + n, -std::numeric_limits<float>::infinity());
      std::fill(tile.sum, tile.sum + n * kLanes, 0.0f);
      for (int64_t t = 0; t < rows; ++t)
        for (int64_t h = 0; h < G; ++h)
          for (int64_t c = 0; c < a.chunks; ++c)
            store(tile.q + (t * G + h) * width + c * kLanes,
                  load(qp + ((item.first + t) * H + g * G + h) * Dh + c * kLanes, lanes(c)));
#if DG_DOT
      if constexpr (std::is_same_v<KV, uint16_t>) dot_round(tile.q, n, width, tile.qb);
#endif
      int64_t live[kQueryTile];
      if (ms[s] < 0) {  // causal: row t allows the list's first C + first_i + t + 1 keys
        const int64_t stop = C + first_i + rows;
        for (int64_t b = 0; b < stop; b += kKeyBlock) {
          int64_t t0 = rows;  // the tile's first row with keys in this block
          for (int64_t t = rows - 1; t >= 0; --t) {
            live[t] = std::clamp<int64_t>(C + first_i + t + 1 - b, 0, kKeyBlock);
            if (live[t] > 0) t0 = t;
          }
          const int64_t next = b + kKeyBlock;  // the next block ahead
          ahead.plan(a, g, list + next, std::clamp<int64_t>(stop - next, 0, kKeyBlock));
          attend_block(a, g, tile, t0, rows, list + b, live[rows - 1], live);
        }
      } else {  // the context's whole blocks together, then each row's own keys
        const int64_t full = C / kKeyBlock * kKeyBlock;
        std::fill(live, live + rows, int64_t{kKeyBlock});
        for (int64_t b = 0; b < full; b += kKeyBlock) {
          const int64_t next = b + kKeyBlock;  // the next block of the list ahead
          ahead.plan(a, g, list + next, std::clamp<int64_t>(end - next, 0, kKeyBlock));
          attend_block(a, g, tile, 0, rows, list + b, kKeyBlock, live);
        }
        ahead.plan(a, g, list, 0);  // a row's own blocks: none ahead
        for (int64_t t = 0; t < rows; ++t) {
          const bool* mask = mp + ms[s] + (first_i + t) * T;
          int64_t block[kKeyBlock];
          int64_t next = full;  // next index of the key list to consider
          while (next < end) {
            int64_t nb = 0;
            while (nb < kKeyBlock && next < end) {
              if (next < C || mask[next - C]) block[nb++] = list[next];
              ++next;
            }
            live[t] = nb;
            if (nb > 0) attend_block(a, g, tile, t, t + 1, block, nb, live);
          }
        }
      }
      for (int64_t v = 0; v < n; ++v) {
        const int64_t r = item.first + v / G, h = v % G;
        const Vec inv = set1(1.0f / lane_sum(load(tile.sum + v * kLanes)));
        for (int64_t c = 0; c < a.chunks; ++c)
          store(op + (r * H + g * G + h) * Dh + c * kLanes, lanes(c),
                mul(load(tile.acc + v * width + c * kLanes), inv));
      }
    }
  }
}

}  // namespace
