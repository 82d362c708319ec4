"""A root of a one-unknown function, for the fits on emulated points (link_fit.fit_links)."""

from __future__ import annotations

from collections.abc import Callable


def root(f: Callable[[float], float], lo: float, hi: float, rounds: int) -> tuple[float, int]:
    """(x in [lo, hi] where the increasing f crosses 0, tries): regula falsi (Illinois); lo if f(lo) >= 0, hi if
    f(hi) <= 0 (then lo where f barely moves over the range)."""
    f_lo = f(lo)
    if f_lo >= 0:
        return lo, 1
    f_hi = f(hi)
    if f_hi <= 0:
        return (hi if f_hi - f_lo > 0.005 else lo), 2
    tries, side = 2, 0
    while tries < rounds + 2:
        x = (lo * f_hi - hi * f_lo) / (f_hi - f_lo)
        fx = f(x)
        tries += 1
        if abs(fx) < 0.002 or hi - lo < 0.05:
            return x, tries
        if fx < 0:
            lo, f_lo = x, fx
            f_hi, side = (f_hi / 2, side) if side == -1 else (f_hi, -1)
        else:
            hi, f_hi = x, fx
            f_lo, side = (f_lo / 2, side) if side == 1 else (f_lo, 1)
    return (lo + hi) / 2, tries
