// GGUF quantized blocks as they lie in the file (Q4_0, Q4_1, Q5_0, Q8_0: 32 values per
// block; Q4_K, Q5_K, Q6_K: 256 in sub-blocks of 32): each type's 32 values of a sub-block
// decoded in registers to bytes, and its scales and minimums decoded to float32.
#pragma once

#include <cstdint>
#include <cstring>

#include "simd.h"

namespace {

// The GGML type codes of the types run here (dg_linear_quant's `type`).
enum QuantType { kQ4_0 = 2, kQ4_1 = 3, kQ5_0 = 6, kQ8_0 = 8, kQ4_K = 12, kQ5_K = 13, kQ6_K = 14 };
constexpr int64_t kQBlock = 32;  // values per activation block and per weight sub-block

inline float half_to_float(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return _cvtsh_ss(h);
}

inline __m256i low_nibbles(__m128i packed) {  // values 0-15 low nibbles, 16-31 high ones
  const __m128i m = _mm_set1_epi8(0x0F);
  return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(packed, 4), m), _mm_and_si128(packed, m));
}

inline __m256i bits_to_bytes(const uint8_t* p) {  // bit j of 32 -> byte j 0xFF or 0
  uint32_t bits;
  std::memcpy(&bits, p, 4);
  const __m256i shuffle = _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202,
                                            0x0101010101010101, 0x0000000000000000);
  __m256i bytes = _mm256_shuffle_epi8(_mm256_set1_epi32(static_cast<int>(bits)), shuffle);
  bytes = _mm256_or_si256(bytes, _mm256_set1_epi64x(0x7fbfdfeff7fbfdfe));
  return _mm256_cmpeq_epi8(bytes, _mm256_set1_epi64x(-1));
}

// Q4_K and Q5_K's 6-bit scale and minimum of sub-block j (ggml's get_scale_min_k4).
inline void scale_min_k4(int j, const uint8_t* q, int* scale, int* min) {
  if (j < 4) {
    *scale = q[j] & 63;
    *min = q[j + 4] & 63;
  } else {
    *scale = (q[j + 4] & 0x0F) | ((q[j - 4] >> 6) << 4);
    *min = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
  }
}

// The two fp16 fields at p + at[c] and 2 bytes on (c = 0 .. 7) as 8 float32 each.
inline void halves8(const uint8_t* p, __m256i at, __m256* first, __m256* second) {
  const __m256i dwords = _mm256_i32gather_epi32(reinterpret_cast<const int*>(p), at, 1);
  const __m256i low = _mm256_and_si256(dwords, _mm256_set1_epi32(0xFFFF));
  const __m256i high = _mm256_srli_epi32(dwords, 16);
  *first = _mm256_cvtph_ps(_mm_packus_epi32(_mm256_castsi256_si128(low),
                                            _mm256_extracti128_si256(low, 1)));
  *second = _mm256_cvtph_ps(_mm_packus_epi32(_mm256_castsi256_si128(high),
                                             _mm256_extracti128_si256(high, 1)));
}

// Per type: kValues and kBytes of a block, kSubs sub-blocks of 32 values, kGroups scale
// groups per sub-block (Q6_K's scales cover 16 values), kMin (a minimum per sub-block:
// w = scale q + min) and kSigned (values int8, else uint8 0-63).
// values(b, s): sub-block s's 32 values; scales(b, scale, min): the block's kSubs kGroups
// scales in k order and (kMin) its kSubs minimums, as float32; for the 32-value types,
// scales8(b, at, scale, min): the same for the 8 blocks at b + at[c], one lane each.
// kTop: the largest magnitude of a value (Q8_0's -128).
template <int T>
struct QuantTraits;

template <>
struct QuantTraits<kQ8_0> {
  static constexpr int64_t kValues = 32, kBytes = 34;
  static constexpr int kSubs = 1, kGroups = 1;
  static constexpr bool kMin = false, kSigned = true;
  static constexpr int kTop = 128;
  static __m256i values(const uint8_t* b, int) {
    return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 2));
  }
  static void scales(const uint8_t* b, float* scale, float*) { scale[0] = half_to_float(b); }
  static void scales8(const uint8_t* b, __m256i at, __m256* scale, __m256*) {
    __m256 unused;
    halves8(b, at, scale, &unused);
  }
};

template <>
struct QuantTraits<kQ4_0> {  // d (q - 8): the offset as a minimum of -8 d
  static constexpr int64_t kValues = 32, kBytes = 18;
  static constexpr int kSubs = 1, kGroups = 1;
  static constexpr bool kMin = true, kSigned = false;
  static constexpr int kTop = 15;
  static __m256i values(const uint8_t* b, int) {
    return low_nibbles(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 2)));
  }
  static void scales(const uint8_t* b, float* scale, float* min) {
    scale[0] = half_to_float(b);
    min[0] = -8.0f * scale[0];
  }
  static void scales8(const uint8_t* b, __m256i at, __m256* scale, __m256* min) {
    __m256 unused;
    halves8(b, at, scale, &unused);
    *min = _mm256_mul_ps(_mm256_set1_ps(-8.0f), *scale);
  }
};

