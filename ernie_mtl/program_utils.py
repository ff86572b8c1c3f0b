"""Small edits of static programs that task types may make on the programs they help build
(kept out of the program builder so that task types import no builder)."""
from __future__ import annotations


def remove_variable(name: str, programs) -> None:
    """Remove variable `name` and the ops that write it from the global blocks of `programs`."""
    for program in programs:
        block = program.global_block()
        for idx in reversed(range(len(block.ops))):
            if name in block.ops[idx].output_arg_names:
                block._remove_op(idx, sync=False)
        if block.has_var(name):
            block._remove_var(name, sync=False)
        block._sync_with_cpp()
