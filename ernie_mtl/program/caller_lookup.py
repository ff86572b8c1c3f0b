"""Building a static program without reading the source of every frame on the stack for each operator.

Paddle 2.6's operator overloading on static variables (`paddle.base.layers.math_op_patch`) calls
`inspect.stack()[1]` for every `a + b`, `a * b`, ... whose right operand has a batch dimension of -1,
only to put the caller's file and line into a DeprecationWarning ("The behavior of expression A + B has
been unified with elementwise_add(X, Y, axis=-1) from Paddle 2.0"), which Python's default warning
filters then hide. `inspect.stack()` builds a FrameInfo for every frame of the stack, reading each one's
source file to find its line, for nothing. Measured on Intel-11-28 (loaded, A/B twice each): a case of
`tests/unit/test_program_matrix.py` ([mlm], deep pytest stacks) 20.5/19.6 s without, 15.9/17.1 s with;
a 2-step command-line run of the tiny test model 5.7 s without, 5.3 s with.

`use_cheap_caller_lookup()` gives that module an `inspect` whose `stack()` returns the same frame, file,
line and function of the calling frame and of its caller, from the frame objects alone (no source read);
every other attribute is the real `inspect`'s. The warning's text is the same; nothing else changes.
Idempotent; applied by `build_forward` (ernie_mtl/program/forward.py), so every program the project
builds (command line, Python API, the PALM face) gets it.
"""
from __future__ import annotations

import inspect
import sys
from types import ModuleType
from typing import Any, List


class CheapCallerLookup:
    """`inspect` for paddle.base.layers.math_op_patch: `stack()` without the source of the frames."""

    def __init__(self, real: ModuleType) -> None:
        self._real = real

    def stack(self, context: int = 1) -> List[inspect.FrameInfo]:
        """FrameInfo of the calling frame ([0]) and of its caller ([1]), as `inspect.stack()` gives them
        but without code_context (the only fields math_op_patch reads are [1]'s filename and lineno)."""
        frames: List[inspect.FrameInfo] = []
        frame = sys._getframe(1)
        while frame is not None and len(frames) < 2:
            code = frame.f_code
            frames.append(inspect.FrameInfo(frame, code.co_filename, frame.f_lineno, code.co_name, None, None))
            frame = frame.f_back
        return frames

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)


def use_cheap_caller_lookup() -> bool:
    """Install CheapCallerLookup into Paddle's math_op_patch (once). False if that module has no
    `inspect` to replace (another Paddle version: nothing is changed)."""
    from paddle.base.layers import math_op_patch

    current = getattr(math_op_patch, "inspect", None)
    if isinstance(current, CheapCallerLookup):
        return True
    if current is not inspect:
        return False
    math_op_patch.inspect = CheapCallerLookup(inspect)
    return True
