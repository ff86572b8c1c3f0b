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

The same holds for the call stack Paddle 2.6 records in every operator it creates (`Operator.__init__`
stores `traceback.extract_stack()` as the `op_callstack` attribute, which Paddle's errors print):
`traceback.extract_stack()` checks, for every operator, each source file on the stack on disk
(`linecache.checkcache`: an `os.stat` per file) and builds a FrameSummary per frame.
`use_cheap_stack_extract()` gives paddle.base.framework a `traceback` whose `extract_stack()` returns the
same (file, line, function, source line) per frame, oldest first, from the frame objects and linecache's
cached lines; the attribute's text is the same. Measured on Intel-11-28 (loaded, twice each), building six
of tests/unit/test_program_matrix.py's fleet programs from a script: 171-270 us per operator -> 52-54 us,
0.7-1.2 s of 8.7-9.7 s of building (5,697 operators); under pytest's deeper stacks it saves more.
"""
from __future__ import annotations

import inspect
import linecache
import sys
import traceback
from types import FrameType, ModuleType
from typing import Any, List, Optional, Tuple


class CheapCallerLookup:
    """`inspect` for paddle.base.layers.math_op_patch: `stack()` without the source of the frames."""

    def __init__(self, real: ModuleType) -> None:
        self._real = real

    def stack(self, context: int = 1) -> List[inspect.FrameInfo]:
        """FrameInfo of the calling frame ([0]) and of its caller ([1]), as `inspect.stack()` gives them
        but without code_context (the only fields math_op_patch reads are [1]'s filename and lineno)."""
        frames: List[inspect.FrameInfo] = []
        frame: Optional[FrameType] = sys._getframe(1)
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

    return _install(math_op_patch, inspect, CheapCallerLookup)


StackEntry = Tuple[str, Optional[int], str, Optional[str]]  # (filename, lineno, name, line)


class CheapStackExtract:
    """`traceback` for paddle.base.framework: `extract_stack()` without checking the source files on disk."""

    def __init__(self, real: ModuleType) -> None:
        self._real = real

    def extract_stack(self, frame: Any = None, limit: Optional[int] = None) -> List[StackEntry]:
        """(filename, lineno, name, line) of every frame from `frame` (default: the caller) up, oldest first:
        what indexing `traceback.extract_stack()`'s FrameSummary entries gives, `line` stripped as theirs."""
        if frame is None:
            frame = sys._getframe(1)
        if limit is not None and limit < 0:  # traceback's own semantics: the oldest -limit frames
            return [(s.filename, s.lineno, s.name, s.line) for s in self._real.extract_stack(frame, limit)]
        frames: List[StackEntry] = []
        while frame is not None and (limit is None or len(frames) < limit):
            code, lineno = frame.f_code, frame.f_lineno
            linecache.lazycache(code.co_filename, frame.f_globals)
            line = None if lineno is None else linecache.getline(code.co_filename, lineno).strip()
            frames.append((code.co_filename, lineno, code.co_name, line))
            frame = frame.f_back
        frames.reverse()
        return frames

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)


def use_cheap_stack_extract() -> bool:
    """Install CheapStackExtract into paddle.base.framework (once). False if that module has no `traceback`
    to replace (another Paddle version: nothing is changed)."""
    from paddle.base import framework

    return _install(framework, traceback, CheapStackExtract)


def _install(module: ModuleType, real: ModuleType, proxy: type) -> bool:
    """Replace `module`'s import of the standard module `real` by `proxy(real)`, once; False (nothing
    changed) when `module` holds something else under that name."""
    name = real.__name__
    current = getattr(module, name, None)
    if isinstance(current, proxy):
        return True
    if current is not real:
        return False
    setattr(module, name, proxy(real))
    return True
