"""Merge corpora tokenized by separate `create_pretraining_data` jobs into one `.bin/.idx` pair.

    python -m data_tools.merge --inputs data/shard0 data/shard1 data/shard2 --output_prefix data/corpus

Nothing is re-tokenized: the token bytes of each input are copied as they are (in the kernel
where the filesystem allows it), the sentence sizes and document ends are streamed and shifted,
so memory does not depend on the corpus size. Documents keep the order of --inputs. Merging the
outputs of shards of an input gives, byte for byte, the `.bin` and `.idx` that one job on the
concatenated input writes.

Checked first, all problems reported at once: every input exists, is a valid MMIDIDX pair whose
sizes add up to its `.bin` (the merge computes the pointers from the sizes) and has its `.json`
sidecar, whose counts match the pair; all inputs have the same token dtype, the same
vocabulary (sha1 of the vocab file) and the same tokenization options (do_lower_case,
split_sentences, cn_whole_word_segment, jieba_hmm); no input is given twice; the output does not
exist yet. The output appears only when complete (temporary files, then rename; `.json` last);
a failure (disk full, ...) leaves nothing behind. Exit status 2 with one message for any of these.

The merged `<output_prefix>.json` holds the fields of the inputs' sidecars: the shared ones
(format, dtype, vocab, options) as they are; `inputs` = every input's inputs, in merge order;
`input_bytes`, `documents`, `sentences`, `tokens`, `empty_documents_skipped`, `malformed_lines`
= sums; plus `merged_from`: each merged prefix with its counts.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import List, Optional, Sequence

import numpy as np

from data_tools.cli_utils import UserError, run_cli, write_error

PROG = "data_tools.merge"
# sidecar fields that must agree for token ids to mean the same thing in every input
MUST_MATCH = ("dtype", "vocab_sha1", "do_lower_case", "split_sentences", "cn_whole_word_segment", "jieba_hmm")
SUMMED = ("input_bytes", "documents", "sentences", "tokens", "empty_documents_skipped", "malformed_lines")


def _prefix(path: str) -> str:
    return path[:-4] if path.endswith((".bin", ".idx")) else path


class _Input:
    def __init__(self, prefix: str, dataset, sidecar: dict):
        self.prefix, self.dataset, self.sidecar = prefix, dataset, sidecar

    @property
    def bin_bytes(self) -> int:
        return os.path.getsize(self.prefix + ".bin")


def open_inputs(prefixes: Sequence[str]) -> List[_Input]:
    """Open and check every input (see the module docstring); raises UserError listing all problems."""
    from data_tools.indexed_dataset import IndexedDatasetError, MMapIndexedDataset

    problems: List[str] = []
    inputs: List[_Input] = []
    seen = {}
    for arg in prefixes:
        prefix = _prefix(arg)
        key = os.path.realpath(prefix)
        if key in seen:
            problems.append(f"--inputs {arg}: given twice (also as {seen[key]}); list each corpus once")
            continue
        seen[key] = arg
        missing = [prefix + ext for ext in (".bin", ".idx") if not os.path.isfile(prefix + ext)]
        if missing:
            problems.append(f"--inputs {arg}: {' and '.join(missing)} not found (give the prefix that "
                            "create_pretraining_data --output_prefix wrote)")
            continue
        try:
            ds = MMapIndexedDataset(prefix)
        except IndexedDatasetError as exc:
            problems.append(f"--inputs {arg}: {exc}")
            continue
        # the merge writes pointers computed from the sizes: those must describe the .bin exactly
        tokens = int(ds.sizes.sum(dtype=np.int64))
        if tokens * ds.dtype.itemsize != os.path.getsize(prefix + ".bin"):
            problems.append(f"--inputs {arg}: its sizes add up to {tokens * ds.dtype.itemsize} bytes of tokens, "
                            f"{prefix}.bin has {os.path.getsize(prefix + '.bin')}: the pair is inconsistent")
            continue
        sidecar_path = prefix + ".json"
        try:
            with open(sidecar_path, encoding="utf-8") as f:
                sidecar = json.load(f)
            if not isinstance(sidecar, dict):
                raise ValueError("not a JSON object")
        except FileNotFoundError:
            problems.append(f"--inputs {arg}: {sidecar_path} not found: without the sidecar the vocabulary "
                            "cannot be checked (merge corpora written by create_pretraining_data)")
            continue
        except (ValueError, UnicodeDecodeError) as exc:
            problems.append(f"--inputs {arg}: {sidecar_path} is not a valid sidecar ({exc})")
            continue
        lacking = [k for k in MUST_MATCH + SUMMED if k not in sidecar]
        if lacking:
            problems.append(f"--inputs {arg}: {sidecar_path} lacks {', '.join(lacking)} (not written by "
                            "create_pretraining_data?)")
            continue
        actual = {"dtype": ds.dtype.name, "documents": ds.num_docs, "sentences": len(ds), "tokens": tokens}
        stale = [f"{k} {sidecar[k]} in the sidecar, {v} in the data" for k, v in actual.items() if sidecar[k] != v]
        if stale:
            problems.append(f"--inputs {arg}: {sidecar_path} does not describe {prefix}.bin/.idx ({'; '.join(stale)}): "
                            "re-run create_pretraining_data for this shard")
            continue
        inputs.append(_Input(prefix, ds, sidecar))
    if inputs:
        first = inputs[0]
        for other in inputs[1:]:
            diff = [f"{k} {other.sidecar[k]!r} (vs {first.sidecar[k]!r} in {first.prefix})"
                    for k in MUST_MATCH if other.sidecar[k] != first.sidecar[k]]
            if diff:
                what = "vocabulary" if any(d.startswith("vocab_sha1") for d in diff) else "tokenization"
                problems.append(f"--inputs {other.prefix}: different {what}: {'; '.join(diff)}; token ids only "
                                "mean the same thing with the same vocab, dtype and options: re-tokenize the shard")
    if problems:
        raise UserError(problems)
    return inputs


def merged_sidecar(inputs: Sequence[_Input]) -> dict:
    """The output's sidecar (see the module docstring)."""
    out = dict(inputs[0].sidecar)
    out.pop("merged_from", None)
    out["inputs"] = [path for i in inputs for path in i.sidecar.get("inputs", [])]
    for key in SUMMED:
        out[key] = sum(int(i.sidecar[key]) for i in inputs)
    out["merged_from"] = [{"prefix": os.path.abspath(i.prefix), **{k: i.sidecar[k] for k in SUMMED}}
                          for i in inputs]
    return out


