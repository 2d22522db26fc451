"""Comparing an output with a reference output: ``run --compare``, ``demo`` and ``--verify``.

One rule for special values everywhere: NaN where the reference has NaN is equal, a NaN on one
side only is a mismatch; an infinity equals only the same infinity (``rtol · |inf|`` excuses
nothing); everything else is equal when ``|a - b| <= atol + rtol · |b|``, ``b`` the reference.
"""

from __future__ import annotations

from typing import Any

import numpy as np


class Difference:
    """Max absolute and relative difference of two outputs and whether they meet a tolerance."""

    def __init__(self, a: Any, b: Any, *, atol: float, rtol: float) -> None:
        self.comparable = a.shape == b.shape
        self.shape_text = f"shapes differ: {a.shape} vs {b.shape}"
        self.max_abs = self.max_rel = float("nan")
        self.nan_mismatch = 0
        self.ok = False
        if not self.comparable:
            return
        x = np.asarray(a, dtype=np.float64)
        y = np.asarray(b, dtype=np.float64)
        both_nan = np.isnan(x) & np.isnan(y)
        self.nan_mismatch = int((np.isnan(x) ^ np.isnan(y)).sum())
        with np.errstate(invalid="ignore", divide="ignore"):
            # equal values (infinities included) and NaN against NaN count as no error; any other
            # error against an infinity is infinite, and rtol * |inf| must not excuse it
            err = np.where((x == y) | both_nan, 0.0, np.abs(x - y))
            rel = np.where(err == 0, 0.0, err / np.abs(y))
            within = (err == 0) | (np.isfinite(err) & (err <= atol + rtol * np.abs(y)))
        finite = ~(np.isnan(x) | np.isnan(y))
        self.max_abs = float(err[finite].max()) if finite.any() else 0.0
        self.max_rel = float(rel[finite].max()) if finite.any() else 0.0
        self.ok = self.nan_mismatch == 0 and bool(np.all(within[finite]))

    def text(self) -> str:
        if not self.comparable:
            return self.shape_text
        nan = f"  {self.nan_mismatch} NaN mismatches" if self.nan_mismatch else ""
        return f"max abs {self.max_abs:.3e}  max rel {self.max_rel:.3e}{nan}"


def compare_arrays(a: Any, b: Any, *, atol: float = 0.0, rtol: float = 0.0) -> Difference:
    """Compare ``a`` with the reference ``b`` (|a - b| <= atol + rtol·|b| everywhere is ok)."""
    return Difference(a, b, atol=atol, rtol=rtol)
