// The vector layer of the step kernels: the instruction set chosen at compile time
// (-march=native) and a float vector of kLanes lanes with the operations on it, so that every
// kernel is written once for AVX-512 and AVX2 + FMA.
#pragma once

#include <cpuid.h>
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#if defined(__AVX512F__) && defined(__AVX512DQ__) && defined(__AVX512BW__) && \
    defined(__AVX512VL__)
#define DG_AVX512 1
#elif defined(__AVX2__) && defined(__FMA__)
#define DG_AVX512 0
#else
#error "step_cpu.cpp needs AVX-512 (F, DQ, BW, VL) or AVX2 and FMA"
#endif
// AMX-BF16 tiles for AMX-packed bf16 weights, where the compiler targets them (-march=native
// on a CPU with AMX); used only where amx_usable() (cpu/amx.h).
#if DG_AVX512 && defined(__AMX_TILE__) && defined(__AMX_BF16__) && defined(__AVX512BF16__)
#define DG_AMX 1
#else
#define DG_AMX 0
#endif
// AVX512-BF16 dot products (vdpbf16ps) for the same AMX-packed bf16 weights on CPUs without
// usable AMX (cpu/dot.h).
#if DG_AVX512 && defined(__AVX512BF16__)
#define DG_DOT 1
#else
#define DG_DOT 0
#endif

namespace {

// ---- The vector layer: a float vector of kLanes lanes and the operations on it. --------

#if DG_AVX512
constexpr int kLanes = 16;
using Vec = __m512;
using Mask = __mmask16;  // the live lanes of a partial vector

constexpr int kRowTile = 4;       // rows sharing one pass over a weight tile
constexpr int kColTile = 4;       // output columns per register tile
constexpr int kWideColTile = 16;  // output columns per register tile of a single row
constexpr int kScoreTile = 8;     // query vectors per register tile of attention scores
constexpr int kValueRegs = 28;    // registers for a register tile of attention outputs

inline Mask first_lanes(int64_t n) { return static_cast<Mask>((1u << n) - 1u); }
inline Vec zero() { return _mm512_setzero_ps(); }
inline Vec set1(float x) { return _mm512_set1_ps(x); }
inline Vec add(Vec a, Vec b) { return _mm512_add_ps(a, b); }
inline Vec sub(Vec a, Vec b) { return _mm512_sub_ps(a, b); }
inline Vec mul(Vec a, Vec b) { return _mm512_mul_ps(a, b); }
inline Vec div(Vec a, Vec b) { return _mm512_div_ps(a, b); }
inline Vec vmin(Vec a, Vec b) { return _mm512_min_ps(a, b); }
inline Vec vmax(Vec a, Vec b) { return _mm512_max_ps(a, b); }
inline Vec fmadd(Vec a, Vec b, Vec c) { return _mm512_fmadd_ps(a, b, c); }    // a b + c
inline Vec fnmadd(Vec a, Vec b, Vec c) { return _mm512_fnmadd_ps(a, b, c); }  // c - a b
inline float first(Vec v) { return _mm512_cvtss_f32(v); }

inline void in_register(Vec&) {}  // 32 registers: the compiler's own allocation suffices

inline Vec load(const float* p) { return _mm512_loadu_ps(p); }
inline Vec load(const float* p, Mask m) { return _mm512_maskz_loadu_ps(m, p); }  // others 0
inline void store(float* p, Vec v) { _mm512_storeu_ps(p, v); }
inline void store(float* p, Mask m, Vec v) { _mm512_mask_storeu_ps(p, m, v); }

// 16 bfloat16 values (raw uint16) widened exactly to float32.
inline Vec widen(__m256i bits) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(bits), 16));
}
inline Vec load(const uint16_t* p) {
  return widen(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}
inline Vec load_first(const uint16_t* p, int64_t n) {
  return widen(_mm256_maskz_loadu_epi16(first_lanes(n), p));
}

// max(top, v) in the lanes of m, top elsewhere; the largest lane (max is exact, any order).
inline Vec max_masked(Vec top, Mask m, Vec v) { return _mm512_mask_max_ps(top, m, top, v); }
inline float max_lane(Vec v) { return _mm512_reduce_max_ps(v); }
inline Vec keep(Mask m, Vec v) { return _mm512_maskz_mov_ps(m, v); }  // v in m, else 0

inline Vec round_nearest(Vec x) {
  return _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}
inline Vec times_pow2(Vec p, Vec n) { return _mm512_scalef_ps(p, n); }  // p 2^n, n integral

// Sum of the 16 lanes in one fixed order: halves, quarters, pairs, then the last pair.
inline float lane_sum(Vec v) {
  const __m256 upper = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1));
  __m256 a = _mm256_add_ps(_mm512_castps512_ps256(v), upper);
  __m128 b = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
  __m128 c = _mm_add_ps(b, _mm_movehl_ps(b, b));
  __m128 d = _mm_add_ss(c, _mm_movehdup_ps(c));
  return _mm_cvtss_f32(d);
}

