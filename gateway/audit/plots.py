"""PNG plots of an audit (matplotlib, the ``report`` extra, imported lazily)."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

from sdk.wire.endpoints import AuditResult


def _pyplot() -> Any:
    try:
        import matplotlib
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise RuntimeError("plots need matplotlib: pip install 'draftgate[report]'") from exc
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _distributions(result: AuditResult, field: str, title: str, path: Path) -> None:
    plt = _pyplot()
    series: dict[str, list[float]] = defaultdict(list)
    for r in result.records:
        if r.get("error") is None and r.get(field) is not None:
            key = f"{r['config']} c={r['concurrency']}" + (
                "" if r["setting"] == "default" else f" {r['setting']}"
            )
            series[key].append(r[field] * 1e3)
    fig, ax = plt.subplots(figsize=(7, 3.6), dpi=80)
    labels = sorted(series)
    if labels:
        ax.boxplot([series[k] for k in labels], orientation="horizontal", showfliers=True)
        ax.set_yticks(range(1, len(labels) + 1), labels)
    ax.set_xlabel("ms")
    ax.set_title(title)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def _speedup(result: AuditResult, path: Path) -> None:
    plt = _pyplot()
    rows = [r for r in result.summary.speedup if r.config == "drafts" and r.speedup]
    categories = sorted({r.category for r in rows})
    levels = sorted({(r.concurrency, r.setting) for r in rows})
    fig, ax = plt.subplots(figsize=(7, 3.6), dpi=80)
    width = 0.8 / max(1, len(levels))
    for n, (conc, setting) in enumerate(levels):
        values = {
            r.category: r.speedup or 0.0
            for r in rows
            if (r.concurrency, r.setting) == (conc, setting)
        }
        xs = [i + n * width for i in range(len(categories))]
        label = f"c={conc}" + ("" if setting == "default" else f" {setting}")
        ax.bar(xs, [values.get(c, 0.0) for c in categories], width, label=label)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks([i + width * (len(levels) - 1) / 2 for i in range(len(categories))], categories)
    ax.set_ylabel("speedup (tok/s with / without)")
    ax.set_title("Speedup with drafts by category and concurrency")
    if levels:
        ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def write_plots(result: AuditResult, out: Path, fmt: str = "png") -> list[str]:
    """Write the plots into ``out`` as ``fmt`` (``png`` or ``svg``); returns their file names."""
    names = [f"{name}.{fmt}" for name in ("ttft", "tpot", "speedup")]
    _distributions(result, "ttft_s", "TTFT per configuration", out / names[0])
    _distributions(result, "tpot_s", "TPOT per configuration", out / names[1])
    _speedup(result, out / names[2])
    return names
