"""Small SVG charts rendered on the server (no script, no styles: presentation attributes
only, so the pages' Content-Security-Policy holds)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from html import escape

PALETTE = ("#2563eb", "#dc2626", "#16a34a", "#9333ea", "#ea580c", "#0891b2", "#4b5563")


def _number(value: float) -> str:
    return f"{value:.3g}" if value < 1000 else f"{value:,.0f}"


def line_chart(
    series: Mapping[str, Sequence[float]],
    *,
    title: str,
    width: int = 520,
    height: int = 160,
) -> str:
    """One polyline per series over equally spaced points, the y axis from 0 to the
    largest value, a legend under the plot."""
    left, right, top, bottom = 44, 8, 20, 22 + 14 * ((len(series) + 2) // 3)
    plot_w, plot_h = width - left - right, height - top - bottom
    peak = max((v for values in series.values() for v in values), default=0.0) or 1.0
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" role="img" viewBox="0 0 {width} {height}" '
        f'width="{width}" height="{height}" font-family="sans-serif" font-size="11">',
        f"<title>{escape(title)}</title>",
        f'<text x="{left}" y="13" fill="#111827" font-weight="bold">{escape(title)}</text>',
        f'<line x1="{left}" y1="{top + plot_h}" x2="{left + plot_w}" y2="{top + plot_h}" '
        'stroke="#9ca3af"/>',
        f'<line x1="{left}" y1="{top}" x2="{left}" y2="{top + plot_h}" stroke="#9ca3af"/>',
        f'<text x="{left - 4}" y="{top + 4}" text-anchor="end" fill="#4b5563">'
        f"{_number(peak)}</text>",
        f'<text x="{left - 4}" y="{top + plot_h}" text-anchor="end" fill="#4b5563">0</text>',
    ]
    for i, (name, values) in enumerate(series.items()):
        color = PALETTE[i % len(PALETTE)]
        step = plot_w / max(1, len(values) - 1)
        points = " ".join(
            f"{left + j * step:.1f},{top + plot_h - v / peak * plot_h:.1f}"
            for j, v in enumerate(values)
        )
        parts.append(f'<polyline points="{points}" fill="none" stroke="{color}" stroke-width="2"/>')
        lx = left + (i % 3) * (plot_w // 3)
        ly = top + plot_h + 16 + 14 * (i // 3)
        parts.append(f'<rect x="{lx}" y="{ly - 8}" width="10" height="10" fill="{color}"/>')
        parts.append(f'<text x="{lx + 14}" y="{ly + 1}" fill="#111827">{escape(name)}</text>')
    parts.append("</svg>")
    return "".join(parts)


def share_bar(
    share: float | None, *, title: str | None = None, width: int = 120, height: int = 14
) -> str:
    """A horizontal bar filled to ``share`` (0..1); an empty outline for None. ``title``
    (default: the share of output tokens from drafts) is its tooltip."""
    filled = 0.0 if share is None else max(0.0, min(1.0, share)) * width
    label = title or ("no output" if share is None else f"{share:.0%} of output tokens from drafts")
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" role="img" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}"><title>{escape(label)}</title>'
        f'<rect x="0" y="0" width="{width}" height="{height}" fill="#e5e7eb"/>'
        f'<rect x="0" y="0" width="{filled:.1f}" height="{height}" fill="#16a34a"/></svg>'
    )
