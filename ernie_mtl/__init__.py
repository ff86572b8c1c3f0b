"""ernie-mtl: static-graph, fleet-distributed pretraining and multi-task fine-tuning of ERNIE."""
import zlib  # noqa: F401  (must be loaded before paddle: paddle 2.6.2 exports clashing zlib symbols)

__version__ = "0.1.0"

# The architecture, lowest layer first. A module may import modules of its own package and of the
# packages of earlier layers only; packages in one layer do not import each other
# (tests/unit/test_layers.py derives the rule from this tuple and the package tree).
LAYERS = (
    ("config",),  # typed configuration, YAML/PALM loading, command-line parsing: a leaf
    ("dist", "data", "checkpoint"),  # the process in its job; datasets; checkpoint layout and store
    ("tasks",),  # task types: reader + head + metric, the plugin contract and feed specs
    ("program",),  # static programs: forward, optimizer, fleet minimize, idle heads, EMA, randomness
    ("planning",),  # task schedule, run plan, dry run
    ("engine",),  # the loop, evaluation, export, inference, callbacks, run functions
    ("convert", "main", "api", "palm"),  # the faces: converter, command line, Python APIs
)

# The Python API (ernie_mtl/api.py), importable as `ernie_mtl.train(...)`. Loaded on first use:
# `import ernie_mtl` stays light, so the command line can set threads before Paddle is imported.
_API = ("CheckpointError", "Callback", "ConfigError", "PrebuildResult", "RunConfig", "RunResult", "TaskType",
        "UserError", "configure_process", "evaluate", "load_config", "export", "plan", "prebuild", "predict",
        "register_callback", "register_task_type", "train")


def __getattr__(name):
    if name in _API:
        from ernie_mtl import api

        return getattr(api, name)
    raise AttributeError(f"module 'ernie_mtl' has no attribute {name!r}")


def __dir__():
    return sorted(list(globals()) + list(_API))
