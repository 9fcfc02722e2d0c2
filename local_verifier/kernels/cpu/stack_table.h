// A model's table for the layer stack (dg_stack_new): the weights' addresses and layouts,
// each layer's norms and switches, and the scratch a step's activations live in.
#pragma once

#include <cstdint>
#include <cstring>
#include <mutex>
#include <type_traits>
#include <utility>
#include <vector>

#include "quant.h"
#include "stack_args.h"

namespace {

// as fused.py's LAYOUT_CODES; kQuantBlocks + a GGML type code: rows of that type's blocks
enum Layout { kRowMajor = 0, kPacked = 1, kAmxPacked = 2, kQuantBlocks = 100 };

// A layer's entries in dg_stack_new's arrays, in this order (fused.py's LayerWeights.tensors,
// .eps and .switches).
enum LayerTensor {
  kAttnNorm, kWqkv, kBqkv, kWo, kFfnNorm, kW13, kW2, kQNorm, kKNorm, kPostAttnNorm,
  kPostFfnNorm, kWqkvK, kWqkvV, kW13Up, kLayerTensors
};
enum LayerNorm { kAttnEps, kFfnEps, kQEps, kKEps, kPostAttnEps, kPostFfnEps, kLayerNorms };
enum LayerSwitch { kActivation, kPlan, kRope, kQkPairs, kLayerSwitches };
enum Activation { kSilu = 0, kGeluTanh = 1 };

// Rows of a linear layer's weight from `row` on, at w in its layout.
struct Run {
  int64_t row;
  const void* w;
  int layout;
};

// A linear layer's weight and its layout (cpu/linear.h, cpu/quant.h); a fused layer whose
// parts lie in runs apart (GGUF blocks each used where the file holds it: wqkv's q, k and v,
// w13's gate and up) lists the runs after the first (at w) in `more`.
struct Matrix {
  const void* w;
  int layout;
  Run more[2] = {};
  int n_more = 0;
};

// One layer: the Llama layer (norm, qkv, rope, attention, wo, norm, gated MLP) with the
// other families' parts where present: per-head q/k norms (Qwen3, Gemma 3), norms of the
// attention's and the MLP's outputs before each residual add (Gemma 3), GeGLU, a sliding
// window (plan 1) and its own rope base (rope 1). With qk_pairs, wqkv's q and k rows lie in
// a GGUF llama file's order (each head's rotated pairs side by side), which the step puts
// back into rotate-half order before the rope.
struct LayerWeights {
  const void* vectors[kLayerTensors];  // the norms and bqkv (null where absent), W's type
  Matrix wqkv, wo, w13, w2;
  float eps[kLayerNorms];
  int activation, plan, rope, qk_pairs;
};

// A layer's vectors as float32 for one step (a bf16 one widened); null where absent.
struct LayerVectors {
  const float *attn_norm, *bqkv, *ffn_norm, *q_norm, *k_norm, *post_attn_norm, *post_ffn_norm;
};

struct Stack {
  int64_t dim, H, KVH, Dh, F, V;
  bool bf16;
  const void* norm;
  Matrix head;
  float norm_eps;
  std::vector<LayerWeights> layers;
  std::vector<LayerVectors> vectors;  // per layer, re-read every step
  const float* final_norm = nullptr;  // the norm's float32 values, this step
  std::vector<float> widened;         // bf16: the vectors' float32 values
  std::vector<float> scratch;         // a step's activations
  QuantRows quant_rows;               // a quantized linear's input rows
  std::mutex busy;                    // one step at a time uses the scratch

