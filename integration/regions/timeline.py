"""Draw a leadership timeline PNG: regions as lanes; leadership, claims, runs, faults, takeovers.

Usage::

    draw_timeline(report, observer, history, regions=["us-east-1", "eu-west-1"], path="t.png")

Per region lane, one row per date: a thin bar while the region's member led the date's role
(observed group assignment), a thick bar while its Spark job ran (label: fencing token);
markers for ledger records (claim ▲, completed ●, failed ✕), the injected fault (red
lightning) and the fence (the region's task failing with the fencing reason); an arrow from
each fault to the other region's takeover claim.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from integration.regions.evidence import Observer, Report

_COLORS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#17becf"]


def draw_timeline(
    report: Report,
    observer: Observer,
    history: Sequence[Any],
    regions: Sequence[str],
    path: str | Path,
    *,
    title: str = "Leadership timeline",
    fences: Sequence[tuple[str, str, float]] = (),
) -> Path:
    """Write the PNG to ``path`` and return it. ``fences``: (region, date, epoch) of fenced
    task failures."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    dates = [d.date for d in report.dates]
    color = {d: _COLORS[i % len(_COLORS)] for i, d in enumerate(dates)}
    t0 = report.started_at
    rows = len(dates)
    lane = {r: i for i, r in enumerate(regions)}

    def y(region: str, date: str) -> float:
        base = (len(regions) - 1 - lane[region]) * (rows + 1)
        return base + (rows - 1 - dates.index(date))

    keys = {d.run_key: d.date for d in report.dates}
    fig_h = 1.2 + 0.45 * len(regions) * (rows + 1)
    fig, ax = plt.subplots(figsize=(13, max(3.5, fig_h)))
    for span in observer.leadership:
        if span.region in lane and span.date in color:
            ax.barh(y(span.region, span.date), max(span.end - span.start, 0.25),
                    left=span.start - t0, height=0.18, color=color[span.date], alpha=0.55)
    for span in observer.executions:
        if span.region in lane and span.date in color:
            ax.barh(y(span.region, span.date), max(span.end - span.start, 0.25),
                    left=span.start - t0, height=0.6, color=color[span.date], alpha=0.9,
                    edgecolor="black", linewidth=0.6)
            ax.text(span.start - t0 + 0.3, y(span.region, span.date), f"token {span.token}",
                    va="center", fontsize=7, color="white", fontweight="bold")
    markers = {"CLAIMED": ("^", "black"), "COMPLETED": ("o", "green"), "FAILED": ("x", "red")}
    for record in history:
        date = keys.get(record.run_key)
        state = str(record.state)
        if date is None or record.deployment not in lane or state not in markers:
            continue
        marker, edge = markers[state]
        ax.plot(record.at - t0, y(record.deployment, date) + 0.38, marker=marker, color=edge,
                markersize=6, linestyle="none")
    for fault in report.faults:
        if fault.region in lane and fault.date in color:
            yy = y(fault.region, fault.date)
            ax.plot(fault.at - t0, yy, marker="$\u26a1$", color="red", markersize=16)
            ax.annotate(fault.kind, (fault.at - t0, yy - 0.45), fontsize=7, color="red",
                        ha="center")
            if fault.resumed_at is not None:
                ax.plot([fault.at - t0, fault.resumed_at - t0], [yy - 0.32, yy - 0.32],
                        color="red", linestyle=":", linewidth=1.5)
    for region, date, at in fences:
        if region in lane and date in color:
            ax.plot(at - t0, y(region, date), marker="X", color="darkred", markersize=10)
            ax.annotate("fenced", (at - t0, y(region, date) + 0.3), fontsize=7,
                        color="darkred", ha="center")
    for outcome in report.dates:
        for fault in report.faults:
            if fault.date != outcome.date:
                continue
            later = [c for c in outcome.claims if c[2] > fault.at]
            if later and later[0][0] in lane and fault.region in lane:
                ax.annotate(
                    "", xy=(later[0][2] - t0, y(later[0][0], outcome.date)),
                    xytext=(fault.at - t0, y(fault.region, outcome.date)),
                    arrowprops={"arrowstyle": "->", "color": "red", "lw": 1.4,
                                "connectionstyle": "arc3,rad=0.2"},
                )
                ax.annotate(f"takeover {later[0][2] - fault.at:.1f} s",
                            ((fault.at + later[0][2]) / 2 - t0,
                             (y(fault.region, outcome.date) + y(later[0][0], outcome.date)) / 2),
                            fontsize=8, color="red", ha="center")
    ticks, labels = [], []
    for region in regions:
        for date in dates:
            ticks.append(y(region, date))
            labels.append(f"{region}  {date}")
    ax.set_yticks(ticks, labels, fontsize=8)
    for region in regions[1:]:
        ax.axhline((len(regions) - lane[region]) * (rows + 1) - 1, color="grey", linewidth=0.8)
    ax.set_xlabel("seconds since the runs were triggered")
    ax.set_title(
        f"{title}: duplicates={report.duplicates}, lost={report.lost}", fontsize=11
    )
    ax.grid(axis="x", alpha=0.3)
    legend = [Patch(color=color[d], label=d) for d in dates] + [
        Line2D([], [], color="grey", linewidth=3, alpha=0.6, label="leads the role"),
        Patch(facecolor="grey", edgecolor="black", label="Spark job (token)"),
        Line2D([], [], marker="^", color="black", linestyle="none", label="claim"),
        Line2D([], [], marker="o", color="green", linestyle="none", label="COMPLETED"),
        Line2D([], [], marker="x", color="red", linestyle="none", label="FAILED record"),
        Line2D([], [], marker="$\u26a1$", color="red", linestyle="none", markersize=10,
               label="fault injected"),
        Line2D([], [], marker="X", color="darkred", linestyle="none", label="task fenced"),
    ]
    ax.legend(handles=legend, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8)
    fig.tight_layout()
    out = Path(path)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
