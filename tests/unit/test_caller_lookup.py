"""Static programs are built without reading the source of the stack's frames for each operator
(ernie_mtl/program/caller_lookup.py), and Paddle's warning about the operator says the same; each
operator's recorded call stack is the same without checking the source files on disk."""
import zlib  # noqa: F401  (before paddle)

import inspect
import warnings

import paddle
import pytest
from paddle.base.layers import math_op_patch

from ernie_mtl.program.caller_lookup import (CheapCallerLookup, CheapStackExtract, use_cheap_caller_lookup,
                                             use_cheap_stack_extract)


def add_batch_shaped():
    """`a + b` of two variables with a batch dimension of -1 (the case that calls inspect.stack)."""
    main, startup = paddle.static.Program(), paddle.static.Program()
    with paddle.static.program_guard(main, startup):
        a = paddle.static.data("a", [-1, 4], "float32")
        b = paddle.static.data("b", [-1, 4], "float32")
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            out = a + b  # the line the warning names
    return main, out, [str(w.message) for w in caught if issubclass(w.category, DeprecationWarning)]


@pytest.fixture
def static_mode(monkeypatch):
    monkeypatch.setattr(math_op_patch, "inspect", inspect)  # the real one again (undone after the test)
    paddle.enable_static()
    yield
    paddle.disable_static()


def test_the_warning_names_the_same_file_and_line_without_reading_any_source(static_mode, monkeypatch):
    _, _, real = add_batch_shaped()
    assert len(real) == 1 and f"{__file__}:" in real[0]
    assert use_cheap_caller_lookup() is True and isinstance(math_op_patch.inspect, CheapCallerLookup)
    assert use_cheap_caller_lookup() is True  # idempotent

    def no_source(*args, **kwargs):
        raise AssertionError("a frame's source was read")

    monkeypatch.setattr(inspect, "findsource", no_source)
    monkeypatch.setattr(inspect, "getframeinfo", no_source)
    main, out, cheap = add_batch_shaped()
    assert cheap == real  # the same text: file and line of `out = a + b`
    assert [op.type for op in main.global_block().ops] == ["elementwise_add"] and out.shape[1] == 4


def test_without_the_lookup_the_source_is_read(static_mode, monkeypatch):
    """The control: Paddle's own path reads frames' source (what the lookup removes)."""
    reads = []
    real_getframeinfo = inspect.getframeinfo
    monkeypatch.setattr(inspect, "getframeinfo", lambda *a, **k: reads.append(1) or real_getframeinfo(*a, **k))
    add_batch_shaped()
    assert len(reads) > 5  # every frame of pytest's stack


def test_its_stack_matches_inspect_for_the_fields_paddle_reads():
    def where(lookup):
        return lookup.stack()[1][1:4]  # (filename, lineno, function) of this frame's caller

    def caller():
        return where(CheapCallerLookup(inspect)), where(inspect)

    cheap, real = caller()
    assert cheap == real
    assert CheapCallerLookup(inspect).getsourcefile is inspect.getsourcefile  # the rest is the real module


def test_another_inspect_in_paddle_is_left_alone(monkeypatch):
    monkeypatch.setattr(math_op_patch, "inspect", object())
    assert use_cheap_caller_lookup() is False and not isinstance(math_op_patch.inspect, CheapCallerLookup)


def _callstacks():
    """The op_callstack attribute of each operator of a small program (fc: mul, elementwise_add, relu)."""
    main, startup = paddle.static.Program(), paddle.static.Program()
    with paddle.static.program_guard(main, startup):
        x = paddle.static.data("x", [-1, 4], "float32")
        paddle.static.nn.fc(x, 3, activation="relu")
    return [op.attr("op_callstack") for op in main.global_block().ops]


def test_each_operator_records_the_same_call_stack_without_checking_files(static_mode, monkeypatch):
    import linecache
    import traceback

    from paddle.base import framework

    monkeypatch.setattr(framework, "traceback", traceback)  # the real one (undone after the test)
    real_check, checked, stacks = linecache.checkcache, [], {}
    for mode in ("real", "cheap"):  # built from the same line: the same stack
        if mode == "cheap":
            assert use_cheap_stack_extract() is True and isinstance(framework.traceback, CheapStackExtract)
            assert use_cheap_stack_extract() is True  # idempotent
            monkeypatch.setattr(linecache, "checkcache", lambda *a: checked.append(a) or real_check(*a))
        stacks[mode] = _callstacks()
    monkeypatch.setattr(linecache, "checkcache", real_check)
    assert stacks["real"] and all(len(s) > 10 and s[0].startswith("  File ") for s in stacks["real"])
    assert checked == []  # no source file checked on disk
    assert stacks["cheap"] == stacks["real"]  # every frame's file, line, function and source line, oldest first


def test_the_cheap_stack_matches_traceback_with_a_limit_and_a_frame():
    import sys
    import traceback

    cheap = CheapStackExtract(traceback)
    frame = sys._getframe()
    for limit in (None, 1, 3, -2):
        assert cheap.extract_stack(frame, limit) == [tuple(s) for s in traceback.extract_stack(frame, limit)], limit
    assert cheap.format_list is traceback.format_list  # the rest is the real module


def test_another_traceback_in_paddle_is_left_alone(monkeypatch):
    from paddle.base import framework

    monkeypatch.setattr(framework, "traceback", object())
    assert use_cheap_stack_extract() is False and not isinstance(framework.traceback, CheapStackExtract)
