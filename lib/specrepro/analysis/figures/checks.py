"""What a reviewer sees wrong in a drawn figure, found by measuring it.

Design:
- `problems(fig)` lays the figure out (a draw), then measures its artists in display
  coordinates and returns one sentence per fault, empty when it is clean:
  - **clipped**: a title, axis label, legend or text whose extent passes the figure's edge;
  - **overlapping**: two such texts (titles, axis labels, legends, tick labels) whose extents
    intersect, and two tick labels of one axis closer than a space (they **run together**:
    "75%rep. 4-grams" reads as one label); a rotated text is measured as the rotated
    rectangle it is drawn in (its unrotated extent turned about its centre), not as the
    upright box around it, so slanted category labels overlap only where their boxes do;
  - **listed, not drawn**: a legend entry whose series has no finite point in any panel (the
    article's diamond plotted at NaN, a proxy handle with no data);
  - **across a missing level**: a line joining two levels of its panel's x axis while another
    series in that panel has a point at a level between them (the line claims a value it
    never had there);
  - **unmarked**: a series drawn from data a verdict calls not testable or not resolvable
    here, drawn as a result. The figure code says which series those are where it picks a
    panel's metric (`declare_untested(ax, {label: reason})`, a registry on the axes: the
    verdict knows it, the pixels do not); the check then asks the pixels whether each such
    series is marked (grey, hatched, or in a panel hatched whole by a patch whose gid
    starts with `PANEL_MARK`) and whether its reason is written in the legend or a text.
- Tick labels are in both checks: matplotlib thins the ticks of a numeric axis itself, but
  the fixed labels of a category axis (arms, workload and level) run into each other when
  they are long. One pixel of slack absorbs rounding.
- Imports matplotlib only: it judges pictures, not data.
"""

from __future__ import annotations

import itertools
import math

from matplotlib.collections import PathCollection
from matplotlib.container import BarContainer
from matplotlib.lines import Line2D
from matplotlib.patches import Rectangle
from matplotlib.text import Text

SLACK_PX = 1.0
TICK_GAP_PX = 4.0  # two tick labels of one axis closer than this (a space at 7 pt) read as one
KEY = "key|"  # a legend key's gid: this, then the gid prefix of the group it explains
REGISTRY = "_specrepro_untested"  # the axes attribute: {series label: why it is untested}
PANEL_MARK = "untested-panel|"  # a hatched patch with this gid marks its whole panel
GREY_SPREAD = 0.06  # a colour whose RGB channels differ by less than this reads as grey


def _label(t: Text) -> str:
    s = t.get_text().replace("\n", " ")
    return s if len(s) <= 50 else s[:47] + "..."


def _named_texts(fig) -> list[tuple[str, object]]:
    """(what, artist) of every text a reader reads as a unit: titles, axis labels, legends,
    free texts; tick labels separately marked."""
    out: list[tuple[str, object]] = []
    if fig._suptitle is not None:
        out.append(("figure title", fig._suptitle))
    out += [("figure text", t) for t in fig.texts if t is not fig._suptitle]
    out += [("legend", leg) for leg in fig.legends]
    for i, ax in enumerate(fig.axes):
        p = f"panel {i + 1}"
        out += [(f"{p} title", t) for t in (ax.title, ax._left_title, ax._right_title)]
        out += [(f"{p} x label", ax.xaxis.label), (f"{p} y label", ax.yaxis.label)]
        out += [(f"{p} text", t) for t in ax.texts]
        if ax.get_legend() is not None:
            out.append((f"{p} legend", ax.get_legend()))
        for xy, axis in (("x", ax.xaxis), ("y", ax.yaxis)):  # drawn: inside the view limits
            if ax.axison and axis.get_visible():  # a panel of text turns its axes off
                out += [(f"{p} {xy} tick label", t.label1) for t in axis._update_ticks()
                        if t.label1.get_visible()]
    return [(w, a) for w, a in out if a.get_visible()
            and (not isinstance(a, Text) or a.get_text().strip())]


def _what(what: str, artist) -> str:
    return f"{what} '{_label(artist)}'" if isinstance(artist, Text) else what


def clipped(fig, renderer) -> list[str]:
    fb = fig.bbox
    out = []
    for what, a in _named_texts(fig):
        bb = a.get_window_extent(renderer)
        sides = [side for side, past in (
            ("left", fb.x0 - bb.x0), ("right", bb.x1 - fb.x1),
            ("bottom", fb.y0 - bb.y0), ("top", bb.y1 - fb.y1)) if past > SLACK_PX]
        if sides:
            out.append(f"clipped: {_what(what, a)} passes the figure's {' and '.join(sides)} "
                       "edge")
    return out


