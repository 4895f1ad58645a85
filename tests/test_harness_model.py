"""lm-evaluation-harness on our checkpoints (``model="t5x_like"``) gives the numbers of
lm-eval's own Hugging Face backend on the same weights: a multiple-choice task, a
perplexity task (rolling windows) and a generation task with stop sequences, all from
local YAML and JSONL (offline)."""

import json
import os
import re

import lm_eval  # the dev extra installs it: a missing one must fail, not skip
import pytest
import yaml
from hf_helpers import tiny_gpt2_with_tokenizer, tiny_hf_t5

from t5x_like import harness as harness_cli
from t5x_like.builtin_tasks import pretraining as builtin
from t5x_like.convert import __main__ as convert_cli
from t5x_like.evaluation import harness_model, loaded_lm
from t5x_like.evaluation import lm_eval_harness as hf_side

os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
CLOZE = "embedded_austen_cloze"
WINDOW = 64  # the model's positions: long texts take several rolling windows
TASKS = ("t5xl_cloze", "t5xl_perplexity", "t5xl_generate")


def write_tasks(folder) -> None:
    """Three harness tasks over the embedded data: multiple choice (acc, acc_norm),
    perplexity over whole passages (several windows each), and generation cut at ".",
    a newline or "e" (a stop the random model meets)."""
    folder.mkdir(parents=True, exist_ok=True)
    records = hf_side.task_records(CLOZE, "test")[:8]
    passages = [doc[:700] for doc in builtin.embedded_en_documents("validation")[:4]]
    files = {"cloze": records, "passages": [{"text": t} for t in passages]}
    for name, rows in files.items():
        (folder / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))

    def metric(name):
        lower = name.endswith("perplexity") or name == "bits_per_byte"
        aggregation = {"word_perplexity": "weighted_perplexity",
                       "byte_perplexity": "weighted_perplexity"}.get(name, name if lower else
                                                                     "mean")
        return {"metric": name, "aggregation": aggregation, "higher_is_better": not lower}

    def spec(task, data, **fields):
        return {"task": task, "dataset_path": "json",
                "dataset_kwargs": {"data_files": {"test": str(folder / f"{data}.jsonl")}},
                "test_split": "test", **fields}

    specs = [
        spec("t5xl_cloze", "cloze", output_type="multiple_choice", doc_to_text="inputs",
             doc_to_choice="options", doc_to_target="label", target_delimiter=" ",
             metric_list=[metric(m) for m in ("acc", "acc_norm")]),
        spec("t5xl_perplexity", "passages", output_type="loglikelihood_rolling",
             doc_to_text="", doc_to_target="{{text}}",
             metric_list=[metric(m) for m in ("word_perplexity", "byte_perplexity",
                                                  "bits_per_byte")]),
        spec("t5xl_generate", "cloze", output_type="generate_until", doc_to_text="{{inputs}}",
             doc_to_target="{{targets}}", target_delimiter=" ",
             generation_kwargs={"until": [".", "\n", "e"], "do_sample": False,
                                "max_gen_toks": 12},
             metric_list=[metric("exact_match")]),
    ]
    for s in specs:
        (folder / f"{s['task']}.yaml").write_text(yaml.safe_dump(s, sort_keys=False))


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("harness")
    tiny_gpt2_with_tokenizer(root / "hf", n_positions=WINDOW)
    assert convert_cli.main(["import", f"--hf_dir={root / 'hf'}", f"--out={root / 'ours'}"]) == 0
    write_tasks(root / "tasks")
    return root


def evaluate(model, root, **kwargs):
    from lm_eval.tasks import TaskManager
    manager = TaskManager(include_path=str(root / "tasks"), include_defaults=False)
    return lm_eval.simple_evaluate(model=model, tasks=list(TASKS), task_manager=manager,
                                   log_samples=True, bootstrap_iters=0, **kwargs)


def samples(out, task):
    return sorted(out["samples"][task], key=lambda s: s["doc_id"])


@pytest.fixture(scope="module")
def theirs(setup):
    """lm-eval's Hugging Face backend on the folder the checkpoint was imported from."""
    return evaluate(hf_side.load_model(setup / "hf", WINDOW, batch_size=8), setup)


