"""Instruction templates (``data/preprocessors/templates.py``) and the ``*_instruct``
tasks of the embedded benchmark (``builtin_tasks/instructions.py``)."""

import collections
import itertools

import numpy as np
import pytest

import t5x_like.builtin_tasks  # noqa: F401 - registers the tasks and their templates
import t5x_like.data as td
from t5x_like.builtin_tasks import bench, instructions
from t5x_like.data import preprocessors as pp

LENGTHS = {"inputs": 512, "targets": 64}


def templates_used(task: str, seed: int, n: int = 40, split: str = "train") -> list[str]:
    ds = td.TaskRegistry.get(task).get_dataset(split, LENGTHS, seed=seed)
    return [example["template"] for example in itertools.islice(iter(ds), n)]


def test_the_template_of_each_example_is_fixed_by_the_seed():
    first = templates_used("embedded_spam_instruct", seed=3)
    assert templates_used("embedded_spam_instruct", seed=3) == first
    assert templates_used("embedded_spam_instruct", seed=4) != first
    # Every phrasing is used: the pick is spread over the templates.
    many = collections.Counter(templates_used("embedded_spam_instruct", seed=3, n=200))
    assert set(many) == {t.name for t in instructions.TEMPLATES["embedded_spam"]}


@pytest.mark.parametrize("task", bench.TASKS)
def test_every_template_renders_every_kind_of_example(task):
    """Each template on validation examples: no field missing, the answer is the
    task's target or the template's own word for its label, and options are listed
    where the template asks for them."""
    examples = list(itertools.islice(
        iter(td.TaskRegistry.get(task).source.get("validation")), 20))
    label_options = td.TaskRegistry.get(task).label_options
    for template in td.TemplateRegistry.get(task):
        for example in examples:
            out = template.render(example, label_options)
            assert out["inputs"] and out["targets"]
            if template.answer_choices:
                assert out["targets"] == template.answer_choices[example["label"]]
            else:
                assert out["targets"] == example["targets"]
            if template.lists_options:
                choices = template.choices(example, label_options)
                assert len(choices) >= 2 and out["targets"] in choices
                assert "OPTIONS:\n" + "\n".join(f"- {c}" for c in choices) in out["inputs"]
            else:
                assert "OPTIONS:" not in out["inputs"]


def test_the_instruction_task_is_the_task_through_its_templates():
    task = td.TaskRegistry.get("embedded_bible_paraphrase_instruct")
    example = next(iter(task.get_dataset("validation", LENGTHS, seed=0, shuffle=False)))
    plain = next(iter(td.TaskRegistry.get("embedded_bible_paraphrase").source.get("validation")))
    assert example["kjv_key"] == plain["kjv_key"]  # same examples, same order unshuffled
    template = {t.name: t for t in td.TemplateRegistry.get("embedded_bible_paraphrase")}[
        example["template"]]
    assert example["inputs_pretokenized"] == template.render(plain)["inputs"]
    assert example["inputs"].ndim == 1 and example["inputs"][-1] == 1  # tokenized, EOS


def test_options_come_from_answer_choices_then_the_example_then_the_task():
    example = {"text": "hello", "targets": "spam", "label": 1, "options": ["a", "b"]}
    yes_no = pp.Template("q", "{text} {options}", answer_choices=("no", "yes"))
    assert yes_no.render(example)["targets"] == "yes"
    assert yes_no.render(example)["inputs"] == "hello OPTIONS:\n- no\n- yes"
    own = pp.Template("q", "{options}")
    assert own.render(example, ("ham", "spam"))["inputs"] == "OPTIONS:\n- a\n- b"
    del example["options"]
    assert own.render(example, ("ham", "spam"))["inputs"] == "OPTIONS:\n- ham\n- spam"
    assert pp.Template("plain", "{text}").render(example)["targets"] == "spam"


