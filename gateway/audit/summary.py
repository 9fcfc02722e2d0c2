"""The audit summary: per-group figures, speedup, break-even, quality, languages."""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Sequence
from typing import Any

from gateway.audit.client import RequestRecord
from gateway.audit.figures import (
    FORMULAS,
    group_stats,
    prefix_cache_stats,
    time_per_token,
    tokens_per_second,
)
from gateway.audit.quality import Checks
from gateway.records.evidence import make
from sdk.wire.audits import (
    AuditPlanInfo,
    AuditSummary,
    BreakEven,
    CheckCount,
    GroupStats,
    LanguageStats,
    Level,
    LevelIdentity,
    Lossless,
    MeasuredSpeedup,
    PrefixCacheStats,
    Quality,
    Speedup,
)
from sdk.wire.evidence import Evidence

BASELINE = "baseline"
DRAFTED = ("drafts", "no_prediction")
MEASURED_YES_SPEEDUP = 1.20
MEASURED_MAX_P = 0.05


def sign_test_p(faster: int, pairs: int) -> float:
    """One-sided sign test: the chance of at least ``faster`` of ``pairs`` coin flips."""
    return sum(math.comb(pairs, k) for k in range(faster, pairs + 1)) / 2**pairs if pairs else 1.0


def _by(
    records: Sequence[RequestRecord], key: Callable[[RequestRecord], Any]
) -> dict[Any, list[RequestRecord]]:
    groups: dict[Any, list[RequestRecord]] = defaultdict(list)
    for r in records:
        groups[key(r)].append(r)
    return dict(groups)


def _pairs(records: Sequence[RequestRecord]) -> list[tuple[str, RequestRecord, RequestRecord]]:
    """(drafted config, drafted request, baseline request) for the same item/setting/level/round."""
    base = {(r.item, r.setting, r.concurrency, r.round): r for r in records if r.config == BASELINE}
    return [
        (r.config, r, base[(r.item, r.setting, r.concurrency, r.round)])
        for r in records
        if r.config in DRAFTED and (r.item, r.setting, r.concurrency, r.round) in base
    ]


def comparisons(records: Sequence[RequestRecord]) -> tuple[list[Speedup], list[BreakEven]]:
    """Speedup and break-even per (category, concurrency, setting, drafted config), over the
    pairs where both requests finished."""
    cells: dict[tuple[str, int, str, str], list[tuple[RequestRecord, RequestRecord]]] = defaultdict(
        list
    )
    for config, with_, without in _pairs(records):
        if with_.ok() and without.ok():
            for category in (with_.category, "all"):
                cells[(category, with_.concurrency, with_.setting, config)].append((with_, without))
    speedups, break_even = [], []
    for (category, conc, setting, config), pairs in sorted(cells.items()):
        withs, withouts = [p[0] for p in pairs], [p[1] for p in pairs]
        tps_with, tps_without = tokens_per_second(withs), tokens_per_second(withouts)
        cell: dict[str, Any] = {
            "category": category,
            "concurrency": conc,
            "setting": setting,
            "config": config,
            "pairs": len(pairs),
        }
        speedups.append(
            Speedup(
                **cell,
                tok_s_with=tps_with,
                tok_s_without=tps_without,
                speedup=tps_with / tps_without if tps_with and tps_without else None,
                faster_pairs=sum(
                    1
                    for w, wo in pairs
                    if (w.output_tokens or 0) * (wo.e2e_s or 0)
                    > (wo.output_tokens or 0) * (w.e2e_s or 0)
                ),
            )
        )
        t_with, t_without = time_per_token(withs), time_per_token(withouts)
        pays: bool | None = None
        statement = "not enough tokens to compare"
        if t_with is not None and t_without is not None:
            pays = t_with < t_without
            statement = (
                f"drafts {'pay' if pays else 'do NOT pay'}: {t_with * 1e3:.2f} ms/token with "
                f"vs {t_without * 1e3:.2f} without"
            )
        break_even.append(
            BreakEven(
                **cell, t_with_s=t_with, t_without_s=t_without, pays=pays, statement=statement
            )
        )
    return speedups, break_even


def lossless(records: Sequence[RequestRecord], expected: bool) -> list[Lossless]:
    """Per category and drafted config: how many answers equal the answer without drafts."""
    cells: dict[tuple[str, str, str], list[bool]] = defaultdict(list)
    for config, with_, without in _pairs(records):
        if with_.ok() and without.ok():
            cells[(with_.category, config, with_.setting)].append(with_.text == without.text)
    return [
        Lossless(
            category=cat,
            config=config,
            setting=setting,
            pairs=len(same),
            identical=sum(same),
            expected_identical=expected,
            mismatch=expected and not all(same),
        )
        for (cat, config, setting), same in sorted(cells.items())
    ]


def identical_to_first_level(records: Sequence[RequestRecord]) -> list[LevelIdentity]:
    """Per config, setting and level: answers equal to the ``baseline`` answer of the same
    item, round and setting at the lowest concurrency level (batching must not change them)."""
    ok = [r for r in records if r.ok()]
    if not ok:
        return []
    low = min(r.concurrency for r in ok)
    reference = {
        (r.item, r.round, r.setting): r.text
        for r in ok
        if r.config == BASELINE and r.concurrency == low
    }
    cells: dict[tuple[str, str, int], list[bool]] = defaultdict(list)
    for r in ok:
        expected = reference.get((r.item, r.round, r.setting))
        if expected is not None:
            cells[(r.config, r.setting, r.concurrency)].append(r.text == expected)
    return [
        LevelIdentity(
            config=config, setting=setting, concurrency=conc, pairs=len(same), identical=sum(same)
        )
        for (config, setting, conc), same in sorted(cells.items())
    ]


