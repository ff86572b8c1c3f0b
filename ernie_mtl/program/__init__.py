"""Static programs of a run, built once and never run here (except the single-op programs that time
CPU kernels): the multi-task forward, AdamW and its LR schedule, fleet's minimize, idle-head freezing,
dropout seeds, the EMA, CPU kernel rewrites and their per-machine choice, and small program edits.
Imports config, dist, tasks and checkpoint.io (the kernel cache's atomic write)."""
