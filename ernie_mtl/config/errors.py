"""The configuration error: every problem names the file/flag/key, the bad value and the fix."""
from __future__ import annotations

from typing import List, Sequence, Union

from data_tools.cli_utils import UserError


class ConfigError(UserError):
    """Bad user configuration. Each problem names the flag, the bad value and the fix."""

    def __init__(self, problems: Union[str, Sequence[str]]):
        problems = [problems] if isinstance(problems, str) else list(problems)
        if len(problems) == 1:
            message = problems[0]
        else:
            message = f"{len(problems)} configuration problems:\n" + "\n".join(f"  - {p}" for p in problems)
        ValueError.__init__(self, message)
        self.problems = problems


def raise_if(problems: List[str]) -> None:
    """Raise one ConfigError listing `problems`, if there are any."""
    if problems:
        raise ConfigError(problems)
