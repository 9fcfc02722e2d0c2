// The arguments of one dg_stack_step call: plain C structs, mirrored field for field by
// step_args.py (ctypes.Structure each; dg_step_args_layout reports this side's layout, which
// cpp.build_library compares before it uses a library). A field added here goes to the
// mirror and to step_args_layout in the same place.
#pragma once

#include <cstddef>
#include <cstdint>

// An attention plan: dg_attention's arrays over the step's rows, and its sequences.
struct DgPlan {
  const int64_t* keys;
  const int64_t* key_start;
  const int64_t* row_start;
  const int64_t* ctx_len;
  const bool* masks;
  const int64_t* mask_start;
  int64_t n_seqs;
};

// The rows' rotation by one rope table: cos and sin [N, Dh] (the sign of rotate_half in sin).
struct DgRope {
  const float* cos;
  const float* sin;
};

// A layer attends by plan[0] (every key of its rows) or plan[1] (each row's list cut to its
// last `window` keys), rotates by rope[0] (the model's rope base) or rope[1] (the sliding
// layers' own base): as its table entry says (LayerWeights::plan, ::rope). A slot no layer
// uses may hold anything.
constexpr int kPlanSlots = 2;
constexpr int kRopeSlots = 2;

struct DgStepArgs {
  float* x;  // [N, dim]: the rows' embeddings, then their hidden states
  DgRope rope[kRopeSlots];
  const int64_t* new_slots;  // [N]: each row's K/V slot, all distinct
  int64_t n_rows;  // N
  void* k_cache;  // [L] x dg_rope_store's kc, of the weights' type
  void* v_cache;  // [L] x dg_rope_store's vc (float, or bfloat16 bits)
  int64_t n_slots;  // S, a multiple of kKeyTile
  DgPlan plan[kPlanSlots];
  const int64_t* picked;  // [P]: the rows that get logits
  int64_t n_picked;  // P
  float* logits;  // [P, V] (unless hidden)
  int threads;
  double* seconds;  // null, or where the step adds its seconds per kind of kernel
  float* hidden;  // null, or [P, dim]: the picked rows' final-normed states, the head not run
};

// The three structs' layouts into out: per struct (DgStepArgs, DgPlan, DgRope) its size, then
// per field in order its offset and size. Returns the number of values written (out holds
// at least 3 + 2 * 23).
inline int64_t step_args_layout(int64_t* out) {
  int64_t n = 0;
#define DG_FIELD(type, name)       \
  out[n++] = offsetof(type, name); \
  out[n++] = sizeof(type::name)
  out[n++] = sizeof(DgStepArgs);
  DG_FIELD(DgStepArgs, x);
  DG_FIELD(DgStepArgs, rope);
  DG_FIELD(DgStepArgs, new_slots);
  DG_FIELD(DgStepArgs, n_rows);
  DG_FIELD(DgStepArgs, k_cache);
  DG_FIELD(DgStepArgs, v_cache);
  DG_FIELD(DgStepArgs, n_slots);
  DG_FIELD(DgStepArgs, plan);
  DG_FIELD(DgStepArgs, picked);
  DG_FIELD(DgStepArgs, n_picked);
  DG_FIELD(DgStepArgs, logits);
  DG_FIELD(DgStepArgs, threads);
  DG_FIELD(DgStepArgs, seconds);
  DG_FIELD(DgStepArgs, hidden);
  out[n++] = sizeof(DgPlan);
  DG_FIELD(DgPlan, keys);
  DG_FIELD(DgPlan, key_start);
  DG_FIELD(DgPlan, row_start);
  DG_FIELD(DgPlan, ctx_len);
  DG_FIELD(DgPlan, masks);
  DG_FIELD(DgPlan, mask_start);
  DG_FIELD(DgPlan, n_seqs);
  out[n++] = sizeof(DgRope);
  DG_FIELD(DgRope, cos);
  DG_FIELD(DgRope, sin);
#undef DG_FIELD
  return n;
}
