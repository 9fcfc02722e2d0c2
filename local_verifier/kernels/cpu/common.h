// What several kernels share: the K storage's tile layout, exp on vectors, and the
// row-wise operations (one row at a time, the same operations wherever they are called).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "simd.h"

namespace {

// K is stored in tiles of kKeyTile slots, each head's dimensions across the slots:
// [S / kKeyTile][KVH][Dh][kKeyTile] (V stays [S][KVH][Dh]), so that a block's scores read a
// stored tile as it lies, kLanes keys per load.
constexpr int64_t kKeyTile = 16;

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
