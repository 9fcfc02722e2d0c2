// The alternative to cpu/quant.h's integer products that bench_quant.py measures it against:
// the same blocks decoded in registers to float32 (w = scale * q + min) and multiplied with
// the float32 activations by FMA, 8 lanes x 4 accumulators per output, sub-blocks in k order.
// Built with the step's flags; the step's own cpu/quant_blocks.h supplies the decoders.
#include "../../local_verifier/kernels/cpu/quant_blocks.h"

namespace {

inline float sum8(__m256 v) {  // one fixed tree
  const __m128 four = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 two = _mm_add_ps(four, _mm_movehl_ps(four, four));
  return _mm_cvtss_f32(_mm_add_ss(two, _mm_movehdup_ps(two)));
}

template <int T, int R>
void f32_dot(const uint8_t* w, int64_t nb, const float* x, int64_t K, float* y, int64_t ldy) {
  using Q = QuantTraits<T>;
  __m256 acc[R][4];
  for (int r = 0; r < R; ++r)
    for (int i = 0; i < 4; ++i) acc[r][i] = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb; ++b, w += Q::kBytes) {
    float scale[Q::kSubs * Q::kGroups], min[Q::kSubs] = {};
    Q::scales(w, scale, min);
    for (int s = 0; s < Q::kSubs; ++s) {
      const __m256i q = Q::values(w, s);
      const __m256 lo = _mm256_set1_ps(scale[s * Q::kGroups]);
      const __m256 hi = _mm256_set1_ps(scale[s * Q::kGroups + Q::kGroups - 1]);
      const __m256 m = _mm256_set1_ps(Q::kMin ? min[s] : 0.0f);
      __m256 wv[4];
      for (int i = 0; i < 4; ++i) {
        const __m128i bytes = i < 2 ? _mm256_castsi256_si128(q) : _mm256_extracti128_si256(q, 1);
        const __m128i eight = i % 2 ? _mm_srli_si128(bytes, 8) : bytes;
        const __m256 v = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(eight));
        wv[i] = _mm256_fmadd_ps(v, i < 2 ? lo : hi, m);
      }
      const int64_t k = (b * Q::kSubs + s) * kQBlock;
      for (int r = 0; r < R; ++r)
        for (int i = 0; i < 4; ++i)
          acc[r][i] = _mm256_fmadd_ps(wv[i], _mm256_loadu_ps(x + r * K + k + 8 * i), acc[r][i]);
    }
  }
  for (int r = 0; r < R; ++r)
    y[r * ldy] = sum8(_mm256_add_ps(_mm256_add_ps(acc[r][0], acc[r][1]),
                                    _mm256_add_ps(acc[r][2], acc[r][3])));
}

template <int T>
void f32_linear(const float* x, const uint8_t* w, float* y, int64_t N, int64_t K, int64_t M,
                int threads) {
  using Q = QuantTraits<T>;
  const int64_t nb = K / Q::kValues, row_bytes = nb * Q::kBytes;
#pragma omp parallel for num_threads(threads) schedule(static)
  for (int64_t m = 0; m < M; ++m) {
    int64_t r = 0;
    for (; r + 4 <= N; r += 4) f32_dot<T, 4>(w + m * row_bytes, nb, x + r * K, K, y + r * M + m, M);
    for (; r < N; ++r) f32_dot<T, 1>(w + m * row_bytes, nb, x + r * K, K, y + r * M + m, M);
  }
}

}  // namespace

extern "C" int dg_linear_quant_f32(const float* x, const uint8_t* w, float* y, int64_t N,
                                   int64_t K, int64_t M, int type, int threads) {
  switch (type) {
    case kQ4_0: f32_linear<kQ4_0>(x, w, y, N, K, M, threads); return 0;
    case kQ4_1: f32_linear<kQ4_1>(x, w, y, N, K, M, threads); return 0;
    case kQ5_0: f32_linear<kQ5_0>(x, w, y, N, K, M, threads); return 0;
    case kQ8_0: f32_linear<kQ8_0>(x, w, y, N, K, M, threads); return 0;
    case kQ4_K: f32_linear<kQ4_K>(x, w, y, N, K, M, threads); return 0;
    case kQ5_K: f32_linear<kQ5_K>(x, w, y, N, K, M, threads); return 0;
    case kQ6_K: f32_linear<kQ6_K>(x, w, y, N, K, M, threads); return 0;
    default: return -1;
  }
}