def test_bad_templates_are_named():
    with pytest.raises(ValueError, match=r"Template 'q' needs the example's \['title'\]"):
        pp.Template("q", "{title}").render({"targets": "x"})
    with pytest.raises(ValueError, match="'broken'.*not a format pattern"):
        pp.Template("broken", "{text")
    with pytest.raises(ValueError, match="Template names repeat"):
        pp.ApplyTemplates((pp.Template("a", "{text}"), pp.Template("a", "{text}!")))
    with pytest.raises(ValueError, match="repeat a name"):
        td.TemplateRegistry.add("embedded_spam", [pp.Template("is_spam", "{text}")])
    with pytest.raises(ValueError, match="has no templates"):
        td.instruction_task("embedded_en_lm")


def test_tasks_show_lists_the_templates(capsys):
    from t5x_like import tasks
    tasks.main(["show", "embedded_udhr_langid_instruct"])
    out = capsys.readouterr().out
    assert "3 templates (0 listing options)" in out
    assert "ApplyTemplates(3: which_language, identify, language_name)" in out
    tasks.main(["show", "embedded_spam"])
    out = capsys.readouterr().out
    assert "instruction templates (embedded_spam_instruct reads" in out
    assert "    is_spam: 'Is the following email spam?\\n\\n{text}' -> '{target}'  [answers: " \
        "no / yes]" in out


def test_the_docs_example_registers_templates_as_printed(tmp_path):
    """docs/instruction_tuning.md's module and commands, run as printed (only
    `.venv/bin/python` becomes this interpreter)."""
    import os
    import re
    import shlex
    import subprocess
    import sys
    from pathlib import Path
    repo = Path(__file__).resolve().parent.parent
    page = (repo / "docs" / "instruction_tuning.md").read_text()
    module = re.search(r"```python\n(# my_templates.py\n.*?)```", page, flags=re.S).group(1)
    (tmp_path / "my_templates.py").write_text(module)
    commands = re.search(r"```sh\n(.*?)```", page, flags=re.S).group(1).strip().splitlines()
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_PLATFORMS")}
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), str(repo)])
    outputs = []
    for command in commands:
        argv = [sys.executable if w == ".venv/bin/python" else w for w in shlex.split(command)]
        result = subprocess.run(argv, cwd=repo, env=env, capture_output=True, text=True,
                                timeout=300)
        assert result.returncode == 0, result.stderr[-2000:]
        outputs.append(result.stdout)
    # The user's two templates join the four built in, and the task reads through all six.
    assert "my_bible_en_es_instruct: embedded_bible_en_es as instructions: 6 templates" \
        in outputs[0]
    assert "in_spanish, verse)" in outputs[0]
    assert outputs[1].count("template: ") == 3


# Each task's examples carry a field no other task's have.
OWN_FIELD = {"embedded_spam": "id", "embedded_ud_pos": "sent_id",
             "embedded_bible_paraphrase": "kjv_key", "embedded_bible_en_es": "key",
             "embedded_udhr_langid": "code", "embedded_austen_cloze": "line"}


def test_held_out_clusters_never_appear_in_the_training_mixture():
    train = td.MixtureRegistry.get("embedded_instruct_train")
    held_out = td.MixtureRegistry.get("embedded_instruct_held_out")
    train_tasks = {t.removesuffix("_instruct") for t in train.leaf_rates("train")}
    held_out_tasks = {t.removesuffix("_instruct") for t in held_out.leaf_rates("train")}
    assert held_out_tasks == {"embedded_bible_paraphrase", "embedded_austen_cloze"}
    assert train_tasks | held_out_tasks == set(bench.TASKS) and not train_tasks & held_out_tasks
    # A full epoch of the training mixture at its capped sizes: every example is one of
    # a training task's, phrased by one of its templates.
    epoch = sum(min(td.TaskRegistry.get(t).num_input_examples("train"),
                    instructions.MIXTURE_MAXIMUM) for t in train_tasks)
    templates = {task: {t.name for t in td.TemplateRegistry.get(task)} for task in bench.TASKS}
    seen = collections.Counter()
    for example in itertools.islice(iter(train.get_dataset("train", LENGTHS, seed=1)), epoch):
        (task,) = [t for t, field in OWN_FIELD.items() if field in example]
        assert task in train_tasks and example["template"] in templates[task]
        seen[task] += 1
    assert set(seen) == train_tasks  # every training task is in the mix


