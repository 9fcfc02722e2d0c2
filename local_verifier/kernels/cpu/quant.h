// Linear layers on GGUF quantized weights, applied as they lie in the file: row-major rows
// of blocks (Q4_0, Q4_1, Q5_0, Q8_0: 32 values per block; Q4_K, Q5_K, Q6_K: 256).
#pragma once

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "simd.h"

namespace {

// ---- Quantized linear layers. ---------------------------------------------------------------
//
// y[n][m] = sum over k of w[m][k] x[n][k], with x quantized per block of 32 values to int8
// (llama.cpp's Q8_0 activations: d = max|x| / 127, q = round-to-nearest-even(x / d), the sum
// of q kept as d * sum q for the types with a minimum) and each weight sub-block of 32 values
// decoded in registers to 32 uint8 (Q4_0, Q4_1, Q5_0, Q4_K, Q5_K: Q4_0's and Q5_0's offsets
// of -8 and -16 become minimum terms) or int8 (Q8_0, Q6_K). Per sub-block the 32 products are
// summed exactly in integers (4 consecutive products per int32 lane: vpdpbusd where the CPU
// has AVX512-VNNI, else vpmaddubsw + vpmaddwd, the same lane sums; int8 weights through
// their magnitudes and x's sign flipped by theirs), the 8 lanes widened exactly to float and
// folded into a float accumulator by one FMA with the sub-block's scale (lane-wise for Q6_K's
// 16-value scales); a minimum term adds into a float sum; the accumulators, one fixed lane
// tree, the minimum sums, the bias. An output is thus one fixed sequence of operations on
// its own row and column: the same bits for any row count, row tile and thread count.

// The GGML type codes of the types run here (dg_linear_quant's `type`).
enum QuantType { kQ4_0 = 2, kQ4_1 = 3, kQ5_0 = 6, kQ8_0 = 8, kQ4_K = 12, kQ5_K = 13, kQ6_K = 14 };
constexpr int64_t kQBlock = 32;  // values per activation block and per weight sub-block

inline float half_to_float(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return _cvtsh_ss(h);
}

// A decoded weight sub-block: 32 int8 values, the float scale of each int32 lane (4 values
// per lane), and its minimum's float factor (0 where the type has none).
struct SubBlock {
  __m256i q;
  __m256 scale;
  float min;
};

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

template <int T>
struct QuantTraits;

template <>
struct QuantTraits<kQ8_0> {
  static constexpr int64_t kValues = 32, kBytes = 34;
  static constexpr bool kMin = false, kUnsigned = false;
  static SubBlock decode(const uint8_t* b, int) {
    return {_mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 2)),
            _mm256_set1_ps(half_to_float(b)), 0.0f};
  }
};

template <>
struct QuantTraits<kQ4_0> {  // d (q - 8): the offset as a minimum of -8 d
  static constexpr int64_t kValues = 32, kBytes = 18;
  static constexpr bool kMin = true, kUnsigned = true;
  static SubBlock decode(const uint8_t* b, int) {
    const float d = half_to_float(b);
    return {low_nibbles(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 2))),
            _mm256_set1_ps(d), -8.0f * d};
  }
};

template <>
struct QuantTraits<kQ4_1> {
  static constexpr int64_t kValues = 32, kBytes = 20;
  static constexpr bool kMin = true, kUnsigned = true;
  static SubBlock decode(const uint8_t* b, int) {
    return {low_nibbles(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 4))),
            _mm256_set1_ps(half_to_float(b)), half_to_float(b + 2)};
  }
};

template <>
struct QuantTraits<kQ5_0> {  // d ((nibble | high bit << 4) - 16): the offset a minimum
  static constexpr int64_t kValues = 32, kBytes = 22;
  static constexpr bool kMin = true, kUnsigned = true;
  static SubBlock decode(const uint8_t* b, int) {
    const float d = half_to_float(b);
    const __m256i q = low_nibbles(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 6)));
    const __m256i high = _mm256_and_si256(bits_to_bytes(b + 2), _mm256_set1_epi8(16));
    return {_mm256_or_si256(q, high), _mm256_set1_ps(d), -16.0f * d};
  }
};