def overlapping(fig, renderer) -> list[str]:
    """Texts whose extents share more than the slack; two tick labels of one axis also when
    they are closer than TICK_GAP_PX (they read as one label)."""
    items = [(w, a) for w, a in _named_texts(fig)]
    tight = [_box(a, renderer, -SLACK_PX) for _, a in items]
    spaced = [_box(a, renderer, TICK_GAP_PX) if "tick label" in w else None for w, a in items]
    out = []
    for i, (w1, a1) in enumerate(items):
        for j in range(i + 1, len(items)):
            w2, a2 = items[j]
            if w1 == w2 and spaced[i] is not None:  # the same axis's labels
                if _intersect(spaced[i], spaced[j]):
                    gap = "overlapping" if _intersect(tight[i], tight[j]) else "run together"
                    out.append(f"{gap}: {_what(w1, a1)} and '{_label(a2)}' (under "
                               f"{TICK_GAP_PX:g} px apart)")
            elif _intersect(tight[i], tight[j]):
                out.append(f"overlapping: {_what(w1, a1)} and {_what(w2, a2)}")
    return out


def _box(artist, renderer, grow: float = 0.0) -> list[tuple[float, float]]:
    """The corners of the rectangle `artist` is drawn in (display px), its sides moved out by
    half of `grow` (in by half the slack with a negative one, so two overlap where they share
    more than it; out by half a gap, so two touch where they are closer than it): a rotated
    text's unrotated extent turned by its angle about the centre of its upright extent (the
    centre of a rectangle's bounding box is its own)."""
    bb = artist.get_window_extent(renderer)
    w, h, angle = bb.width, bb.height, 0.0
    if isinstance(artist, Text) and artist.get_rotation() % 180:
        angle = math.radians(artist.get_rotation())
        artist.set_rotation(0)
        upright = artist.get_window_extent(renderer)
        artist.set_rotation(math.degrees(angle))
        w, h = upright.width, upright.height
    cx, cy = (bb.x0 + bb.x1) / 2, (bb.y0 + bb.y1) / 2
    hw, hh = max((w + grow) / 2, 0.0), max((h + grow) / 2, 0.0)
    c, s = math.cos(angle), math.sin(angle)
    return [(cx + dx * c - dy * s, cy + dx * s + dy * c)
            for dx, dy in ((-hw, -hh), (hw, -hh), (hw, hh), (-hw, hh))]


def _intersect(p: list, q: list) -> bool:
    """Whether two convex quadrilaterals overlap (separating axis theorem: they do not when
    the projections on some edge's normal are apart)."""
    for poly in (p, q):
        for (x1, y1), (x2, y2) in zip(poly, poly[1:] + poly[:1], strict=True):
            nx, ny = y1 - y2, x2 - x1
            a = [nx * x + ny * y for x, y in p]
            b = [nx * x + ny * y for x, y in q]
            if max(a) <= min(b) or max(b) <= min(a):
                return False
    return True


def _finite_points(handle) -> int:
    """How many finite points the artist a legend entry stands for has drawn."""
    if isinstance(handle, Line2D):
        if handle.axes is None:
            return 0
        return sum(1 for x, y in zip(handle.get_xdata(orig=False),
                                     handle.get_ydata(orig=False), strict=False)
                   if _finite(x) and _finite(y))
    if isinstance(handle, PathCollection):
        return sum(1 for x, y in handle.get_offsets() if _finite(x) and _finite(y))
    if isinstance(handle, BarContainer):  # a bar of height 0 is drawn, as a bar of 0
        return sum(1 for p in handle.patches if _finite(p.get_height()))
    if isinstance(handle, Rectangle):
        return 1 if handle.axes is not None and _finite(handle.get_height()) else 0
    return 1  # other artists (error bars, patches drawn elsewhere) are taken as drawn


def _finite(v) -> bool:
    try:
        return math.isfinite(float(v))
    except (TypeError, ValueError):
        return False


def listed_not_drawn(fig) -> list[str]:
    """Legend entries standing for nothing drawn. An entry's artist is the series itself
    (its points count), or an empty key (`ax.scatter([], [], label=...)`, a style legend)
    whose gid is `key|<group>`: it counts the points of the drawn artists whose gid starts
    with <group>."""
    legends = list(fig.legends) + [ax.get_legend() for ax in fig.axes if ax.get_legend()]
    drawn = _artists(fig)
    out = []
    for leg in legends:
        for text in leg.get_texts():
            label = text.get_text()
            mine = [a for a in drawn if a.get_label() == label]
            points = sum(_finite_points(a) for a in mine)
            keys = {gid_of(a).removeprefix(KEY) for a in mine if (gid_of(a) or "").startswith(KEY)}
            if not points and keys:  # a key: the group it names (gids it prefixes)
                points = sum(_finite_points(a) for a in drawn if a.get_label() != label
                             and any((gid_of(a) or "").startswith(k) for k in keys))
            if not points:
                out.append(f"listed, not drawn: legend entry '{label}' has no point in any "
                           "panel" + ("" if keys else f" (an empty key names its group by a "
                                                      f"gid '{KEY}<group>')"))
    return out


def gid_of(artist) -> str | None:
    if isinstance(artist, BarContainer):  # a container has no gid: its first bar's
        return artist.patches[0].get_gid() if artist.patches else None
    return artist.get_gid() if hasattr(artist, "get_gid") else None  # other containers


