"""The one rule for the integer and bool fields of the config dataclasses (AttentionConfig, MXDotConfig).

Integer fields take Python ints and NumPy integer scalars (np.int64(64) from a NumPy computation, say) and
store them as Python ints, so that equal configs hash, compare and print alike; bools (True is an int in
Python) and floats (64.0) raise a ValueError naming the field. Bool fields take Python and NumPy bools,
stored as Python bools, and nothing else (no truthiness: "no" is not False).
"""

from __future__ import annotations

import numpy as np


def int_field(owner: str, name: str, value, want: str = "an int") -> int:
    """`value` as a Python int; ValueError naming `owner.name` (with `want`, what the field takes) unless it
    is a Python int or NumPy integer scalar that is not a bool. Range checks are the caller's."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise ValueError(f"{owner}.{name}={value!r} must be {want} (a Python or NumPy integer, not a bool or float)")
    return int(value)


def bool_field(owner: str, name: str, value) -> bool:
    """`value` as a Python bool; ValueError naming `owner.name` unless it is a Python or NumPy bool."""
    if not isinstance(value, (bool, np.bool_)):
        raise ValueError(f"{owner}.{name}={value!r} must be a bool (True or False)")
    return bool(value)