// Lane j of the result = lane_sum(v[j]) bitwise: the same additions on the same operands
// (each step pairs two vectors' halves with shuffles, then adds them), 2.8 operations per
// sum instead of 7.
inline Vec lane_sums(const Vec v[kLanes]) {
  __m512 a[8], b[4], c[2];
  for (int j = 0; j < 8; ++j)  // i + (i + 8): lanes 8m..8m+7 from v[2j + m]
    a[j] = _mm512_add_ps(_mm512_shuffle_f32x4(v[2 * j], v[2 * j + 1], 0x44),
                         _mm512_shuffle_f32x4(v[2 * j], v[2 * j + 1], 0xEE));
  for (int m = 0; m < 4; ++m)  // i + (i + 4): 128-bit lane L from v[4m + L]
    b[m] = _mm512_add_ps(_mm512_shuffle_f32x4(a[2 * m], a[2 * m + 1], 0x88),
                         _mm512_shuffle_f32x4(a[2 * m], a[2 * m + 1], 0xDD));
  for (int n = 0; n < 2; ++n) {  // i + (i + 2)
    const __m512d p = _mm512_castps_pd(b[2 * n]), q = _mm512_castps_pd(b[2 * n + 1]);
    c[n] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(p, q)),
                         _mm512_castpd_ps(_mm512_unpackhi_pd(p, q)));
  }
  // i + (i + 1): lane 4L + t holds the sum of v[4t + L]
  const __m512 d = _mm512_add_ps(_mm512_shuffle_ps(c[0], c[1], _MM_SHUFFLE(2, 0, 2, 0)),
                                 _mm512_shuffle_ps(c[0], c[1], _MM_SHUFFLE(3, 1, 3, 1)));
  const __m512i order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
  return _mm512_permutexvar_ps(order, d);
}

#else  // AVX2 + FMA: 16 ymm registers, so smaller register tiles
constexpr int kLanes = 8;
using Vec = __m256;
using Mask = __m256i;  // the live lanes of a partial vector: all ones, else zero

constexpr int kRowTile = 3;      // 3 x 4 accumulators + 3 rows + 1 weight = 16 registers
constexpr int kColTile = 4;
constexpr int kWideColTile = 8;
constexpr int kScoreTile = 2;    // 2 x 4 accumulators + 4 keys + 1 query = 13 registers
constexpr int kValueRegs = 14;

inline Mask first_lanes(int64_t n) {
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(n)),
                            _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}
inline Vec zero() { return _mm256_setzero_ps(); }
inline Vec set1(float x) { return _mm256_set1_ps(x); }
inline Vec add(Vec a, Vec b) { return _mm256_add_ps(a, b); }
inline Vec sub(Vec a, Vec b) { return _mm256_sub_ps(a, b); }
inline Vec mul(Vec a, Vec b) { return _mm256_mul_ps(a, b); }
inline Vec div(Vec a, Vec b) { return _mm256_div_ps(a, b); }
inline Vec vmin(Vec a, Vec b) { return _mm256_min_ps(a, b); }
inline Vec vmax(Vec a, Vec b) { return _mm256_max_ps(a, b); }
inline Vec fmadd(Vec a, Vec b, Vec c) { return _mm256_fmadd_ps(a, b, c); }    // a b + c
inline Vec fnmadd(Vec a, Vec b, Vec c) { return _mm256_fnmadd_ps(a, b, c); }  // c - a b
inline float first(Vec v) { return _mm256_cvtss_f32(v); }

