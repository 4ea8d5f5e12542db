"""The one rounding rule of every printed number (:func:`fmt`; ``report.fmt`` is this function): every table writer of
the package (the eval's report, train/ tables, reproduce_report, the audits' reports, scripts/detectors.py) prints
through it, so that one value prints the same everywhere.

Why a function and not ``f"{x:.3f}"``: the same AUROC reached two ways (a rank sum, a trapezoid over the ROC curve)
can differ in its last bits, 0.7325 against 0.73249999999999993, and ``.3f`` rounds the one up and the other down
(IMDB Min-K% printed 0.733 in one table and 0.732 in another). :func:`fmt` first rounds to ``NOISE_DIGITS`` decimal
places (float noise from the computation goes, every real digit of a metric stays), then rounds half away from zero
to the printed digits, in decimal arithmetic: 0.7325 and 0.73249999999999993 both print 0.733.
"""
from __future__ import annotations

import math
from decimal import ROUND_HALF_EVEN, ROUND_HALF_UP, Decimal

NOISE_DIGITS = 9  # decimal places kept before the printed rounding (float noise is ~1e-16 relative)


def fmt(x, digits: int = 3, sign: bool = False) -> str:
    """``x`` with ``digits`` decimals (``sign``: always with its sign, ``+0.012``); None, NaN as ``n/a``; inf as
    ``inf`` / ``-inf``. Ties round half away from zero after removing float noise (module docstring): ``fmt(0.7325)
    == fmt(0.73249999999999993) == "0.733"``, ``fmt(-0.0001, sign=True) == "-0.000"`` (a negative number keeps its
    sign)."""
    if x is None:
        return "n/a"
    v = float(x)
    if math.isnan(v):
        return "n/a"
    if math.isinf(v):
        return "inf" if v > 0 else "-inf"
    d = Decimal(repr(v)).quantize(Decimal(1).scaleb(-max(NOISE_DIGITS, digits)), rounding=ROUND_HALF_EVEN)
    d = d.quantize(Decimal(1).scaleb(-digits), rounding=ROUND_HALF_UP)
    if d == 0 and v >= 0:
        d = abs(d)
    return f"{d:+f}" if sign else f"{d:f}"


def diff_ci(diff, ci) -> str:
    """A paired difference with its interval as every report prints it: ``+0.179 [+0.147, +0.212]``."""
    return f"{fmt(diff, sign=True)} [{fmt(ci[0], sign=True)}, {fmt(ci[1], sign=True)}]"
