"""How every condition of a report's plots is drawn: one colour per arm (shades within an arm, a hatch for bars),
a line style, marker and width per condition in drawing order, and which drawn series coincide (said in the legend,
one band drawn). harness.report.plots draws with them."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")  # before pyplot: no display, same output everywhere

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib import colors as mcolors  # noqa: E402

from arms import registry  # noqa: E402
from harness.report.compare import Condition  # noqa: E402

ARM_COLORS = {name: spec.color for name, spec in registry().items() if spec.color}  # arms/<name>/__init__.py
TAIL = ["tab:red", "tab:purple", "tab:brown", "tab:pink", "tab:olive", "tab:cyan"]
LINESTYLES = ["-", (0, (5, 2)), (0, (3, 1.5, 1, 1.5)), (0, (1, 1.2)), (0, (7, 2, 1, 2, 1, 2)), (0, (2, 2))]
MARKERS = ["o", "s", "^", "D", "v", "P", "X", "*"]
MARKS_PER_LINE = 8  # markers along a curve (at different points for each condition)
HATCHES = ["", "//", "..", "xx", "\\\\", "++"]
GRID_POINTS = 200


def _shade(color: str, f: float) -> tuple:
    """f < 0 darkens toward black, f > 0 lightens toward white."""
    rgb = np.array(mcolors.to_rgb(color))
    out = rgb * (1 + f) if f < 0 else rgb + (1 - rgb) * f
    return tuple(float(v) for v in np.clip(out, 0, 1))


def styles(conditions: list[Condition]) -> dict[str, dict]:
    others = sorted({c.arm for c in conditions if c.arm not in ARM_COLORS})
    base = {**ARM_COLORS, **{a: TAIL[i % len(TAIL)] for i, a in enumerate(others)}}
    out = {}
    for arm in dict.fromkeys(c.arm for c in conditions):
        same = [c for c in conditions if c.arm == arm]
        shades = [0.0] if len(same) == 1 else np.linspace(-0.35, 0.45, len(same))
        for j, c in enumerate(same):
            out[c.label] = {"color": _shade(base[arm], float(shades[j])), "hatch": HATCHES[j % len(HATCHES)]}
    # line style, marker, width: by the order curves are drawn (the RL conditions first: SFT draws no curve)
    drawn = [c for c in conditions if c.rl] + [c for c in conditions if not c.rl]
    for k, c in enumerate(drawn):
        out[c.label].update(linestyle=LINESTYLES[k % len(LINESTYLES)], marker=MARKERS[k % len(MARKERS)],
                            width=float(np.linspace(1.7, 1.0, len(drawn))[k]) if len(drawn) > 1 else 1.0,
                            order=k, of=len(drawn))
    return out


def _markevery(s: dict, points: int) -> tuple[int, int]:
    """Markers at MARKS_PER_LINE points of a curve, each condition's at other points (coinciding curves show
    every condition's markers)."""
    step = max(1, points // MARKS_PER_LINE)
    return (int(step * (s["order"] + 0.5) / max(s["of"], 1)) % step, step)


def _and(items: list[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


class Drawn(tuple):
    """The arrays `seed_band` drew (what `coinciding` compares) and its band's artist (None without a band)."""

    band = None


def one_band(same: list[list[str]], drawn: dict[str, Drawn]) -> None:
    """Identical series share one band, in the first one's colour (two translucent bands on top of each other make
    a third colour that no condition has)."""
    for labels in same:
        for label in labels[1:]:
            if drawn[label].band is not None:
                drawn[label].band.remove()


def coinciding(series: dict[str, tuple]) -> list[list[str]]:
    """Sets of labels whose drawn series (x, mean, band arrays as `seed_band` returns them) are identical."""
    sets: list[list[str]] = []
    for label, arrays in series.items():
        for found in sets:
            ref = series[found[0]]
            if len(ref) == len(arrays) and all(
                    a.shape == b.shape and np.allclose(a, b, rtol=1e-9, atol=1e-12, equal_nan=True)
                    for a, b in zip(ref, arrays)):
                found.append(label)
                break
        else:
            sets.append([label])
    return [s for s in sets if len(s) > 1]


def coincide_text(sets: list[list[str]]) -> str:
    """'lines of grpo and papo coincide (identical values)'."""
    return "; ".join(f"lines of {_and(s)} coincide (identical values)" for s in sets)


def _line_kw(s: dict, lw: float, points: int | None, marks: bool = True) -> dict:
    kw = {"color": s["color"], "linestyle": s["linestyle"], "lw": lw * s["width"], "zorder": 2 + 0.1 * s["order"]}
    if marks and points:
        kw.update(marker=s["marker"], markevery=_markevery(s, points), markersize=3.5 + 1.5 * s["width"],
                  markerfacecolor="none", markeredgewidth=1.0)
    return kw


def legend_handle(s: dict, lw: float = 1.5, marks: bool = True):
    """A legend entry drawn like the condition's curves (colour, style, width, marker)."""
    kw = _line_kw(s, lw, None)
    if marks:
        kw.update(marker=s["marker"], markersize=3.5 + 1.5 * s["width"], markerfacecolor="none")
    return plt.Line2D([], [], **kw)
