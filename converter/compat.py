"""What changed across the supported releases (setup.cfg's ranges), in one place: each helper works on both sides of
a change, and says which release made it."""

from __future__ import annotations


def variable_value(variable):
    """An nnx.Variable's value: `get_value()` from Flax 0.12.1 on (where `.value` is deprecated), `.value` before."""
    if hasattr(type(variable), "get_value"):
        return variable.get_value()
    return variable.value


def set_variable_value(variable, value):
    if hasattr(type(variable), "set_value"):
        variable.set_value(value)
    else:
        variable.value = value
