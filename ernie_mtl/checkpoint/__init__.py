"""Checkpoints: the layout of an output folder (`layout`), atomic writes (`io`), and the store that
writes, finds, verifies and loads them (`store`). Every consumer (the loop, evaluation, export, the
converter, the command-line checks) goes through here. Imports only config."""
from ernie_mtl.checkpoint.layout import MANIFEST, MODEL_PREFIX, export_dir  # noqa: F401
from ernie_mtl.checkpoint.store import *  # noqa: F401,F403
from ernie_mtl.checkpoint.store import (CheckpointError, CheckpointRef, Checkpointer, TrainState,  # noqa: F401
                                        existing_outputs, find_latest, kept_checkpoints, read_train_state,
                                        read_train_state_file, scan, sha1_of, verify_files, STATE_DIR, SUMS,
                                        TRAIN_STATE, _write_json_atomic)