template <>
struct QuantTraits<kQ4_K> {  // d, dmin, 12 bytes of scales, 128 of nibbles
  static constexpr int64_t kValues = 256, kBytes = 144;
  static constexpr bool kMin = true, kUnsigned = true;
  static SubBlock decode(const uint8_t* b, int s) {
    int scale, min;
    scale_min_k4(s, b + 4, &scale, &min);
    __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 16 + 32 * (s / 2)));
    if (s % 2) q = _mm256_srli_epi16(q, 4);
    return {_mm256_and_si256(q, _mm256_set1_epi8(0x0F)),
            _mm256_set1_ps(half_to_float(b) * static_cast<float>(scale)),
            -(half_to_float(b + 2) * static_cast<float>(min))};
  }
};

template <>
struct QuantTraits<kQ5_K> {  // d, dmin, 12 bytes of scales, 32 of high bits, 128 of nibbles
  static constexpr int64_t kValues = 256, kBytes = 176;
  static constexpr bool kMin = true, kUnsigned = true;
  static SubBlock decode(const uint8_t* b, int s) {
    int scale, min;
    scale_min_k4(s, b + 4, &scale, &min);
    __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 48 + 32 * (s / 2)));
    if (s % 2) q = _mm256_srli_epi16(q, 4);
    q = _mm256_and_si256(q, _mm256_set1_epi8(0x0F));
    const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 16));
    const __m256i bit = _mm256_and_si256(_mm256_srli_epi16(qh, s), _mm256_set1_epi8(1));
    return {_mm256_or_si256(q, _mm256_slli_epi16(bit, 4)),
            _mm256_set1_ps(half_to_float(b) * static_cast<float>(scale)),
            -(half_to_float(b + 2) * static_cast<float>(min))};
  }
};

template <>
struct QuantTraits<kQ6_K> {  // 128 bytes low nibbles, 64 of 2-bit highs, 16 int8 scales, d
  static constexpr int64_t kValues = 256, kBytes = 210;
  static constexpr bool kMin = false, kUnsigned = false;
  static SubBlock decode(const uint8_t* b, int s) {
    const int half = s / 4, t = s % 4;
    __m256i low =
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 64 * half + 32 * (t % 2)));
    if (t >= 2) low = _mm256_srli_epi16(low, 4);
    low = _mm256_and_si256(low, _mm256_set1_epi8(0x0F));
    const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 128 + 32 * half));
    const __m256i high = _mm256_and_si256(_mm256_srli_epi16(qh, 2 * t), _mm256_set1_epi8(3));
    const __m256i q = _mm256_sub_epi8(_mm256_or_si256(low, _mm256_slli_epi16(high, 4)),
                                      _mm256_set1_epi8(32));
    const int8_t* scales = reinterpret_cast<const int8_t*>(b + 192 + 8 * half + 2 * t);
    const float d = half_to_float(b + 208);
    const float first = d * static_cast<float>(scales[0]), second = d * static_cast<float>(scales[1]);
    return {q, _mm256_set_ps(second, second, second, second, first, first, first, first), 0.0f};
  }
};

// Lane i: the exact sum of products 4i..4i+3 of w (uint8 values 0-63) and x (int8).
inline __m256i dot_unsigned(__m256i w, __m256i x) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
  return _mm256_dpbusd_epi32(_mm256_setzero_si256(), w, x);
#else  // |pair sum| <= 2 * 63 * 128: no saturation
  return _mm256_madd_epi16(_mm256_maddubs_epi16(w, x), _mm256_set1_epi16(1));
#endif
}

// Lane i: the exact sum of products 4i..4i+3 of two int8 vectors.
inline __m256i dot_lanes(__m256i w, __m256i x) {
  const __m256i magnitude = _mm256_sign_epi8(w, w);  // |w| as uint8 (-128 -> 128)
  const __m256i signed_x = _mm256_sign_epi8(x, w);
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
  return _mm256_dpbusd_epi32(_mm256_setzero_si256(), magnitude, signed_x);
#else  // |pair sum| <= 2 * 128 * 127: no saturation
  return _mm256_madd_epi16(_mm256_maddubs_epi16(magnitude, signed_x), _mm256_set1_epi16(1));
#endif
}

inline float sum8(__m256 v) {  // one fixed tree
  const __m128 four = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 two = _mm_add_ps(four, _mm_movehl_ps(four, four));
  return _mm_cvtss_f32(_mm_add_ss(two, _mm_movehdup_ps(two)));
}

