"""User plugin files: Python files whose `@register_task_type` / `@register_callback` classes become
usable by name from the configuration (`plugins:` in a global YAML, `--plugins` on the command line).

Each file is imported once per process under a name derived from its path, so a training run, a
resumed run and `--do_predict` (which re-imports the plugins an exported model's manifest lists)
register the same classes.
"""
from __future__ import annotations

import hashlib
import importlib.util
import os
import sys
from typing import List, Sequence


def module_name(path: str) -> str:
    return "ernie_mtl_plugin_" + hashlib.sha1(path.encode()).hexdigest()[:12]


def import_plugins(paths: Sequence[str], *, where: str) -> List[str]:
    """Import every file of `paths` (absolute); returns one problem per file that is missing or whose
    import failed (naming `where` the list came from), and imports the rest."""
    problems = []
    for path in paths:
        module = module_name(path)
        if module in sys.modules:  # imported earlier in this process: its classes are registered
            continue
        if not path.endswith(".py") or not os.path.isfile(path):
            problems.append(f"{where}: {path!r} is not an existing .py file")
            continue
        spec = importlib.util.spec_from_file_location(module, path)
        assert spec is not None and spec.loader is not None  # a .py file that exists always has a loader
        mod = importlib.util.module_from_spec(spec)
        sys.modules[module] = mod
        try:
            spec.loader.exec_module(mod)
        except Exception as e:  # noqa: BLE001  (any error in user code becomes a configuration problem)
            del sys.modules[module]
            problems.append(f"{where}: importing {path} failed: {type(e).__name__}: {e}")
    return problems
