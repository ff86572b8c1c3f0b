"""Shared fixtures for tests that build static programs with fleet."""
import zlib  # noqa: F401  (before paddle: paddle 2.6.2 exports clashing zlib symbols)

import functools

import pytest


@pytest.fixture(scope="module")
def static_mode():
    """Paddle static-graph mode for one test module; the previous mode is restored afterwards."""
    import paddle

    was_dynamic = paddle.in_dynamic_mode()
    paddle.enable_static()
    yield
    if was_dynamic:
        paddle.disable_static()


@pytest.fixture(scope="module")
def build_programs(static_mode, tmp_path_factory):
    """Factory: tiny-ERNIE flag-mode pretraining programs (the one task `pretrain`, through the one
    builder) as rank `rank` of `world`; see tests/helpers.pretraining_programs."""
    from helpers import pretraining_programs

    folder = tmp_path_factory.mktemp("vocab")
    return functools.partial(pretraining_programs, folder)