def test_our_backend_equals_the_hugging_face_backend(setup, theirs):
    ours = evaluate(harness_model.NAME, setup, model_args=f"checkpoint={setup / 'ours'},batch_size=8")
    assert isinstance(ours["config"]["model"], str) and ours["config"]["model"] == "t5x_like"
    for task, metric_names in [("t5xl_cloze", ("acc", "acc_norm")),
                               ("t5xl_perplexity", ("word_perplexity", "byte_perplexity",
                                                    "bits_per_byte")),
                               ("t5xl_generate", ("exact_match",))]:
        for name in metric_names:
            key = f"{name},none"
            assert ours["results"][task][key] == pytest.approx(
                theirs["results"][task][key], rel=1e-5), (task, name)
    # Per request: the same log-likelihoods, the same is_greedy, the same text.
    for a, b in zip(samples(ours, "t5xl_cloze"), samples(theirs, "t5xl_cloze"), strict=True):
        assert a["arguments"] == b["arguments"]
        for [(score_a, greedy_a)], [(score_b, greedy_b)] in zip(a["resps"], b["resps"],
                                                                strict=True):
            assert score_a == pytest.approx(score_b, abs=1e-4)
            assert greedy_a == greedy_b
    rolling = [(a["resps"][0][0], b["resps"][0][0]) for a, b in zip(
        samples(ours, "t5xl_perplexity"), samples(theirs, "t5xl_perplexity"), strict=True)]
    for a, b in rolling:
        assert a == pytest.approx(b, rel=1e-5)
    generated = [(a["resps"][0][0], b["resps"][0][0]) for a, b in zip(
        samples(ours, "t5xl_generate"), samples(theirs, "t5xl_generate"), strict=True)]
    assert all(a == b for a, b in generated), generated
    assert any(a for a, _ in generated), "the random model generated nothing before a stop"
    assert not any(stop in a for a, _ in generated for stop in (".", "\n", "e"))


def test_the_harness_command_writes_the_same_results(setup, theirs, tmp_path, capsys,
                                                    monkeypatch):
    """``t5xl harness`` over --include_path: lm-eval's table, the results JSON and the
    samples, equal to the Hugging Face backend's; the requests' progress on stderr."""
    monkeypatch.setenv("T5XL_PROGRESS_INTERVAL_S", "0")
    out = tmp_path / "results.json"
    assert harness_cli.main([f"--checkpoint={setup / 'ours'}", "--tasks=t5xl_cloze,t5xl_generate",
                             f"--include_path={setup / 'tasks'}", "--bootstrap_iters=0",
                             "--batch_size=16", f"--output_path={out}", "--log_samples"]) == 0
    captured = capsys.readouterr()
    printed = captured.out
    assert "t5xl_cloze" in printed and "acc_norm" in printed and "exact_match" in printed
    for kind in ("loglikelihood", "generate_until"):
        assert re.search(rf"^t5x_like {kind}: (\d+)/\1 requests \(100%\)", captured.err,
                         flags=re.M), captured.err
    results = json.loads(out.read_text())["results"]
    for task, key in [("t5xl_cloze", "acc,none"), ("t5xl_cloze", "acc_norm,none"),
                      ("t5xl_generate", "exact_match,none")]:
        assert results[task][key] == pytest.approx(theirs["results"][task][key]), (task, key)
    written = [json.loads(line) for line in
               (tmp_path / "results_samples_t5xl_generate.jsonl").read_text().splitlines()]
    assert sorted(s["resps"][0][0] for s in written) == sorted(
        s["resps"][0][0] for s in theirs["samples"]["t5xl_generate"])


def test_the_harness_command_refuses_before_reading_the_model(setup, tmp_path, capsys):
    """Each mistake exits 2 with one line naming the fix: an unknown task (with the
    close names), a dataset that is not here, an encoder-decoder checkpoint."""
    common = [f"--include_path={setup / 'tasks'}", "--bootstrap_iters=0"]
    assert harness_cli.main([f"--checkpoint={setup / 'ours'}", "--tasks=t5xl_clze",
                             *common]) == 2
    assert "Did you mean t5xl_cloze" in capsys.readouterr().err
    missing = tmp_path / "missing"
    missing.mkdir()
    (missing / "gone.yaml").write_text(yaml.safe_dump({
        "task": "t5xl_gone", "dataset_path": "json", "output_type": "loglikelihood_rolling",
        "dataset_kwargs": {"data_files": {"test": str(tmp_path / "nowhere.jsonl")}},
        "test_split": "test", "doc_to_text": "", "doc_to_target": "{{text}}"}))
    assert harness_cli.main([f"--checkpoint={tmp_path / 'not_read'}", "--tasks=t5xl_gone",
                             f"--include_path={missing}"]) == 2
    err = capsys.readouterr().err
    assert "could not load its dataset" in err and "Traceback" not in err
    tiny_hf_t5("v1_1").save_pretrained(tmp_path / "t5_hf")
    assert convert_cli.main(["import", f"--hf_dir={tmp_path / 't5_hf'}",
                             f"--out={tmp_path / 't5'}"]) == 0
    assert harness_cli.main([f"--checkpoint={tmp_path / 't5'}", "--tasks=t5xl_cloze",
                             *common]) == 2
    assert "runs lm-evaluation-harness on decoder language models" in capsys.readouterr().err


