"""A user's data mistakes are one line (``errors.DataError``): a bad preference row, a
Parquet shard without its column, a JSONL field of the wrong type, a chat row with an
unknown role, each refused through ``train`` (and ``eval`` where it reads data) with exit 2
and one line naming the file and line or row; met mid-run, the line names the step, the
checkpoints already written stay as they were and the same command resumes once the file
is fixed. A plug-in family whose module does not sow its final hidden state trains and
evaluates; only what compares hidden states asks for them, in one line."""

import hashlib
import json
import pathlib
import pickle
import re
import shutil

import pytest

from t5x_like import cache_tasks, errors, infer, train
from t5x_like import eval as eval_command
from t5x_like import tasks as tasks_command
from t5x_like.data import sources

TESTS = pathlib.Path(__file__).resolve().parent

TASKS = '''
"""The tasks of test_data_errors: one file each, in this module's folder."""
import pathlib

import t5x_like.data as td
from t5x_like import metrics
from t5x_like.builtin_tasks import pretraining
from t5x_like.data import chat, hf_tokenizers
from t5x_like.data import preprocessors as pp
from t5x_like.data.parquet import ParquetSource
from t5x_like.data.preference import PreferenceSource, TokenizePair

HERE = pathlib.Path(__file__).parent
TEXT_STEPS = [pp.Rekey({"targets": "text"}), pp.Tokenize(copy_pretokenized=True), pp.AppendEos(),
              pp.Truncate()]
SCORED = dict(score_metric_fns=[metrics.mean_log_likelihood])
td.TaskRegistry.add("de_lm", td.JsonlSource([str(HERE / "lm.jsonl")], holdout_every=0),
                    TEXT_STEPS, pretraining.features("targets"), **SCORED)
td.TaskRegistry.add("de_wrong_type", td.JsonlSource([str(HERE / "typed.jsonl")], holdout_every=0),
                    TEXT_STEPS, pretraining.features("targets"), **SCORED)
td.TaskRegistry.add("de_parquet", ParquetSource([str(HERE / "shard.parquet")], holdout_every=0),
                    TEXT_STEPS, pretraining.features("targets"), **SCORED)
td.TaskRegistry.add("de_prefs", PreferenceSource([str(HERE / "prefs.jsonl")], holdout_every=0),
                    [TokenizePair()],
                    pretraining.features("prompt", "chosen", "rejected", add_eos=False))
td.TaskRegistry.add("de_chat", chat.ConversationSource([str(HERE / "chat.jsonl")], holdout_every=0),
                    [chat.RenderChat()],
                    {"targets": td.Feature(hf_tokenizers.HfTokenizerVocabulary(HERE / "chat_tok"))})
'''

QUIET_FAMILY = '''
"""conv_lm_quiet: plugin_family's convolutional LM, its module without the sow of its
final hidden state (distillable, to be asked for it)."""
import flax.linen as nn
import jax.numpy as jnp

import plugin_family
from t5x_like.config.sections import section
from t5x_like.models import layers
from t5x_like.structures import families


@section
class QuietSpec(plugin_family.ConvLMSpec):
    FAMILY = "conv_lm_quiet"


class QuietConvLM(plugin_family.ConvLM):
    @nn.compact
    def __call__(self, decoder_input_tokens, deterministic=True, **unused_features):
        cfg = self.config
        embed = layers.Embed(cfg.vocab_size, cfg.d_model, dtype=layers.compute_dtype(cfg),
                             name="token_embedder")
        x = embed(decoder_input_tokens)
        for i in range(cfg.num_layers):
            x = plugin_family.ConvBlock(cfg, name=f"layers_{i}")(x)
        x = layers.RMSNorm(dtype=layers.compute_dtype(cfg), name="final_norm")(x)
        return embed.attend(x).astype(jnp.float32)


class QuietStructure(plugin_family.ConvLMStructure):
    name = "conv_lm_quiet"
    distillable = True


families.register(families.Family("conv_lm_quiet", QuietSpec, QuietConvLM, QuietStructure,
                                  rules={"*": (("taps", None),)}))
'''