def test_instruction_mixtures_refuse_unknown_or_empty_splits():
    clusters = {"a": ("embedded_spam",), "b": ("embedded_ud_pos",)}
    with pytest.raises(ValueError, match=r"held-out clusters \['c'\] are not among"):
        td.dataset_providers.instruction_mixtures("x", clusters, ["c"], 10)
    with pytest.raises(ValueError, match="no cluster left for train"):
        td.dataset_providers.instruction_mixtures("x", clusters, ["a", "b"], 10)
    with pytest.raises(ValueError, match="no cluster left for held_out"):
        td.dataset_providers.instruction_mixtures("x", clusters, [], 10)
    with pytest.raises(KeyError, match="No task named 'embedded_en_lm_instruct'"):
        td.dataset_providers.instruction_mixtures("x", {"lm": ("embedded_en_lm",), **clusters},
                                                  ["b"], 10)
    assert "x_train" not in td.MixtureRegistry.names()  # nothing registered on the way
    with pytest.raises(ValueError, match="is in clusters 'a' and 'b'"):
        td.dataset_providers.instruction_mixtures(
            "x", {"a": ("embedded_spam",), "b": ("embedded_spam",)}, ["a"], 10)


def test_held_out_instructions_evaluate_by_their_templates_answer_choices():
    """A tiny untrained T5 on two instruction tasks: classification ranks each example's
    own answer choices (yes/no or ham/spam, by its template), translation decodes, and
    both report the metrics on the answer texts."""
    from conftest import tiny_config

    from t5x_like.engine import partitioning
    from t5x_like.engine import trainer as trainer_lib
    from t5x_like.evaluation import evaluator, runner
    config = tiny_config()
    config.task_feature_lengths = {"inputs": 32, "targets": 8}
    td.MixtureRegistry.remove("test_instruct_eval")
    td.MixtureRegistry.add("test_instruct_eval", ["embedded_spam_instruct",
                                                  "embedded_bible_en_es_instruct"],
                           default_rate=1.0)
    mesh = partitioning.make_mesh({"dcn": 1, "data": 8, "fsdp": 1, "tensor": 1})
    trainer = trainer_lib.build_trainer(config, mesh)
    ev = runner.build_evaluator(config, trainer, "test_instruct_eval", evaluator.EvalSettings(
        batch_size=8, max_examples=16, max_decode_length=4))
    results = {r.task: r for r in ev.evaluate(trainer.init_state(0).params)}
    spam = results["embedded_spam_instruct"]
    assert spam.mode == "rank" and set(spam.metrics) == {"accuracy"}
    answers = {t.name: t for t in td.TemplateRegistry.get("embedded_spam")}
    examples = ev.examples(td.TaskRegistry.get("embedded_spam_instruct"))
    for example, record in zip(examples, spam.records, strict=True):
        template = answers[example["template"]]
        assert record["options"] == list(template.answer_choices or bench.SPAM_LABELS)
        assert record["targets"] in record["options"]
    assert spam.metrics["accuracy"] == pytest.approx(
        100 * np.mean([r["prediction"] == r["targets"] for r in spam.records]))
    translation = results["embedded_bible_en_es_instruct"]
    assert translation.mode == "predict" and set(translation.metrics) == {"bleu", "chrf"}


@pytest.mark.parametrize("config", ["gpt2_tiny_instruct", "t5_instruct"])
def test_the_instruction_tuning_configs_train_on_the_train_clusters(config):
    from pathlib import Path

    from t5x_like import resolving
    path = Path(__file__).resolve().parent.parent / "configs" / "finetune" / f"{config}.py"
    loaded = resolving.load_and_validate(str(path), [])
    assert loaded.task == "embedded_instruct_train"
    assert loaded.evals["benchmark"].mixture == "embedded_instruct_held_out"
