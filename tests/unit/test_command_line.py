"""The command line: PaddleNLP flag names, booleans, YAML + CLI precedence, one error listing every problem."""
import zlib  # noqa: F401  (before paddle)

import pytest

import args
import run_multitask_static
from ernie_mtl.config import ConfigError


def make_corpus(folder):
    from data_tools.indexed_dataset import IndexedDatasetBuilder

    builder = IndexedDatasetBuilder(str(folder / "corpus"))
    for doc in range(3):
        builder.add_sentence([5, 6, 7 + doc])
        builder.add_sentence([8, 9])
        builder.end_document()
    builder.finalize()


@pytest.fixture()
def corpus(tmp_path):
    """A tiny real corpus (validation reads its header) and a 40-token vocab."""
    make_corpus(tmp_path)
    (tmp_path / "vocab.txt").write_text("\n".join(["[PAD]", "[CLS]", "[SEP]", "[MASK]", "[UNK]"]
                                                  + [f"t{i}" for i in range(35)]) + "\n")
    return tmp_path


def base_argv(corpus):
    return ["--input_dir", str(corpus / "corpus"), "--tokenizer_name_or_path", str(corpus),
            "--model_name_or_path", "ernie-tiny-test", "--max_seq_len", "64", "--device", "cpu",
            "--output_dir", str(corpus / "out")]


def test_every_paddlenlp_flag_exists():
    names = {a.dest for a in args.build_parser()._actions}
    paddlenlp = """model_type model_name_or_path tokenizer_name_or_path input_dir output_dir split binary_head
        max_seq_len micro_batch_size global_batch_size dp_degree sharding_degree use_sharding sharding_stage use_amp
        amp_dtype
        use_recompute max_lr min_lr warmup_rate decay_steps max_steps weight_decay grad_clip adam_beta1 adam_beta2
        adam_epsilon save_steps checkpoint_steps logging_freq eval_freq eval_iters num_workers seed device
        masked_lm_prob short_seq_prob max_ngrams hidden_dropout_prob attention_probs_dropout_prob config resume
        keep_last""".split()
    assert set(paddlenlp) <= names
    help_text = args.build_parser().format_help()
    assert "Peak learning rate, reached at the end of warm-up. (default: 0.0001)" in " ".join(help_text.split())


def test_typed_tree_defaults_and_resolved_paths(corpus, monkeypatch):
    monkeypatch.chdir(corpus)
    cfg = args.parse_config(base_argv(corpus)[:-1] + ["out"])
    assert isinstance(cfg, args.RunConfig)
    assert cfg.parallel.micro_batch_size == 8 and cfg.optim.max_lr > cfg.optim.min_lr
    assert cfg.data.vocab_file == corpus / "vocab.txt"  # a directory containing vocab.txt
    assert cfg.train.output_dir == str(corpus / "out")  # absolute: programs are built in another cwd
    assert cfg.train.resume == "auto" and cfg.amp.use_amp is False
    with pytest.raises(Exception):  # frozen
        cfg.train.seed = 1


@pytest.mark.parametrize("flags, expected", [
    (["--use_amp"], True), (["--use_amp", "true"], True), (["--use_amp", "False"], False), ([], False),
    (["--use_amp", "1"], True)])
def test_bare_boolean_enables(corpus, flags, expected):
    assert args.parse_config(base_argv(corpus) + flags).amp.use_amp is expected


def test_yaml_then_command_line(corpus):
    yaml_file = corpus / "run.yaml"
    yaml_file.write_text("max_lr: 0.002\nmin_lr: 1.0e-4\nuse_recompute: true\nmicro_batch_size: 4\n"
                         "custom_white_list: [softmax, gelu]\n")
    cfg = args.parse_config(base_argv(corpus) + ["--config", str(yaml_file), "--micro_batch_size", "2"])
    assert cfg.optim.max_lr == 0.002 and cfg.optim.min_lr == 1e-4
    assert cfg.parallel.use_recompute is True
    assert cfg.parallel.micro_batch_size == 2  # the command line wins
    assert cfg.amp.custom_white_list == ("softmax", "gelu")


def test_unknown_yaml_key_names_file_and_key(corpus):
    yaml_file = corpus / "bad.yaml"
    yaml_file.write_text("max_lr: 0.001\nmax_lrr: 0.1\n")
    with pytest.raises(ConfigError) as e:
        args.parse_config(base_argv(corpus) + ["--config", str(yaml_file)])
    assert e.value.problems == [f"{yaml_file}: unknown key 'max_lrr' (did you mean 'max_lr'?); keys are the flag "
                                "names (see --help)"]


