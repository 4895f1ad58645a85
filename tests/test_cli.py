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


def quickstart_parameters() -> int:
    """T5 v1.1's parameters in closed form at the quickstart's sizes (configs/quickstart.py):
    vocabulary 8192, d_model 128, 4 heads of 32, d_ff 512, 2 + 2 layers, 32 buckets."""
    vocab, d, inner, d_ff, layers, buckets, heads = 8192, 128, 4 * 32, 512, 2, 32, 4
    attention = 4 * d * inner              # query, key, value, output
    gated_mlp = 3 * d * d_ff               # wi_0, wi_1 (GEGLU), wo
    encoder_layer = attention + gated_mlp + 2 * d  # + 2 RMSNorm scales
    decoder_layer = 2 * attention + gated_mlp + 3 * d  # self and cross attention
    return (2 * vocab * d                  # input embeddings, untied output layer
            + layers * (encoder_layer + decoder_layer)
            + 2 * d                        # the stacks' final norms
            + 2 * buckets * heads)         # relative position biases (first layer of each)


def test_subcommand_runs_its_module(capsys):
    assert cli.main(["summary", f"--config={QUICKSTART}"]) == 0
    total = quickstart_parameters()
    assert total == 3_278_592
    assert capsys.readouterr().out.strip().splitlines()[-1] == \
        f"params: {total}  trainable: {total} (100.00%)"
