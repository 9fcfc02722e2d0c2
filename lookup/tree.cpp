// The drafter's tree builder (lookup.drafter.Drafter._tree) compiled: the same trie, the
// same IEEE double operations in the same order, the same node order, so its drafts are
// identical bit for bit to the Python builder's (which stays the reference and fallback).
//
// One call, one argument: a block of int64 slots (layout below, written by lookup.native)
// holding the addresses of the rates table and of the output arrays, the sizes, and the
// continuation sources of up to kMaxCandidates candidates. Built with -ffp-contract=off and
// without fast-math, so nothing is fused or reordered.
#include <algorithm>
#include <cstdint>
#include <vector>

namespace {

constexpr int kMaxCandidates = 8;

// block layout: header, then kCandidateSlots per candidate
enum Header : int {
  kBuckets,      // buckets per source
  kBucketOf,     // int64[bucket_len]: the bucket of each match length below bucket_len
  kBucketLen,
  kOutTokens,    // int64[max_nodes]
  kOutParents,   // int32[max_nodes]
  kOutScores,    // float[max_nodes]
  kOutSources,   // int8[max_nodes]
  kOutMatch,     // int64[max_nodes]
  kRates,        // double[sources][buckets]: the acceptance rates (set per call from here)
  kCount,        // candidates (each one's rate is the rate of its source and match)
  kMaxNodes,     // nodes in the draft at most
  kMaxWidth,     // children per node at most
  kHeaderSlots,
};

enum Slot : int {
  kStatic,       // int64*: the source's static tokens
  kStaticLen,
  kTail,         // int64*: tokens after them (the context's output)
  kTailLen,
  kPos,          // where the continuation starts
  kPeriodic,     // 1: a short continuation repeats (copies from the context)
  kSource,
  kMatch,        // the candidate's match length
  kCandidateSlots,
};

template <typename T>
T* at(const int64_t* block, int slot) {
  return reinterpret_cast<T*>(static_cast<intptr_t>(block[slot]));
}

struct Trie {
  std::vector<int64_t> tok, depth, source, match;
  std::vector<int> parent, first_kid, next_kid, last_kid;
  std::vector<double> weight, rate, score;
  std::vector<int> root_kids;

  void clear() {
    for (auto* v : {&tok, &depth, &source, &match}) v->clear();
    for (auto* v : {&parent, &first_kid, &next_kid, &last_kid, &root_kids}) v->clear();
    for (auto* v : {&weight, &rate, &score}) v->clear();
  }

  // children in creation order: the root's in root_kids, the others linked
  template <typename F>
  void each_kid(int node, F f) const {
    if (node < 0) {
      for (int k : root_kids) f(k);
      return;
    }
    for (int k = first_kid[node]; k >= 0; k = next_kid[k]) f(k);
  }

  int add(int64_t token, int par, int64_t d, double w, double r, int64_t src, int64_t m) {
    int node = static_cast<int>(tok.size());
    tok.push_back(token), depth.push_back(d), source.push_back(src), match.push_back(m);
    parent.push_back(par), weight.push_back(w), rate.push_back(r);
    first_kid.push_back(-1), next_kid.push_back(-1), last_kid.push_back(-1);
    if (par < 0) {
      root_kids.push_back(node);
    } else if (last_kid[par] < 0) {
      first_kid[par] = last_kid[par] = node;
    } else {
      next_kid[last_kid[par]] = node;
      last_kid[par] = node;
    }
    return node;
  }
};

}  // namespace

