"""A quiet console: the framework's chatter stays out of what the user reads, unless asked for.

What Paddle 2.6.2 and its dependencies write on their own during a run, and where each is cut:

- glog `I1125 12:00:00.000 ... New Executor is Running.` lines (C++): `GLOG_minloglevel=1` in the
  environment before paddle is imported (glog reads it at initialisation); warnings and errors stay.
- `WARNING: OMP_NUM_THREADS set to 2, not 1 ... PLEASE USE OMP_NUM_THREADS WISELY.` (printed by
  `import paddle` whenever OMP_NUM_THREADS > 1): misleading here, where the entry point chose the
  thread count on purpose (ernie_mtl/dist/threads.py). Dropped from stderr while paddle is imported.
- `Setuptools is replacing distutils.` (a UserWarning raised when paddle imports distutils).
- fleet's Python logger (`[INFO] distributed_strategy.py:214 - distributed strategy initialized`,
  sharding's group tables, `It is recommended to use DistributedStrategy in fleet.init()`): set to
  ERROR.
- `init_parallel_env`'s "Modified FLAGS detected" table (the flags are the entry point's choice):
  `captured_stderr` around the call, re-logged at debug level.
- fleet's `print`s of its meta-optimizers while it minimizes (`valid_optimizer_list= [...]`,
  `meta_optimizer= ...`, `graph_optimizer= None`): `captured_prints` around the call, re-logged at
  debug level.

`--log_level debug` (or `ERNIE_MTL_DEBUG=1`) keeps all of it. Our own lines go through
`get_logger(rank)`: timestamped `[rank N]` lines, INFO on rank 0 and WARNING elsewhere. Progress bars are drawn only on a
terminal (tqdm's `disable=None`): a log file (`--log_dir`, the launcher's `workerlog.N`) gets the
log lines, not carriage returns.
"""
from __future__ import annotations

import contextlib
import io
import logging
import os
import sys
import warnings
from typing import Iterator, Mapping, MutableMapping, Optional, Sequence, TextIO

DEBUG_ENV = "ERNIE_MTL_DEBUG"
GLOG_LEVEL = "GLOG_minloglevel"
_IMPORT_CHATTER = ("WARNING: OMP_NUM_THREADS set to", "PLEASE USE OMP_NUM_THREADS WISELY")
_FLEET_LOGGERS = ("paddle.distributed.fleet.utils.log_util",)
# Modules whose import makes an INFO logger of their own name (paddle.base.log_helper.get_logger sets the level
# when the module is imported, so these are imported first, then set): recompute's segment lines and AMP's
# "found amp-cast op" lines, 84 of 127 console lines of a 32-rank GPU dry run
_FRAMEWORK_LOGGERS = ("paddle.base.backward", "paddle.static.amp.fp16_utils", "paddle.static.amp.fp16_lists",
                      "paddle.static.amp.bf16.amp_utils", "paddle.static.amp.function_overload",
                      "paddle.static.amp.debugging")
_DEBUG = False


def debug_requested(argv: Sequence[str], env: Mapping[str, str] = os.environ) -> bool:
    """`--log_level debug` on the command line (read before the parser runs: the framework must be
    told before paddle is imported) or ERNIE_MTL_DEBUG=1."""
    if env.get(DEBUG_ENV, "").strip() not in ("", "0"):
        return True
    for k, token in enumerate(argv):
        if token == "--log_level" and k + 1 < len(argv):
            return argv[k + 1].strip().lower() == "debug"
        if token.startswith("--log_level="):
            return token.split("=", 1)[1].strip().lower() == "debug"
    return False


def quiet_framework(*, debug: bool, env: Optional[MutableMapping[str, str]] = None) -> None:
    """Before paddle is imported: glog's info lines off (unless the user set GLOG_minloglevel), the
    distutils warning filtered, and `import paddle` with its OMP warning dropped. With `debug`,
    nothing is filtered."""
    global _DEBUG
    _DEBUG = debug
    env = os.environ if env is None else env
    if debug:
        return
    env.setdefault(GLOG_LEVEL, "1")
    warnings.filterwarnings("ignore", message="Setuptools is replacing distutils")
    if "paddle" not in sys.modules:
        with _dropped_lines(_IMPORT_CHATTER):
            import paddle  # noqa: F401


