// Batch-invariant CPU kernels for one forward step (float32 activations; linear weights and
// the K/V storage in float32 or bfloat16, a bf16 value widened to float32 by a 16-bit shift,
// a K/V value rounded to bf16 as it is stored). One source for
// two instruction sets, chosen at compile time (-march=native): AVX-512 (16 float lanes)
// where the CPU has it, else AVX2 + FMA (8 lanes). The kernels are written once against
// the small vector layer below; the two builds may give different bits from each other.
// A bf16 weight packed in the AMX tiles' pair layout runs on its own kernels, which round
// each linear's input to bf16: AMX tiles where the CPU has AMX-BF16 ("Linear layers on AMX
// tiles"), else AVX512-BF16 dot products ("Linear layers on bf16 dot products").
//
// Every output element is computed by one fixed sequence of IEEE operations that depends
// only on that element's own inputs: never on the number of rows in the call, on a row's
// position, on the other rows, or on the thread count. Reductions run kLanes-lane partial
// sums in index order, then one fixed lane tree (lane_sum); an attention score is one FMA
// chain in head_dim order, or on bf16 K/V one bf16 dot-product chain (see "Attention"
// below). Built with -ffp-contract=off,
// so the only fused multiply-adds are the explicit ones, used identically on every path.
//
// A plain C ABI over raw float32/int64 pointers (loaded with ctypes): no torch headers, so
// the build takes seconds. Callers pass contiguous tensors and allocate the outputs.
#include <cpuid.h>
#include <immintrin.h>
#include <omp.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <mutex>
#include <type_traits>
#include <utility>
#include <vector>

#if defined(__AVX512F__) && defined(__AVX512DQ__) && defined(__AVX512BW__) && \
    defined(__AVX512VL__)
#define DG_AVX512 1
#elif defined(__AVX2__) && defined(__FMA__)
#define DG_AVX512 0
#else
#error "step_cpu.cpp needs AVX-512 (F, DQ, BW, VL) or AVX2 and FMA"
#endif
// AMX-BF16 tiles for AMX-packed bf16 weights, where the compiler targets them (-march=native
// on a CPU with AMX); used only where amx_usable() (see "Linear layers on AMX tiles").
#if DG_AVX512 && defined(__AMX_TILE__) && defined(__AMX_BF16__) && defined(__AVX512BF16__)
#define DG_AMX 1
#else
#define DG_AMX 0
#endif
// AVX512-BF16 dot products (vdpbf16ps) for the same AMX-packed bf16 weights on CPUs without
// usable AMX (see "Linear layers on bf16 dot products").
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

// ---- The kernels, written once against the layer. ---------------------------------------

constexpr int kRowBlock = 64;  // rows whose inputs stay in cache while W streams
constexpr int kKeyBlock = 32;  // keys per online-softmax block (in a row's key order)
// K is stored in tiles of kKeyTile slots, each head's dimensions across the slots:
// [S / kKeyTile][KVH][Dh][kKeyTile] (V stays [S][KVH][Dh]), so that a block's scores read a
// stored tile as it lies, kLanes keys per load.
constexpr int64_t kKeyTile = 16;
constexpr int kBlockTiles = kKeyBlock / kKeyTile;
constexpr int kTileVecs = kKeyTile / kLanes;
static_assert(kKeyBlock % kKeyTile == 0 && kKeyTile % kLanes == 0,
              "a block is whole key tiles, a tile whole vectors");
constexpr int kQueryTile = 64;  // the most rows of one sequence sharing each key block
constexpr int kMinQueryTile = 8;
constexpr int kMaxHeadDim = 256;
constexpr int kMaxChunks = kMaxHeadDim / kLanes;  // vectors per head

// exp(x) for float lanes: x = n ln2 + r, degree-6 polynomial for exp(r), scaled by 2^n.
// Explicit operations only, so the result is a fixed function of x (underflows to 0 for
// x below about -87, so exp(-inf) = 0).
inline Vec vexp(Vec x) {
  x = vmax(vmin(x, set1(88.0f)), set1(-87.0f));
  const Vec n = round_nearest(mul(x, set1(1.44269504088896341f)));
  Vec r = fnmadd(n, set1(0.693359375f), x);
  r = fnmadd(n, set1(-2.12194440e-4f), r);
  Vec p = set1(1.9875691500e-4f);
  p = fmadd(p, r, set1(1.3981999507e-3f));
  p = fmadd(p, r, set1(8.3334519073e-3f));
  p = fmadd(p, r, set1(4.1665795894e-2f));
  p = fmadd(p, r, set1(1.6666665459e-1f));
  p = fmadd(p, r, set1(5.0000001201e-1f));
  p = fmadd(p, mul(r, r), add(r, set1(1.0f)));
  return times_pow2(p, n);
}

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

// Bytes a packed decode row's stream is prefetched ahead (into L2): 256 B-4 KB measured
// alike for bf16 on Zen 4, a whole tile ahead slower (benchmarks/RESULTS.md, "Packed weights").
constexpr int64_t kPackAhead = 512;

