"""The training losses, summed per task on the device, so that `Executor.run` needs no fetch per
micro-batch.

Why. Fetching a loss makes the executor copy it to the host inside the run (`fetch_v2` has CPU
kernels only: a GPU value goes through `memcpy_d2h`, whose kernel waits for the device stream for
copies of 64 KiB or less -- phi/kernels/memcpy_kernel.cc in Paddle 2.6). A fetch per micro-batch
therefore syncs host and device every micro-batch, and the host can never run ahead of the GPU.
`return_numpy=False` does not help: it only skips the final numpy conversion of a tensor that is
already on the host. Without a fetch, `Executor.run` returns once the kernels are queued.

What. For every task, a persistable float64 vector `loss_sums@<task>` = [loss, *scalars] (the
task's loss and its extra log scalars, e.g. mlm_loss and nsp_loss) is updated at the end of the
training program:

    sums_t = where(gate_t, sums_t + float64([loss_t, *scalars_t]), sums_t)

with `gate_t` the micro-batch's task one-hot (fed; with one task, always true). A value is cast
to float64 exactly and added in the order the micro-batches run: the same IEEE operations as the
host's running sum in `engine.metrics.Window` (Python floats), so the logged means are bitwise
the same numbers as when every micro-batch was fetched. `where` rather than `gate * value` keeps
an infinite or NaN loss (AMP overflow) of one task out of the other tasks' sums.

`take(exe)` runs a small program that copies the sums out, zeroes them, and fetches the copies
with the learning rate and the AMP loss scale (both persistable: their value after the latest
run): one fetch per logging step instead of one per micro-batch.

The sums are a window's state, not the model's: checkpoints leave them out (`StateView`), so a
checkpoint holds exactly the variables it held before, and a resumed run starts a new window
from zero as before.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

PREFIX = "loss_sums@"


def sums_name(task: str) -> str:
    return PREFIX + task


@dataclass
class Taken:
    """What `LossSums.take` returns: per task the sums of [loss, *scalars] since the previous take,
    and the learning rate and loss scale after the latest run (None without AMP loss scaling)."""

    sums: Dict[str, np.ndarray]
    lr: float
    loss_scale: Optional[float]


class LossSums:
    """The per-task sums of a training program (module docstring)."""

    def __init__(self, main, startup, task_losses: Mapping[str, Any], task_scalars: Mapping[str, Mapping[str, Any]],
                 *, gate: Optional[Any], lr: Any, loss_scaling: Optional[Any] = None):
        import paddle
        from paddle.utils import unique_name

        self.columns: Dict[str, Tuple[str, ...]] = {task_name: ("loss", *task_scalars.get(task_name, {}))
                                                     for task_name in task_losses}
        self.names: Dict[str, str] = {task_name: sums_name(task_name) for task_name in task_losses}
        self._lr, self._scale = lr.name, None if loss_scaling is None else loss_scaling.name
        # own temporary names: the program's were generated under a guard that has ended
        with paddle.static.program_guard(main, startup), unique_name.guard(PREFIX):
            for i, (task, loss) in enumerate(task_losses.items()):
                width = len(self.columns[task])
                sums = paddle.static.create_global_var([width], 0.0, "float64", persistable=True,
                                                       name=self.names[task])
                sums.stop_gradient = True
                values = paddle.concat([paddle.reshape(paddle.cast(v, "float64"), [1])
                                        for v in (loss, *task_scalars.get(task, {}).values())])
                added = paddle.add(sums, values)
                if gate is not None:
                    drawn = paddle.greater_than(paddle.slice(gate, axes=[0], starts=[i], ends=[i + 1]),
                                                paddle.full([1], 0.5, "float32"))
                    added = paddle.where(paddle.expand(drawn, [width]), added, sums)
                paddle.assign(added, sums)
        self._take = self._take_program(main)

    def _take_program(self, main):
        """A program that copies every sum, zeroes it, and fetches the copies, lr and loss scale."""
        import paddle
        from paddle.utils import unique_name

        program = paddle.static.Program()
        block, source = program.global_block(), main.global_block()

        def declare(name):
            v = source.var(name)
            return block.create_var(name=name, shape=v.shape, dtype=v.dtype, persistable=True)

        with paddle.static.program_guard(program, paddle.static.Program()), unique_name.guard(PREFIX):
            self._fetch: List[Any] = []
            for task, name in self.names.items():
                sums = declare(name)
                self._fetch.append(paddle.assign(sums))
                paddle.assign(paddle.zeros([len(self.columns[task])], "float64"), sums)
            self._fetch.append(declare(self._lr))
            if self._scale is not None:
                self._fetch.append(declare(self._scale))
        return program

    @property
    def variables(self) -> List[str]:
        return list(self.names.values())

    def take(self, exe, scope=None) -> Taken:
        """The sums since the previous take (then zero), the latest lr and loss scale: one fetch."""
        values = exe.run(self._take, fetch_list=self._fetch, scope=scope)
        sums = {task: np.asarray(v, dtype=np.float64).reshape(-1) for task, v in zip(self.names, values)}
        rest = [float(np.asarray(v).reshape(-1)[0]) for v in values[len(self.names):]]
        return Taken(sums=sums, lr=rest[0], loss_scale=rest[1] if len(rest) > 1 else None)


    def read(self, scope) -> Dict[str, np.ndarray]:
        """Host copies of the sums as they are now (not zeroed): for `restore`."""
        return {name: np.array(scope.find_var(name).get_tensor()) for name in self.names.values()}

    def restore(self, scope, values: Mapping[str, np.ndarray], place) -> None:
        """Put the sums back to `values` (from `read`): a replayed step (--on_anomaly replay) replaces
        the first attempt's losses instead of adding to them."""
        for name, value in values.items():
            scope.find_var(name).get_tensor().set(value, place)


class StateView:
    """`program` as `paddle.static.save`/`load` see it, without the variables `hidden` (the loss
    sums): those functions read `list_vars()` and the program desc only. Checkpoints written
    through it hold the same variables as before the sums existed, and older checkpoints load."""

    def __init__(self, program, hidden: Sequence[str]):
        self._program = program
        self._hidden = frozenset(hidden)

    def list_vars(self):
        return (v for v in self._program.list_vars() if v.name not in self._hidden)

    def __getattr__(self, name):
        return getattr(self._program, name)