// Activations quantized per block of kQBlock: q [N, K], d and sums (d * sum q) [N, K / 32].
struct QuantRows {
  std::vector<int8_t> q;
  std::vector<float> d, sums;
  void fit(int64_t N, int64_t K) {
    if (static_cast<int64_t>(q.size()) < N * K) {
      q.resize(N * K);
      d.resize(N * K / kQBlock);
      sums.resize(N * K / kQBlock);
    }
  }
};

inline void quantize_row(const float* x, int64_t K, int8_t* q, float* d, float* sums) {
  for (int64_t b = 0; b < K / kQBlock; ++b) {
    const float* v = x + b * kQBlock;
    float top = 0.0f;
    for (int i = 0; i < kQBlock; ++i) top = std::max(top, std::fabs(v[i]));
    const float scale = top / 127.0f, inverse = scale != 0.0f ? 1.0f / scale : 0.0f;
    int total = 0;
    for (int i = 0; i < kQBlock; ++i) {
      const int value = static_cast<int>(std::nearbyint(v[i] * inverse));
      q[b * kQBlock + i] = static_cast<int8_t>(value);
      total += value;
    }
    d[b] = scale;
    sums[b] = scale * static_cast<float>(total);
  }
}

// Float accumulators per output: sub-block s folds into accumulator s % kQuantAccs (each
// sub-block's FMA then waits on the one kQuantAccs before it, not on the last one).
constexpr int kQuantAccs = DG_AVX512 ? 4 : 2;

// R outputs of one weight row (nb blocks at w) against R quantized activation rows (rows
// K apart, their blocks' d and sums K / 32 apart): the sub-block's decode shared, each
// output's own operations the same as for R = 1.
template <int T, int R>
inline void quant_dot(const uint8_t* w, int64_t nb, const int8_t* xq, const float* xd,
                      const float* xs, int64_t K, const float* bias, float* y, int64_t ldy) {
  using Q = QuantTraits<T>;
  constexpr int kSubs = static_cast<int>(Q::kValues / kQBlock);
  static_assert(kSubs == 1 || kSubs % kQuantAccs == 0, "a block's sub-blocks fill the accumulators");
  const int64_t ldb = K / kQBlock;
  __m256 acc[R][kQuantAccs];
  float mins[R][kQuantAccs];
  for (int r = 0; r < R; ++r)
    for (int a = 0; a < kQuantAccs; ++a) {
      acc[r][a] = _mm256_setzero_ps();
      mins[r][a] = 0.0f;
    }
  // sub-block `at` into accumulator A = at % kQuantAccs (A a constant: registers, not memory)
  auto fold = [&](int64_t at, auto accumulator) {
    constexpr int A = decltype(accumulator)::value;
    const SubBlock sub = Q::decode(w + at / kSubs * Q::kBytes, static_cast<int>(at % kSubs));
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const __m256i xv =
          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq + r * K + at * kQBlock));
      const __m256i lanes = Q::kUnsigned ? dot_unsigned(sub.q, xv) : dot_lanes(sub.q, xv);
      const __m256 sums = _mm256_cvtepi32_ps(lanes);
      const __m256 scale = _mm256_mul_ps(sub.scale, _mm256_set1_ps(xd[r * ldb + at]));
      acc[r][A] = _mm256_fmadd_ps(scale, sums, acc[r][A]);
      if constexpr (Q::kMin) mins[r][A] = mins[r][A] + sub.min * xs[r * ldb + at];
    }
  };
  using First = std::integral_constant<int, 0>;
  using Second = std::integral_constant<int, 1>;
  using Third = std::integral_constant<int, 2 % kQuantAccs>;
  using Fourth = std::integral_constant<int, 3 % kQuantAccs>;
  const int64_t subs = nb * kSubs;
  int64_t at = 0;
  for (; at + kQuantAccs <= subs; at += kQuantAccs) {
    fold(at, First{});
    fold(at + 1, Second{});
    if constexpr (kQuantAccs == 4) {
      fold(at + 2, Third{});
      fold(at + 3, Fourth{});
    }
  }
  if (at < subs) fold(at, First{});  // the last whole group's remainder (32-value blocks)
  if (at + 1 < subs) fold(at + 1, Second{});
  if (at + 2 < subs) fold(at + 2, Third{});
  for (int r = 0; r < R; ++r) {
    __m256 total = acc[r][0];
    float min = mins[r][0];
    for (int a = 1; a < kQuantAccs; ++a) {
      total = _mm256_add_ps(total, acc[r][a]);
      min = min + mins[r][a];
    }
    const float s = sum8(total) + min;
    y[r * ldy] = bias != nullptr ? s + bias[0] : s;
  }
}