// Lines of the next column tile (or group) that a register tile prefetches into L2 while it
// runs, spread evenly over its k steps (`lines` 0: none).
struct Lookahead {
  const char* next;
  int64_t lines;
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
// loop's, in its order for each accumulator, from zero, so the same bits; 0.78-0.95x its
// time from 16 rows on (benchmarks/RESULTS.md, "Session 17"). With Ahead, each block
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
// is 1 KB in a row too (RESULTS.md, "AMX tiles for many rows").
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

// ---- Linear layers on bf16 dot products (AVX512-BF16, CPUs without usable AMX). ---------
//
// The same AMX-packed weight, [M / 16][K / 32][16 pairs of k][16 columns][2]:
// along a column tile's stream, pair i of k is one 64-byte row of 16 columns x 2 values, a
// vector that vdpbf16ps takes as is. One arithmetic path for every row count: the input row
// rounded to bfloat16 (vcvtneps2bf16, as the AMX kernels do), then per 16 output columns one
// chain acc = vdpbf16ps(acc, broadcast(x pair i), B pair i) over i = 0 .. K/2 - 1 in order
// from zero, then + bias[c] in float32. Each lane is one output element: no horizontal sum,
// and nothing in an element's chain depends on the register tile's shape, the other rows,
// the row count or the thread, so rows agree bitwise in any call. (AMX's tdpbf16ps may
// round differently, so the two CPUs' bits may differ, as the two vector builds' do.)
//
// Register tiles of R rows x CT column tiles (R * CT chains in flight, each B vector used R
// times, each broadcast CT times); a thread takes an even share of the column tiles and
// runs every row over one group of CT column tiles before the next, so the group's streams
// are read from memory once and from L2 for the later rows. Rows <= 2 take CT = 8 (enough
// chains to hide vdpbf16ps' latency at 1 row), more rows R = 6 x CT = 4. Above one row tile,
// the tiles of a group also prefetch the next group into L2, so that memory keeps streaming
// while the later row tiles compute (8-32 rows: 0.75-0.89x the time of waiting on memory in
// the first row tile only; RESULTS.md, "Session 19").
#if DG_DOT
// Bytes a first row tile prefetches each stream ahead, into L2: at 1 row, 512 B-1 KB measured
// alike, 256 B slower, and into L1 (T0) 30-50% slower (RESULTS.md, "bf16 dot products").
constexpr int64_t kDotAhead = 1024;
thread_local std::vector<uint16_t> dot_rows;  // the input rows rounded to bf16, per thread

// rows x K floats (K a multiple of 16) rounded to bf16 (round to nearest even) into xb.
inline void dot_round(const float* x, int64_t rows, int64_t K, uint16_t* xb) {
  for (int64_t i = 0; i < rows * K; i += 16) {
    const __m256bh b = _mm512_cvtneps_pbh(_mm512_loadu_ps(x + i));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(xb + i), (__m256i)b);
  }
}

// The pair i of k of a rounded row, broadcast to all 16 lanes.
inline __m512bh dot_pair(const uint16_t* xr, int64_t i) {
  int32_t pair;
  std::memcpy(&pair, xr + 2 * i, sizeof(pair));
  return (__m512bh)_mm512_set1_epi32(pair);
}

