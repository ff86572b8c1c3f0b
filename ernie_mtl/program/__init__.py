"""Static programs of a run, built once and never run here: the multi-task forward, AdamW and its
LR schedule, fleet's minimize, idle-head freezing, dropout seeds, the EMA, CPU kernel rewrites and
small program edits. Imports config, dist and tasks."""