// Keeps v in a register: a vector used by several FMAs is loaded once, not folded into each
// of them as a memory operand (GCC's choice, which makes a 3 x 4 tile load-bound).
inline void in_register(Vec& v) { __asm__("" : "+x"(v)); }

inline Vec load(const float* p) { return _mm256_loadu_ps(p); }
// masked lanes read as 0 and are never touched in memory (no fault past the end)
inline Vec load(const float* p, Mask m) { return _mm256_maskload_ps(p, m); }
inline void store(float* p, Vec v) { _mm256_storeu_ps(p, v); }
inline void store(float* p, Mask m, Vec v) { _mm256_maskstore_ps(p, m, v); }

// 8 bfloat16 values (raw uint16) widened exactly to float32.
inline Vec widen(__m128i bits) {
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(bits), 16));
}
inline Vec load(const uint16_t* p) {
  return widen(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}
inline Vec load_first(const uint16_t* p, int64_t n) {  // no 16-bit masked load in AVX2
  alignas(16) uint16_t part[kLanes] = {};
  std::memcpy(part, p, static_cast<size_t>(n) * sizeof(uint16_t));
  return widen(_mm_load_si128(reinterpret_cast<const __m128i*>(part)));
}

// max(top, v) in the lanes of m, top elsewhere; the largest lane (max is exact, any order).
inline Vec max_masked(Vec top, Mask m, Vec v) {
  return _mm256_blendv_ps(top, _mm256_max_ps(top, v), _mm256_castsi256_ps(m));
}
inline float max_lane(Vec v) {
  __m128 a = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  a = _mm_max_ps(a, _mm_movehl_ps(a, a));
  return _mm_cvtss_f32(_mm_max_ss(a, _mm_movehdup_ps(a)));
}
inline Vec keep(Mask m, Vec v) { return _mm256_and_ps(v, _mm256_castsi256_ps(m)); }

inline Vec round_nearest(Vec x) {
  return _mm256_round_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}
// p 2^n for integral n in [-126, 127]: 2^n built exactly from its exponent bits
inline Vec times_pow2(Vec p, Vec n) {
  const __m256i e = _mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127));
  return _mm256_mul_ps(p, _mm256_castsi256_ps(_mm256_slli_epi32(e, 23)));
}

// Sum of the 8 lanes in one fixed order: halves, pairs, then the last pair.
inline float lane_sum(Vec v) {
  __m128 b = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  __m128 c = _mm_add_ps(b, _mm_movehl_ps(b, b));
  __m128 d = _mm_add_ss(c, _mm_movehdup_ps(c));
  return _mm_cvtss_f32(d);
}

// Lane j of the result = lane_sum(v[j]) bitwise: the same additions on the same operands
// (each step pairs two vectors' halves with shuffles, then adds them).
inline Vec lane_sums(const Vec v[kLanes]) {
  __m256 a[4], c[2];
  for (int j = 0; j < 4; ++j)  // i + (i + 4): 128-bit lane m from v[2j + m]
    a[j] = _mm256_add_ps(_mm256_permute2f128_ps(v[2 * j], v[2 * j + 1], 0x20),
                         _mm256_permute2f128_ps(v[2 * j], v[2 * j + 1], 0x31));
  for (int n = 0; n < 2; ++n) {  // i + (i + 2): lane L, pairs of v[4n + L], v[4n + 2 + L]
    const __m256d p = _mm256_castps_pd(a[2 * n]), q = _mm256_castps_pd(a[2 * n + 1]);
    c[n] = _mm256_add_ps(_mm256_castpd_ps(_mm256_unpacklo_pd(p, q)),
                         _mm256_castpd_ps(_mm256_unpackhi_pd(p, q)));
  }
  // i + (i + 1): lane 4L + t holds the sum of v[2t + L]
  const __m256 d = _mm256_add_ps(_mm256_shuffle_ps(c[0], c[1], _MM_SHUFFLE(2, 0, 2, 0)),
                                 _mm256_shuffle_ps(c[0], c[1], _MM_SHUFFLE(3, 1, 3, 1)));
  return _mm256_permutevar8x32_ps(d, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}
#endif

inline Vec load_first(const float* p, int64_t n) { return load(p, first_lanes(n)); }

}  // namespace
