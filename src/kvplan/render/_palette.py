"""Which colour and hatching each group of a plan gets, stable across the two plans of a diff.

A group is drawn in a *style* (a colour × hatching pair, :data:`STYLES` of them). The first plan
of a page gives its groups styles in group order; every later plan's group takes the style of
the earlier group it shares the most layers with (each earlier group at most once), so a
layer keeps its colour when vLLM numbers the groups differently on the other side. Groups that
match nothing take styles nobody uses yet. Linear in the views (plus sorting the matches).
"""

from __future__ import annotations

from collections import Counter

from kvplan.schemas.plan import BindingPlan

OKABE_ITO = ["#E69F00", "#56B4E9", "#009E73", "#F0E442", "#0072B2", "#D55E00", "#CC79A7"]
"""Okabe–Ito (colour-blind safe)."""
COLOUR_NAMES = ("orange", "sky blue", "green", "yellow", "blue", "vermillion", "purple")
HATCH_NAMES = ("diagonal", "back-diagonal", "dots", "horizontal", "vertical", "cross", "grid")
STYLES = len(OKABE_ITO) * len(HATCH_NAMES)
"""Distinct colour × hatching pairs; style ``k`` is pair ``k % STYLES``."""


def style(k: int) -> tuple[int, int]:
    """(colour, hatching) of style ``k``: 0..6 differ in both, 7.. pair them differently."""
    k %= STYLES
    colour = k % len(OKABE_ITO)
    return colour, (colour + k // len(OKABE_ITO)) % len(HATCH_NAMES)


def style_name(k: int) -> str:
    colour, hatch = style(k)
    return f"{COLOUR_NAMES[colour]}, {HATCH_NAMES[hatch]} hatching"


def _groups(plan: BindingPlan) -> dict[int, list[str]]:
    out: dict[int, list[str]] = {}
    for view in plan.views:
        out.setdefault(view.group, []).append(view.layer)
    return out


def palette(*plans: BindingPlan) -> list[dict[int, int]]:
    """For each plan, group → style index (see the module docstring)."""
    out: list[dict[int, int]] = []
    owner: dict[str, tuple[int, int]] = {}  # layer -> (style, plan index) of its first drawing
    used: set[int] = set()
    for index, plan in enumerate(plans):
        groups = _groups(plan)
        styles: dict[int, int] = {}
        if index == 0:
            for rank, gid in enumerate(sorted(groups)):
                styles[gid] = rank
        else:
            overlap: Counter[tuple[int, int]] = Counter()
            for gid, layers in groups.items():
                for layer in layers:
                    if layer in owner:
                        overlap[(gid, owner[layer][0])] += 1
            taken: set[int] = set()
            for (gid, k), _ in sorted(overlap.items(), key=lambda item: (-item[1], item[0])):
                if gid not in styles and k not in taken:
                    styles[gid] = k
                    taken.add(k)
            blocked = used | taken
            free = (k for k in range(len(blocked) + len(groups) + 1) if k not in blocked)
            for gid in sorted(groups):
                if gid not in styles:
                    styles[gid] = next(free)
        for gid, layers in groups.items():
            for layer in layers:
                owner.setdefault(layer, (styles[gid], index))
        used |= set(styles.values())
        out.append(styles)
    return out
