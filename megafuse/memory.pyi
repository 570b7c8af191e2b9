from typing import Any, Optional, Sequence, SupportsIndex, Union

import numpy as np
import numpy.typing as npt

_Shape = Union[SupportsIndex, Sequence[SupportsIndex]]

HUGE_PAGE_BYTES: int

def empty(shape: _Shape, dtype: npt.DTypeLike = ...) -> npt.NDArray[Any]: ...
def zeros(shape: _Shape, dtype: npt.DTypeLike = ...) -> npt.NDArray[Any]: ...
def empty_like(a: npt.ArrayLike, dtype: Optional[npt.DTypeLike] = ...,
               shape: Optional[_Shape] = ...) -> npt.NDArray[Any]: ...
def huge_pages_requested(a: npt.ArrayLike) -> Optional[bool]: ...