constexpr int kQuantRowTile = 4;       // activation rows sharing one decode of a sub-block
constexpr int64_t kQuantColTile = 16;  // output columns per thread's unit of work
constexpr int64_t kQuantRowBlock = 64;  // activation rows whose blocks stay in cache

// y [N, M] = x [N, K] @ w.T (+ bias) for w [M, K / values per block] blocks of type T; the
// calling team quantizes x into `rows` (grown beforehand by the caller: fit), then shares
// tiles of kQuantColTile output columns, an even run per thread. Ends with a barrier.
template <int T>
void quant_linear_team_of(const float* x, const uint8_t* w, const float* bias, float* y,
                          int64_t N, int64_t K, int64_t M, QuantRows& rows) {
  using Q = QuantTraits<T>;
  const int64_t ldb = K / kQBlock, nb = K / Q::kValues, row_bytes = nb * Q::kBytes;
  int8_t* xq = rows.q.data();
  float *xd = rows.d.data(), *xs = rows.sums.data();
#pragma omp for schedule(static)
  for (int64_t n = 0; n < N; ++n)
    quantize_row(x + n * K, K, xq + n * K, xd + n * ldb, xs + n * ldb);
  const int64_t tiles = (M + kQuantColTile - 1) / kQuantColTile;
  const int64_t team = omp_get_num_threads(), me = omp_get_thread_num();
  for (int64_t t = tiles * me / team; t < tiles * (me + 1) / team; ++t) {
    const int64_t m0 = t * kQuantColTile, m1 = std::min(M, m0 + kQuantColTile);
    for (int64_t n = 0; n < N; n += kQuantRowBlock) {
      const int64_t n1 = std::min(N, n + kQuantRowBlock);
      for (int64_t m = m0; m < m1; ++m) {
        const uint8_t* wm = w + m * row_bytes;
        const float* b = bias != nullptr ? bias + m : nullptr;
        int64_t r = n;
        for (; r + kQuantRowTile <= n1; r += kQuantRowTile)
          quant_dot<T, kQuantRowTile>(wm, nb, xq + r * K, xd + r * ldb, xs + r * ldb, K, b,
                                      y + r * M + m, M);
        for (; r < n1; ++r)
          quant_dot<T, 1>(wm, nb, xq + r * K, xd + r * ldb, xs + r * ldb, K, b, y + r * M + m, M);
      }
    }
  }
#pragma omp barrier
}

// Whether dg_linear_quant runs blocks of `type` (a GGML type code).
inline bool quant_type_known(int type) {
  switch (type) {
    case kQ4_0: case kQ4_1: case kQ5_0: case kQ8_0: case kQ4_K: case kQ5_K: case kQ6_K:
      return true;
    default:
      return false;
  }
}

// quant_linear_team_of for a GGML type code (quant_type_known), K a multiple of its block.
inline void quant_linear_team(int type, const float* x, const uint8_t* w, const float* bias,
                              float* y, int64_t N, int64_t K, int64_t M, QuantRows& rows) {
  switch (type) {
    case kQ4_0: return quant_linear_team_of<kQ4_0>(x, w, bias, y, N, K, M, rows);
    case kQ4_1: return quant_linear_team_of<kQ4_1>(x, w, bias, y, N, K, M, rows);
    case kQ5_0: return quant_linear_team_of<kQ5_0>(x, w, bias, y, N, K, M, rows);
    case kQ8_0: return quant_linear_team_of<kQ8_0>(x, w, bias, y, N, K, M, rows);
    case kQ4_K: return quant_linear_team_of<kQ4_K>(x, w, bias, y, N, K, M, rows);
    case kQ5_K: return quant_linear_team_of<kQ5_K>(x, w, bias, y, N, K, M, rows);
    case kQ6_K: return quant_linear_team_of<kQ6_K>(x, w, bias, y, N, K, M, rows);
    default: return;
  }
}

}  // namespace