def test_bad_flags_exit_2_with_one_message_listing_each(corpus, capsys):
    argv = base_argv(corpus) + ["--use_sharding", "false", "--sharding_degree", "2", "--max_lr", "fast",
                                "--min_lr", "-1", "--use_amp", "maybe", "--global_batch_size", "12",
                                "--micro_batch_size", "8", "--max_seq_len", "512", "--masked_lm_prob", "0",
                                "--eval_iters", "0", "--resume", str(corpus / "nowhere"), "--lerning_rate", "1"]
    assert run_multitask_static.main(argv) == 2
    err = capsys.readouterr().err
    expected = [
        "unknown argument '--lerning_rate'",
        "--max_lr 'fast' (command line) is not a number",
        "--use_amp 'maybe' (command line) is not true or false",
        "--min_lr -1.0 must be within [0, --max_lr 0.0001]",
        "--sharding_degree 2 needs --use_sharding; add it or set --sharding_degree 1",
        "--max_seq_len 512 exceeds the model's max_position_embeddings 128; use --max_seq_len <= 128",
        "--masked_lm_prob 0.0 must be within (0, 1)",
        "--eval_iters 0 must be >= 1",
        f"--resume {corpus / 'nowhere'}: not a complete checkpoint",
    ]
    assert err.startswith(f"run_multitask_static.py: error: {len(expected)} configuration problems:"), err
    for line in expected:
        assert line in err, line
    # the topology is checked once the parallel slice is consistent: nearest valid global batches
    with pytest.raises(ConfigError, match=r"--global_batch_size 12 is not a multiple .* nearest valid: 8 or 16"):
        args.parse_config(base_argv(corpus) + ["--global_batch_size", "12", "--micro_batch_size", "8"])


def test_vocab_larger_than_model_and_missing_corpus(corpus):
    (corpus / "corpus.idx").unlink()
    big = corpus / "big_vocab.txt"
    big.write_text("\n".join(["[PAD]", "[CLS]", "[SEP]", "[MASK]", "[UNK]"] + [f"t{i}" for i in range(1495)]) + "\n")
    argv = base_argv(corpus) + ["--tokenizer_name_or_path", str(big)]
    with pytest.raises(ConfigError) as e:
        args.parse_config(argv)
    assert sorted(e.value.problems) == sorted([
        f"--input_dir {corpus / 'corpus'}: {corpus / 'corpus.idx'} not found; give the corpus prefix (the path "
        "without .bin/.idx), weight/prefix pairs, or a folder of corpora",
        f"--tokenizer_name_or_path {big} has 1500 tokens but the model's vocab_size is 1000; pass --vocab_size 1500"])
    make_corpus(corpus)
    assert args.parse_config(argv + ["--vocab_size", "1500"]).model.vocab_size == 1500


def test_world_size_shapes_the_topology(corpus):
    cfg = args.parse_config(base_argv(corpus) + ["--use_sharding", "--sharding_degree", "2"], world_size=4)
    assert cfg.parallel.sharding_degree == 2
    with pytest.raises(ConfigError, match="does not divide the number of processes 3"):
        args.parse_config(base_argv(corpus) + ["--use_sharding", "--sharding_degree", "2"], world_size=3)


def test_bf16_amp_on_cpu_is_refused(corpus):
    with pytest.raises(ConfigError, match="--use_amp with --amp_dtype bfloat16 cannot run on CPU"):
        args.parse_config(base_argv(corpus) + ["--use_amp", "--amp_dtype", "bfloat16"])


@pytest.mark.parametrize("flags,yaml_text,expected", [
    ([], None, "auto"),  # the default: measured per machine
    (["--cpu_kernels"], None, "auto"),  # the old boolean, bare: on
    (["--cpu_kernels", "true"], None, "auto"),
    (["--cpu_kernels", "false"], None, "plain"),
    ([], "cpu_kernels: false\n", "plain"),  # a YAML boolean
    (["--cpu_kernels", "EXACT"], None, "exact"),
    (["--cpu_kernels", "matmul_v2, matmul_v2_grad,matmul_v2"], None, "matmul_v2,matmul_v2_grad"),
])
def test_cpu_kernels_modes_and_the_old_boolean(corpus, flags, yaml_text, expected):
    extra = []
    if yaml_text is not None:
        (corpus / "k.yaml").write_text(yaml_text)
        extra = ["--config", str(corpus / "k.yaml")]
    assert args.parse_config(base_argv(corpus) + extra + flags).train.cpu_kernels == expected


def test_a_bad_cpu_kernels_value_is_named(corpus):
    with pytest.raises(ConfigError) as e:
        args.parse_config(base_argv(corpus) + ["--cpu_kernels", "fast!"])
    assert any("--cpu_kernels 'fast!' is not auto, exact, plain (or true/false) or a comma-separated list of op "
               "types" in p for p in e.value.problems), e.value.problems
