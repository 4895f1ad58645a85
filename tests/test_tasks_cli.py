"""`python -m t5x_like.tasks list | show | sample`."""

import gzip
import pathlib

from t5x_like import tasks as cli

DATA = pathlib.Path(__file__).resolve().parents[1] / "data"


def raw_train_records(name: str, holdout_every: int = 100) -> int:
    """Train records of a file in data/, counted from the raw file: its non-empty lines
    but every ``holdout_every``-th (the held-out validation line)."""
    with gzip.open(DATA / name, "rt", encoding="utf-8", errors="replace") as f:
        return sum(1 for index, line in enumerate(f)
                   if line.strip() and index % holdout_every != holdout_every - 1)


def run(capsys, *argv):
    cli.main(list(argv))
    return capsys.readouterr().out


def test_list_shows_tasks_and_mixtures(capsys):
    out = run(capsys, "list")
    for name in ("embedded_en_span_corruption", "embedded_en_mlm", "embedded_en_lm",
                 "embedded_en_prefix_lm", "c4_span_corruption", "wikipedia_mlm"):
        assert f"task     {name} " in out
    assert "mixture  mc4_span_corruption" in out
    assert "mixture  embedded_multilingual_span_corruption" in out


def test_show_lists_preprocessors_and_sizes(capsys):
    english = sum(raw_train_records(f"en/{name}.txt.gz")
                  for name in ("austen", "kjv_bible", "shakespeare", "web_bible"))
    out = run(capsys, "show", "embedded_en_mlm")
    assert "MaskedLM(key='targets', rate=0.15" in out and f"examples: train {english:,}" in out
    # XLM-R's temperature rates q_i = p_i^0.3 / sum_j p_j^0.3 over the raw train sizes.
    sizes = {"en": english, "es": raw_train_records("multi/spa_rv1909_bible_every4th.txt.gz"),
             "ja": raw_train_records("multi/jpn_kougo_bible_every4th.txt.gz"),
             "udhr": raw_train_records("multi/udhr_3k.jsonl.gz", holdout_every=10)}
    weights = {k: (n / sum(sizes.values())) ** 0.3 for k, n in sizes.items()}
    out = run(capsys, "show", "embedded_multilingual_span_corruption")
    for language, weight in weights.items():
        rate = weight / sum(weights.values())
        assert f"{rate:8.4f}  embedded_bytes_{language}_span_corruption" in out, out


def test_sample_decodes_inputs_and_targets(capsys):
    out = run(capsys, "sample", "embedded_en_span_corruption", "--n=2",
              "--lengths=inputs=48,targets=16")
    assert out.count("--- example") == 2
    assert "inputs (48 tokens):" in out and "targets (" in out and "<extra_id_0>" in out


def test_unknown_name_suggests_and_exits_2(capsys):
    assert cli.main(["sample", "embedded_en_mln"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("tasks: "), err
    assert "Did you mean 'embedded_en_mlm'" in err and "Traceback" not in err


def test_bad_lengths_flag_is_explained(capsys):
    assert cli.main(["sample", "embedded_en_lm", "--lengths=targets"]) == 2
    assert "is not NAME=INT" in capsys.readouterr().err