CONFIG = '''
from t5x_like import config_lib


def get_config(variant="lm"):
    config = config_lib.default_config()
    quiet = variant.startswith("quiet")
    config.model = config_lib.model_defaults("conv_lm_quiet" if quiet else "decoder")
    config.model.update(dict(d_model=32, num_layers=1) if quiet else
                        dict(vocab_size=8192, d_model=32, num_heads=2, head_dim=16, d_ff=64,
                             num_layers=1))
    config.task = {"prefs": "de_prefs", "chat": "de_chat"}.get(variant, "de_lm")
    config.task_feature_lengths = {"prefs": {"inputs": 8, "targets": 8},
                                   "quiet_head": {"inputs": 16}}.get(variant, {"targets": 16})
    if variant == "prefs":
        config.preference.objective = "reward_model"
    if variant == "quiet_head":
        config.head.kind = "regression"
    config.data.pack = False
    config.batch_size = 8  # the 8 fake devices
    config.data_streams = 1  # one stream: its shuffled order of the rows is the file's
    config.num_train_steps = 2
    config.logging.every_steps = 1
    config.checkpoint.every_steps = 2
    config.evals.held_out.every_steps = 0
    config.optimizer.update(name="adamw", learning_rate=1e-3, warmup_steps=0)
    return config
'''

LM_ROWS = [{"text": f"It is a truth universally acknowledged, line {i}."} for i in range(40)]
BAD_LM_ROW = 26  # made bad mid-run: the stream (seed 0) reads it at step 5, its 38th row


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))


@pytest.fixture(scope="module")
def place(tmp_path_factory):
    """A folder as a user's: the task module and its data files (each with its one
    mistake), the no-sow family, the config; importable as the user's --module."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from test_chat_sft import make_tokenizer

    folder = tmp_path_factory.mktemp("user")
    (folder / "de_tasks.py").write_text(TASKS)
    (folder / "quiet_family.py").write_text(QUIET_FAMILY)
    (folder / "de_config.py").write_text(CONFIG)
    write_jsonl(folder / "lm.jsonl", LM_ROWS)
    write_jsonl(folder / "typed.jsonl", [LM_ROWS[0], LM_ROWS[1], {"text": {"words": 3}},
                                         LM_ROWS[2]])
    pq.write_table(pa.table({"body": [row["text"] for row in LM_ROWS]}), folder / "shard.parquet")
    write_jsonl(folder / "prefs.jsonl", [{"prompt": "a b", "chosen": "c", "rejected": "d"},
                                         {"prompt": "e", "chosen": "f", "rejected": "g"},
                                         {"prompt": "a", "chosen": "b"}])
    write_jsonl(folder / "chat.jsonl", [
        {"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}]},
        {"messages": [{"role": "user", "content": "Hi"}, {"role": "robot", "content": "Beep"}]}])
    make_tokenizer(folder / "chat_tok")
    with pytest.MonkeyPatch.context() as patch:
        patch.syspath_prepend(str(TESTS))  # plugin_family, which quiet_family builds on
        patch.syspath_prepend(str(folder))
        yield folder


def flags(place, variant="lm", *extra):
    return [f"--config={place / 'de_config.py'}:{variant}", "--module=de_tasks", "--quiet",
            *extra]


def one_line(code, capsys) -> str:
    """The refusal's line: exit 2, and stderr is that one line (no traceback)."""
    err = capsys.readouterr().err
    assert code == 2, err
    assert len(err.strip().splitlines()) == 1, err
    return err.strip()


@pytest.fixture(scope="module")
def trained(place):
    """Two steps of the decoder on de_lm, a checkpoint at step 2."""
    workdir = place / "trained"
    assert train.main(flags(place, "lm", f"--workdir={workdir}")) == 0
    return workdir


def test_a_preference_row_without_rejected_is_one_line_naming_file_and_line(place, capsys):
    workdir = place / "prefs_run"
    line = one_line(train.main(flags(place, "prefs", f"--workdir={workdir}")), capsys)
    assert re.fullmatch(r"train: \S*prefs\.jsonl:3: a preference row needs 'prompt', 'chosen' "
                        r"and 'rejected' .* it lacks \['rejected'\] .*", line), line
    assert not (workdir / "train.lock").exists()


def test_a_parquet_shard_without_its_column_is_one_line(place, trained, capsys):
    line = one_line(train.main(flags(place, "lm", f"--workdir={place / 'pq_run'}",
                                     "--config.task=de_parquet")), capsys)
    assert re.fullmatch(r"train: \S*shard\.parquet: no column 'text' \(its columns: body\); set "
                        r"ParquetSource's fields .*", line), line
    line = one_line(eval_command.main([f"--checkpoint={trained}", "--task=de_parquet",
                                       "--split=train", "--mode=score", f"--output_dir={place / 'pq_eval'}",
                                       "--module=de_tasks", "--quiet"]), capsys)
    assert line.startswith("eval: ") and "shard.parquet: no column 'text'" in line, line


