// The many-row kernel's view of GGUF quantized blocks (cpu/quant_gemm.h): a tile of kTileCols
// columns, one column per lane, a block of k decoded (cpu/quant_decode.h) into one vector per
// 4 values of k holding those 4 weight bytes of every column, and a vector per scale group and
// per minimum holding every column's float scale and minimum; the integer vectors, and the
// loads that bring the same bytes of every column into one vector.
#pragma once

#include <cstdint>
#include <cstring>
#include <vector>

#include "quant_blocks.h"
#include "simd.h"

namespace {

#if DG_AVX512 && defined(__AVX512VNNI__)
#define DG_VNNI 1
#else
#define DG_VNNI 0
#endif

// The tile's decode and the rows' products inlined into one loop whatever the compiler's
// budget (a decoded block passed through memory costs a store and a load per vector).
#define DG_TILE_INLINE inline __attribute__((always_inline))

constexpr int kTileCols = kLanes;    // columns of a tile: one per lane
constexpr int64_t kTileSlack = 32;  // bytes a decoder may read past a block's end

// Int8 weights held as uint8 value + kHeldOffset<T> where the products take them on their
// unsigned side, each scale group's integer sum started from -kHeldOffset<T> times the
// activations' sum over the group (QuantRows' corr): with VNNI, Q8_0 and Q6_K by 128
// (vpdpbusd); without, Q6_K by 32 (its 6-bit codes: a vpmaddubsw pair of them, at most
// 2 x 63 x 127, does not saturate) and Q8_0 not at all (0: int8, multiplied through their
// magnitudes and signs).
template <int T>
constexpr int kHeldOffset = T == kQ6_K ? (DG_VNNI ? 128 : 32) : T == kQ8_0 && DG_VNNI ? 128 : 0;

// ---- Integer vectors: one int32 lane (4 bytes) per column. -------------------------------

#if DG_AVX512
using IVec = __m512i;
inline IVec izero() { return _mm512_setzero_si512(); }
inline IVec iset8(int8_t v) { return _mm512_set1_epi8(v); }
inline IVec iset32(int32_t v) { return _mm512_set1_epi32(v); }
inline IVec iand(IVec a, IVec b) { return _mm512_and_si512(a, b); }
inline IVec ior(IVec a, IVec b) { return _mm512_or_si512(a, b); }
inline IVec ixor(IVec a, IVec b) { return _mm512_xor_si512(a, b); }
inline IVec iadd8(IVec a, IVec b) { return _mm512_add_epi8(a, b); }
inline IVec isrl(IVec a, int n) { return _mm512_srli_epi32(a, n); }
inline IVec isll(IVec a, int n) { return _mm512_slli_epi32(a, n); }
inline IVec isra(IVec a, int n) { return _mm512_srai_epi32(a, n); }
inline Vec to_float(IVec v) { return _mm512_cvtepi32_ps(v); }
inline Vec negate(Vec v) { return _mm512_xor_ps(v, _mm512_set1_ps(-0.0f)); }
// The low (High: high) 16 bits of each lane as fp16, in float32.
template <bool High>
inline Vec halves(IVec v) {
  if constexpr (High) v = _mm512_srli_epi32(v, 16);
  return _mm512_cvtph_ps(_mm512_cvtepi32_epi16(v));
}
#else
using IVec = __m256i;
inline IVec izero() { return _mm256_setzero_si256(); }
inline IVec iset8(int8_t v) { return _mm256_set1_epi8(v); }
inline IVec iset32(int32_t v) { return _mm256_set1_epi32(v); }
inline IVec iand(IVec a, IVec b) { return _mm256_and_si256(a, b); }
inline IVec ior(IVec a, IVec b) { return _mm256_or_si256(a, b); }
inline IVec ixor(IVec a, IVec b) { return _mm256_xor_si256(a, b); }
inline IVec iadd8(IVec a, IVec b) { return _mm256_add_epi8(a, b); }
inline IVec isrl(IVec a, int n) { return _mm256_srli_epi32(a, n); }
inline IVec isll(IVec a, int n) { return _mm256_slli_epi32(a, n); }
inline IVec isra(IVec a, int n) { return _mm256_srai_epi32(a, n); }
inline Vec to_float(IVec v) { return _mm256_cvtepi32_ps(v); }
inline Vec negate(Vec v) { return _mm256_xor_ps(v, _mm256_set1_ps(-0.0f)); }
template <bool High>
inline Vec halves(IVec v) {
  v = High ? _mm256_srli_epi32(v, 16) : _mm256_and_si256(v, _mm256_set1_epi32(0xFFFF));
  const __m128i low = _mm256_castsi256_si128(v), high = _mm256_extracti128_si256(v, 1);
  return _mm256_cvtph_ps(_mm_packus_epi32(low, high));
}
#endif

inline IVec ibroadcast(const int8_t* p) {  // 4 bytes to every lane
  int32_t v;
  std::memcpy(&v, p, 4);
  return iset32(v);
}
inline IVec ibroadcast(const int32_t* p) { return iset32(*p); }

// ---- Decoded blocks. -------------------------------------------------------------------------

// One decoded block of Q values: words [values / 4] vectors of 4 bytes per column (k order),
// scale [subs x groups] and min [subs] vectors (float per column).
template <typename Q>
struct TileBlock {
  IVec words[Q::kValues / 4];
  Vec scale[Q::kSubs * Q::kGroups];
  Vec min[Q::kSubs];
};

// A tile's decoded blocks, one per block of k, kept for the passes of rows after the first.
template <typename Q>
struct TileBuffer {
  std::vector<TileBlock<Q>> blocks;
  TileBlock<Q>* fit(int64_t n) {
    if (static_cast<int64_t>(blocks.size()) < n) blocks.resize(n);
    return blocks.data();
  }
};

// ---- The same bytes of every column in one vector. ---------------------------------------

#if DG_AVX512
// rows[p] = columns (p, p + 4) for p < 4, (p + 4, p + 8) for p >= 4, 32 bytes each: out[j]
// lane c = dword j of column c's 32 bytes (the 128-bit lane shuffles that end the
// transposition put the columns in order).
// rows[p] = 64-byte row p of the stage: out[j] lane c = dword j of column c's 32 bytes.
DG_TILE_INLINE void transpose_rows(const __m512i (&rows)[8], IVec (&out)[8]) {
  __m512i t[8], u[8];
  for (int i = 0; i < 8; i += 2) {
    t[i] = _mm512_unpacklo_epi32(rows[i], rows[i + 1]);
    t[i + 1] = _mm512_unpackhi_epi32(rows[i], rows[i + 1]);
  }
  for (int h = 0; h < 8; h += 4) {
    u[h] = _mm512_unpacklo_epi64(t[h], t[h + 2]);      // dwords 0 and 4
    u[h + 1] = _mm512_unpackhi_epi64(t[h], t[h + 2]);  // 1 and 5
    u[h + 2] = _mm512_unpacklo_epi64(t[h + 1], t[h + 3]);  // 2 and 6
    u[h + 3] = _mm512_unpackhi_epi64(t[h + 1], t[h + 3]);  // 3 and 7
  }
  for (int j = 0; j < 4; ++j) {
    out[j] = _mm512_shuffle_i32x4(u[j], u[4 + j], _MM_SHUFFLE(2, 0, 2, 0));
    out[j + 4] = _mm512_shuffle_i32x4(u[j], u[4 + j], _MM_SHUFFLE(3, 1, 3, 1));
  }
}
#else
// rows[c] = column c's 32 bytes: out[j] lane c = dword j of them.
DG_TILE_INLINE void transpose_rows(const __m256i (&rows)[8], IVec (&out)[8]) {
  __m256i t[8], u[8];
  for (int i = 0; i < 8; i += 2) {
    t[i] = _mm256_unpacklo_epi32(rows[i], rows[i + 1]);
    t[i + 1] = _mm256_unpackhi_epi32(rows[i], rows[i + 1]);
  }
  for (int h = 0; h < 8; h += 4) {
    u[h] = _mm256_unpacklo_epi64(t[h], t[h + 2]);
    u[h + 1] = _mm256_unpackhi_epi64(t[h], t[h + 2]);
    u[h + 2] = _mm256_unpacklo_epi64(t[h + 1], t[h + 3]);
    u[h + 3] = _mm256_unpackhi_epi64(t[h + 1], t[h + 3]);
  }
  for (int j = 0; j < 4; ++j) {
    out[j] = _mm256_permute2x128_si256(u[j], u[4 + j], 0x20);
    out[j + 4] = _mm256_permute2x128_si256(u[j], u[4 + j], 0x31);
  }
}
#endif

// Lane c: the 4 bytes at col[c] + at (through a small stage: scalar loads, one vector load).
DG_TILE_INLINE IVec dwords(const uint8_t* const (&col)[kTileCols], int64_t at) {
  alignas(64) uint32_t stage[kTileCols];
  for (int c = 0; c < kTileCols; ++c) std::memcpy(stage + c, col[c] + at, 4);
#if DG_AVX512
  return _mm512_load_si512(stage);
#else
  return _mm256_load_si256(reinterpret_cast<const __m256i*>(stage));
#endif
}

// out[j] lane c: dword j of the 16 bytes at col[c] + at.
DG_TILE_INLINE void dwords4(const uint8_t* const (&col)[kTileCols], int64_t at, IVec (&out)[4]) {
  const auto part = [&](int c) {
    return _mm_loadu_si128(reinterpret_cast<const __m128i*>(col[c] + at));
  };
  IVec a[4];  // a[q], 128-bit lane i: column 4i + q
  for (int q = 0; q < 4; ++q) {
#if DG_AVX512
    __m512i v = _mm512_castsi128_si512(part(q));
    v = _mm512_inserti32x4(v, part(4 + q), 1);
    v = _mm512_inserti32x4(v, part(8 + q), 2);
    a[q] = _mm512_inserti32x4(v, part(12 + q), 3);
#else
    a[q] = _mm256_set_m128i(part(4 + q), part(q));
#endif
  }
#if DG_AVX512
  const __m512i t0 = _mm512_unpacklo_epi32(a[0], a[1]), t1 = _mm512_unpackhi_epi32(a[0], a[1]);
  const __m512i t2 = _mm512_unpacklo_epi32(a[2], a[3]), t3 = _mm512_unpackhi_epi32(a[2], a[3]);
  out[0] = _mm512_unpacklo_epi64(t0, t2);
  out[1] = _mm512_unpackhi_epi64(t0, t2);
  out[2] = _mm512_unpacklo_epi64(t1, t3);
  out[3] = _mm512_unpackhi_epi64(t1, t3);
#else
  const __m256i t0 = _mm256_unpacklo_epi32(a[0], a[1]), t1 = _mm256_unpackhi_epi32(a[0], a[1]);
  const __m256i t2 = _mm256_unpacklo_epi32(a[2], a[3]), t3 = _mm256_unpackhi_epi32(a[2], a[3]);
  out[0] = _mm256_unpacklo_epi64(t0, t2);
  out[1] = _mm256_unpackhi_epi64(t0, t2);
  out[2] = _mm256_unpacklo_epi64(t1, t3);
  out[3] = _mm256_unpackhi_epi64(t1, t3);
#endif
}

// out[j] lane c: dword j of the 32 bytes at col[c] + at.
// With Rotate (AVX-512), the 32 bytes rotated by one 16-bit word first: dword j holds bytes
// 4j + 2 .. 4j + 5, dword 7 bytes 30, 31, 0, 1.
template <bool Rotate = false>
DG_TILE_INLINE void dwords8(const uint8_t* const (&col)[kTileCols], int64_t at, IVec (&out)[8]) {
  const auto part = [&](int c) {
    return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(col[c] + at));
  };
#if DG_AVX512
  __m512i rows[8];  // as transpose_rows takes them
  const __m512i words = _mm512_set_epi16(16, 31, 30, 29, 28, 27, 26, 25, 24, 23, 22, 21, 20, 19,
                                         18, 17, 0, 15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3,
                                         2, 1);
  for (int p = 0; p < 8; ++p) {
    const int c = (p / 4) * 8 + p % 4;
    rows[p] = _mm512_inserti64x4(_mm512_castsi256_si512(part(c)), part(c + 4), 1);
    if constexpr (Rotate) rows[p] = _mm512_permutexvar_epi16(words, rows[p]);
  }
#else
  static_assert(!Rotate, "AVX-512 only");
  __m256i rows[8];
  for (int c = 0; c < 8; ++c) rows[c] = part(c);
#endif
  transpose_rows(rows, out);
}

// The 4-bit values of 4 dwords of packed nibbles: out[j] low nibbles, out[4 + j] high ones.
template <int N>
DG_TILE_INLINE void nibbles(const IVec (&packed)[N], IVec* low, IVec* high) {
  const IVec m = iset8(0x0F);
  for (int j = 0; j < N; ++j) {
    low[j] = iand(packed[j], m);
    high[j] = iand(isrl(packed[j], 4), m);
  }
}

}  // namespace
