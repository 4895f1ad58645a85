import pathlib
import subprocess
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]

# Published parameter counts (T5 paper / released checkpoints).
PUBLISHED = {
    "t5_1_0_small": 60.5e6,
    "t5_1_0_base": 222.9e6,
    "t5_1_1_small": 77.0e6,
    "t5_1_1_base": 247.6e6,
    "t5_1_1_large": 783.2e6,
    "t5_1_1_xl": 2.85e9,
    "t5_1_1_xxl": 11.1e9,
    "gpt2_small": 124.4e6,
    "gpt2_medium": 354.8e6,
    "gpt2_large": 774.0e6,
    "gpt2_xl": 1557.6e6,
    "bert_base": 110e6,
    "bert_large": 340e6,
    "roberta_base": 125e6,
    "albert_base": 11.7e6,         # albert-base-v2
    "bart_base": 139.4e6,          # facebook/bart-base
    "bart_large": 406.3e6,         # facebook/bart-large
    "decoder_modern_1b": 1.100e9,  # TinyLlama-1.1B's shape
    "longformer_base": 148.7e6,    # LongformerForMaskedLM, longformer-base-4096's config
}


def summary(config_name: str, *extra: str) -> str:
    result = subprocess.run([sys.executable, "-m", "t5x_like.summary",
                             f"--config=configs/{config_name}.py", *extra],
                            cwd=REPO, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return result.stdout


@pytest.mark.parametrize("name", ["t5_1_0_small", "t5_1_1_base", "t5_1_1_xxl", "gpt2_small",
                                  "gpt2_xl", "bert_base", "bert_large", "roberta_base",
                                  "albert_base", "bart_base", "decoder_modern_1b",
                                  "longformer_base"])
def test_standard_sizes_match_published_counts(name):
    last = summary(name).strip().splitlines()[-1]
    assert last.startswith("params: ")
    count = int(last.split()[1])
    assert abs(count - PUBLISHED[name]) / PUBLISHED[name] < 0.02, count


def test_rows_add_up_and_overrides_apply():
    out = summary("t5_1_1_small", "--config.model.num_encoder_layers=1")
    lines = out.strip().splitlines()
    rows = [line.split() for line in lines[1:-1]]
    assert sum(int(r[1].replace(",", "")) for r in rows) == int(lines[-1].split()[1])
    assert "encoder/layers_0" in out and "encoder/layers_1" not in out


def test_every_size_config_validates():
    from t5x_like import config_lib
    for name in PUBLISHED:
        config_lib.validate(config_lib.load_config_file(str(REPO / "configs" / f"{name}.py")))