// y[r][16 c + j] = chain over k pairs (+ bias) for R rows of xb (K apart) x CT column tiles
// (w: the first one's stream, K * 16 values to the next). With Ahead, each stream's line
// kDotAhead bytes ahead is prefetched (past a stream's end: the next one's start, harmless);
// with Next, the region `after` as well (without, none of that work is compiled in).
template <int R, int CT, bool Ahead, bool Next>
inline void dot_tile(const uint16_t* xb, int64_t K, const uint16_t* w, const float* bias,
                     float* y, int64_t ldy, Lookahead after) {
  const int64_t stride = K * 16, pairs = K / 2;
  __m512 acc[R][CT];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < CT; ++c) acc[r][c] = _mm512_setzero_ps();
  int64_t owed = 0;  // after.lines per pair, in pairs: one line whenever it reaches `pairs`
  for (int64_t i = 0; i < pairs; ++i) {
    if constexpr (Next)
      for (owed += after.lines; owed >= pairs; owed -= pairs, after.next += 64)
        _mm_prefetch(after.next, _MM_HINT_T1);
    __m512bh b[CT];
    for (int c = 0; c < CT; ++c) {
      const uint16_t* p = w + c * stride + i * 32;
      if constexpr (Ahead)
        _mm_prefetch(reinterpret_cast<const char*>(p) + kDotAhead, _MM_HINT_T1);
      b[c] = (__m512bh)_mm512_loadu_si512(p);
    }
    for (int r = 0; r < R; ++r) {
      const __m512bh xv = dot_pair(xb + r * K, i);
      for (int c = 0; c < CT; ++c) acc[r][c] = _mm512_dpbf16_ps(acc[r][c], xv, b[c]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < CT; ++c) {
      __m512 v = acc[r][c];
      if (bias != nullptr) v = _mm512_add_ps(v, _mm512_loadu_ps(bias + 16 * c));
      _mm512_storeu_ps(y + r * ldy + 16 * c, v);
    }
}

// dot_tile over `rows` rows of one group of CT column tiles: R at a time, then the remainder
// in one smaller tile. With Ahead, the first tile prefetches the group's own streams. With
// Next, `next` (the following group's lines) is prefetched over all the tiles in proportion
// to their rows, so that the memory streams it while the group's later row tiles compute.
template <int R, int CT, bool Ahead, bool Next>
inline void dot_cols(const uint16_t* xb, int64_t K, int64_t rows, const uint16_t* w,
                     const float* bias, float* y, int64_t ldy, Lookahead next) {
  const auto share = [&](int64_t r, int64_t n) {  // next's lines for rows r .. r + n - 1
    const int64_t from = next.lines * r / rows, to = next.lines * (r + n) / rows;
    return Lookahead{next.next + 64 * from, to - from};
  };
  int64_t r = 0;
  if (R <= rows) {
    dot_tile<R, CT, Ahead, Next>(xb, K, w, bias, y, ldy, share(0, R));
    r = R;
  }
  for (; r + R <= rows; r += R)
    dot_tile<R, CT, false, Next>(xb + r * K, K, w, bias, y + r * ldy, ldy, share(r, R));
  if constexpr (R > 1)
    if (r < rows) {
      dot_cols<R - 1, CT, Ahead, Next>(xb + r * K, K, rows - r, w, bias, y + r * ldy, ldy,
                                       share(r, rows - r));
    }
}

// dot_cols for a group of ct <= CT column tiles.
template <int R, int CT, bool Ahead, bool Next>
inline void dot_group(int64_t ct, const uint16_t* xb, int64_t K, int64_t rows,
                      const uint16_t* w, const float* bias, float* y, int64_t ldy,
                      Lookahead next) {
  if constexpr (CT > 1)
    if (ct < CT) return dot_group<R, CT - 1, Ahead, Next>(ct, xb, K, rows, w, bias, y, ldy, next);
  dot_cols<R, CT, Ahead, Next>(xb, K, rows, w, bias, y, ldy, next);
}

// y [N, M] = bf16(x) [N, K] @ w.T (+ bias [M] unless null) for an AMX-packed w (M a
// multiple of 16, K of 32): each thread rounds all rows itself (no barrier to share
// them), then runs its share of the column tiles, CT at a time, over all rows.
// One row tile (N <= 6) streams each group's weights as it goes. More rows stream the next
// group while the row tiles run: only a thread's first group waits on memory alone.
// Called by every thread of a team (or outside a parallel region); ends with a barrier.
inline void dot_linear_team(const float* xp, const uint16_t* wp, const float* bp, float* yp,
                            int64_t N, int64_t K, int64_t M) {
  constexpr int R = 6;
  if (static_cast<int64_t>(dot_rows.size()) < N * K) dot_rows.resize(N * K);
  uint16_t* xb = dot_rows.data();
  dot_round(xp, N, K, xb);
  const int64_t tiles = M / 16, team = omp_get_num_threads(), me = omp_get_thread_num();
  const int64_t begin = tiles * me / team, end = tiles * (me + 1) / team, ct = N <= 2 ? 8 : 4;
  for (int64_t t = begin; t < end; t += ct) {
    const uint16_t* w = wp + t * 16 * K;
    const float* b = bp != nullptr ? bp + 16 * t : nullptr;
    const int64_t n = std::min(ct, end - t);  // the next group: up to ct tiles after these
    const Lookahead next{reinterpret_cast<const char*>(w + n * 16 * K),
                         std::min(ct, end - t - n) * 16 * K * 2 / 64};
    if (N <= 2)
      dot_group<2, 8, true, false>(n, xb, K, N, w, b, yp + 16 * t, M, next);
    else if (N <= R)
      dot_group<R, 4, true, false>(n, xb, K, N, w, b, yp + 16 * t, M, next);
    else if (t == begin)
      dot_group<R, 4, true, true>(n, xb, K, N, w, b, yp + 16 * t, M, next);
    else
      dot_group<R, 4, false, true>(n, xb, K, N, w, b, yp + 16 * t, M, next);
  }
#pragma omp barrier
}
#endif

#if DG_DOT
// An AMX-packed bf16 weight's linear layer on AMX tiles where usable, else dot products.
inline void bf16_linear_team(const float* xp, const uint16_t* wp, const float* bp, float* yp,
                             int64_t N, int64_t K, int64_t M) {
#if DG_AMX
  if (amx_usable()) return amx_linear_team(xp, wp, bp, yp, N, K, M);
#endif
  dot_linear_team(xp, wp, bp, yp, N, K, M);
}
#endif

// One row of the row-wise operations (the extern functions and the layer stack loop over
// rows): the same operations on a row wherever it is called from.

// y = w * (x / sqrt(mean(x^2) + eps)) for one row of D floats.
inline void rms_norm_row(const float* xr, const float* wp, float* yr, int64_t D, float eps) {
  Vec acc = zero();
  int64_t d = 0;
  for (; d + kLanes <= D; d += kLanes) {
    const Vec v = load(xr + d);
    acc = fmadd(v, v, acc);
  }
  if (d < D) {
    const Vec v = load_first(xr + d, D - d);
    acc = fmadd(v, v, acc);
  }
  const float scale = 1.0f / std::sqrt(lane_sum(acc) / static_cast<float>(D) + eps);
  for (d = 0; d < D; ++d) yr[d] = wp[d] * (xr[d] * scale);
}

// x as stored in K/V of element type KV: itself, or rounded to bfloat16 bits (to nearest,
// ties to even; NaN to 0x7FC0: torch's conversion).
inline void put(float* p, float x) { *p = x; }
inline void put(uint16_t* p, float x) {
  uint32_t u;
  std::memcpy(&u, &x, sizeof(u));
  *p = (u & 0x7FFFFFFFu) > 0x7F800000u ? uint16_t{0x7FC0}
                                       : static_cast<uint16_t>((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

// Where slot's K lies in one layer's K of kv_width (KVH Dh) values per slot: its head h,
// dimension d at key(...)[(h Dh + d) kKeyTile] (see kKeyTile).
inline int64_t key_offset(int64_t slot, int64_t kv_width) {
  return slot / kKeyTile * kv_width * kKeyTile + slot % kKeyTile;
}

// Rotates the q and k heads of one row of qkv [(H + 2 KVH) * Dh] by its cos/sin [Dh];
// the rotated q to q [H, Dh], the rotated k to k_out (head h, dimension d at
// k_out[(h Dh + d) kKeyTile]: see key_offset) and the v to v_out [KVH, Dh] (of KV's type:
// see put).
template <typename KV>
inline void rope_store_row(const float* row, const float* c, const float* s, KV* k_out,
                           KV* v_out, float* q, int64_t n_heads, int64_t n_kv_heads,
                           int64_t Dh) {
  const int64_t half = Dh / 2;
  const auto rotated = [&](const float* head, int64_t d) {
    const float rolled = head[d < half ? d + half : d - half];
    const float a = head[d] * c[d];
    const float b = rolled * s[d];
    return a + b;
  };
  for (int64_t h = 0; h < n_heads; ++h)
    for (int64_t d = 0; d < Dh; ++d) q[h * Dh + d] = rotated(row + h * Dh, d);
  for (int64_t h = 0; h < n_kv_heads; ++h)
    for (int64_t d = 0; d < Dh; ++d)
      put(k_out + (h * Dh + d) * kKeyTile, rotated(row + (n_heads + h) * Dh, d));
  const float* v = row + (n_heads + n_kv_heads) * Dh;
  for (int64_t i = 0; i < n_kv_heads * Dh; ++i) put(v_out + i, v[i]);
}

// out [F] = silu(gate) * up for one row of gate_up [2 F] (gate first).
inline void silu_mul_row(const float* g, float* out, int64_t F) {
  const float* u = g + F;
  for (int64_t f = 0; f < F; f += kLanes) {  // lane by lane: the same ops on every lane
    const Mask live = first_lanes(std::min<int64_t>(kLanes, F - f));
    const Vec gv = load(g + f, live);
    const Vec silu = div(gv, add(set1(1.0f), vexp(sub(zero(), gv))));
    store(out + f, live, mul(silu, load(u + f, live)));
  }
}

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
// wait on memory (benchmarks/RESULTS.md, "Session 15"). Into L2: asked into L1, a block's
// lines wait on L1's few miss buffers, and 8 decode rows' attention took 1.2-1.35x the time
// ("Session 20").
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
// address again for every line planned (RESULTS.md, "Session 20").
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
  // sequence's K tiles and V rows (0.9x the time at 8 sequences of 1-2 rows: RESULTS.md,
  // "Session 16").
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

template <typename KV>
void rope_store_rows(const float* src, const float* cp, const float* sp, KV* kc, KV* vc,
                     const int64_t* slots, float* qp, int64_t N, int64_t n_heads,
                     int64_t n_kv_heads, int64_t Dh) {
  const int64_t width = (n_heads + 2 * n_kv_heads) * Dh, kv_width = n_kv_heads * Dh;
  for (int64_t n = 0; n < N; ++n)
    rope_store_row(src + n * width, cp + n * Dh, sp + n * Dh, kc + key_offset(slots[n], kv_width),
                   vc + slots[n] * kv_width, qp + n * n_heads * Dh, n_heads, n_kv_heads, Dh);
}

}  // namespace

extern "C" {

// y [N, M] = x [N, K] @ w[M, K].T (+ bias [M] unless null), w float32.
void dg_linear(const float* xp, const float* wp, const float* bp, float* yp, int64_t N, int64_t K,
               int64_t M, int threads) {
  linear(xp, wp, false, bp, yp, N, K, M, threads);
}

// The same with w bfloat16 (raw bits): bitwise what dg_linear gives on w widened to float32.
void dg_linear_bf16(const float* xp, const uint16_t* wp, const float* bp, float* yp, int64_t N,
                    int64_t K, int64_t M, int threads) {
  linear(xp, wp, false, bp, yp, N, K, M, threads);
}

// dg_linear and dg_linear_bf16 on a packed w (see "Linear layers"): bitwise the same y.
void dg_linear_packed(const float* xp, const float* wp, const float* bp, float* yp, int64_t N,
                      int64_t K, int64_t M, int threads) {
  linear(xp, wp, true, bp, yp, N, K, M, threads);
}

void dg_linear_packed_bf16(const float* xp, const uint16_t* wp, const float* bp, float* yp,
                           int64_t N, int64_t K, int64_t M, int threads) {
  linear(xp, wp, true, bp, yp, N, K, M, threads);
}

// Frees the calling thread's OpenMP team (torch's threads too: the process has one OpenMP
// runtime); the thread's next parallel region builds one again.
void dg_release_threads() { omp_pause_resource_all(omp_pause_soft); }

// The kernels that run AMX-packed bf16 weights here (dg_linear_amx and the stack's): 2 AMX
// tiles, 1 AVX512-BF16 dot products (no usable AMX), 0 none (the layout is not used).
int dg_bf16_kernels() {
#if DG_AMX
  if (amx_usable()) return 2;
#endif
  return DG_DOT;
}

#if DG_DOT
// y [N, M] = bf16(x) [N, K] @ w.T (+ bias [M] unless null) for an AMX-packed bf16 w, on the
// kernels dg_bf16_kernels() names; only where it is not 0.
void dg_linear_amx(const float* xp, const uint16_t* wp, const float* bp, float* yp, int64_t N,
                   int64_t K, int64_t M, int threads) {
#pragma omp parallel num_threads(threads)
  bf16_linear_team(xp, wp, bp, yp, N, K, M);
}
#endif

// Root-mean-square norm of each row of x [N, D]: w * (x / sqrt(mean(x^2) + eps)).
void dg_rms_norm(const float* xp, const float* wp, float* yp, int64_t N, int64_t D, float eps) {
  for (int64_t n = 0; n < N; ++n) rms_norm_row(xp + n * D, wp, yp + n * D, D, eps);
}

// Rotates the q and k heads of qkv [N, (H + 2 KVH) * Dh] by cos/sin [N, Dh] (the sign of
// rotate_half folded into sin), writes k and v to slots new_slots of kc [S / kKeyTile, KVH,
// Dh, kKeyTile] (see kKeyTile) and vc [S, KVH, Dh] and the rotated q to qp [N, H, Dh].
void dg_rope_store(const float* src, const float* cp, const float* sp, float* kc, float* vc,
                   const int64_t* slots, float* qp, int64_t N, int64_t n_heads,
                   int64_t n_kv_heads, int64_t Dh) {
  rope_store_rows(src, cp, sp, kc, vc, slots, qp, N, n_heads, n_kv_heads, Dh);
}

// The same into bfloat16 K/V (each value rounded: see put).
void dg_rope_store_bf16(const float* src, const float* cp, const float* sp, uint16_t* kc,
                        uint16_t* vc, const int64_t* slots, float* qp, int64_t N,
                        int64_t n_heads, int64_t n_kv_heads, int64_t Dh) {
  rope_store_rows(src, cp, sp, kc, vc, slots, qp, N, n_heads, n_kv_heads, Dh);
}

// yp [N, F] = silu(gate) * up for gp = gate_up [N, 2 * F] (gate first).
void dg_silu_mul(const float* gp, float* yp, int64_t N, int64_t F) {
  for (int64_t n = 0; n < N; ++n) silu_mul_row(gp + n * 2 * F, yp + n * F, F);
}

// Grouped-query attention of each row over its own key list, in that list's order.
//
// q [N, H, Dh] -> out [N, H, Dh]; kc and vc as dg_rope_store's. Sequence s (of n_seqs) owns rows
// [row_start[s], row_start[s+1]) and keys[key_start[s] : key_start[s+1]] = its context
// slots (ctx_len[s] of them) then its new rows' slots. Row i of s attends to every context
// key, then to new row j when mask[i, j] (masks[mask_start[s] + i * T + j]) or, with
// mask_start[s] < 0, when j <= i. A row's allowed keys, in list order, are cut into blocks
// of kKeyBlock, each folded into an online softmax (see "Attention" above): the same
// operations for that row whatever else the call holds. Rows of one sequence are taken
// in tiles of up to kQueryTile per kv head: a block of the list that several rows of the tile
// allow (a prefix of it for each: the context, and every block under the causal mask) is
// folded into all of them, its keys read from their stored tiles where they fill them in
// order from the first, else gathered once; a masked row's own keys after the context's
// whole blocks are gathered and folded into it alone.
// Needs head_dim <= kMaxHeadDim (checked by the caller).
void dg_attention(const float* qp, const float* kc, const float* vc, const int64_t* kp,
                  const int64_t* ks, const int64_t* rs, const int64_t* cl, const bool* mp,
                  const int64_t* ms, float* op, int64_t N, int64_t n_seqs, int64_t H,
                  int64_t KVH, int64_t Dh, int threads) {
  attention_rows(qp, kc, vc, kp, ks, rs, cl, mp, ms, op, N, n_seqs, H, KVH, Dh, threads);
}

// The same over bfloat16 K/V (raw bits, widened exactly as read).
void dg_attention_bf16(const float* qp, const uint16_t* kc, const uint16_t* vc,
                       const int64_t* kp, const int64_t* ks, const int64_t* rs, const int64_t* cl,
                       const bool* mp, const int64_t* ms, float* op, int64_t N, int64_t n_seqs,
                       int64_t H, int64_t KVH, int64_t Dh, int threads) {
  attention_rows(qp, kc, vc, kp, ks, rs, cl, mp, ms, op, N, n_seqs, H, KVH, Dh, threads);
}

}  // extern "C"

// ---- The layer stack of a step in one call. ---------------------------------------------
//
// dg_stack_step runs what the per-op path (the functions above, called op by op) runs, in
// the same order on the same values, so its logits and K/V are bitwise the same: per layer
// rms_norm, qkv linear (+ bias), rope_store, attention, wo linear + residual, rms_norm, w13
// linear, silu_mul, w2 linear + residual; then the picked rows' final norm and head. The
// weights' addresses sit in a table built once per model; the activations in scratch owned
// by the table, grown to the largest step. One parallel region per layer (from the wo of
// the layer before to the rope of this one) plus attention's own.

namespace {

enum Layout { kRowMajor = 0, kPacked = 1, kAmxPacked = 2 };  // as fused.py's LAYOUT_CODES

struct Matrix {  // a linear layer's weight and its layout (see "Linear layers")
  const void* w;
  int layout;
};

struct LayerWeights {  // float or bfloat16 (uint16_t bits), as the table's `bf16` says
  const void *attn_norm, *bqkv, *ffn_norm;  // bqkv may be null
  Matrix wqkv, wo, w13, w2;
  float attn_eps, ffn_eps;
};

struct Stack {
  int64_t dim, H, KVH, Dh, F, V;
  bool bf16;
  const void* norm;
  Matrix head;
  float norm_eps;
  std::vector<LayerWeights> layers;
  std::vector<float> widened;         // bf16: the norms' and biases' float32 values, per step
  std::vector<const float*> vectors;  // per layer attn_norm, ffn_norm, bqkv; then the norm
  std::vector<float> scratch;         // a step's activations
  std::mutex busy;                    // one step at a time uses the scratch
};

struct StepArgs {
  float* x;  // [N, dim]: the rows' embeddings, then their hidden states
  const float *cos, *sin;  // [N, Dh]
  const int64_t* new_slots;
  int64_t N;
  void *kc, *vc;   // [L] x dg_rope_store's, of the weights' type (float, or bfloat16 bits)
  int64_t n_slots;  // S, a multiple of kKeyTile
  const int64_t *kp, *ks, *rs, *cl;  // the attention plan (see dg_attention)
  const bool* mp;
  const int64_t* ms;
  int64_t n_seqs;
  const int64_t* picked;  // [P]: the rows that get logits
  int64_t P;
  float* logits;  // [P, V]
  int threads;
  double* seconds;  // null, or where the step adds its seconds per kind of kernel
};

enum Kind { kLinearTime, kHeadTime, kAttentionTime, kRowOpsTime };

// Seconds since the last mark added to seconds[kind], by the calling team's first thread.
struct Clock {
  double* seconds;
  double last;
  void mark(Kind kind) {
    if (seconds == nullptr || omp_get_thread_num() != 0) return;
    const double now = omp_get_wtime();
    seconds[kind] += now - last;
    last = now;
  }
};

// Attention of one layer: dg_attention with its arguments (its own parallel region, so it
// is called between the stack's regions, never inside one).
template <typename KV>
void attention(const float* qp, const KV* kc, const KV* vc, const StepArgs& s, float* op,
               int64_t H, int64_t KVH, int64_t Dh) {
  attention_rows(qp, kc, vc, s.kp, s.ks, s.rs, s.cl, s.mp, s.ms, op, s.N, s.n_seqs, H, KVH, Dh,
                 s.threads);
}

// linear_team over a matrix of the table.
template <typename W>
void linear_team(const float* xp, const Matrix& w, const float* bp, float* yp, int64_t N,
                 int64_t K, int64_t M) {
#if DG_DOT
  if constexpr (std::is_same_v<W, uint16_t>)
    if (w.layout == kAmxPacked)
      return bf16_linear_team(xp, static_cast<const W*>(w.w), bp, yp, N, K, M);
#endif
  linear_team(xp, static_cast<const W*>(w.w), w.layout == kPacked, bp, yp, N, K, M);
}

// The float32 values of a parameter vector of n values (a bf16 one widened into out).
template <typename W>
const float* as_float(const void* p, int64_t n, float* out) {
  if constexpr (std::is_same_v<W, float>) {
    return static_cast<const float*>(p);
  } else {
    const uint16_t* bits = static_cast<const uint16_t*>(p);
    for (int64_t i = 0; i < n; ++i) {
      const uint32_t wide = static_cast<uint32_t>(bits[i]) << 16;
      std::memcpy(out + i, &wide, sizeof(float));
    }
    return out;
  }
}

inline void add_row(float* x, const float* t, int64_t D) {  // x + t, as torch's x + t
  for (int64_t d = 0; d < D; ++d) x[d] = x[d] + t[d];
}

// W: the weights' type, and the K/V's (float, or uint16_t for bfloat16 bits).
template <typename W>
void stack_step(Stack& m, const StepArgs& s) {
  W* const kc = static_cast<W*>(s.kc);
  W* const vc = static_cast<W*>(s.vc);
  const int64_t N = s.N, P = s.P, D = m.dim, H = m.H, KVH = m.KVH, Dh = m.Dh, F = m.F;
  const int64_t L = static_cast<int64_t>(m.layers.size());
  const int64_t QKV = (H + 2 * KVH) * Dh, HD = H * Dh, kv_width = KVH * Dh;
  const int64_t layer_kv = s.n_slots * kv_width;
  // the norms and biases as float32, re-read every step (a bf16 one widened)
  int64_t used = 0;
  for (int64_t l = 0; l < L; ++l) {
    const LayerWeights& w = m.layers[l];
    m.vectors[3 * l] = as_float<W>(w.attn_norm, D, m.widened.data() + used);
    m.vectors[3 * l + 1] = as_float<W>(w.ffn_norm, D, m.widened.data() + used + D);
    m.vectors[3 * l + 2] =
        w.bqkv != nullptr ? as_float<W>(w.bqkv, QKV, m.widened.data() + used + 2 * D) : nullptr;
    used += 2 * D + QKV;
  }
  m.vectors[3 * L] = as_float<W>(m.norm, D, m.widened.data() + used);

  const int64_t sizes[] = {N * D, N * QKV, N * HD, N * HD, N * D, N * 2 * F, N * F, P * D, P * D};
  int64_t total = 0;
  for (const int64_t n : sizes) total += n;
  if (static_cast<int64_t>(m.scratch.size()) < total) m.scratch.resize(total);
  float* buffers[9];
  float* next = m.scratch.data();
  for (int i = 0; i < 9; ++i) {
    buffers[i] = next;
    next += sizes[i];
  }
  float *h = buffers[0], *qkv = buffers[1], *q = buffers[2], *att = buffers[3];
  float *tmp = buffers[4], *gate_up = buffers[5], *act = buffers[6];
  float *last = buffers[7], *normed = buffers[8];
  float* x = s.x;
  Clock clock{s.seconds, s.seconds != nullptr ? omp_get_wtime() : 0.0};

  for (int64_t l = 0; l <= L; ++l) {
#pragma omp parallel num_threads(s.threads)
    {
      if (l > 0) {  // the rest of layer l - 1, after its attention
        const LayerWeights& w = m.layers[l - 1];
        linear_team<W>(att, w.wo, nullptr, tmp, N, HD, D);
        clock.mark(kLinearTime);
#pragma omp for schedule(static)
        for (int64_t n = 0; n < N; ++n) {
          add_row(x + n * D, tmp + n * D, D);
          rms_norm_row(x + n * D, m.vectors[3 * (l - 1) + 1], h + n * D, D, w.ffn_eps);
        }
        clock.mark(kRowOpsTime);
        linear_team<W>(h, w.w13, nullptr, gate_up, N, D, 2 * F);
        clock.mark(kLinearTime);
#pragma omp for schedule(static)
        for (int64_t n = 0; n < N; ++n) silu_mul_row(gate_up + n * 2 * F, act + n * F, F);
        clock.mark(kRowOpsTime);
        linear_team<W>(act, w.w2, nullptr, tmp, N, F, D);
        clock.mark(kLinearTime);
      }
      if (l < L) {  // layer l up to its attention
        const LayerWeights& w = m.layers[l];
#pragma omp for schedule(static)
        for (int64_t n = 0; n < N; ++n) {
          if (l > 0) add_row(x + n * D, tmp + n * D, D);
          rms_norm_row(x + n * D, m.vectors[3 * l], h + n * D, D, w.attn_eps);
        }
        clock.mark(kRowOpsTime);
        linear_team<W>(h, w.wqkv, m.vectors[3 * l + 2], qkv, N, D, QKV);
        clock.mark(kLinearTime);
#pragma omp for schedule(static)
        for (int64_t n = 0; n < N; ++n) {  // each row to its own slot (a step's are distinct)
          const int64_t slot = s.new_slots[n], layer = l * layer_kv;
          rope_store_row(qkv + n * QKV, s.cos + n * Dh, s.sin + n * Dh,
                         kc + layer + key_offset(slot, kv_width), vc + layer + slot * kv_width,
                         q + n * HD, H, KVH, Dh);
        }
        clock.mark(kRowOpsTime);
      } else {  // the picked rows' final norm and the head
#pragma omp for schedule(static)
        for (int64_t p = 0; p < P; ++p) {
          const int64_t r = s.picked[p];
          std::memcpy(last + p * D, x + r * D, D * sizeof(float));
          if (L > 0) add_row(last + p * D, tmp + r * D, D);
          rms_norm_row(last + p * D, m.vectors[3 * L], normed + p * D, D, m.norm_eps);
        }
        clock.mark(kRowOpsTime);
        linear_team<W>(normed, m.head, nullptr, s.logits, P, D, m.V);
        clock.mark(kHeadTime);
      }
    }
    if (l < L) {
      attention(q, kc + l * layer_kv, vc + l * layer_kv, s, att, H, KVH, Dh);
      clock.mark(kAttentionTime);
    }
  }
}

}  // namespace

extern "C" {

// A layer stack's table: n_layers layers of dim, n_heads / n_kv_heads heads of head_dim,
// hidden_dim and vocab; weights (float32, or bf16 bits when bf16) = the final norm, the head,
// then per layer attn_norm, wqkv, bqkv (or null), wo, ffn_norm, w13, w2; layouts[i]: the
// Layout of weights[i] (a linear layer's; kAmxPacked only where dg_bf16_kernels); eps = per
// layer attn_norm's, ffn_norm's, then the final norm's. The weights must outlive the table.
void* dg_stack_new(int64_t n_layers, int64_t dim, int64_t n_heads, int64_t n_kv_heads,
                   int64_t head_dim, int64_t hidden_dim, int64_t vocab, int bf16,
                   const void* const* weights, const int* layouts, const float* eps) {
  Stack* m = new Stack();
  m->dim = dim;
  m->H = n_heads;
  m->KVH = n_kv_heads;
  m->Dh = head_dim;
  m->F = hidden_dim;
  m->V = vocab;
  m->bf16 = bf16 != 0;
  m->norm = weights[0];
  m->head = {weights[1], layouts[1]};
  m->norm_eps = eps[2 * n_layers];
  for (int64_t l = 0; l < n_layers; ++l) {
    const void* const* w = weights + 2 + 7 * l;
    const int* p = layouts + 2 + 7 * l;
    m->layers.push_back({w[0], w[2], w[4], {w[1], p[1]}, {w[3], p[3]}, {w[5], p[5]}, {w[6], p[6]},
                         eps[2 * l], eps[2 * l + 1]});
  }
  const int64_t qkv = (n_heads + 2 * n_kv_heads) * head_dim;
  m->widened.resize(n_layers * (2 * dim + qkv) + dim);
  m->vectors.resize(3 * n_layers + 1);
  return m;
}

void dg_stack_free(void* stack) { delete static_cast<Stack*>(stack); }

// One forward step of the stack over N rows (see StepArgs; the attention plan's arrays as
// dg_attention's): writes every row's K/V to its slot in each layer of kc/vc (of the
// weights' type: float32, or bfloat16 bits for a bf16 stack) and the picked rows' logits; x is overwritten. seconds, unless null, gets the step's seconds added per
// kind: linear layers, the head, attention, the row-wise operations.
void dg_stack_step(void* stack, float* x, const float* cos, const float* sin,
                   const int64_t* new_slots, int64_t N, void* kc, void* vc, int64_t n_slots,
                   const int64_t* kp, const int64_t* ks, const int64_t* rs, const int64_t* cl,
                   const bool* mp, const int64_t* ms, int64_t n_seqs, const int64_t* picked,
                   int64_t P, float* logits, int threads, double* seconds) {
  Stack& m = *static_cast<Stack*>(stack);
  const StepArgs s{x,  cos, sin, new_slots, N,  kc,     vc,     n_slots, kp,      ks,     rs,
                   cl, mp,  ms,  n_seqs,    picked, P, logits, threads, seconds};
  const std::lock_guard<std::mutex> hold(m.busy);
  if (m.bf16)
    stack_step<uint16_t>(m, s);
  else
    stack_step<float>(m, s);
}

}  // extern "C"
