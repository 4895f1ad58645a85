"""`python -m t5x_like.tasks list | show | sample`."""


from t5x_like import tasks as cli


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
    out = run(capsys, "show", "embedded_en_mlm")
    assert "MaskedLM(key='targets', rate=0.15" in out and "examples: train 116,621" in out
    assert "0.4820  embedded_bytes_en_span_corruption" in run(
        capsys, "show", "embedded_multilingual_span_corruption")


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