def merge(inputs: Sequence[_Input], output_prefix: str, progress=None) -> dict:
    """Write the merged pair and sidecar (atomically: temporary files, then rename). Returns the
    builder's stats."""
    from data_tools.create_pretraining_data import remove_quietly, write_json_temp
    from data_tools.indexed_dataset import IndexedDatasetBuilder

    json_tmp = None
    try:
        with IndexedDatasetBuilder(output_prefix, inputs[0].dataset.dtype) as builder:
            for i in inputs:
                builder.append_dataset(i.dataset, progress)
            json_tmp = write_json_temp(output_prefix + ".json", merged_sidecar(inputs))
            stats = builder.finalize()
            os.replace(json_tmp, output_prefix + ".json")
            json_tmp = None
    finally:
        if json_tmp is not None:
            remove_quietly(json_tmp)
    return stats


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=f"python -m {PROG}", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--inputs", nargs="+", required=True,
                   help="corpus prefixes (as given to create_pretraining_data --output_prefix), in merge order")
    p.add_argument("--output_prefix", required=True, help="writes <prefix>.bin, <prefix>.idx, <prefix>.json")
    return p


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Returns the exit status: 0 merged, 2 a problem the user can fix (the message says which)."""
    return run_cli(PROG, lambda: _main(argv))


def _main(argv: Optional[Sequence[str]]) -> int:
    args = build_parser().parse_args(argv)
    out = args.output_prefix
    problems = []
    if os.path.isdir(out):
        problems.append(f"--output_prefix {out}: is a directory; give a file prefix such as "
                        f"{os.path.join(out, 'corpus')}")
    else:
        from data_tools.create_pretraining_data import output_parent_problem

        exists = [out + ext for ext in (".bin", ".idx", ".json") if os.path.lexists(out + ext)]
        if exists:
            problems.append(f"--output_prefix {out}: {', '.join(exists)} already exist(s); remove them or choose "
                            "another prefix (a merge never overwrites a corpus)")
        parent = output_parent_problem(out, "--output_prefix")
        if parent:
            problems.append(parent)
    try:
        inputs = open_inputs(args.inputs)
    except UserError as exc:
        problems = exc.problems + problems
        inputs = []
    if problems:
        raise UserError(problems)
    from tqdm import tqdm

    total = sum(i.bin_bytes for i in inputs)
    t0 = time.perf_counter()
    from data_tools.create_pretraining_data import is_output_fault

    try:
        with tqdm(total=total, unit="B", unit_scale=True, desc="merging", disable=None, file=sys.stderr,
                  mininterval=1.0) as bar:
            stats = merge(inputs, out, bar.update)
    except OSError as exc:
        if not is_output_fault(exc, out):
            raise
        raise write_error(exc, f"{out}.bin/.idx/.json", "nothing was written (temporary files removed)") from exc
    seconds = max(time.perf_counter() - t0, 1e-9)
    written = stats["bin_bytes"] + stats["idx_bytes"]
    print(f"merged {len(inputs)} corpora: documents {stats['documents']:,} | sentences {stats['sequences']:,} | "
          f"tokens {stats['tokens']:,} ({stats['dtype']})\n"
          f"wrote {stats['bin_path']} ({stats['bin_bytes']:,} B), {stats['idx_path']} ({stats['idx_bytes']:,} B), "
          f"{out}.json in {seconds:.1f}s = {written / seconds / 1e6:.0f} MB/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
