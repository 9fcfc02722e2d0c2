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

import heapq
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from lookup.acceptance import AcceptanceModel
from lookup.draft import Draft, Source
from lookup.index import TokenIndex
from lookup.tracks import Track


@dataclass(frozen=True)
class DrafterConfig:
    """Tuning knobs of the drafter."""

    candidates: int = 8  # occurrences kept per source
    max_match: int = 32  # match lengths are counted up to this (the longest bucket)
    tree_candidates: int = 4  # distinct continuations merged into a tree


class Candidate(NamedTuple):
    """An occurrence to copy from: a position in a track's source with tokens after it."""

    neg_rate: float  # minus the estimated acceptance rate of its first token
    source: Source
    position: int  # continuation start in ``track.index`` (always < its length)
    track: Track


def _rank(item: tuple[float, Source, Any, Any]) -> tuple[float, int]:
    return item[0], item[1]


class _Nodes(NamedTuple):
    """Draft nodes as lists (cheap to build and to walk)."""

    tokens: list[int]
    parents: list[int]
    scores: list[float]
    sources: list[int]
    match: list[int]  # match length each node's estimate was taken at


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
        self._last_parents: Sequence[int] = []
        self._last_sources: Sequence[int] = []
        self._last_match: Sequence[int] = []
        self._last_children: dict[int, list[int]] | None = None
        self._cursor: int | None = None

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
        if isinstance(self._last_parents, range):  # a chain: node i + 1 follows node i
            children = [node + 1] if node + 1 < len(self._last_parents) else None
        else:
            if self._last_children is None:
                self._last_children = {}
                for child, parent in enumerate(self._last_parents):
                    self._last_children.setdefault(parent, []).append(child)
            children = self._last_children.get(node)
        if not children:
            self._cursor = None
            return
        tokens = self._last_tokens
        first = children[0]
        self.acceptance.observe(
            self._last_sources[first], self._last_match[first], int(tokens[first]) == token
        )
        self._cursor = next((c for c in children if int(tokens[c]) == token), None)

    # -- proposing -----------------------------------------------------------------------

    def propose(self, max_tokens: int, max_width: int = 1) -> Draft:
        """A chain (``max_width == 1``) or a small tree of at most ``max_tokens`` nodes."""
        wanted = 1 if max_width <= 1 else self.config.tree_candidates
        candidates = self._candidates(wanted) if max_tokens > 0 else []
        if not candidates:
            self._remember([], range(-1, -1), [], range(0))
            return Draft.empty()
        if max_width <= 1 or len(candidates) == 1:
            return self._chain(candidates, max_tokens)
        nodes = self._tree(candidates, max_tokens, max_width)
        self._remember(nodes.tokens, nodes.parents, nodes.sources, nodes.match)
        return Draft(
            np.asarray(nodes.tokens, np.int64),
            np.asarray(nodes.parents, np.int32),
            np.asarray(nodes.scores, np.float32),
            np.asarray(nodes.sources, np.int8),
        )

    def _remember(
        self,
        tokens: Sequence[int] | np.ndarray,
        parents: Sequence[int],
        sources: Sequence[int],
        match: Sequence[int],
    ) -> None:
        """Keep the proposal for :meth:`_learn` (``parents`` a range: a chain)."""
        self._last_tokens = tokens
        self._last_parents = parents
        self._last_sources = sources
        self._last_match = match
        self._last_children = None
        self._cursor = -1 if len(tokens) else None

    def _candidates(self, at_least: int) -> list[Candidate]:
        """Occurrences of the best sources (rate, then source priority), whole sources at a
        time until there are ``at_least``; best first. An occurrence at the very end of its
        source has nothing to copy and is skipped, so the next source drafts instead."""
        rate = self.acceptance.rate
        context = self._context
        ranked: list[tuple[float, Source, Track, list[int]]] = []
        for track in self._tracks:
            positions = track.positions
            if not positions:
                continue
            size = len(track.index)
            usable = [p for p in positions if p < size]
            if usable:
                source = self._source_at(track, usable[0])
                ranked.append((-rate(source, track.match), source, track, usable))
        if len(ranked) > 1:
            ranked.sort(key=_rank)
        out: list[Candidate] = []
        for r, source, track, usable in ranked:
            if track.index is context:
                for pos in usable:
                    src = self._source_at(track, pos)
                    neg = r if src is source else -rate(src, track.match)
                    out.append(Candidate(neg, src, pos, track))
            else:
                out += [Candidate(r, source, pos, track) for pos in usable]
            if len(out) >= at_least:
                break
        if len(out) > 1:
            out.sort(key=_rank)
        return out

    def _source_at(self, track: Track, pos: int) -> Source:
        if track.index is self._context and pos >= self._n_prompt:
            return Source.OUTPUT
        return track.source

    def _continuation(self, cand: Candidate, k: int) -> list[int]:
        """Up to k tokens after the occurrence; copies from the context repeat periodically."""
        pos, track = cand.position, cand.track
        tokens = track.index.slice(pos, pos + k)
        if track.index is self._context and 0 < len(tokens) < k:
            tokens = (tokens * (k // len(tokens) + 1))[:k]
        return tokens

    def _chain(self, candidates: list[Candidate], k: int) -> Draft:
        best = candidates[0]
        if len(candidates) > 1:
            same = [c for c in candidates if c.track is best.track and c.neg_rate == best.neg_rate]
            if len(same) > 1:  # equally good occurrences disagree: follow the majority
                votes: dict[int, list[Candidate]] = {}
                for c in same:
                    votes.setdefault(c.track.index.token(c.position), []).append(c)
                best = max(votes.values(), key=len)[0]
        index, pos = best.track.index, best.position
        tokens = index.array(pos, pos + k)
        if index is self._context and 0 < len(tokens) < k:  # repeats periodically
            tokens = np.asarray(self._continuation(best, k), np.int64)
        n = len(tokens)
        source = int(best.source)
        m0 = best.track.match
        self._remember(tokens, range(-1, n - 1), [source] * n, range(m0, m0 + n))
        return Draft.copied_chain(tokens, self.acceptance.path_scores(source, m0, n), source)

    def _tree(self, candidates: list[Candidate], max_nodes: int, max_width: int) -> _Nodes:
        """Merge the best few continuations into a trie scored by path probability.

        A continuation walks the trie while it agrees with it, then the rest of it becomes
        a new chain of nodes: node i's child along its chain is node i + 1 (when its parent
        is i); only the children added where a later continuation branches off are kept
        in ``branches``."""
        rates = self.acceptance.rates
        # trie nodes: token, parent, weight (sum of candidate rates through it), depth, and
        # the rate, source and match length of the candidate that created it
        tok: list[int] = []
        par: list[int] = []
        weight: list[float] = []
        depth: list[int] = []
        node_rate: list[float] = []
        source: list[int] = []
        match: list[int] = []
        branches: dict[int, dict[int, int]] = {}

        def children(node: int) -> list[int]:
            """A node's children in creation order (its chain child first)."""
            out = [node + 1] if node + 1 < len(par) and par[node + 1] == node else []
            extra = branches.get(node)
            return out + list(extra.values()) if extra else out

        for rank, cand in enumerate(candidates[: self.config.tree_candidates]):
            # alternatives rarely win deep nodes: copy half as far for them
            length = max_nodes if rank == 0 else (max_nodes + 1) // 2
            tokens = self._continuation(cand, length)
            neg = cand.neg_rate
            node, d, n = -1, 0, len(tokens)
            while d < n:  # follow the nodes an earlier continuation made
                token = tokens[d]
                nxt = node + 1
                if nxt < len(par) and par[nxt] == node and tok[nxt] == token:
                    child: int | None = nxt
                else:
                    child = branches.get(node, {}).get(token)
                if child is None:
                    break
                weight[child] -= neg
                node, d = child, d + 1
            if d == n:
                continue
            first = len(tok)
            if node + 1 != first:  # ``node`` has a chain child already: a branch
                branches.setdefault(node, {})[tokens[d]] = first
            src, m0, k = int(cand.source), cand.track.match, n - d
            tok += tokens[d:]
            par += [node, *range(first, first + k - 1)]
            weight += [0.0 - neg] * k
            depth += range(d, n)
            node_rate += rates(src, m0 + d, k)
            source += [src] * k
            match += range(m0 + d, m0 + n)
        score = [0.0] * len(tok)
        totals: dict[int, float] = {}  # summed weight of each branching node's children
        for i, parent in enumerate(par):  # parents precede children
            if parent in branches or parent < 0:
                total = totals.get(parent)
                if total is None:
                    total = totals[parent] = sum(weight[c] for c in children(parent))
                share = weight[i] / total
            else:  # an only child
                share = 1.0  # weight / weight, exactly
            base = 1.0 if parent < 0 else score[parent]
            score[i] = base * node_rate[i] * share
        # best-first expansion: the max_nodes best nodes, at most max_width children each
        order: list[int] = []
        heap = sorted((-score[c], c) for c in children(-1))[:max_width]
        heapq.heapify(heap)
        while heap and len(order) < max_nodes:
            _, node = heapq.heappop(heap)
            order.append(node)
            kids = children(node)
            if len(kids) == 1:
                heapq.heappush(heap, (-score[kids[0]], kids[0]))
            elif kids:
                for item in sorted((-score[c], c) for c in kids)[:max_width]:
                    heapq.heappush(heap, item)
        # parents before children, siblings by decreasing score
        order.sort(key=lambda i: (depth[i], -score[i], i))
        new_index = {old: new for new, old in enumerate(order)}
        new_index[-1] = -1
        return _Nodes(
            [tok[i] for i in order],
            [new_index[par[i]] for i in order],
            [score[i] for i in order],
            [source[i] for i in order],
            [match[i] for i in order],
        )
