"""The in-process unit tests' own setting (tests/conftest.py holds the shared fixtures)."""
import sys

import pytest


@pytest.fixture(autouse=True)
def _no_fleet_sharding_dumps(request, monkeypatch):
    """Fleet's sharding optimizer (Paddle 2.6.2, `ShardingOptimizer._dump_program_for_debug`) writes the
    text of both programs to `main_sharding_<rank>`/`start_sharding_<rank>` in the working directory on
    every sharded build. The engine's runs keep them under `<output_dir>/program_desc` (tests/e2e checks
    that); the unit tests build programs without a run, so here they would land in the repository root,
    at about 10% of a sharded build's time. Unit tests read the program objects, never those files. Only
    where Paddle is already imported (a test that builds programs has it from the `static_mode` fixture):
    a module without Paddle does not pay its import. A test marked `fleet_dumps` keeps fleet's own method
    (it checks where the builder puts the dumps)."""
    if "paddle" not in sys.modules or request.node.get_closest_marker("fleet_dumps") is not None:
        return
    from paddle.distributed.fleet.meta_optimizers.sharding_optimizer import ShardingOptimizer

    monkeypatch.setattr(ShardingOptimizer, "_dump_program_for_debug", lambda self: None)
