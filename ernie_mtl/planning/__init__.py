"""What a run will do before it runs: the seeded task schedule, the run plan (tasks, data, streams,
planned steps) and the dry-run planner (memory, GPU program facts, warnings)."""
