"""The lookup drafter: proposes the next tokens by copying from known text.

Sources, in priority order: the prediction (the predicted output, e.g. the file being
edited), the prompt, the output generated so far, and documents. For each source a
:class:`~lookup.tracks.Track` keeps the longest suffix matches of the context up to date
as tokens are committed. The prediction is aligned like the predicted-outputs APIs do:
it starts aligned with the beginning of the answer, and after the answer diverges from
it (an edit) the track re-anchors where the answer's last tokens occur in it again.

Scores come from an :class:`~lookup.acceptance.AcceptanceModel` that learns from the
request itself: every committed token is compared with the last proposal, so estimates
keep improving even while the controller decides not to verify the drafts.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import accumulate
from operator import itemgetter, mul
from typing import Any

import numpy as np

from lookup.acceptance import AcceptanceModel, bucket
from lookup.draft import Draft, Source
from lookup.index import TokenIndex
from lookup.native import address, drafter_block, load_library
from lookup.tracks import Track


@dataclass(frozen=True)
class DrafterConfig:
    """Tuning knobs of the drafter."""

    candidates: int = 8  # occurrences kept per source
    max_match: int = 32  # match lengths are counted up to this (the longest bucket)
    tree_candidates: int = 4  # distinct continuations merged into a tree
    native_trees: bool = True  # trees by the compiled proposal when it loads (same drafts)


_Ints = list[int] | np.ndarray  # a tree's parents, sources or match lengths

Candidate = tuple[float, int, int, Track]
"""An occurrence to copy from: minus the estimated acceptance rate of its first token, its
source, the continuation start in ``track.index`` (always < its length), the track."""

_rank = itemgetter(0, 1)  # candidates sort by rate, then source priority


class Drafter:
    """Incremental suffix matching over the sources of one request."""

    def __init__(
        self,
        prompt: Sequence[int],
        prediction: Sequence[int] | None = None,
        documents: Sequence[TokenIndex] = (),
        config: DrafterConfig = DrafterConfig(),
        document_sources: Sequence[Source] = (),
        prompt_index: TokenIndex | None = None,
    ) -> None:
        """``document_sources``: each document's source (default ``Source.DOCUMENT``).
        ``prompt_index``: an index over exactly ``prompt`` that this drafter may append to
        (e.g. from a ``PromptIndexCache``); built here when None."""
        self.config = config
        self.acceptance = AcceptanceModel()
        self._bucket_of = [bucket(m) for m in range(config.max_match + 1)]  # tracks' matches
        self._n_prompt = len(prompt)
        if prompt_index is None:
            prompt_index = TokenIndex(np.asarray(list(prompt), dtype=np.int64))
        elif len(prompt_index) != len(prompt):
            raise ValueError("prompt_index must cover exactly the prompt")
        self._context = prompt_index
        self._n_out = 0
        self._prediction: Track | None = None
        self._pred_used = bytearray()  # 1 where a prediction token appeared in the output
        self._pred_accepted = 0
        if prediction:
            self._prediction = Track(
                TokenIndex(np.asarray(list(prediction), np.int64)), Source.PREDICTION
            )
            self._prediction.positions = [0]  # aligned with the start of the answer
            self._prediction.complete = True
            self._pred_used = bytearray(len(prediction))
        self._tracks: list[Track] = [Track(self._context, Source.PROMPT)]
        sources = list(document_sources) + [Source.DOCUMENT] * len(documents)
        self._tracks += [Track(index, src) for index, src in zip(documents, sources, strict=False)]
        if self._prediction is not None:
            self._tracks.insert(0, self._prediction)
        hashes = self._context.suffix_hashes()
        for track in self._tracks:
            if track is not self._prediction:
                track.anchor(self._context, hashes, config.candidates, config.max_match)
        # the last proposal, walked by committed tokens to learn acceptance
        self._last_tokens: Sequence[int] | np.ndarray = []
        self._last_source = 0  # a chain's source and the match length of its first node
        self._last_m0 = 0
        self._last_tree: tuple[_Ints, _Ints, _Ints] | None = None  # parents, sources and
        # match lengths of a tree's nodes (None: the last proposal is a chain)
        self._last_children: dict[int, list[int]] | None = None
        self._cursor: int | None = None  # the node the committed tokens have reached
        # the compiled tree proposal (loaded here, not in a proposal: the first is slow)
        self._native: Callable[..., tuple[Any, ...]] | None = None
        library = load_library()[0] if config.native_trees else None
        if library is not None:
            self._block = drafter_block(
                self._tracks,
                self._context,
                self._n_prompt,
                self.acceptance.rows,
                config.tree_candidates,
            )
            self._block_address = address(self._block)
            self._native = library.dg_propose

    # -- committing tokens -------------------------------------------------------------

    def extend(self, tokens: Sequence[int]) -> None:
        """Append committed output tokens (accepted draft tokens and the target's own)."""
        cfg = self.config
        for raw in tokens:
            token = int(raw)
            self._learn(token)
            lost = [t for t in self._tracks if not self._follow(t, token)]
            self._context.append([token])
            self._n_out += 1
            if lost:
                hashes = self._context.suffix_hashes()
                for track in lost:
                    track.anchor(self._context, hashes, cfg.candidates, cfg.max_match)
                    if track is self._prediction:
                        self._mark_anchor(track)
                        if not track.positions and not self._pred_accepted:
                            track.positions = [0]  # the answer has not reached it yet

    def _follow(self, track: Track, token: int) -> bool:
        before = track.positions[0] if track.positions else -1
        ok = track.follow(token, self.config.max_match)
        if track is self._prediction and track.positions and before >= 0:
            self._use_prediction(track.positions[0] - 1)
        return ok

    def _use_prediction(self, pos: int) -> None:
        if not self._pred_used[pos]:
            self._pred_used[pos] = 1
            self._pred_accepted += 1

    def _mark_anchor(self, track: Track) -> None:
        if track.positions:
            pos = track.positions[0]
            for i in range(max(pos - min(track.match, self._n_out), 0), pos):
                self._use_prediction(i)

    def prediction_usage(self) -> tuple[int, int]:
        """(accepted, rejected) prediction tokens: those that did / did not appear in the output."""
        return self._pred_accepted, len(self._pred_used) - self._pred_accepted

    def _learn(self, token: int) -> None:
        """Compare a committed token with the last proposal's best child at the cursor."""
        node = self._cursor
        if node is None:
            return
        tokens = self._last_tokens
        if self._last_tree is None:  # a chain: node i + 1 follows node i
            first = node + 1
            if first >= len(tokens):
                self._cursor = None
                return
            hit = int(tokens[first]) == token
            self.acceptance.observe(self._last_source, self._last_m0 + first, hit)
            self._cursor = first if hit else None
            return
        parents, sources, match = self._last_tree
        if self._last_children is None:
            self._last_children = {}
            for child, parent in enumerate(list(map(int, parents))):
                self._last_children.setdefault(parent, []).append(child)
        children = self._last_children.get(node)
        if not children:
            self._cursor = None
            return
        first = children[0]
        hit = int(tokens[first]) == token
        self.acceptance.observe(int(sources[first]), int(match[first]), hit)
        self._cursor = next((c for c in children if int(tokens[c]) == token), None)

    # -- proposing -----------------------------------------------------------------------

    def propose(self, max_tokens: int, max_width: int = 1) -> Draft:
        """A chain (``max_width == 1``) or a small tree of at most ``max_tokens`` nodes."""
        native = self._native
        if max_width > 1 and native is not None and max_tokens > 0:
            return self._native_tree(native, max_tokens, max_width)
        ranked = self._ranked() if max_tokens > 0 else []
        if not ranked:
            self._cursor = None
            return Draft.empty()
        if max_width <= 1:
            return self._chain(min(ranked), max_tokens)
        candidates = self._candidates(ranked, self.config.tree_candidates)
        if len(candidates) == 1:
            _, source, pos, track = candidates[0]
            return self._copy(track, pos, source, max_tokens)
        return self._tree(candidates[: self.config.tree_candidates], max_tokens, max_width)

    def _native_tree(
        self, native: Callable[..., tuple[Any, ...]], max_nodes: int, max_width: int
    ) -> Draft:
        """:meth:`propose` of a tree, compiled: one call ranks the tracks, collects the
        candidates and builds the tree (or names the one candidate to copy a chain from)."""
        _, _, tail, tail_len = self._context.addresses()
        out = native((self._block_address, self._tracks, tail, tail_len, max_nodes, max_width))
        if len(out) == 5:
            tokens, parents, scores, sources, match = out
            self._last_tokens, self._last_tree = tokens, (parents, sources, match)
            self._last_children = None
            self._cursor = -1
            return Draft(tokens, parents, scores, sources)
        if out:
            track, pos, source = out
            return self._copy(self._tracks[track], pos, source, max_nodes)
        self._cursor = None
        return Draft.empty()

    def _ranked(self) -> list[tuple[float, int, int]]:
        """(minus the estimated rate, source, track number) of each track with an occurrence
        to copy from; the smallest is the best track. An occurrence at the very end of its
        source has nothing to copy and is skipped, so the next source drafts instead."""
        rows = self.acceptance.table
        bucket_of = self._bucket_of
        context, n_prompt = self._context, self._n_prompt
        out: list[tuple[float, int, int]] = []
        for i, track in enumerate(self._tracks):
            positions = track.positions
            if not positions:
                continue
            index = track.index
            size = index.size
            first = positions[0]
            if first >= size:
                first = next((p for p in positions if p < size), -1)
                if first < 0:
                    continue
            source: int = track.source
            if index is context and first >= n_prompt:
                source = Source.OUTPUT
            out.append((-rows[source][bucket_of[track.match]], source, i))
        return out

    def _occurrences(self, ranked: tuple[float, int, int]) -> list[Candidate]:
        """The candidates of one ranked track, best first (a context track's occurrences in
        the output may rate differently from those in the prompt)."""
        neg, source, i = ranked
        track = self._tracks[i]
        index = track.index
        size = index.size
        usable = [p for p in track.positions if p < size]
        if index is not self._context:
            return [(neg, source, p, track) for p in usable]
        n_prompt = self._n_prompt
        other = Source.PROMPT if source == Source.OUTPUT else Source.OUTPUT
        other_neg = -self.acceptance.rate(other, track.match)
        out = [
            (neg, source, p, track)
            if (p >= n_prompt) == (source == Source.OUTPUT)
            else (other_neg, other, p, track)
            for p in usable
        ]
        if len(out) > 1:
            out.sort(key=_rank)
        return out

    def _candidates(self, ranked: list[tuple[float, int, int]], at_least: int) -> list[Candidate]:
        """Occurrences of the best tracks (rate, then source priority, then track order),
        whole tracks at a time until there are ``at_least``; best first."""
        ranked.sort()
        tracks, context = self._tracks, self._context
        out: list[Candidate] = []
        for entry in ranked:
            track = tracks[entry[2]]
            if len(track.positions) == 1 and track.index is not context:  # the usual case
                out.append((entry[0], entry[1], track.positions[0], track))
            else:
                out += self._occurrences(entry)
            if len(out) >= at_least:
                break
        if len(out) > 1:
            out.sort(key=_rank)
        return out

    def _continuation(self, track: Track, pos: int, k: int) -> list[int]:
        """Up to k tokens after ``pos``; copies from the context repeat periodically."""
        tokens = track.index.slice(pos, pos + k)
        if track.index is self._context and 0 < len(tokens) < k:
            tokens = (tokens * (k // len(tokens) + 1))[:k]
        return tokens

    def _chain(self, best: tuple[float, int, int], k: int) -> Draft:
        """Copy from the best track; when its occurrences are equally rated and disagree,
        from one the majority agrees with (of two, the first)."""
        track = self._tracks[best[2]]
        source, pos = best[1], track.positions[0]
        if len(track.positions) > 1:
            if track.index is not self._context:  # occurrences rated alike
                size = track.index.size
                usable = [p for p in track.positions if p < size]
                pos = usable[0] if len(usable) < 3 else _majority(track.index, usable)
            else:
                candidates = self._occurrences(best)
                neg, source, pos, _ = candidates[0]
                same = [c[2] for c in candidates if c[0] == neg]
                if len(same) > 2:
                    pos = _majority(track.index, same)
                    source = next(c[1] for c in candidates if c[2] == pos)
        return self._copy(track, pos, source, k)

    def _copy(self, track: Track, pos: int, source: int, k: int) -> Draft:
        """A chain of up to k tokens copied from ``pos`` of ``track``."""
        index = track.index
        tokens = index.array(pos, pos + k)
        if index is self._context and 0 < len(tokens) < k:  # repeats periodically
            tokens = np.asarray(self._continuation(track, pos, k), np.int64)
        n = len(tokens)
        source = int(source)
        m0 = track.match
        self._last_tokens, self._last_tree = tokens, None
        self._last_source, self._last_m0 = source, m0
        self._cursor = -1 if n else None
        return Draft.copied_chain(tokens, self.acceptance.path_scores(source, m0, n), source)

    def _tree(self, candidates: list[Candidate], max_nodes: int, max_width: int) -> Draft:
        """Merge the best few continuations into a trie scored by path probability.

        Continuation c (best first) shares its first ``d`` tokens with the trie, ``d`` its
        longest common prefix with an earlier one; its other tokens become new nodes, a
        chain (node i + 1 is node i's child) hanging from the node it shares last. A
        node's weight sums the rates of the continuations through it; where the trie
        branches, a child's score is its parent's times its rate times its share of its
        siblings' weights, elsewhere its parent's times its rate. The draft is the
        ``max_nodes`` best nodes, at most ``max_width`` children each (scores never grow
        along a path, so best-first expansion is a sort), parents first."""
        rates = self.acceptance.rates
        tok: list[int] = []
        par: list[int] = []
        depth: list[int] = []
        owner: list[int] = []  # the continuation that created each node
        node_rate: list[float] = []
        branches: dict[int, list[int]] = {}  # node -> its children that start a chain
        conts: list[list[int]] = []
        common: list[list[int]] = []  # common[c][e]: common prefix of continuations c, e < c
        starts: list[int] = []  # depth of continuation c's first new node
        via: list[int] = []  # the earlier continuation it shares its first tokens with
        firsts: list[int] = []  # continuation c's first new node
        for c, (_, src, pos, track) in enumerate(candidates):
            tokens = self._continuation(track, pos, max_nodes if c == 0 else (max_nodes + 1) // 2)
            n = len(tokens)
            shared = [_common_prefix(tokens, other) for other in conts]
            d = max(shared, default=0)
            conts.append(tokens)
            common.append(shared)
            starts.append(d)
            via.append(shared.index(d) if d else -1)
            first = len(tok)
            firsts.append(first)
            if d == n:
                continue
            parent = _node_at(via[c], d - 1, firsts, starts, via) if d else -1
            if parent + 1 != first:  # ``parent`` has a chain child already: a branch
                branches.setdefault(parent, []).append(first)
            k, m0 = n - d, track.match
            tok += tokens[d:]
            par.append(parent)
            par += range(first, first + k - 1)
            depth += range(d, n)
            owner += [c] * k
            node_rate += rates(src, m0 + d, k)
        size = len(tok)
        negs = [cand[0] for cand in candidates]
        # shares of the children of branching nodes (parents precede children)
        share: dict[int, float] = {}
        kids_of: dict[int, list[int]] = {}
        for parent, extra in branches.items():
            nxt = parent + 1
            kids = [nxt, *extra] if nxt < size and par[nxt] == parent else extra
            weights = []
            for x in kids:
                a, j = owner[x], depth[x]
                w = 0.0 - negs[a]
                for c in range(a + 1, len(candidates)):
                    if common[c][a] > j:
                        w -= negs[c]
                weights.append(w)
            total = sum(weights)
            for x, w in zip(kids, weights, strict=True):
                share[x] = w / total
            kids_of[parent] = kids
        # scores: each run of only children multiplies on from the node that starts it
        score = [0.0] * size
        marks = sorted(share.keys() | {0})
        marks.append(size)
        for s, e in zip(marks, marks[1:], strict=False):
            p = par[s]
            start = (1.0 if p < 0 else score[p]) * node_rate[s] * share.get(s, 1.0)
            score[s:e] = accumulate(node_rate[s + 1 : e], mul, initial=start)
        # best-first expansion: the max_nodes best nodes, at most max_width children each
        nodes: Sequence[int] = range(size)
        crowded = [kids for kids in kids_of.values() if len(kids) > max_width]
        if crowded:
            out = bytearray(size)
            for kids in crowded:
                for x in sorted(kids, key=score.__getitem__, reverse=True)[max_width:]:
                    out[x] = 1
            for x in range(1, size):
                if par[x] >= 0 and out[par[x]]:
                    out[x] = 1
            nodes = [x for x in nodes if not out[x]]
        best = sorted(nodes, key=score.__getitem__, reverse=True)[:max_nodes]
        # parents before children, siblings by decreasing score (ties: creation order)
        order = sorted(best, key=depth.__getitem__)
        new_index = dict(zip(order, range(len(order)), strict=True))
        new_index[-1] = -1
        tokens = list(map(tok.__getitem__, order))
        parents = list(map(new_index.__getitem__, map(par.__getitem__, order)))
        sources = [int(candidates[owner[x]][1]) for x in order]
        match = [candidates[owner[x]][3].match + depth[x] for x in order]
        self._last_tokens, self._last_tree = tokens, (parents, sources, match)
        self._last_children = None
        self._cursor = -1
        return Draft(
            np.asarray(tokens, np.int64),
            np.asarray(parents, np.int32),
            np.asarray(list(map(score.__getitem__, order)), np.float32),
            np.asarray(sources, np.int8),
        )


def _majority(index: TokenIndex, positions: list[int]) -> int:
    """The first of the positions followed by the token most of them are followed by (the
    earliest such token on ties)."""
    votes: dict[int, list[int]] = {}
    for pos in positions:
        votes.setdefault(index.token(pos), []).append(pos)
    return max(votes.values(), key=len)[0]


def _common_prefix(a: list[int], b: list[int]) -> int:
    """Length of the longest common prefix of two token lists."""
    if not a or not b or a[0] != b[0]:
        return 0
    n = min(len(a), len(b))
    i = 1
    while i < n and a[i] == b[i]:
        i += 1
    return i


def _node_at(c: int, j: int, firsts: list[int], starts: list[int], via: list[int]) -> int:
    """The trie node of continuation c at depth j."""
    while j < starts[c]:
        c = via[c]
    return firsts[c] + j - starts[c]