def _artists(fig) -> list:
    return [a for ax in fig.axes for a in list(ax.lines) + list(ax.collections)
            + list(ax.containers)]


def across_missing_levels(fig) -> list[str]:
    """A level is an x value at least two other lines of the panel have a point at (a
    continuous x axis, where each series has its own values, has none; markers alone, an
    article's diamonds at levels no line was measured at, make no level)."""
    out = []
    for i, ax in enumerate(fig.axes):
        lines = [a for a in ax.lines if a.get_linestyle() not in ("None", "none", "", " ")]
        at = [{float(x) for x in _xs(a)} for a in lines]
        for line in lines:
            if not line.get_label():
                continue
            others = [xs for a, xs in zip(lines, at, strict=True) if a is not line]
            levels = sorted({x for xs in others for x in xs
                             if sum(x in o for o in others) >= 2})
            pts = list(zip(line.get_xdata(orig=False), line.get_ydata(orig=False),
                           strict=False))
            # the segments drawn: consecutive points both finite (a NaN breaks the line)
            segs = [(float(p[0]), float(q[0])) for p, q in itertools.pairwise(pts)
                    if all(_finite(v) for v in (*p, *q))]
            for a, b in (sorted(seg) for seg in segs):
                skipped = [v for v in levels if a < v < b]
                if skipped:
                    out.append(f"across a missing level: panel {i + 1}'s line "
                               f"'{line.get_label()}' joins x = {a:g} and {b:g} past "
                               f"{', '.join(f'{v:g}' for v in skipped)}, where it has no point")
    return out


def _xs(art) -> list:
    if isinstance(art, Line2D):
        return [x for x, y in zip(art.get_xdata(orig=False), art.get_ydata(orig=False),
                                  strict=False) if _finite(x) and _finite(y)]
    if isinstance(art, PathCollection):
        return [x for x, y in art.get_offsets() if _finite(x) and _finite(y)]
    return []


def declare_untested(ax, reasons: dict[str, str]) -> None:
    """Record on `ax` the series (by label) whose data a verdict did not test, and why (a
    short reason, which the figure must write somewhere a reader sees it)."""
    setattr(ax, REGISTRY, {**declared_untested(ax), **reasons})


def declared_untested(ax) -> dict[str, str]:
    return dict(getattr(ax, REGISTRY, {}))


def _grey(color) -> bool:
    from matplotlib.colors import to_rgba_array

    try:
        rgba = to_rgba_array(color)
    except (TypeError, ValueError):
        return False
    return len(rgba) > 0 and all(max(c[:3]) - min(c[:3]) < GREY_SPREAD or c[3] == 0
                                 for c in rgba)


def _marked(art) -> bool:
    """Whether a series' own look marks it: grey (lines, dots) or hatched (bars)."""
    if isinstance(art, Line2D):
        return _grey(art.get_color())
    if isinstance(art, PathCollection):
        return _grey(art.get_facecolors()) and _grey(art.get_edgecolors())
    if isinstance(art, BarContainer):
        return bool(art.patches) and all(p.get_hatch() or _grey(p.get_facecolor())
                                         for p in art.patches)
    return False


def _words(text: str) -> str:
    """Text with no whitespace: a reason wrapped anywhere (textwrap breaks after a hyphen,
    "weight-\nread") still reads as itself."""
    return "".join(text.split())


def unmarked(fig) -> list[str]:
    """Series declared untested (`declare_untested`) that are drawn with a finite point and
    not marked, or whose reason no legend entry or text of the figure says."""
    texts = [a.get_text() for _, a in _named_texts(fig) if isinstance(a, Text)]
    legends = list(fig.legends) + [ax.get_legend() for ax in fig.axes if ax.get_legend()]
    texts += [t.get_text() for leg in legends for t in leg.get_texts()]
    said = " | ".join(_words(t) for t in texts)
    out = []
    for i, ax in enumerate(fig.axes):
        reasons = declared_untested(ax)
        if not reasons:
            continue
        whole = any((p.get_gid() or "").startswith(PANEL_MARK) and p.get_hatch()
                    for p in ax.patches)
        for art in list(ax.lines) + list(ax.collections) + list(ax.containers):
            why = reasons.get(art.get_label())
            if why is None or not _finite_points(art):
                continue
            if not (whole or _marked(art)):
                out.append(f"unmarked: panel {i + 1}'s series '{art.get_label()}' is drawn "
                           f"from data the verdict did not test ({why}) and is neither grey, "
                           "hatched nor in a hatched panel")
            elif _words(why) not in said:
                out.append(f"unmarked: panel {i + 1}'s series '{art.get_label()}' is marked "
                           f"untested but no legend entry or text says why ({why})")
    return list(dict.fromkeys(out))


def problems(fig) -> list[str]:
    """Every fault this module knows in `fig` (drawn first), one sentence each."""
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    return (clipped(fig, renderer) + overlapping(fig, renderer) + listed_not_drawn(fig)
            + across_missing_levels(fig) + unmarked(fig))
