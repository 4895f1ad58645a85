"""ELMo features + a linear tagger on ``embedded_ud_pos`` (UD English EWT UPOS): each
biLM layer alone vs a learned scalar mix (Peters et al. 2018, section 3.2).

Features are frozen: layer 0 the char-CNN projection (twice, as ELMo), layers 1..L
the LSTM outputs (forward and backward concatenated); each word is read at its
first subword. A linear tagger (optax Adam, full batch) is trained on each layer
alone, and on the scalar mix ``gamma * sum_j softmax(s)_j h_j`` with ``s`` and
``gamma`` trained with it. ``--random_init`` adds the same table for an untrained
biLM of the same shape (the control).

    python -m t5x_like.train --config=configs/pretrain/elmo_tiny.py --workdir=runs/pt_elmo
    python benchmarks/elmo_scalar_mix.py --checkpoint=runs/pt_elmo --random_init
    python benchmarks/elmo_scalar_mix.py --smoke   # tiny: a check that it runs

``--smoke``: a tiny ELMo (one biLSTM layer: the mix is then over the char-CNN layer and
that one; each more layer is seconds more compile of the pretraining step and two more
taggers to compile) pretrained for 2 steps (no held-out evaluation) into a temporary
folder (unless ``--checkpoint`` names one), 30 training and 10 validation sentences of 16
tokens, 2 tagger steps, with the random-init control: a check that the script runs.
"""

from __future__ import annotations

import argparse
import pathlib
import tempfile

import jax
import jax.numpy as jnp
import numpy as np
import optax

from t5x_like import structures
from t5x_like.analysis import hidden_states
from t5x_like.builtin_tasks import bench as bench_tasks
from t5x_like.models import bilm


def word_batches(examples, vocab, max_tokens: int):
    """Token rows and, per word, (row, first-subword position, tag)."""
    rows, index, tags = [], [], []
    for example in examples:
        ids, starts = [], []
        for word in example["words"]:
            pieces = vocab.encode(word) or [vocab.unk_id]
            if len(ids) + len(pieces) > max_tokens:
                break
            starts.append(len(ids))
            ids += pieces
        for position, tag in zip(starts, example["tags"], strict=False):
            index.append((len(rows), position))
            tags.append(tag)
        rows.append(ids)
    tokens = np.zeros((len(rows), max_tokens), np.int32)
    for i, ids in enumerate(rows):
        tokens[i, :len(ids)] = ids
    return tokens, np.asarray(index), tags


def features(model, params, tokens, batch_size: int = 64) -> np.ndarray:
    apply = jax.jit(lambda p, t: model.apply({"params": p}, t, return_layers=True)["layers"])
    out = [np.asarray(apply(params, jnp.asarray(tokens[i:i + batch_size])))
           for i in range(0, len(tokens), batch_size)]
    return np.concatenate(out, axis=1)  # [layers, rows, length, dim]


def train_tagger(train_x, train_y, test_x, test_y, num_tags, mix: bool, steps: int, seed=0):
    """``train_x``: [layers, words, dim] (one layer when not ``mix``)."""
    dim = train_x.shape[-1]
    key = jax.random.PRNGKey(seed)
    params = {"w": jax.random.normal(key, (dim, num_tags)) * dim ** -0.5,
              "b": jnp.zeros(num_tags)}
    if mix:
        params["mix"] = {"weights": jnp.zeros(train_x.shape[0]), "gamma": jnp.ones(())}
    mixer = bilm.ScalarMix(train_x.shape[0])

    def logits(p, x):
        h = mixer.apply({"params": p["mix"]}, x) if mix else x[0]
        return h @ p["w"] + p["b"]

    def loss(p):
        return optax.softmax_cross_entropy_with_integer_labels(
            logits(p, train_x), train_y).mean()

    opt = optax.adam(1e-2)
    state = opt.init(params)

    @jax.jit
    def step(p, s):
        grads = jax.grad(loss)(p)
        updates, s = opt.update(grads, s)
        return optax.apply_updates(p, updates), s

    for _ in range(steps):
        params, state = step(params, state)
    accuracy = float((jnp.argmax(logits(params, test_x), -1) == test_y).mean())
    weights = np.asarray(jax.nn.softmax(params["mix"]["weights"])) if mix else None
    gamma = float(params["mix"]["gamma"]) if mix else None
    return accuracy, weights, gamma


