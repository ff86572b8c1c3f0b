"""Command line and YAML configuration for run_multitask_static.py. Not implemented yet (issue #3)."""
