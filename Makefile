# Two commands for a fresh machine (Python 3.11, a C++ compiler, network to PyPI):
#   make demo   -> virtualenv + install + demo data + the main job
#   make test   -> virtualenv + install + the test suite
# and for the inner loop: make test-fast (the in-process unit tests, a few minutes)
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
STAMP := $(VENV)/.installed-stamp
# pip's own chatter about unreachable extra indexes is noise, not progress
PIP_FLAGS ?= --disable-pip-version-check

.PHONY: install demo demo-pretrain test test-fast bench bench-quality clean

$(STAMP): pyproject.toml setup.py constraints.txt data_tools/helpers.cpp
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install $(PIP_FLAGS) -q -c constraints.txt -e ".[cpu,test,demo]"
	$(PY) -c "import data_tools.index as i; print('compiled index helper OK, version', i.HELPER_VERSION)"
	touch $(STAMP)

install: $(STAMP)

# The multi-task demo (scripts/demo/multitask.yaml: its task files point into demo_data/), then a
# prediction with one exported target through Paddle Inference, then what the figures mean (baselines).
demo: $(STAMP)
	$(PY) -m data_tools.prepare_demo_data --output_dir demo_data
	$(PY) run_multitask_static.py --config scripts/demo/multitask.yaml --resume none --overwrite_output_dir
	$(PY) run_multitask_static.py --do_predict --task sentiment --output_dir output/demo_multitask \
	    --pred_file demo_data/tasks/sentiment/test.tsv
	$(PY) scripts/demo/report.py --run_dir output/demo_multitask --tasks_dir demo_data/tasks
	@echo "demo done: checkpoints output/demo_multitask/model_last (best_<task>; each target refined alone:" \
	    "refine/<task>/), inference models output/demo_multitask/<task>/infer_model (the refined ones;" \
	    "the multi-task stage's: infer_model_multitask), predictions output/demo_multitask/sentiment/predictions.json;" \
	    "VisualDL: $(VENV)/bin/visualdl --logdir output/demo_multitask/visualdl"

# The flag-mode pretraining demo (PaddleNLP ERNIE 1.0 flags, one corpus)
demo-pretrain: $(STAMP)
	$(PY) -m data_tools.prepare_demo_data --output_dir demo_data
	$(PY) run_multitask_static.py --config scripts/demo_pretrain.yaml

# Two passes: nearly everything shares the 2 cores (pytest-xdist; multi-process launches too, each worker
# with its own port range), then the tests whose outcome depends on real time passing at the expected pace
# (peer heartbeat timeouts: module flag EXCLUSIVE, tests/conftest.py) run apart from the CPU-bound ones,
# two at a time: they mostly wait on heartbeats and timeouts (8 of them used 2 of 2.7 CPU-minutes per 2.8
# minutes of wall time, two at a time, on a machine whose 2 cores were busy with other jobs, and passed).
test: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy
	$(PY) -m pytest -q -n 2 --dist loadfile -m "not exclusive" --durations=10 tests
	$(PY) -m pytest -q -n 2 --dist load -m exclusive --durations=10 tests

# The inner loop: tests/unit without the tests marked slow (each over about 4 s) or exclusive; both cores.
test-fast: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy
	$(PY) -m pytest -q -n 2 -m "not slow and not exclusive" --durations=5 tests/unit

bench: $(STAMP)
	$(PY) benchmarks/bench_index.py
	$(PY) benchmarks/bench_preprocess.py
	$(PY) benchmarks/bench_dataset.py
	$(PY) benchmarks/bench_merge.py --repeats 3
	$(PY) benchmarks/bench_train.py
	$(PY) benchmarks/bench_multitask.py

# What the pipeline's models are worth: pretraining and multi-task gains over paired seeds
# (docs/quality.md; long: not part of `make bench`)
bench-quality: $(STAMP)
	$(PY) benchmarks/bench_quality.py --jobs 2

clean:
	rm -rf build *.egg-info data_tools/_helpers*.so demo_data output/demo_pretrain output/demo_multitask
