"""analysis/plots.py: one PNG per analysis, models as lines over relative depth."""

import matplotlib.image
import numpy as np

from t5x_like.analysis import plots


def test_relative_depth_runs_from_the_embeddings_to_the_last_block():
    np.testing.assert_allclose(plots.relative_depth([5.0, 4.0, 3.0, 2.0, 1.0]),
                               [0.0, 0.25, 0.5, 0.75, 1.0])
    np.testing.assert_allclose(plots.relative_depth([7.0]), [0.0])  # one value: no division by 0


def test_a_random_init_control_shares_its_models_colour_dashed():
    colours = {}
    trained = plots._style("BERT", colours)
    control = plots._style("BERT (random init)", colours)
    other = plots._style("GPT-2", colours)
    assert trained["color"] == control["color"] != other["color"]
    assert (trained["linestyle"], control["linestyle"]) == ("-", "--")


def _pixels(path):
    return matplotlib.image.imread(str(path))


def test_layer_curves_and_panels_write_pngs_of_the_asked_size(tmp_path):
    curves = {"BERT": [0.1, 0.5, 0.7], "BERT (random init)": [0.1, 0.1, 0.2],
              "T5 encoder": [0.2, 0.3]}
    one = tmp_path / "one.png"
    plots.layer_curves(one, curves, title="anisotropy", ylabel="mean cosine",
                       hlines={"chance": (0.25, "grey")}, size=(6, 4))
    assert one.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert _pixels(one).shape[:2] == (4 * plots.DPI, 6 * plots.DPI)  # height, width
    several = tmp_path / "panels.png"
    plots.panels(several, {"raw": curves, "all-but-the-top": {"BERT": [0.0, 0.1, 0.1]}},
                 title="self-similarity", ylabel="cosine", size=(9, 4))
    image = _pixels(several)
    assert image.shape[:2] == (4 * plots.DPI, 9 * plots.DPI)
    assert image[..., :3].std() > 0.05  # something was drawn, not a blank canvas
