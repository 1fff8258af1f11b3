"""Point labels on a scatter that do not overlap each other, the markers or the figure's edge (greedy placement)."""

from __future__ import annotations

from dataclasses import dataclass

# where a label may go, tried in order: (dx, dy) in points from its point; the first ring sits beside the marker,
# the farther rings are drawn with a thin leader line back to the point
_NEAR = ((6, 4), (6, -4), (-6, 4), (-6, -4), (0, 9), (0, -9))
_RINGS = (18, 30, 44, 60)
_DIRECTIONS = ((1, 1), (1, -1), (-1, 1), (-1, -1), (0, 1), (0, -1), (1, 0), (-1, 0))
_PAD_PX = 2.0
_MARKER_PX = 9.0  # half the side of the box a marker is taken to cover (the best star is the largest)


@dataclass(frozen=True)
class Box:
    """An axis-aligned box in display pixels."""

    x0: float
    y0: float
    x1: float
    y1: float

    def overlap(self, other: Box) -> float:
        """Return the area this box shares with `other` (0 when they do not touch)."""
        w = min(self.x1, other.x1) - max(self.x0, other.x0)
        h = min(self.y1, other.y1) - max(self.y0, other.y0)
        return w * h if w > 0 and h > 0 else 0.0

    def inside(self, outer: Box) -> bool:
        """Return whether this box lies wholly within `outer`."""
        return self.x0 >= outer.x0 and self.y0 >= outer.y0 and self.x1 <= outer.x1 and self.y1 <= outer.y1


def _offsets() -> list[tuple[float, float]]:
    far = [(dx * r, dy * r) for r in _RINGS for dx, dy in _DIRECTIONS]
    return [*_NEAR, *far]


def _align(dx: float, dy: float) -> tuple[str, str]:
    return ("left" if dx > 0 else "right" if dx < 0 else "center"), (
        "bottom" if dy > 0 else "top" if dy < 0 else "center"
    )


def _box(anchor: tuple[float, float], size: tuple[float, float], offset: tuple[float, float], scale: float) -> Box:
    """Return the display box of a label of `size` (px) placed at `offset` (points) from `anchor` (px)."""
    (x, y), (w, h), (dx, dy) = anchor, size, offset
    x, y = x + dx * scale, y + dy * scale
    ha, va = _align(dx, dy)
    x0 = x if ha == "left" else x - w if ha == "right" else x - w / 2
    y0 = y if va == "bottom" else y - h if va == "top" else y - h / 2
    return Box(x0 - _PAD_PX, y0 - _PAD_PX, x0 + w + _PAD_PX, y0 + h + _PAD_PX)


def merge_coincident(
    labels: list[tuple[str, float, float]], anchors: list[tuple[float, float]], within_px: float = 3.0
) -> list[tuple[str, float, float, tuple[float, float]]]:
    """Merge labels whose points are drawn within `within_px` of each other into one multi-line label.

    Returns:
        [(text, x, y, anchor)] in the order of each group's first label; texts of a group joined by newlines.
    """
    groups: list[tuple[list[str], float, float, tuple[float, float]]] = []
    for (text, x, y), (ax_, ay) in zip(labels, anchors, strict=True):
        for texts, _, _, (gx, gy) in groups:
            if abs(gx - ax_) <= within_px and abs(gy - ay) <= within_px:
                texts.append(text)
                break
        else:
            groups.append(([text], x, y, (ax_, ay)))
    return [("\n".join(texts), x, y, anchor) for texts, x, y, anchor in groups]


def _crosses(segment: tuple[tuple[float, float], tuple[float, float]], box: Box, skip_px: float = 6.0) -> bool:
    """Return whether a leader line (from its point, the first `skip_px` left out) passes through `box`."""
    (x0, y0), (x1, y1) = segment
    length = max(abs(x1 - x0), abs(y1 - y0), 1.0)
    for k in range(1, 17):
        t = k / 16
        if t * length < skip_px:
            continue
        px, py = x0 + t * (x1 - x0), y0 + t * (y1 - y0)
        if box.x0 <= px <= box.x1 and box.y0 <= py <= box.y1:
            return True
    return False


def _choose(anchor, size, scale: float, bounds: Box, obstacles) -> tuple[float, float]:
    """Return the first offset whose label box hits nothing (else the one that hits least).

    `obstacles` is (boxes of markers and labels, boxes of labels, leader lines drawn so far): a label may not cover
    a marker or a label, and its own leader line may not cross a label, nor its box an earlier leader line.
    """
    taken, labels_taken, leaders = obstacles
    best, best_cost = (6.0, 4.0), float("inf")
    for offset in _offsets():
        box = _box(anchor, size, offset, scale)
        cost = sum(box.overlap(t) for t in taken) + (0.0 if box.inside(bounds) else 1e9)
        cost += 500.0 * sum(_crosses(line, box) for line in leaders)
        if offset not in _NEAR:
            end = (anchor[0] + offset[0] * scale, anchor[1] + offset[1] * scale)
            cost += 500.0 * sum(_crosses((anchor, end), t) for t in labels_taken)
        if cost < best_cost:
            best, best_cost = offset, cost
        if cost == 0.0:
            break
    return best


def place_labels(ax, labels: list[tuple[str, float, float]], fontsize: float = 8) -> list:
    """Annotate points of `ax` with `labels` [(text, x, y) in data coordinates], first ones first, without overlaps.

    Points drawn on the same spot share one label (one line each, in order). Each label takes the first position
    (beside its point, then on rings farther out with a leader line) that overlaps no marker, no label placed before
    it, and stays inside the figure; when none does, the position that overlaps least. The figure's layout must
    be final (draw it first): positions are computed in display pixels. The annotations are kept out of the layout
    so placing them cannot move the axes.

    Returns:
        The annotations, one per group of coincident points, in the order of `labels`.
    """
    fig = ax.figure
    renderer = fig.canvas.get_renderer()
    scale = fig.dpi / 72.0
    frame = fig.bbox
    bounds = Box(frame.x0, frame.y0, frame.x1, frame.y1)
    anchors = [(float(px), float(py)) for px, py in ax.transData.transform([(x, y) for _, x, y in labels])]
    taken = [Box(x - _MARKER_PX, y - _MARKER_PX, x + _MARKER_PX, y + _MARKER_PX) for x, y in anchors]
    labels_taken: list[Box] = []
    leaders: list[tuple[tuple[float, float], tuple[float, float]]] = []
    placed = []
    for text, x, y, anchor in merge_coincident(labels, anchors):
        probe = ax.text(0, 0, text, fontsize=fontsize)
        extent = probe.get_window_extent(renderer)
        probe.remove()
        size = (extent.width, extent.height)
        best = _choose(anchor, size, scale, bounds, (taken, labels_taken, leaders))
        box = _box(anchor, size, best, scale)
        taken.append(box)
        labels_taken.append(box)
        near = best in _NEAR
        if not near:
            leaders.append((anchor, (anchor[0] + best[0] * scale, anchor[1] + best[1] * scale)))
        ha, va = _align(*best)
        ann = ax.annotate(
            text,
            (x, y),
            textcoords="offset points",
            xytext=best,
            ha=ha,
            va=va,
            fontsize=fontsize,
            arrowprops=None if near else {"arrowstyle": "-", "color": "#888888", "lw": 0.6, "shrinkB": 4},
            zorder=4,
        )
        ann.set_in_layout(False)
        placed.append(ann)
    return placed