def quiet_fleet_loggers() -> None:
    """fleet's own logger at ERROR (after paddle's import; no-op in debug mode)."""
    if _DEBUG:
        return
    import importlib

    logging.disable(logging.INFO)  # importing fleet logs at INFO (it builds a strategy) before the level is set
    try:
        loggers = [getattr(importlib.import_module(name), "logger", None) for name in _FLEET_LOGGERS]
    finally:
        logging.disable(logging.NOTSET)
    for logger in loggers:
        if logger is not None:
            logger.setLevel(logging.ERROR)
    for name in _FRAMEWORK_LOGGERS:
        try:
            importlib.import_module(name)
        except ImportError:  # another Paddle layout: nothing of it to quiet
            continue
        logging.getLogger(name).setLevel(logging.WARNING)


def fleet_log_level() -> str:
    """The `log_level` to pass to `fleet.init`, which sets fleet's logger again."""
    return "INFO" if _DEBUG else "ERROR"


@contextlib.contextmanager
def captured_prints(log: Optional[logging.Logger] = None) -> Iterator[None]:
    """What framework code `print`s inside the block goes to `log` at debug level (to the console
    unchanged in debug mode)."""
    if _DEBUG:
        yield
        return
    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        yield
    log = log or logging.getLogger("ernie_mtl")
    for line in buffer.getvalue().splitlines():
        if line.strip():
            log.debug("paddle: %s", line)


@contextlib.contextmanager
def captured_stderr(log: Optional[logging.Logger] = None) -> Iterator[None]:
    """What framework code writes to stderr inside the block goes to `log` at debug level (e.g. the
    "Modified FLAGS detected" table `paddle.distributed.init_parallel_env` prints when the entry point
    set executor flags on purpose); unchanged in debug mode."""
    if _DEBUG:
        yield
        return
    buffer = io.StringIO()
    with contextlib.redirect_stderr(buffer):
        yield
    log = log or logging.getLogger("ernie_mtl")
    for line in buffer.getvalue().splitlines():
        if line.strip():
            log.debug("paddle: %s", line)


def is_debug() -> bool:
    return _DEBUG


class _LineFilter(io.TextIOBase):
    """A text stream that forwards every line except those starting with one of `prefixes`."""

    def __init__(self, target: TextIO, prefixes: Sequence[str]):
        self._target, self._prefixes, self._pending = target, tuple(prefixes), ""

    def write(self, text: str) -> int:
        self._pending += text
        *lines, self._pending = self._pending.split("\n")
        for line in lines:
            if not line.startswith(self._prefixes):
                self._target.write(line + "\n")
        return len(text)

    def flush(self) -> None:
        if self._pending and not self._pending.startswith(self._prefixes):
            self._target.write(self._pending)
        self._pending = ""
        self._target.flush()


@contextlib.contextmanager
def _dropped_lines(prefixes: Sequence[str]) -> Iterator[None]:
    original = sys.stderr
    sys.stderr = _LineFilter(original, prefixes)
    try:
        yield
    finally:
        sys.stderr.flush()
        sys.stderr = original


class _TqdmHandler(logging.StreamHandler):
    """Writes through tqdm so that log lines do not tear the progress bar."""

    def emit(self, record: logging.LogRecord) -> None:
        from tqdm import tqdm

        try:
            tqdm.write(self.format(record), file=self.stream)
        except Exception:  # logging must never kill training
            self.handleError(record)


def get_logger(rank: int) -> logging.Logger:
    """`ernie_mtl` logger: INFO on rank 0, WARNING elsewhere (errors still show on every rank)."""
    logger = logging.getLogger("ernie_mtl")
    handler = next((h for h in logger.handlers if isinstance(h, _TqdmHandler)), None)
    if handler is None:
        handler = _TqdmHandler(sys.stdout)
        logger.addHandler(handler)
        logger.propagate = False
    handler.setFormatter(logging.Formatter(f"%(asctime)s [rank {rank}] %(message)s", "%H:%M:%S"))
    logger.setLevel(logging.DEBUG if is_debug() else logging.INFO if rank == 0 else logging.WARNING)
    return logger
