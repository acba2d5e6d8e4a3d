"""Charts are drawn off-screen (no display on servers and in CI): one set-up for all."""

from __future__ import annotations

from typing import Any


def pyplot() -> Any:
    """matplotlib.pyplot on the file-only Agg backend."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def texts_outside(fig: Any) -> list[str]:
    """The texts of `fig` drawn past its edges (what a saved PNG would cut off), as drawn:
    each axes' title, labels, legend and the tick labels in its view. Empty when everything
    is inside."""
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    box = fig.bbox

    def past(extent: Any) -> bool:
        return (
            extent.x0 < box.x0 - 1
            or extent.y0 < box.y0 - 1
            or extent.x1 > box.x1 + 1
            or extent.y1 > box.y1 + 1
        )

    texts = list(fig.texts)
    for ax in fig.axes:
        texts += [ax.title, ax.xaxis.label, ax.yaxis.label]
        legend = ax.get_legend()
        texts += list(legend.get_texts()) if legend else []
        for axis, (low, high) in ((ax.xaxis, ax.get_xlim()), (ax.yaxis, ax.get_ylim())):
            low, high = min(low, high), max(low, high)
            texts += [
                tick.label1
                for tick in axis.get_major_ticks()
                if low <= tick.get_loc() <= high and tick.label1.get_visible()
            ]
    return [
        t.get_text()
        for t in texts
        if t.get_visible() and t.get_text().strip() and past(t.get_window_extent(renderer))
    ]
