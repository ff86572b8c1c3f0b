"""The engine as a library: the training loop, evaluation, export and inference around one
prediction loop, callbacks, reporting, train state and resume, and the run functions the command
line and the Python APIs call (typed config in, results out; no process exits)."""