extern "C" int64_t dg_tree(const int64_t* block) {
  const int count = static_cast<int>(std::min<int64_t>(block[kCount], kMaxCandidates));
  const int64_t max_nodes = block[kMaxNodes];
  const size_t max_width = static_cast<size_t>(block[kMaxWidth]);
  const double* rates = at<const double>(block, kRates);
  const int64_t buckets = block[kBuckets];
  const int64_t* bucket_of = at<const int64_t>(block, kBucketOf);
  const int64_t bucket_len = block[kBucketLen];
  // reused between calls (each thread its own): no allocation once they have grown
  thread_local Trie t;
  thread_local std::vector<int64_t> tokens;
  thread_local std::vector<double> totals;
  thread_local std::vector<char> kept;
  thread_local std::vector<int> kids, order, where;
  t.clear();
  auto rate = [&](int64_t src, int64_t m) {
    return rates[src * buckets + (m < bucket_len ? bucket_of[m] : buckets - 1)];
  };
  for (int c = 0; c < count; ++c) {
    const int64_t* slots = block + kHeaderSlots + c * kCandidateSlots;
    const int64_t* stat = at<const int64_t>(slots, kStatic);
    const int64_t* tail = at<const int64_t>(slots, kTail);
    const int64_t n_static = slots[kStaticLen], size = n_static + slots[kTailLen];
    const int64_t pos = slots[kPos], src = slots[kSource], m0 = slots[kMatch];
    const double neg = -rate(src, m0);
    // alternatives rarely win deep nodes: copy half as far for them
    const int64_t length = c == 0 ? max_nodes : (max_nodes + 1) / 2;
    const int64_t avail = std::max<int64_t>(std::min(length, size - pos), 0);
    const int64_t n = slots[kPeriodic] && avail > 0 ? length : avail;
    tokens.resize(n);
    for (int64_t j = 0; j < n; ++j) {
      const int64_t i = pos + j % avail;
      tokens[j] = i < n_static ? stat[i] : tail[i - n_static];
    }
    int node = -1;
    int64_t d = 0;
    for (; d < n; ++d) {  // follow the nodes an earlier continuation made
      int child = -1;
      t.each_kid(node, [&](int k) {
        if (child < 0 && t.tok[k] == tokens[d]) child = k;
      });
      if (child < 0) break;
      t.weight[child] -= neg;
      node = child;
    }
    for (; d < n; ++d) {
      node = t.add(tokens[d], node, d, 0.0 - neg, rate(src, m0 + d), src, m0 + d);
    }
  }
  const int size = static_cast<int>(t.tok.size());
  t.score.assign(size, 0.0);
  totals.assign(size + 1, -1.0);  // [node + 1]: its children's summed weight
  for (int i = 0; i < size; ++i) {  // parents precede children
    const int p = t.parent[i];
    double& total = totals[p + 1];
    if (total < 0.0) {
      total = 0.0;
      t.each_kid(p, [&](int k) { total += t.weight[k]; });
    }
    const double base = p < 0 ? 1.0 : t.score[p];
    t.score[i] = base * t.rate[i] * (t.weight[i] / total);
  }
  // best-first expansion is a sort (scores never grow along a path): the best nodes whose
  // ancestors each rank among their siblings' max_width best
  auto better = [&](int a, int b) {
    return t.score[a] > t.score[b] || (t.score[a] == t.score[b] && a < b);
  };
  kept.assign(size, 0);
  for (int p = -1; p < size; ++p) {
    if (p >= 0 && !kept[p]) continue;
    kids.clear();
    t.each_kid(p, [&](int k) { kids.push_back(k); });
    if (kids.size() > max_width) {
      std::sort(kids.begin(), kids.end(), better);
      kids.resize(max_width);
    }
    for (int k : kids) kept[k] = 1;
  }
  order.clear();
  for (int i = 0; i < size; ++i) {
    if (kept[i]) order.push_back(i);
  }
  std::sort(order.begin(), order.end(), better);
  if (static_cast<int64_t>(order.size()) > max_nodes) order.resize(max_nodes);
  // parents before children, siblings by decreasing score
  std::stable_sort(order.begin(), order.end(),
                   [&](int a, int b) { return t.depth[a] < t.depth[b]; });
  where.assign(size, -1);
  for (size_t j = 0; j < order.size(); ++j) where[order[j]] = static_cast<int>(j);
  int64_t* out_tokens = at<int64_t>(block, kOutTokens);
  int32_t* out_parents = at<int32_t>(block, kOutParents);
  float* out_scores = at<float>(block, kOutScores);
  int8_t* out_sources = at<int8_t>(block, kOutSources);
  int64_t* out_match = at<int64_t>(block, kOutMatch);
  for (size_t j = 0; j < order.size(); ++j) {
    const int i = order[j];
    out_tokens[j] = t.tok[i];
    out_parents[j] = t.parent[i] < 0 ? -1 : where[t.parent[i]];
    out_scores[j] = static_cast<float>(t.score[i]);
    out_sources[j] = static_cast<int8_t>(t.source[i]);
    out_match[j] = t.match[i];
  }
  return static_cast<int64_t>(order.size());
}
