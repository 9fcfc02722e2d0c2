// Each quantized type's block of every column of a tile decoded for the many-row kernel
// (cpu/quant_tiles.h's TileBlock), from a few loads of the same bytes of every column and
// their transposition, the values as bytes (fifth and sixth bits merged, int8 offset by 128
// where kHeldOffset) and the scales and minimums as float32 computed as QuantTraits<T>::scales
// computes them (the same operations, so the same bits).
#pragma once

#include <cstdint>

#include "quant_blocks.h"
#include "quant_tiles.h"
#include "simd.h"

namespace {

// TileDecoder<T>::decode(col, b, out): block b of the tile's columns (col[c]: column c's first
// block) into out. A decoder may read up to kTileSlack bytes past the block. The 256-value
// types' scales(at, scale, min) decode the scales and minimums of the blocks at at[c] alone
// (within the blocks; the one-row kernel takes them too).
template <int T>
struct TileDecoder;

// The columns' blocks b (col[c] + b * bytes).
template <int T>
DG_TILE_INLINE void block_columns(const uint8_t* const (&col)[kTileCols], int64_t b,
                          const uint8_t* (&at)[kTileCols]) {
  for (int c = 0; c < kTileCols; ++c) at[c] = col[c] + b * QuantTraits<T>::kBytes;
}

template <>
struct TileDecoder<kQ4_0> {  // d, 16 bytes of nibbles (AVX-512: 32 bytes read)
  static DG_TILE_INLINE void decode(const uint8_t* const (&col)[kTileCols], int64_t b,
                     TileBlock<QuantTraits<kQ4_0>>& out) {
    const uint8_t* at[kTileCols];
    block_columns<kQ4_0>(col, b, at);
#if DG_AVX512
    IVec v[8];  // rotated: v[0 .. 3] the nibbles, v[7] d in its high half
    dwords8<true>(at, 0, v);
    IVec packed[4] = {v[0], v[1], v[2], v[3]};
    out.scale[0] = halves<true>(v[7]);
#else
    IVec packed[4];
    dwords4(at, 2, packed);
    out.scale[0] = halves<false>(dwords(at, 0));
#endif
    nibbles(packed, out.words, out.words + 4);
    out.min[0] = mul(set1(-8.0f), out.scale[0]);
  }
};

template <>
struct TileDecoder<kQ4_1> {  // d, m, 16 bytes of nibbles (32 bytes read)
  static DG_TILE_INLINE void decode(const uint8_t* const (&col)[kTileCols], int64_t b,
                     TileBlock<QuantTraits<kQ4_1>>& out) {
    const uint8_t* at[kTileCols];
    block_columns<kQ4_1>(col, b, at);
    IVec v[8];  // v[0]: d and m, v[1 .. 4]: the nibbles (v[5 .. 7] unused, not computed)
    dwords8(at, 0, v);
    IVec packed[4] = {v[1], v[2], v[3], v[4]};
    nibbles(packed, out.words, out.words + 4);
    out.scale[0] = halves<false>(v[0]);
    out.min[0] = halves<true>(v[0]);
  }
};

template <>
struct TileDecoder<kQ8_0> {  // d, 32 int8
  static DG_TILE_INLINE void decode(const uint8_t* const (&col)[kTileCols], int64_t b,
                     TileBlock<QuantTraits<kQ8_0>>& out) {
    const uint8_t* at[kTileCols];
    block_columns<kQ8_0>(col, b, at);
    dwords8(at, 2, out.words);
    if constexpr (kHeldOffset<kQ8_0> != 0)
      for (int j = 0; j < 8; ++j) out.words[j] = ixor(out.words[j], iset8(-128));
    IVec head[8];  // head[0]: d and the first two values (head[1 .. 7] not computed)
    dwords8(at, 0, head);
    out.scale[0] = halves<false>(head[0]);
  }
};

// Q5_0's fifth bits into w, word j of the columns' values (values 4j .. 4j + 3): bits 4j ..
// 4j + 3 of each column's 32 high bits qh, as 16 in each byte.
DG_TILE_INLINE IVec with_fifth_bits(IVec w, IVec qh, int j) {
#if DG_AVX512 && defined(__AVX512BITALG__)
  // byte t of each column's dword selects bit 4j + t of that dword within its qword
  uint64_t select = 0;
  for (int t = 0; t < 4; ++t)
    select |= static_cast<uint64_t>(4 * j + t) << (8 * t) |
              static_cast<uint64_t>(32 + 4 * j + t) << (8 * (t + 4));
  const __m512i selects = _mm512_set1_epi64(static_cast<int64_t>(select));
  const __mmask64 set = _mm512_bitshuffle_epi64_mask(qh, selects);
  return _mm512_mask_add_epi8(w, set, w, _mm512_set1_epi8(16));
#else  // the byte holding them copied to each of the column's 4 bytes, then one bit each
  const __m128i within = _mm_add_epi8(_mm_setr_epi32(0, 0x04040404, 0x08080808, 0x0C0C0C0C),
                                      _mm_set1_epi8(static_cast<char>(j / 2)));
  const int32_t bits = 0x08040201 << (4 * (j % 2));
#if DG_AVX512
  const IVec spread = _mm512_shuffle_epi8(qh, _mm512_broadcast_i32x4(within));
  return _mm512_mask_add_epi8(w, _mm512_test_epi8_mask(spread, _mm512_set1_epi32(bits)), w,
                              _mm512_set1_epi8(16));
#else
  const IVec spread = _mm256_shuffle_epi8(qh, _mm256_broadcastsi128_si256(within));
  const IVec mask = _mm256_set1_epi32(bits);
  const IVec set = _mm256_cmpeq_epi8(_mm256_and_si256(spread, mask), mask);
  return _mm256_or_si256(w, _mm256_and_si256(set, _mm256_set1_epi8(16)));
#endif
#endif
}

template <>
struct TileDecoder<kQ5_0> {  // d, 4 of fifth bits, 16 of nibbles (AVX-512: 32 bytes read)
  static DG_TILE_INLINE void decode(const uint8_t* const (&col)[kTileCols], int64_t b,
                     TileBlock<QuantTraits<kQ5_0>>& out) {
    const uint8_t* at[kTileCols];
    block_columns<kQ5_0>(col, b, at);
#if DG_AVX512
    IVec v[8];  // rotated: v[0] the fifth bits, v[1 .. 4] the nibbles, v[7] d in its high half
    dwords8<true>(at, 0, v);
    IVec packed[4] = {v[1], v[2], v[3], v[4]};
    const IVec qh = v[0];
    out.scale[0] = halves<true>(v[7]);
#else
    IVec packed[4];
    dwords4(at, 6, packed);
    const IVec qh = dwords(at, 2);
    out.scale[0] = halves<false>(dwords(at, 0));
#endif
    nibbles(packed, out.words, out.words + 4);
    for (int j = 0; j < 8; ++j) out.words[j] = with_fifth_bits(out.words[j], qh, j);
    out.min[0] = mul(set1(-16.0f), out.scale[0]);
  }
};

// Q4_K's and Q5_K's scales and minimums from their first 16 bytes (head: d and dmin, then 12
// bytes of 6-bit fields, as scale_min_k4 reads them).
DG_TILE_INLINE void k4_scales(const IVec (&head)[4], Vec (&scale)[8], Vec (&min)[8]) {
  const Vec d = halves<false>(head[0]), dmin = halves<true>(head[0]);
  const IVec six = iset8(0x3F), four = iset8(0x0F), top = iset8(0x30), byte = iset32(0xFF);
  const IVec sc_low = iand(head[1], six), m_low = iand(head[2], six);
  const IVec sc_high = ior(iand(head[3], four), iand(isrl(head[1], 2), top));
  const IVec m_high = ior(iand(isrl(head[3], 4), four), iand(isrl(head[2], 2), top));
  for (int j = 0; j < 4; ++j) {
    scale[j] = mul(d, to_float(iand(isrl(sc_low, 8 * j), byte)));
    scale[4 + j] = mul(d, to_float(iand(isrl(sc_high, 8 * j), byte)));
    min[j] = negate(mul(dmin, to_float(iand(isrl(m_low, 8 * j), byte))));
    min[4 + j] = negate(mul(dmin, to_float(iand(isrl(m_high, 8 * j), byte))));
  }
}

template <>
struct TileDecoder<kQ4_K> {  // d, dmin, 12 bytes of scales, 128 of nibbles
  // Streamed: a single pass takes the scales (scales), then each chunk of kChunkSubs
  // sub-blocks' words (chunk) as it multiplies them, so the block never goes through memory.
  static constexpr int kChunkSubs = 2;
  static DG_TILE_INLINE void scales(const uint8_t* const (&at)[kTileCols], Vec (&scale)[8],
                                    Vec (&min)[8]) {
    IVec head[4];
    dwords4(at, 0, head);
    k4_scales(head, scale, min);
  }
  // Sub-blocks 2i (low nibbles: words[0 .. 7]) and 2i + 1 (high: words[8 .. 15]).
  static DG_TILE_INLINE void chunk(const uint8_t* const (&at)[kTileCols], int i, IVec* words) {
    IVec packed[8];
    dwords8(at, 16 + 32 * i, packed);
    nibbles(packed, words, words + 8);
  }
  static DG_TILE_INLINE void decode(const uint8_t* const (&col)[kTileCols], int64_t b,
                     TileBlock<QuantTraits<kQ4_K>>& out) {
    const uint8_t* at[kTileCols];
    block_columns<kQ4_K>(col, b, at);
    scales(at, out.scale, out.min);
    for (int i = 0; i < 4; ++i) chunk(at, i, out.words + 16 * i);
  }
};

// Bit `from` of each byte of v moved to bit `to` (other bits 0).
DG_TILE_INLINE IVec bit_to(IVec v, int from, int to) {
  const IVec v2 = from <= to ? isll(v, to - from) : isrl(v, from - to);
  return iand(v2, iset8(static_cast<int8_t>(1 << to)));
}

template <>
struct TileDecoder<kQ5_K> {  // d, dmin, 12 bytes of scales, 32 of fifth bits, 128 of nibbles
  static DG_TILE_INLINE void scales(const uint8_t* const (&at)[kTileCols], Vec (&scale)[8],
                                    Vec (&min)[8]) {
    TileDecoder<kQ4_K>::scales(at, scale, min);  // the same head
  }
  static DG_TILE_INLINE void decode(const uint8_t* const (&col)[kTileCols], int64_t b,
                     TileBlock<QuantTraits<kQ5_K>>& out) {
    const uint8_t* at[kTileCols];
    block_columns<kQ5_K>(col, b, at);
    scales(at, out.scale, out.min);
    IVec qh[8];
    dwords8(at, 16, qh);  // bit s of value i's byte: sub-block s's fifth bit
    for (int i = 0; i < 4; ++i) {
      IVec packed[8];
      dwords8(at, 48 + 32 * i, packed);
      IVec* low = out.words + 16 * i;
      nibbles(packed, low, low + 8);
      for (int j = 0; j < 8; ++j) {
        low[j] = ior(low[j], bit_to(qh[j], 2 * i, 4));
        low[8 + j] = ior(low[8 + j], bit_to(qh[j], 2 * i + 1, 4));
      }
    }
  }
};

template <>
struct TileDecoder<kQ6_K> {  // 128 bytes low nibbles, 64 of 2-bit highs, 16 int8 scales, d
  static constexpr int kChunkSubs = 4;  // streamed as TileDecoder<kQ4_K>
  static DG_TILE_INLINE void scales(const uint8_t* const (&at)[kTileCols], Vec (&scale)[16],
                                    Vec (&)[8]) {
    const Vec d = halves<true>(dwords(at, 206));  // bytes 208-209 (the block ends there)
    IVec packed[4];
    dwords4(at, 192, packed);
    for (int g = 0; g < 16; ++g)  // the int8 scale of group g, sign-extended
      scale[g] = mul(d, to_float(isra(isll(packed[g / 4], 24 - 8 * (g % 4)), 24)));
  }
  // Sub-blocks 4h .. 4h + 3: words[8t .. 8t + 7] sub-block 4h + t's.
  static DG_TILE_INLINE void chunk(const uint8_t* const (&at)[kTileCols], int h, IVec* words) {
    constexpr int8_t kShift = kHeldOffset<kQ6_K> - 32;  // codes are values + 32
    const IVec four = iset8(0x0F), offset = iset8(kShift);
    IVec first[8], second[8], high[8];
    dwords8(at, 64 * h, first);
    dwords8(at, 64 * h + 32, second);
    dwords8(at, 128 + 32 * h, high);
    for (int t = 0; t < 4; ++t)
      for (int j = 0; j < 8; ++j) {
        const IVec packed = t % 2 ? second[j] : first[j];
        const IVec low = iand(t < 2 ? packed : isrl(packed, 4), four);
        const IVec top = iand(t <= 2 ? isll(high[j], 4 - 2 * t) : isrl(high[j], 2 * t - 4),
                              iset8(0x30));
        words[8 * t + j] = kShift != 0 ? iadd8(ior(low, top), offset) : ior(low, top);
      }
  }
  static DG_TILE_INLINE void decode(const uint8_t* const (&col)[kTileCols], int64_t b,
                     TileBlock<QuantTraits<kQ6_K>>& out) {
    const uint8_t* at[kTileCols];
    block_columns<kQ6_K>(col, b, at);
    scales(at, out.scale, out.min);
    for (int h = 0; h < 2; ++h) chunk(at, h, out.words + 32 * h);
  }
};

}  // namespace
