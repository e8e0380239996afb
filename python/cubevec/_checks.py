"""Argument checks the layers and the pipelines share: each names the argument in its error."""

import math
import numbers

import numpy as np


def finite_float(value, name):
    """A real number (not a bool) as a finite Python float: TypeError for another type, ValueError
    for NaN, infinities and ints too large for a float."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a float, got {type(value).__name__}")
    try:
        value = float(value)
    except OverflowError:
        raise ValueError(f"{name} must be finite, got an int too large for a float") from None
    if not math.isfinite(value):
        raise ValueError(f"{name} must be finite, got {value}")
    return value
