import pathlib

from t5x_like import cli

QUICKSTART = str(pathlib.Path(__file__).resolve().parents[1] / "configs" / "quickstart.py")


def test_help_lists_every_subcommand(capsys):
    assert cli.main(["--help"]) == 0
    out = capsys.readouterr().out
    for name in cli.COMMANDS:
        assert f"  {name} " in out
    assert "python -m t5x_like.convert)" in out


def test_unknown_subcommand_is_an_error(capsys):
    assert cli.main(["trian"]) == 2
    assert "unknown command 'trian'" in capsys.readouterr().err


def test_subcommand_runs_its_module(capsys):
    assert cli.main(["summary", f"--config={QUICKSTART}"]) == 0
    assert capsys.readouterr().out.strip().splitlines()[-1] == "params: 3278592  trainable: 3278592 (100.00%)"