template <>
struct QuantTraits<kQ4_1> {
  static constexpr int64_t kValues = 32, kBytes = 20;
  static constexpr int kSubs = 1, kGroups = 1;
  static constexpr bool kMin = true, kSigned = false;
  static constexpr int kTop = 15;
  static __m256i values(const uint8_t* b, int) {
    return low_nibbles(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 4)));
  }
  static void scales(const uint8_t* b, float* scale, float* min) {
    scale[0] = half_to_float(b);
    min[0] = half_to_float(b + 2);
  }
  static void scales8(const uint8_t* b, __m256i at, __m256* scale, __m256* min) {
    halves8(b, at, scale, min);
  }
};

template <>
struct QuantTraits<kQ5_0> {  // d ((nibble | high bit << 4) - 16): the offset a minimum
  static constexpr int64_t kValues = 32, kBytes = 22;
  static constexpr int kSubs = 1, kGroups = 1;
  static constexpr bool kMin = true, kSigned = false;
  static constexpr int kTop = 31;
  static __m256i values(const uint8_t* b, int) {
    const __m256i q = low_nibbles(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 6)));
    const __m256i high = _mm256_and_si256(bits_to_bytes(b + 2), _mm256_set1_epi8(16));
    return _mm256_or_si256(q, high);
  }
  static void scales(const uint8_t* b, float* scale, float* min) {
    scale[0] = half_to_float(b);
    min[0] = -16.0f * scale[0];
  }
  static void scales8(const uint8_t* b, __m256i at, __m256* scale, __m256* min) {
    __m256 unused;
    halves8(b, at, scale, &unused);
    *min = _mm256_mul_ps(_mm256_set1_ps(-16.0f), *scale);
  }
};

// Q4_K and Q5_K's scales and minimums: d and dmin times the 6-bit fields.
inline void scales_k4(const uint8_t* b, float* scale, float* min) {
  const float d = half_to_float(b), dmin = half_to_float(b + 2);
  for (int s = 0; s < 8; ++s) {
    int sc, m;
    scale_min_k4(s, b + 4, &sc, &m);
    scale[s] = d * static_cast<float>(sc);
    min[s] = -(dmin * static_cast<float>(m));
  }
}

template <>
struct QuantTraits<kQ4_K> {  // d, dmin, 12 bytes of scales, 128 of nibbles
  static constexpr int64_t kValues = 256, kBytes = 144;
  static constexpr int kSubs = 8, kGroups = 1;
  static constexpr bool kMin = true, kSigned = false;
  static constexpr int kTop = 15;
  static __m256i values(const uint8_t* b, int s) {
    __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 16 + 32 * (s / 2)));
    if (s % 2) q = _mm256_srli_epi16(q, 4);
    return _mm256_and_si256(q, _mm256_set1_epi8(0x0F));
  }
  static void scales(const uint8_t* b, float* scale, float* min) { scales_k4(b, scale, min); }
};

template <>
struct QuantTraits<kQ5_K> {  // d, dmin, 12 bytes of scales, 32 of high bits, 128 of nibbles
  static constexpr int64_t kValues = 256, kBytes = 176;
  static constexpr int kSubs = 8, kGroups = 1;
  static constexpr bool kMin = true, kSigned = false;
  static constexpr int kTop = 31;
  static __m256i values(const uint8_t* b, int s) {
    __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 48 + 32 * (s / 2)));
    if (s % 2) q = _mm256_srli_epi16(q, 4);
    q = _mm256_and_si256(q, _mm256_set1_epi8(0x0F));
    const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 16));
    const __m256i bit = _mm256_and_si256(_mm256_srli_epi16(qh, s), _mm256_set1_epi8(1));
    return _mm256_or_si256(q, _mm256_slli_epi16(bit, 4));
  }
  static void scales(const uint8_t* b, float* scale, float* min) { scales_k4(b, scale, min); }
};

template <>
struct QuantTraits<kQ6_K> {  // 128 bytes low nibbles, 64 of 2-bit highs, 16 int8 scales, d
  static constexpr int64_t kValues = 256, kBytes = 210;
  static constexpr int kSubs = 8, kGroups = 2;
  static constexpr bool kMin = false, kSigned = true;
  static constexpr int kTop = 32;
  static __m256i values(const uint8_t* b, int s) {
    const int half = s / 4, t = s % 4;
    __m256i low =
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 64 * half + 32 * (t % 2)));
    if (t >= 2) low = _mm256_srli_epi16(low, 4);
    low = _mm256_and_si256(low, _mm256_set1_epi8(0x0F));
    const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 128 + 32 * half));
    const __m256i high = _mm256_and_si256(_mm256_srli_epi16(qh, 2 * t), _mm256_set1_epi8(3));
    return _mm256_sub_epi8(_mm256_or_si256(low, _mm256_slli_epi16(high, 4)),
                           _mm256_set1_epi8(32));
  }
  static void scales(const uint8_t* b, float* scale, float*) {  // group 2s + j: scales[2s + j]
    const float d = half_to_float(b + 208);
    const int8_t* q = reinterpret_cast<const int8_t*>(b + 192);
    for (int g = 0; g < 16; ++g) scale[g] = d * static_cast<float>(q[g]);
  }
};

// Whether the kernels run blocks of `type` (a GGML type code).
inline bool quant_type_known(int type) {
  switch (type) {
    case kQ4_0: case kQ4_1: case kQ5_0: case kQ8_0: case kQ4_K: case kQ5_K: case kQ6_K:
      return true;
    default:
      return false;
  }
}

}  // namespace