  // The number of values of a layer's vector t (LayerTensor; the final norm: as kAttnNorm).
  int64_t length(int t) const {
    switch (t) {
      case kBqkv: return (H + 2 * KVH) * Dh;
      case kQNorm: case kKNorm: return Dh;
      default: return dim;
    }
  }
};

// The float32 values of a parameter vector of n values (a bf16 one widened into out).
template <typename W>
const float* as_float(const void* p, int64_t n, float* out) {
  if (p == nullptr) return nullptr;
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

// Every vector of the table as float32 (re-read each step: values copied into the
// parameters in place are seen).
template <typename W>
void read_vectors(Stack& m) {
  float* out = m.widened.data();
  const auto next = [&](const void* p, int t) {
    const float* v = as_float<W>(p, m.length(t), out);
    if constexpr (!std::is_same_v<W, float>)
      if (p != nullptr) out += m.length(t);
    return v;
  };
  for (size_t l = 0; l < m.layers.size(); ++l) {
    const void* const* v = m.layers[l].vectors;
    LayerVectors& f = m.vectors[l];
    f.attn_norm = next(v[kAttnNorm], kAttnNorm);
    f.bqkv = next(v[kBqkv], kBqkv);
    f.ffn_norm = next(v[kFfnNorm], kFfnNorm);
    f.q_norm = next(v[kQNorm], kQNorm);
    f.k_norm = next(v[kKNorm], kKNorm);
    f.post_attn_norm = next(v[kPostAttnNorm], kPostAttnNorm);
    f.post_ffn_norm = next(v[kPostFfnNorm], kPostFfnNorm);
  }
  m.final_norm = next(m.norm, kAttnNorm);
}

// A fused matrix of parts at w[t] for t in `parts` with `rows` rows each: a part at an
// address of its own begins a run (null: it lies after the part before); the first part's
// address is never null.
template <size_t P>
Matrix fused_matrix(const void* const* w, const int* p, const int (&parts)[P],
                    const int64_t (&rows)[P]) {
  Matrix m{w[parts[0]], p[parts[0]]};
  int64_t row = rows[0];
  for (size_t i = 1; i < P; row += rows[i], ++i)
    if (w[parts[i]] != nullptr) m.more[m.n_more++] = {row, w[parts[i]], p[parts[i]]};
  return m;
}

// The table of dg_stack_new's arguments (see there), or null for a quantized type not run
// here, a run apart beside weights that are not blocks, or a switch out of range.
inline Stack* new_stack(int64_t n_layers, int64_t dim, int64_t n_heads, int64_t n_kv_heads,
                        int64_t head_dim, int64_t hidden_dim, int64_t vocab, bool bf16,
                        const void* const* weights, const int* layouts, const float* eps,
                        const int* switches) {
  for (int64_t i = 1; i < 2 + kLayerTensors * n_layers; ++i)  // a quantized matrix: a known type
    if (layouts[i] >= kQuantBlocks && !quant_type_known(layouts[i] - kQuantBlocks)) return nullptr;
  for (int64_t l = 0; l < n_layers; ++l) {
    const void* const* w = weights + 2 + kLayerTensors * l;
    const int* p = layouts + 2 + kLayerTensors * l;
    for (const auto [first, run] :
         {std::pair{kWqkv, kWqkvK}, std::pair{kWqkv, kWqkvV}, std::pair{kW13, kW13Up}})
      if (w[run] != nullptr && (p[first] < kQuantBlocks || p[run] < kQuantBlocks))
        return nullptr;  // runs apart split quantized blocks only
    const int* s = switches + kLayerSwitches * l;
    if (s[kActivation] < 0 || s[kActivation] > kGeluTanh || s[kPlan] < 0 ||
        s[kPlan] >= kPlanSlots || s[kRope] < 0 || s[kRope] >= kRopeSlots || s[kQkPairs] < 0 ||
        s[kQkPairs] > 1 || (s[kQkPairs] == 1 && head_dim % 2 != 0))
      return nullptr;
  }
  Stack* m = new Stack();
  m->dim = dim;
  m->H = n_heads;
  m->KVH = n_kv_heads;
  m->Dh = head_dim;
  m->F = hidden_dim;
  m->V = vocab;
  m->bf16 = bf16;
  m->norm = weights[0];
  m->head = {weights[1], layouts[1]};
  m->norm_eps = eps[kLayerNorms * n_layers];
  int64_t widened = dim;
  for (int64_t l = 0; l < n_layers; ++l) {
    const void* const* w = weights + 2 + kLayerTensors * l;
    const int* p = layouts + 2 + kLayerTensors * l;
    const int* s = switches + kLayerSwitches * l;
    LayerWeights layer{};
    for (int t = 0; t < kLayerTensors; ++t) {
      const bool matrix = t == kWqkv || t == kWo || t == kW13 || t == kW2 || t == kWqkvK ||
                          t == kWqkvV || t == kW13Up;
      layer.vectors[t] = matrix ? nullptr : w[t];
      if (!matrix && w[t] != nullptr) widened += m->length(t);
    }
    const int64_t q_rows = n_heads * head_dim, kv_rows = n_kv_heads * head_dim;
    layer.wqkv = fused_matrix(w, p, {kWqkv, kWqkvK, kWqkvV}, {q_rows, kv_rows, kv_rows});
    layer.wo = {w[kWo], p[kWo]};
    layer.w13 = fused_matrix(w, p, {kW13, kW13Up}, {hidden_dim, hidden_dim});
    layer.w2 = {w[kW2], p[kW2]};
    std::memcpy(layer.eps, eps + kLayerNorms * l, sizeof(layer.eps));
    layer.activation = s[kActivation];
    layer.plan = s[kPlan];
    layer.rope = s[kRope];
    layer.qk_pairs = s[kQkPairs];
    m->layers.push_back(layer);
  }
  m->widened.resize(bf16 ? widened : 0);
  m->vectors.resize(n_layers);
  return m;
}

}  // namespace
