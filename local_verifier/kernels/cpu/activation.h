// The gated activations of the MLP, one row at a time (the same operations on a row wherever
// it is called from): SwiGLU and GeGLU with the tanh-approximated GELU.
#pragma once

#include <algorithm>
#include <cstdint>

#include "common.h"
#include "simd.h"

namespace {

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

// out [F] = gelu_tanh(gate) * up for one row of gate_up [2 F] (gate first). gelu_tanh(g) =
// 0.5 g (1 + tanh(t)), t = sqrt(2 / pi) (g + 0.044715 g^3), computed as the same value
// g / (1 + exp(-2 t)) (0.5 (1 + tanh(t)) is the logistic function of 2 t): no cancellation
// near 0, and exp's clamp gives 0 and g at the far ends.
inline void gelu_tanh_mul_row(const float* g, float* out, int64_t F) {
  const float* u = g + F;
  const Vec cubic = set1(0.044715f), minus_two_c = set1(-2.0f * 0.7978845608028654f);
  for (int64_t f = 0; f < F; f += kLanes) {
    const Mask live = first_lanes(std::min<int64_t>(kLanes, F - f));
    const Vec gv = load(g + f, live);
    const Vec inner = add(gv, mul(cubic, mul(mul(gv, gv), gv)));
    const Vec gelu = div(gv, add(set1(1.0f), vexp(mul(minus_two_c, inner))));
    store(out + f, live, mul(gelu, load(u + f, live)));
  }
}

}  // namespace
