"""Small helpers shared by the command-line tools: boolean flags and the one error style.

The error style of every entry point (data tools, run_multitask_static.py, static_to_dynamic.py):
a user error or an I/O fault (disk full, permission denied, not a directory, ...) prints one
message naming the file, line, flag or setting and the fix, on stderr, prefixed with the program
name, and the process exits with status 2. No traceback, unless the environment variable
`ERNIE_MTL_DEBUG=1` asks for it. Anything else is a bug and keeps its traceback.

    def main(argv=None) -> int:
        ...
        raise UserError(f"{path}:{line}: ...; fix: ...")

    if __name__ == "__main__":
        sys.exit(run_cli("data_tools.build_vocab", main))
"""
from __future__ import annotations

import argparse
import errno
import os
import sys
import traceback
from typing import Callable, Sequence, Union

DEBUG_ENV = "ERNIE_MTL_DEBUG"
USER_ERROR_EXIT = 2

_TRUE = {"1", "true", "t", "yes", "y", "on"}
_FALSE = {"0", "false", "f", "no", "n", "off"}


def str2bool(value) -> bool:
    """Parse a boolean flag value. Use with `nargs="?", const=True` so that a bare `--flag`
    enables it and `--flag true/false` both work (PaddleNLP's `const=False` turned a bare
    `--use_amp` *off*)."""
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise argparse.ArgumentTypeError(f"expected a boolean (true/false, 1/0, yes/no), got {value!r}")


class UserError(ValueError):
    """A problem the user can fix (bad flag, bad file, bad value). `problems` lists each one; the
    message is the single problem, or all of them one per line."""

    def __init__(self, problems: Union[str, Sequence[str]]):
        self.problems = [problems] if isinstance(problems, str) else list(problems)
        if len(self.problems) == 1:
            message = self.problems[0]
        else:
            message = f"{len(self.problems)} problems:\n" + "\n".join(f"  - {p}" for p in self.problems)
        super().__init__(message)


class Terminated(BaseException):
    """The process was asked to stop by a signal (SIGTERM, SIGINT, SIGHUP) outside a step boundary that
    could save it (ernie_mtl/dist/preemption.py raises it from the signal handler). A BaseException, like
    KeyboardInterrupt, so no `except Exception` on the way up swallows it; `run_cli` prints its message
    and exits 128 + the signal number (143 for SIGTERM, 130 for SIGINT), the status a shell expects."""

    def __init__(self, signum: int, message: str):
        super().__init__(message)
        self.signum = signum

    @property
    def exit_status(self) -> int:
        return 128 + self.signum


# errno -> what to do about it (the message always names the file and the system's reason)
IO_FIXES = {
    errno.ENOSPC: "free disk space or write somewhere else",
    errno.EDQUOT: "free space in your quota or write somewhere else",
    errno.EFBIG: "the file exceeds the size limit (ulimit -f) or the filesystem's maximum file size",
    errno.EACCES: "check the permissions, or choose a folder you can write to",
    errno.EPERM: "check the permissions, or choose a folder you can write to",
    errno.EROFS: "the filesystem is read-only: choose a writable folder",
    errno.ENOTDIR: "a part of the path is a file, not a folder: choose another path",
    errno.EISDIR: "the path is a folder, where a file is expected: give a file path",
    errno.ENOENT: "check the path",
    errno.EEXIST: "remove it or choose another path",
    errno.ENOTEMPTY: "remove it or choose another path",
    errno.EIO: "the device reported an I/O error: check the disk",
}
IO_ERRNOS = frozenset(IO_FIXES)


def describe_os_error(e: OSError) -> str:
    """'cannot write /x/y: No space left on device; free disk space or write somewhere else'."""
    name = e.filename if e.filename is not None else "a file"
    if e.filename2 is not None:
        name = f"{e.filename} -> {e.filename2}"
    reason = e.strerror or str(e)
    fix = IO_FIXES.get(e.errno)
    return f"{name}: {reason}" + (f"; {fix}" if fix else "")


def write_error(e: OSError, target: str, outcome: str = "nothing was written") -> UserError:
    """The one-message form of an I/O fault met while writing `target` (an output, or a set of
    them): `write()` errors name no file, and temporary names mean nothing to the user.
    'cannot write data/corpus.bin: No space left on device; free disk space or write somewhere
    else; nothing was written'."""
    reason = e.strerror or str(e)
    fix = IO_FIXES.get(e.errno)
    return UserError(f"cannot write {target}: {reason}" + (f"; {fix}" if fix else "")
                     + (f"; {outcome}" if outcome else ""))


def is_user_fault(e: BaseException) -> bool:
    """UserError, or an OSError a user can act on (disk full, permissions, missing/wrong paths)."""
    return isinstance(e, UserError) or (isinstance(e, OSError) and e.errno in IO_ERRNOS)


def debug_enabled() -> bool:
    return os.environ.get(DEBUG_ENV, "").strip().lower() in _TRUE


def report(prog: str, e: BaseException) -> int:
    """Print `e` in the one error style and return the exit status (2 for user faults)."""
    if debug_enabled():
        traceback.print_exception(e, file=sys.stderr)
    if isinstance(e, UserError):
        text = str(e)
    elif isinstance(e, OSError):
        text = describe_os_error(e)
    else:  # a bug: keep the traceback
        if not debug_enabled():
            traceback.print_exception(e, file=sys.stderr)
        return 1
    sys.stderr.write(f"{prog}: error: {text}\n")
    return USER_ERROR_EXIT


def run_cli(prog: str, main: Callable[[], int]) -> int:
    """Run `main()` and turn user faults into the one error style (exit 2); Ctrl-C exits 130."""
    try:
        return int(main() or 0)
    except Terminated as e:
        sys.stderr.write(f"{prog}: {e}\n")
        return e.exit_status
    except KeyboardInterrupt:
        sys.stderr.write(f"{prog}: interrupted\n")
        return 130
    except BaseException as e:  # noqa: BLE001  (SystemExit passes through below)
        if isinstance(e, SystemExit):
            raise
        if is_user_fault(e):
            return report(prog, e)
        raise
