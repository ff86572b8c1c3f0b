"""Typed wrapper around the compiled index helper `data_tools._helpers`."""
try:
    from data_tools import _helpers
except ImportError as exc:  # pragma: no cover - exercised by hand on broken installs
    raise ImportError(
        "The compiled index helper data_tools._helpers is not importable "
        f"({exc}). Build it with `pip install -e .` from the project root (needs a C++17 "
        "compiler such as g++ and the Python headers, e.g. apt-get install g++ python3-dev)."
    ) from exc

HELPER_VERSION = _helpers.VERSION
