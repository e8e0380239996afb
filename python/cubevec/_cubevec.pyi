# Type stubs of cubevec's native module (python/module.cpp).
from typing import Callable, Optional, TypedDict

import numpy as np
import numpy.typing as npt

class Error(RuntimeError):
    """A cubevec failure that is not a bad argument (a damaged model file, a failed run)."""

class _Result(TypedDict):
    images: list[npt.NDArray[np.uint8]]
    report: str

class Pipeline:
    """A model folder loaded once (the generation library's Pipeline)."""

    @staticmethod
    def load(path: str, options_json: str = "{}") -> "Pipeline": ...
    def generate(self, request_json: str, on_step: Optional[Callable[[int, int], None]] = None) -> _Result: ...
    @property
    def family(self) -> str: ...
    @property
    def task(self) -> str: ...