@pytest.mark.slow
def test_training_runs_harness_tasks_at_its_evaluation_steps(setup, tmp_path, capsys):
    """``config.eval.harness_tasks``: a decoder run scores lm-eval tasks on its own params
    at eval_every_steps (Levanter's in-loop harness); the numbers written at a step
    equal the harness command's on that step's checkpoint."""
    from t5x_like import train

    workdir = tmp_path / "run"
    assert train.main(["--config=configs/pretrain/gpt2_tiny.py", f"--workdir={workdir}",
                       "--config.num_train_steps=4", "--config.batch_size=8",
                       "--config.eval_batches=1", "--config.checkpoint_every_steps=2",
                       "--config.eval_every_steps=2", "--config.model.num_layers=1",
                       "--config.model.d_model=32", "--config.model.num_heads=2",
                       "--config.model.head_dim=16", "--config.model.d_ff=64",
                       "--config.eval.harness_tasks=t5xl_cloze,t5xl_perplexity",
                       f"--config.eval.harness_include_path={setup / 'tasks'}",
                       "--config.eval.harness_limit=4"]) == 0
    assert "t5xl_perplexity" in capsys.readouterr().out  # lm-eval's table
    lines = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
    at = {line["step"]: line for line in lines if "harness/t5xl_cloze/acc" in line}
    assert sorted(at) == [2, 4]
    assert at[2]["harness/t5xl_perplexity/bits_per_byte"] != at[4][
        "harness/t5xl_perplexity/bits_per_byte"]
    out = tmp_path / "step2.json"
    assert harness_cli.main([f"--checkpoint={workdir / 'checkpoints' / '2'}",
                             "--tasks=t5xl_cloze,t5xl_perplexity", "--limit=4",
                             f"--include_path={setup / 'tasks'}", "--bootstrap_iters=0",
                             f"--output_path={out}"]) == 0
    results = json.loads(out.read_text())["results"]
    assert at[2]["harness/t5xl_cloze/acc_norm"] == pytest.approx(
        results["t5xl_cloze"]["acc_norm,none"])
    assert at[2]["harness/t5xl_perplexity/bits_per_byte"] == pytest.approx(
        results["t5xl_perplexity"]["bits_per_byte,none"], rel=1e-5)


def test_request_widths_hold_the_row_with_at_most_a_third_padding():
    widths = set()
    for length in range(1, 3000):
        width = loaded_lm.bucket(length, 2048)
        widths.add(width)
        assert width == 2048 if length > 2048 else length <= width <= max(16, 1.5 * length)
    assert len(widths) <= 16  # a 2048-token window compiles at most this many programs


def test_training_an_encoder_decoder_with_harness_tasks_is_refused(tmp_path, capsys):
    from t5x_like import train
    assert train.main(["--config=configs/quickstart.py", f"--workdir={tmp_path / 'run'}",
                       "--config.eval.harness_tasks=austen_cloze"]) == 2
    err = capsys.readouterr().err
    assert "on decoder language models" in err and "evals.harness" in err
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_a_process_indexes_the_task_catalogue_once_until_a_task_file_changes(tmp_path,
                                                                           monkeypatch):
    """lm-eval's TaskManager reads its whole catalogue when made (8 s): loading tasks again
    in one process reuses it, and an edited YAML under the include path is read anew."""
    from t5x_like.evaluation import harness_tasks
    made = []

    class Manager:
        def __init__(self, include_path=None):
            made.append(include_path)

    import lm_eval.tasks
    monkeypatch.setattr(lm_eval.tasks, "TaskManager", Manager)
    monkeypatch.setattr(harness_tasks, "_MANAGERS", {})
    (tmp_path / "a.yaml").write_text("task: a\n")
    first = harness_tasks._task_manager(str(tmp_path))
    assert harness_tasks._task_manager(str(tmp_path)) is first and made == [str(tmp_path)]
    (tmp_path / "a.yaml").write_text("task: a_renamed\n")
    assert harness_tasks._task_manager(str(tmp_path)) is not first and len(made) == 2
    harness_tasks._task_manager("")
    harness_tasks._task_manager("")
    assert made == [str(tmp_path), str(tmp_path), None]