def test_a_field_of_the_wrong_type_names_its_line_in_every_command(place, trained, capsys):
    expected = (r"\S*typed\.jsonl:3: Task 'de_wrong_type': feature 'targets' is dict "
                r"\(\{'words': 3\}\), not text; .*")
    line = one_line(train.main(flags(place, "lm", f"--workdir={place / 'typed_run'}",
                                     "--config.task=de_wrong_type")), capsys)
    assert re.fullmatch(r"train: at step 1: " + expected, line), line
    line = one_line(eval_command.main([f"--checkpoint={trained}", "--task=de_wrong_type",
                                       "--split=train", "--mode=score",
                                       f"--output_dir={place / 'typed_eval'}",
                                       "--module=de_tasks", "--quiet"]), capsys)
    assert re.fullmatch(r"eval: " + expected, line), line
    line = one_line(tasks_command.main(["sample", "de_wrong_type", "--n=4", "--module=de_tasks"]),
                    capsys)
    assert re.fullmatch(r"tasks: " + expected, line), line
    line = one_line(infer.main([f"--checkpoint={trained}", "--task=de_wrong_type", "--split=train",
                                f"--output_file={place / 'typed.out.jsonl'}", "--inputs_length=8",
                                "--module=de_tasks"]), capsys)
    assert re.fullmatch(r"infer: " + expected, line), line


def test_a_chat_row_with_an_unknown_role_is_one_line(place, capsys):
    line = one_line(train.main(flags(place, "chat", f"--workdir={place / 'chat_run'}")), capsys)
    assert re.fullmatch(r"train: \S*chat\.jsonl:2: message 2 has role 'robot'; the roles are "
                        r"system, user, assistant, tool\.", line), line


def test_a_bad_row_in_a_beam_worker_reaches_cache_tasks_as_its_line(place, capsys, caplog):
    """Beam logs a worker's error with its traceback and re-raises it as its own exception
    (with the step's name over the original); cache_tasks prints the data's line alone."""
    import t5x_like.data as td
    from t5x_like.builtin_tasks import pretraining
    from t5x_like.data import preprocessors as pp
    if "de_cached" not in td.TaskRegistry.names():
        td.TaskRegistry.add("de_cached", td.JsonlSource([str(place / "typed.jsonl")], holdout_every=0),
                            [pp.Rekey({"targets": "text"}), pp.Tokenize(), pp.CacheMarker()],
                            pretraining.features("targets"))
    line = one_line(cache_tasks.main(["--tasks=de_cached", f"--output_dir={place / 'cache'}"]),
                    capsys)
    assert re.fullmatch(r"cache_tasks: \S*typed\.jsonl:3: Task 'de_cached': feature 'targets' "
                        r"is dict .*", line), line
    assert not [record for record in caplog.records if record.exc_info], caplog.text


def _digests(folder) -> dict:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def _metrics_steps(workdir) -> list[int]:
    return [json.loads(line)["step"] for line in (workdir / "metrics.jsonl").open()]


def test_a_bad_row_met_mid_run_names_the_step_keeps_the_checkpoints_and_resumes(
        place, trained, capsys):
    workdir = place / "mid_run"
    shutil.copytree(trained, workdir)
    kept = _digests(workdir / "checkpoints")
    command = flags(place, "lm", f"--workdir={workdir}", "--config.num_train_steps=8",
                    "--config.checkpoint.every_steps=100")
    rows = list(LM_ROWS)
    rows[BAD_LM_ROW] = {"text": None}
    write_jsonl(place / "lm.jsonl", rows)
    sources._cached_split.cache_clear()  # a new command is a new process: the file is read
    sources._cached_files.cache_clear()  # again (in-process, its rows are cached)
    try:
        line = one_line(train.main(command), capsys)
        step = int(re.fullmatch(rf"train: at step (\d+): \S*lm\.jsonl:{BAD_LM_ROW + 1}: Task "
                                r"'de_lm': feature 'targets' is null \(None\), not text; .*",
                                line).group(1))
        assert step == 5, line  # steps 3 and 4 trained in this run, then the bad row
        assert _metrics_steps(workdir)[-2:] == [3, 4]
        assert _digests(workdir / "checkpoints") == kept  # nothing written, nothing moved
        assert not (workdir / "train.lock").exists()
    finally:
        write_jsonl(place / "lm.jsonl", LM_ROWS)
        sources._cached_split.cache_clear()
        sources._cached_files.cache_clear()
    assert train.main(command) == 0  # the same command, the file fixed
    assert sorted(int(p.name) for p in (workdir / "checkpoints").iterdir()
                  if p.name.isdigit()) == [2, 8]
    # trained: 1-2; failed: 3-4 (not saved); fixed: from step 2's checkpoint on
    assert _metrics_steps(workdir) == [1, 2, 3, 4, 3, 4, 5, 6, 7, 8]


