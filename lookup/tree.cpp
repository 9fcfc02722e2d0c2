// A tree proposal of the drafter (lookup.drafter.Drafter.propose with max_width > 1)
// compiled, in one call: ranks the tracks (Drafter._ranked), collects the candidates
// (Drafter._candidates), builds the trie (Drafter._tree) and returns the draft's arrays. The
// same comparisons, the same IEEE double operations in the same order and the same node
// order as the Python code, which stays the reference and the fallback, so the drafts are
// identical bit for bit. Built with -ffp-contract=off and without fast-math, so nothing is
// fused or reordered.
//
// Loaded with ctypes.PyDLL (the GIL is held throughout): it reads the tracks' positions and
// match lengths from the Python objects and returns new numpy arrays (numpy's C API).
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#define NPY_NO_DEPRECATED_API NPY_1_7_API_VERSION
#include <numpy/arrayobject.h>

#include <algorithm>
#include <cstdint>
#include <vector>

namespace {

constexpr int64_t kOutput = 2;  // Source.OUTPUT (Source.PROMPT is 1)
constexpr int64_t kPrompt = 1;

// a drafter's block (int64 slots, written once by lookup.native): header, then per track
enum Header : int {
  kTracks,       // tracks (the Python list passed with each call has as many)
  kPromptLen,    // the context's tokens before the output
  kRates,        // double[sources][buckets]: the acceptance rates (updated in place)
  kBuckets,      // buckets per source
  kBucketOf,     // int64[bucket_len]: the bucket of each match length below bucket_len
  kBucketLen,
  kCandidates,   // tree candidates: occurrences merged into a tree
  kHeaderSlots,
};

enum TrackSlot : int {
  kStatic,       // int64*: the source's static tokens
  kStaticLen,
  kTail,         // int64*: tokens after them (unused for the context: passed per call)
  kTailLen,
  kSource,       // the track's source (the context's is the prompt's)
  kContext,      // 1: the context (prompt then output; its copies repeat periodically)
  kTrackSlots,
};

template <typename T>
const T* at(const int64_t* slots, int slot) {
  return reinterpret_cast<const T*>(static_cast<intptr_t>(slots[slot]));
}

struct Node {
  int64_t tok, depth, source, match;
  int parent, first_kid = -1, next_kid = -1, last_kid = -1;
  double weight, rate, score = 0.0;
};

struct Trie {
  std::vector<Node> nodes;  // parents precede children
  std::vector<int> root_kids;

  void clear() { nodes.clear(), root_kids.clear(); }

  // children in creation order: the root's in root_kids, the others linked
  template <typename F>
  void each_kid(int node, F f) const {
    if (node < 0) {
      for (int k : root_kids) f(k);
      return;
    }
    for (int k = nodes[node].first_kid; k >= 0; k = nodes[k].next_kid) f(k);
  }

  int add(int64_t token, int par, int64_t d, double w, double r, int64_t src, int64_t m) {
    const int node = static_cast<int>(nodes.size());
    Node added;
    added.tok = token, added.depth = d, added.source = src, added.match = m;
    added.parent = par, added.weight = w, added.rate = r;
    nodes.push_back(added);
    if (par < 0) {
      root_kids.push_back(node);
    } else if (nodes[par].last_kid < 0) {
      nodes[par].first_kid = nodes[par].last_kid = node;
    } else {
      nodes[nodes[par].last_kid].next_kid = node;
      nodes[par].last_kid = node;
    }
    return node;
  }
};

// a stable insertion sort: the ranges are a few entries (std::stable_sort allocates)
template <typename T, typename Less>
void stable_sort_small(std::vector<T>& v, Less less) {
  for (size_t i = 1; i < v.size(); ++i) {
    T x = v[i];
    size_t j = i;
    for (; j > 0 && less(x, v[j - 1]); --j) v[j] = v[j - 1];
    v[j] = x;
  }
}

struct Rates {  // AcceptanceModel.rate over the drafter's rates table
  const double* table;  // [source][bucket]
  int64_t buckets;
  const int64_t* bucket_of;  // the bucket of each match length below bucket_len
  int64_t bucket_len;