def quality(records: Sequence[RequestRecord], checks: dict[int, Checks]) -> list[Quality]:
    """Pass/fail counts of every quality check per category and config."""
    cells: dict[tuple[str, str], dict[str, CheckCount]] = defaultdict(
        lambda: defaultdict(CheckCount)
    )
    truncated: dict[tuple[str, str], int] = defaultdict(int)
    for i, r in enumerate(records):
        if not r.ok():
            continue
        truncated[(r.category, r.config)] += int(r.finish_reason == "length")
        for name, result in checks.get(i, {}).items():
            if result is not None:
                count = cells[(r.category, r.config)][name]
                if result:
                    count.passed += 1
                else:
                    count.failed += 1
    return [
        Quality(
            category=cat,
            config=config,
            checks=dict(c),
            truncated_at_max_tokens=truncated[(cat, config)],
        )
        for (cat, config), c in sorted(cells.items())
    ]


def languages(records: Sequence[RequestRecord]) -> list[LanguageStats]:
    """Per language and config: acceptance, tokens/s and characters per token."""
    out = []
    for (lang, config), group in sorted(
        _by([r for r in records if r.language], lambda r: (r.language, r.config)).items()
    ):
        stats = group_stats(group, config=config, setting="", concurrency=0, category="")
        out.append(
            LanguageStats(
                language=lang,
                config=config,
                requests=stats.requests,
                acceptance_rate=stats.acceptance.rate,
                output_tok_s=stats.output_tok_s,
                chars_per_token=stats.chars_per_token,
            )
        )
    return out


def prefix_cache(records: Sequence[RequestRecord]) -> list[PrefixCacheStats]:
    """Per config and concurrency level: the prefix hit rate and TTFT with and without hits
    (none when no answer reported its prompt tokens)."""
    out = [
        prefix_cache_stats(group, config=config, concurrency=conc)
        for (config, conc), group in sorted(
            _by(records, lambda r: (r.config, r.concurrency)).items()
        )
    ]
    return [s for s in out if s.requests_reporting]


def groups(records: Sequence[RequestRecord]) -> list[GroupStats]:
    """Per (config, setting, concurrency, category), then per (config, setting, concurrency)
    over every category (``all``)."""
    out = [
        group_stats(group, config=config, setting=setting, concurrency=conc, category=category)
        for (config, setting, conc, category), group in sorted(
            _by(records, lambda r: (r.config, r.setting, r.concurrency, r.category)).items()
        )
    ]
    out += [
        group_stats(group, config=config, setting=setting, concurrency=conc, category="all")
        for (config, setting, conc), group in sorted(
            _by(records, lambda r: (r.config, r.setting, r.concurrency)).items()
        )
    ]
    return out


def measured_speedup(speedups: Sequence[Speedup]) -> MeasuredSpeedup | None:
    """The ``drafts`` config over all categories at the lowest concurrency: speedup, pairs,
    and the pairs where the drafted request was faster (tokens per second)."""
    rows = [s for s in speedups if s.category == "all" and s.config == "drafts" and s.speedup]
    if not rows:
        return None
    low = min(s.concurrency for s in rows)
    row = min((s for s in rows if s.concurrency == low), key=lambda s: s.setting)
    assert row.speedup is not None
    return MeasuredSpeedup(
        speedup=row.speedup,
        pairs=row.pairs,
        faster_pairs=row.faster_pairs,
        concurrency=row.concurrency,
        setting=row.setting,
    )


def measured_evidence(speedups: Sequence[Speedup]) -> Evidence:
    """The audit's evidence for the endpoint's record. ``yes`` needs a clear and consistent
    difference: speedup >= 1.2 and the drafted request faster in enough pairs that chance
    is ruled out (one-sided sign test p <= 0.05, so at least 5 pairs). No difference proves
    nothing either way (``unknown``)."""
    m = measured_speedup(speedups)
    if m is None:
        return make("measured", "audit", "unknown", "no finished with/without pairs to compare")
    p = sign_test_p(m.faster_pairs, m.pairs)
    values = {
        "speedup": m.speedup,
        "pairs": float(m.pairs),
        "faster_pairs": float(m.faster_pairs),
        "sign_test_p": p,
    }
    detail = (
        f"audit speedup with vs without drafts {m.speedup:.2f}x at concurrency "
        f"{m.concurrency}; faster in {m.faster_pairs}/{m.pairs} pairs (sign test p={p:.3f})"
    )
    if m.speedup >= MEASURED_YES_SPEEDUP and p <= MEASURED_MAX_P:
        return make("measured", "audit", "yes", detail, values)
    return make("measured", "audit", "unknown", detail + ": no clear difference", values)


def summarize(
    records: Sequence[RequestRecord],
    checks: dict[int, Checks],
    *,
    plan: AuditPlanInfo,
    levels: list[Level],
    setup_errors: dict[str, int],
    memory: dict[str, Any] | None,
    lossless_expected: bool,
) -> AuditSummary:
    """The whole summary written to audit.json and rendered in report.md."""
    speedups, break_even = comparisons(records)
    errors: dict[str, int] = defaultdict(int)
    for r in records:
        if r.error:
            errors[r.error] += 1
    return AuditSummary(
        plan=plan,
        formulas=FORMULAS,
        levels=levels,
        groups=groups(records),
        speedup=speedups,
        break_even=break_even,
        quality=quality(records, checks),
        lossless=lossless(records, lossless_expected),
        identical_to_first_level=identical_to_first_level(records),
        languages=languages(records),
        prefix_cache=prefix_cache(records),
        errors=dict(errors),
        setup_errors=setup_errors,
        requests=len(records),
        memory=memory,
        measured_evidence=measured_evidence(speedups),
    )