def test_data_errors_cross_processes_and_wrappers_whole():
    error = errors.DataError("column 'text' is null", where="a.parquet row 7", field="text",
                             value=object())  # a look-up value need not pickle
    back = pickle.loads(pickle.dumps(error.at_step(37)))
    assert str(back) == "at step 37: a.parquet row 7: column 'text' is null"
    assert (back.where, back.field, back.step, back.lookup) == ("a.parquet row 7", "text", 37, None)
    # Beam in this process: type(e)(message + " [while running ...]") over the original
    try:
        try:
            raise errors.DataError("bad", where="f.jsonl:3")
        except errors.DataError as e:
            raise errors.DataError(f"{e} [while running 'Write shards']") from e
    except errors.DataError as wrapped:
        assert str(errors.data_error_in(wrapped)) == "f.jsonl:3: bad"
    # Beam from worker processes: the traceback as text
    text = ("Traceback (most recent call last):\n  File \"x.py\", line 1, in process\n"
            "t5x_like.errors.MissingField: f.jsonl:3: no 'text'\n\nDuring handling ...\n"
            "t5x_like.errors.MissingField: f.jsonl:3: no 'text' [while running 'Write']\n")
    found = errors.data_error_in(RuntimeError(text))
    assert type(found) is errors.MissingField and str(found) == "f.jsonl:3: no 'text'"
    assert errors.data_error_in(RuntimeError("ValueError: not ours")) is None


def test_a_family_that_does_not_sow_scores_and_says_what_distillation_needs(place):
    """The contract: the final hidden state is optional; scoring does not ask for it, and
    distillation's cosine loss, which does, says what to add in one line."""
    import jax
    import jax.numpy as jnp

    from t5x_like import config_lib, structures
    __import__("quiet_family")
    config = config_lib.default_config()
    config.model = config_lib.model_defaults("conv_lm_quiet")
    config.model.update(dict(d_model=16, num_layers=1))
    config.task_feature_lengths = {"targets": 8}
    structure = structures.for_config(config)
    batch = {"decoder_input_tokens": jnp.ones((2, 8), jnp.int32),
             "decoder_target_tokens": jnp.ones((2, 8), jnp.int32),
             "decoder_loss_weights": jnp.ones((2, 8), jnp.float32)}
    params = structure.model.init(jax.random.PRNGKey(0), batch["decoder_input_tokens"])["params"]
    assert structure.score_batch(params, batch).shape == (2,)
    with pytest.raises(errors.UserError, match=re.escape(
            "model.family='conv_lm_quiet': its module quiet_family.QuietConvLM does not sow its "
            "final hidden state, which distillation compares (its cosine loss, teacher against "
            'student); add `self.sow("intermediates", "final_hidden", x)` in its __call__')):
        structure.forward(structure.model, params, batch)


@pytest.mark.slow
def test_a_plugin_family_without_sow_trains_evaluates_and_refuses_what_needs_it(place, capsys):
    workdir = place / "quiet_run"
    quiet = [f"--config={place / 'de_config.py'}:quiet", "--module=quiet_family",
             "--module=de_tasks", "--quiet"]
    assert train.main(quiet + [f"--workdir={workdir}"]) == 0
    capsys.readouterr()
    assert eval_command.main([f"--checkpoint={workdir}", "--task=de_lm", "--split=train",
                              "--mode=score", f"--output_dir={place / 'quiet_eval'}",
                              "--module=quiet_family", "--module=de_tasks", "--quiet"]) == 0
    scored = json.loads((place / "quiet_eval" / "metrics.jsonl").read_text().splitlines()[0])
    assert scored["step"] == 2
    capsys.readouterr()
    line = one_line(train.main(quiet + [f"--workdir={place / 'quiet_student'}",
                                        f"--config.distill.teacher={workdir}"]), capsys)
    assert re.fullmatch(r"train: model\.family='conv_lm_quiet': its module "
                        r"quiet_family\.QuietConvLM does not sow its final hidden state, .*"
                        r"add `self\.sow\(\"intermediates\", \"final_hidden\", x\)` .*", line), line
    line = one_line(train.main([f"--config={place / 'de_config.py'}:quiet_head", *quiet[1:],
                                f"--workdir={place / 'quiet_head'}"]), capsys)
    assert "has no head_features method; add `head_features(self" in line, line


def test_a_bad_row_read_in_a_grain_worker_process_arrives_as_itself(place):
    """grain's worker processes send the error back pickled: the same class, its place."""
    from t5x_like.data import pipeline
    __import__("de_tasks")
    dataset = pipeline.get_dataset("de_wrong_type", {"targets": 16}, shuffle=False,
                                   num_workers=1)
    with pytest.raises(errors.DataError) as raised:
        list(dataset)
    assert raised.value.where.endswith("typed.jsonl:3") and raised.value.field == "targets"
