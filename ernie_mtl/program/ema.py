"""Exponential moving average of the weights, kept on the device (PALM's `use_ema` / `ema_decay`).

After every optimizer step a small program updates, for every parameter this rank holds,

    ema = d_n * ema + (1 - d_n) * w          d_0 = 0 (the first update copies w),
                                             d_n = min(decay, (1 + n) / (10 + n)) afterwards

(PALM/TF's warm-up decay, so that early averages are not dominated by the random initialisation),
where w is the float32 value the optimizer updates: the parameter, or under AMP O2 its fp32 master
weight. The averages are persistable variables `<param>@EMA` of the training program, so
checkpoints save and resume them with the rest of the program state (the update count is the
optimizer step). `swapped_in()` runs two more small programs around evaluation or export: the
parameters are backed up on the device and replaced by their averages (cast to the parameter's
dtype), then restored. Nothing goes through the host per step.

Under sharding a rank holds (and averages) only the parameters it owns; the evaluation program's
broadcasts then hand the averaged values to the other ranks, as they hand out the trained ones.
"""
from __future__ import annotations

import contextlib
from typing import Dict, Iterator, List, Mapping

import numpy as np

EMA_SUFFIX = "@EMA"
_BACKUP_SUFFIX = "@EMA_BACKUP"
_DECAY = "ema_decay"
_KEEP = "ema_keep"  # 1 - decay, fed rather than computed so that d_0 = 0 copies exactly


def ema_name(param: str) -> str:
    return param + EMA_SUFFIX


def warmup_decay(decay: float, update: int) -> float:
    """d_n of the module docstring for the update number `update` (0-based)."""
    return 0.0 if update == 0 else min(decay, (1.0 + update) / (10.0 + update))


class DeviceEMA:
    """Averages of `params` (static names held by this rank in `main`) in `main`'s scope."""

    def __init__(self, main, params: List[str], decay: float):
        self.decay = float(decay)
        block = main.global_block()
        self.params = [p for p in params if block.has_var(p) and block.var(p).persistable]
        # the float32 value the optimizer updates: AMP O2's master weight where there is one
        self.sources = {p: (p + "_fp32_master_0" if block.has_var(p + "_fp32_master_0") else p) for p in self.params}
        # shapes of the tensors these programs touch only: gradient merge's conditional block adds
        # STEP_SCOPES variables to the block, which have no shape (asking raises)
        self._specs = {n: (list(block.var(n).shape), block.var(n).dtype)
                       for n in {*self.params, *self.sources.values()}}
        for p in self.params:  # persistable in the training program: checkpoints carry them
            block.create_var(name=ema_name(p), shape=self._specs[p][0], dtype="float32", persistable=True,
                             stop_gradient=True)
        self.init_program = self._program(self._init_ops)
        self.update_program = self._program(self._update_ops, feeds=True)
        self.swap_in_program = self._program(self._swap_in_ops)
        self.swap_out_program = self._program(self._swap_out_ops)

    # -- program construction ---------------------------------------------------------------------
    def _program(self, build, feeds: bool = False):
        import paddle

        program = paddle.static.Program()
        with paddle.static.program_guard(program, paddle.static.Program()):
            block = program.global_block()
            if feeds:
                build(block, paddle.static.data(_DECAY, [1], "float32"), paddle.static.data(_KEEP, [1], "float32"))
            else:
                build(block)
        return program

    def _declare(self, block, name: str, like: str, dtype=None):
        shape, like_dtype = self._specs[like]
        return block.create_var(name=name, shape=shape, dtype=dtype or like_dtype, persistable=True)

    def _init_ops(self, block):
        for p in self.params:
            ema = self._declare(block, ema_name(p), p, "float32")
            block.append_op(type="fill_constant", outputs={"Out": [ema]},
                            attrs={"shape": list(self._specs[p][0]), "dtype": ema.dtype, "value": 0.0})

    def _update_ops(self, block, decay, keep):
        import paddle

        for p in self.params:
            src = self._declare(block, self.sources[p], self.sources[p])
            ema = self._declare(block, ema_name(p), p, "float32")
            value = src if src.dtype == paddle.float32 else paddle.cast(src, "float32")
            paddle.assign(paddle.add(paddle.multiply(ema, decay), paddle.multiply(value, keep)), output=ema)

    def _swap_in_ops(self, block):
        import paddle

        for p in self.params:
            param = self._declare(block, p, p)
            backup = self._declare(block, p + _BACKUP_SUFFIX, p)
            ema = self._declare(block, ema_name(p), p, "float32")
            paddle.assign(param, output=backup)
            paddle.assign(ema if param.dtype == paddle.float32 else paddle.cast(ema, param.dtype), output=param)

    def _swap_out_ops(self, block):
        import paddle

        for p in self.params:
            paddle.assign(self._declare(block, p + _BACKUP_SUFFIX, p), output=self._declare(block, p, p))

    # -- running --------------------------------------------------------------------------------------
    def initialize(self, exe, scope=None) -> None:
        """Zero the averages (a fresh run; a resumed run then loads its saved ones)."""
        exe.run(self.init_program, scope=scope)

    def update(self, exe, update_number: int, scope=None) -> None:
        """One update after optimizer step `update_number + 1` (`update_number` = 0-based count)."""
        d = warmup_decay(self.decay, update_number)
        exe.run(self.update_program, feed={_DECAY: np.array([d], np.float32),
                                           _KEEP: np.array([1.0 - d], np.float32)}, scope=scope)

    @contextlib.contextmanager
    def swapped_in(self, exe, scope=None) -> Iterator[None]:
        """Inside: the parameters hold their averages (evaluation, export); restored on exit."""
        exe.run(self.swap_in_program, scope=scope)
        try:
            yield
        finally:
            exe.run(self.swap_out_program, scope=scope)

    def values(self, scope) -> Dict[str, np.ndarray]:
        """param -> its average as a host array (export only: a copy, not for the training loop)."""
        out = {}
        for p in self.params:
            var = scope.find_var(ema_name(p))
            if var is not None and var.get_tensor()._is_initialized():
                out[p] = np.array(var.get_tensor())
        return out


def averages_from_state(state: Mapping[str, np.ndarray]) -> Dict[str, np.ndarray]:
    """param -> average, from a saved program state (the `<param>@EMA` entries)."""
    return {k[:-len(EMA_SUFFIX)]: v for k, v in state.items() if k.endswith(EMA_SUFFIX)}