def load_params(checkpoint: str, random_init: bool):
    """The run's spec and its newest params (``hidden_states.load`` without its
    transformer-layer lookup); ``random_init``: fresh params of the same config."""
    from t5x_like import resolving
    from t5x_like.checkpoints import param_sources
    source = param_sources.resolve(checkpoint)
    step = source.steps()[-1]
    config = resolving.resolve_checkpoint(source, step).spec
    if random_init:
        return config, hidden_states._fresh_params(config, 0)  # noqa: SLF001
    return config, param_sources.load_params(source, step, config)


def run(checkpoint, random_init, args, data):
    config, params = load_params(checkpoint, random_init)
    model = structures.for_config(config).model
    (train_tokens, train_index, train_tags), (test_tokens, test_index, test_tags), tag_ids = data
    results = {}
    feats = {}
    for name, tokens, index in (("train", train_tokens, train_index),
                                ("test", test_tokens, test_index)):
        layers = features(model, params, tokens)
        feats[name] = jnp.asarray(layers[:, index[:, 0], index[:, 1]])
    train_y = jnp.asarray([tag_ids[t] for t in train_tags])
    test_y = jnp.asarray([tag_ids.get(t, -1) for t in test_tags])
    num_layers = feats["train"].shape[0]
    for j in range(num_layers):
        acc, _, _ = train_tagger(feats["train"][j:j + 1], train_y, feats["test"][j:j + 1],
                                 test_y, len(tag_ids), False, args.steps)
        results[f"layer {j}"] = (acc, None, None)
    results["scalar mix"] = train_tagger(feats["train"], train_y, feats["test"], test_y,
                                         len(tag_ids), True, args.steps)
    return results


# --smoke's ELMo: the recipe's char CNN and 1 biLSTM layer, narrow, on 16-token rows; no
# held-out evaluation while it trains (nothing here reads it).
SMOKE_ELMO = ["--config.model.lstm_dim=32", "--config.model.projection_dim=16",
              "--config.model.filter_counts=(4,4,8,8,8)", "--config.model.num_layers=1",
              "--config.task_feature_lengths.targets=16", "--config.evals.held_out.every_steps=0"]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoint", default="")
    parser.add_argument("--train_sentences", type=int, default=3000)
    parser.add_argument("--test_sentences", type=int, default=1000)
    parser.add_argument("--max_tokens", type=int, default=64)
    parser.add_argument("--steps", type=int, default=500)
    parser.add_argument("--random_init", action="store_true",
                        help="also report an untrained biLM of the same shape")
    parser.add_argument("--smoke", action="store_true",
                        help="a tiny ELMo and few sentences: a check that the script runs")
    args = parser.parse_args(argv)
    if not args.smoke:
        return report(args, args.checkpoint or "runs/pt_elmo")
    import _smoke
    _smoke.IN_PROCESS = True
    args.train_sentences, args.test_sentences, args.max_tokens, args.steps = 30, 10, 16, 2
    args.random_init = True
    with tempfile.TemporaryDirectory(prefix="elmo_smoke_") as scratch:
        checkpoint = args.checkpoint or _smoke.pretrain(
            pathlib.Path(scratch) / "pt_elmo", "configs/pretrain/elmo_tiny.py", *SMOKE_ELMO)
        return report(args, str(checkpoint))


def report(args, checkpoint: str) -> int:
    """The tables of ``checkpoint``'s biLM (and of a random init of it)."""
    splits = bench_tasks.ud_pos_examples(bench_tasks._ud_paths())  # noqa: SLF001
    from t5x_like.builtin_tasks import pretraining as tasks
    vocab = tasks.embedded_vocabulary()
    train = word_batches(splits["train"][:args.train_sentences], vocab, args.max_tokens)
    test = word_batches(splits["validation"][:args.test_sentences], vocab, args.max_tokens)
    tag_ids = {t: i for i, t in enumerate(sorted(set(train[2])))}
    print(f"UD EWT UPOS: {len(train[2])} train words ({args.train_sentences} sentences), "
          f"{len(test[2])} validation words, {len(tag_ids)} tags; linear tagger, "
          f"{args.steps} full-batch Adam steps")
    runs = [("pretrained", False)] + ([("random init", True)] if args.random_init else [])
    table = {name: run(checkpoint, random, args, (train, test, tag_ids))
             for name, random in runs}
    print("\n| features | " + " | ".join(name for name, _ in runs) + " |")
    print("|---|" + "---|" * len(runs))
    for setting in table["pretrained"]:
        print(f"| {setting} | " + " | ".join(f"{table[name][setting][0]:.4f}"
                                             for name, _ in runs) + " |")
    for name, _ in runs:
        _, weights, gamma = table[name]["scalar mix"]
        print(f"{name}: mix weights softmax(s) = {[round(float(w), 3) for w in weights]}, "
              f"gamma = {gamma:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