  double operator()(int64_t src, int64_t m) const {
    return table[src * buckets + (m < bucket_len ? bucket_of[m] : buckets - 1)];
  }
};

struct Ranked {  // Drafter._ranked's tuple: (minus the rate, source, track)
  double neg;
  int64_t source;
  int64_t track;
};

struct Candidate {  // Drafter's Candidate, with what the trie reads of its track
  double neg;
  int64_t source, pos, track, match;
  const int64_t *stat, *tail;
  int64_t n_static, size;
  bool periodic;
};

bool by_rank(const Candidate& a, const Candidate& b) {  // drafter._rank: rate, then source
  return a.neg < b.neg || (a.neg == b.neg && a.source < b.source);
}

// working memory, reused between calls (each thread its own): no allocation once grown
struct Scratch {
  Trie t;
  std::vector<int64_t> tokens, flat, starts, match;
  std::vector<double> totals;
  std::vector<char> kept;
  std::vector<int> kids, order, where;
  std::vector<Ranked> ranked;
  std::vector<Candidate> cands, occ;
};

// this thread's scratch, its address looked up once per call (not at every use: the
// compiler repeats a thread_local's lookup, a call into the dynamic loader, after each call)
__attribute__((noinline)) Scratch& thread_scratch() {
  thread_local Scratch scratch;
  return scratch;
}

PyObject* positions_name = nullptr;
PyObject* match_name = nullptr;

// the tracks' positions (flattened) and match lengths, read from the Python objects
bool read_tracks(PyObject* tracks, int64_t count, std::vector<int64_t>& flat,
                 std::vector<int64_t>& starts, std::vector<int64_t>& match) {
  if (!PyList_Check(tracks) || PyList_GET_SIZE(tracks) != count) {
    PyErr_SetString(PyExc_ValueError, "the tracks changed since the block was written");
    return false;
  }
  flat.clear(), starts.clear(), match.clear();
  for (int64_t i = 0; i < count; ++i) {
    PyObject* track = PyList_GET_ITEM(tracks, i);
    PyObject* m = PyObject_GetAttr(track, match_name);
    if (m == nullptr) return false;
    match.push_back(PyLong_AsLongLong(m));
    Py_DECREF(m);
    if (PyErr_Occurred()) return false;
    PyObject* positions = PyObject_GetAttr(track, positions_name);
    if (positions == nullptr) return false;
    starts.push_back(static_cast<int64_t>(flat.size()));
    if (!PyList_Check(positions)) {
      Py_DECREF(positions);
      PyErr_SetString(PyExc_TypeError, "a track's positions must be a list");
      return false;
    }
    for (Py_ssize_t j = 0; j < PyList_GET_SIZE(positions); ++j) {
      flat.push_back(PyLong_AsLongLong(PyList_GET_ITEM(positions, j)));
    }
    Py_DECREF(positions);
    if (PyErr_Occurred()) return false;
  }
  starts.push_back(static_cast<int64_t>(flat.size()));
  return true;
}

// Drafter._tree over the candidates (best first): the draft's arrays
PyObject* build(Scratch& s, int64_t max_nodes, size_t max_width, const Rates& rate) {
  const std::vector<Candidate>& cands = s.cands;
  Trie& t = s.t;
  std::vector<int64_t>& tokens = s.tokens;
  std::vector<double>& totals = s.totals;
  std::vector<char>& kept = s.kept;
  std::vector<int>&kids = s.kids, &order = s.order, &where = s.where;
  t.clear();
  for (size_t c = 0; c < cands.size(); ++c) {
    const Candidate& cand = cands[c];
    const int64_t pos = cand.pos, src = cand.source, m0 = cand.match;
    const double neg = -rate(src, m0);
    // alternatives rarely win deep nodes: copy half as far for them
    const int64_t length = c == 0 ? max_nodes : (max_nodes + 1) / 2;
    const int64_t avail = std::max<int64_t>(std::min(length, cand.size - pos), 0);
    const int64_t n = cand.periodic && avail > 0 ? length : avail;
    tokens.resize(n);
    for (int64_t j = 0; j < n; ++j) {
      const int64_t i = pos + j % avail;
      tokens[j] = i < cand.n_static ? cand.stat[i] : cand.tail[i - cand.n_static];
    }
    int node = -1;
    int64_t d = 0;
    for (; d < n; ++d) {  // follow the nodes an earlier continuation made
      int child = -1;
      t.each_kid(node, [&](int k) {
        if (child < 0 && t.nodes[k].tok == tokens[d]) child = k;
      });
      if (child < 0) break;
      t.nodes[child].weight -= neg;
      node = child;
    }
    for (; d < n; ++d) {
      node = t.add(tokens[d], node, d, 0.0 - neg, rate(src, m0 + d), src, m0 + d);
    }
  }
  std::vector<Node>& nodes = t.nodes;
  const int size = static_cast<int>(nodes.size());
  totals.assign(size + 1, -1.0);  // [node + 1]: its children's summed weight
  for (int i = 0; i < size; ++i) {  // parents precede children
    const int p = nodes[i].parent;
    double& total = totals[p + 1];
    if (total < 0.0) {
      total = 0.0;
      t.each_kid(p, [&](int k) { total += nodes[k].weight; });
    }
    const double base = p < 0 ? 1.0 : nodes[p].score;
    nodes[i].score = base * nodes[i].rate * (nodes[i].weight / total);
  }
  // best-first expansion is a sort (scores never grow along a path): the best nodes whose
  // ancestors each rank among their siblings' max_width best
  auto better = [&](int a, int b) {
    return nodes[a].score > nodes[b].score || (nodes[a].score == nodes[b].score && a < b);
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
  // parents before children, siblings by decreasing score (``better`` is a total order, so
  // this is the stable sort by depth of the order above)
  std::sort(order.begin(), order.end(), [&](int a, int b) {
    return nodes[a].depth < nodes[b].depth || (nodes[a].depth == nodes[b].depth && better(a, b));
  });
  where.assign(size, -1);
  for (size_t j = 0; j < order.size(); ++j) where[order[j]] = static_cast<int>(j);
  npy_intp n = static_cast<npy_intp>(order.size());
  PyObject* arrays[5] = {
      PyArray_SimpleNew(1, &n, NPY_INT64),    // tokens
      PyArray_SimpleNew(1, &n, NPY_INT32),    // parents
      PyArray_SimpleNew(1, &n, NPY_FLOAT32),  // scores
      PyArray_SimpleNew(1, &n, NPY_INT8),     // sources
      PyArray_SimpleNew(1, &n, NPY_INT64),    // match lengths
  };
  PyObject* out = PyTuple_New(5);
  for (int a = 0; a < 5; ++a) {
    if (arrays[a] == nullptr || out == nullptr) {
      for (PyObject* array : arrays) Py_XDECREF(array);
      Py_XDECREF(out);
      return nullptr;
    }
  }
  auto data = [&](int a) { return PyArray_DATA(reinterpret_cast<PyArrayObject*>(arrays[a])); };
  auto* out_tokens = static_cast<int64_t*>(data(0));
  auto* out_parents = static_cast<int32_t*>(data(1));
  auto* out_scores = static_cast<float*>(data(2));
  auto* out_sources = static_cast<int8_t*>(data(3));
  auto* out_match = static_cast<int64_t*>(data(4));
  for (size_t j = 0; j < order.size(); ++j) {
    const Node& node = nodes[order[j]];
    out_tokens[j] = node.tok;
    out_parents[j] = node.parent < 0 ? -1 : where[node.parent];
    out_scores[j] = static_cast<float>(node.score);
    out_sources[j] = static_cast<int8_t>(node.source);
    out_match[j] = node.match;
  }
  for (int a = 0; a < 5; ++a) PyTuple_SET_ITEM(out, a, arrays[a]);
  return out;
}

}  // namespace

// Once per process, before dg_propose: numpy's C API and the attribute names. 0 on success.
extern "C" int dg_init() {
  if (_import_array() < 0) return -1;
  positions_name = PyUnicode_InternFromString("positions");
  match_name = PyUnicode_InternFromString("match");
  return positions_name != nullptr && match_name != nullptr ? 0 : -1;
}

// One tree proposal; ``args``: (the address of the drafter's block (see Header), its Track
// list, the address and count of the context's appended tokens, the draft's size and width
// at most). Returns () when no track has an occurrence to copy from, (track, pos, source)
// when there is one candidate (the drafter copies a chain), else the tree's (tokens,
// parents, scores, sources, match lengths) as new arrays.
extern "C" PyObject* dg_propose(PyObject* args) {
  int64_t ints[6];
  if (!PyTuple_Check(args) || PyTuple_GET_SIZE(args) != 6) {
    PyErr_SetString(PyExc_TypeError, "dg_propose takes a tuple of 6");
    return nullptr;
  }
  for (int i = 0; i < 6; ++i) {
    ints[i] = i == 1 ? 0 : PyLong_AsLongLong(PyTuple_GET_ITEM(args, i));
  }
  if (PyErr_Occurred()) return nullptr;
  const int64_t* block = reinterpret_cast<const int64_t*>(static_cast<intptr_t>(ints[0]));
  PyObject* tracks = PyTuple_GET_ITEM(args, 1);
  const int64_t context_tail = ints[2], context_tail_len = ints[3];
  const int64_t max_nodes = ints[4], max_width = ints[5];
  Scratch& s = thread_scratch();
  std::vector<int64_t>&flat = s.flat, &starts = s.starts, &match = s.match;
  std::vector<Ranked>& ranked = s.ranked;
  std::vector<Candidate>&cands = s.cands, &occ = s.occ;
  const int64_t count = block[kTracks], n_prompt = block[kPromptLen];
  const Rates rate{at<double>(block, kRates), block[kBuckets], at<int64_t>(block, kBucketOf),
                   block[kBucketLen]};
  const size_t at_least = static_cast<size_t>(block[kCandidates]);
  if (!read_tracks(tracks, count, flat, starts, match)) return nullptr;
  auto slots = [&](int64_t i) { return block + kHeaderSlots + i * kTrackSlots; };
  auto size_of = [&](int64_t i) {
    const int64_t* track = slots(i);
    return track[kStaticLen] + (track[kContext] ? context_tail_len : track[kTailLen]);
  };
  ranked.clear();  // Drafter._ranked
  for (int64_t i = 0; i < count; ++i) {
    const int64_t size = size_of(i);
    const int64_t* first = std::find_if(flat.data() + starts[i], flat.data() + starts[i + 1],
                                        [&](int64_t p) { return p < size; });
    if (first == flat.data() + starts[i + 1]) continue;
    int64_t source = slots(i)[kSource];
    if (slots(i)[kContext] && *first >= n_prompt) source = kOutput;
    ranked.push_back({-rate(source, match[i]), source, i});
  }
  if (ranked.empty()) return PyTuple_New(0);
  std::sort(ranked.begin(), ranked.end(), [](const Ranked& a, const Ranked& b) {
    return a.neg < b.neg || (a.neg == b.neg && (a.source < b.source ||
                                                (a.source == b.source && a.track < b.track)));
  });
  cands.clear();  // Drafter._candidates
  for (const Ranked& r : ranked) {
    const int64_t* track = slots(r.track);
    const bool context = track[kContext] != 0;
    const int64_t size = size_of(r.track), m = match[r.track];
    const int64_t* tail = context ? reinterpret_cast<const int64_t*>(context_tail)
                                  : at<int64_t>(track, kTail);
    const Candidate base{r.neg, r.source, 0, r.track, m, at<int64_t>(track, kStatic),
                         tail, track[kStaticLen], size, context};
    occ.clear();  // Drafter._occurrences
    const int64_t other = r.source == kOutput ? kPrompt : kOutput;
    const double other_neg = -rate(other, m);
    for (int64_t j = starts[r.track]; j < starts[r.track + 1]; ++j) {
      const int64_t p = flat[j];
      if (p >= size) continue;
      Candidate c = base;
      c.pos = p;
      if (context && (p >= n_prompt) != (r.source == kOutput)) c.neg = other_neg, c.source = other;
      occ.push_back(c);
    }
    if (context) stable_sort_small(occ, by_rank);
    cands.insert(cands.end(), occ.begin(), occ.end());
    if (cands.size() >= at_least) break;
  }
  stable_sort_small(cands, by_rank);
  if (cands.size() == 1) {
    return Py_BuildValue("(LLL)", static_cast<long long>(cands[0].track),
                         static_cast<long long>(cands[0].pos),
                         static_cast<long long>(cands[0].source));
  }
  if (cands.size() > at_least) cands.resize(at_least);
  return build(s, max_nodes, static_cast<size_t>(max_width), rate);
}
