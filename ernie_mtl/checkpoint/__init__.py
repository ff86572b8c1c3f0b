"""Checkpoints: the layout of an output folder (`layout`), atomic writes (`io`), and the store that
writes, finds, verifies and loads them (`store`). Every consumer (the loop, evaluation, export, the
converter, the command-line checks, the watchdog) goes through here. Imports only config."""
from ernie_mtl.checkpoint.io import replace_dir, sha1_of, write_json_atomic  # noqa: F401
from ernie_mtl.checkpoint.layout import (LAST, MANIFEST, MODEL_PREFIX, STATE_DIR, SUMS, TRAIN_STATE,  # noqa: F401
                                         best_dir, best_name, export_dir, is_complete, kept_name, last_dir)
from ernie_mtl.checkpoint.store import (CheckpointError, CheckpointRef, Checkpointer, TrainState,  # noqa: F401
                                        existing_outputs, find_latest, kept_checkpoints, merged_state,
                                        read_train_state, read_train_state_file, scan, unreadable_state_file,
                                        verified_state, verify_files)
