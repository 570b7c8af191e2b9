"""What a metadata value is and how an error message shows it: shared by megafuse.llm.gguf (the
hyper-parameters) and megafuse.llm.tokenizer (the vocabulary), so that a file's wrong values read
the same in both.  Standard library only; NumPy scalars count as what they hold (np.integer
is a numbers.Integral, np.floating a numbers.Real)."""
import numbers
from typing import Any


def is_bool(value: Any) -> bool:
    """A bool, or a NumPy bool_."""
    return isinstance(value, bool) or type(value).__name__ in ("bool", "bool_")   # NumPy 2 / 1


def is_int(value: Any) -> bool:
    """An integer that is not a boolean."""
    return isinstance(value, numbers.Integral) and not is_bool(value)


def is_number(value: Any) -> bool:
    """An integer or a float, not a boolean."""
    return isinstance(value, numbers.Real) and not is_bool(value)


def describe(value: Any) -> str:
    """A value as an error message shows it: an array by its length, a string, a boolean, or
    the type and (shortened) repr of anything else."""
    if isinstance(value, (list, tuple)):
        return f"an array of {len(value)} values"
    if isinstance(value, str):
        return f"the string {value[:40]!r}" + ("..." if len(value) > 40 else "")
    if is_bool(value):
        return f"the boolean {bool(value)}"
    text = repr(value)
    return f"{type(value).__name__} {text if len(text) <= 40 else text[:37] + '...'}"
