"""Learning from preferences and rewards on the embedded data:

- ``embedded_austen_cloze_preference``: an Austen context (the prompt) and its next
  word preferred over each of the three distractors of ``embedded_austen_cloze``
  (three pairs per cloze point, same splits; ``data/preference.py``'s rows). The
  responses carry no EOS: the word continues the text, it does not end a turn.
- ``embedded_arithmetic``: ``a+b=`` -> the sum, for a verifiable reward (online RL,
  ``rl.rewards``): two-digit operands, every (a, b) in exactly one split (train
  8,000, validation and test 500 each, a seeded shuffle of all 10,000).
- the built-in rewards of ``t5x_like.metrics.rewards``, registered by name.

Reading pairs of your own: ``PreferenceSource`` for JSONL files, as
``docs/preference_tuning.md`` shows.
"""

from __future__ import annotations

import functools
import random

from t5x_like import metrics
from t5x_like.builtin_tasks import bench
from t5x_like.builtin_tasks.pretraining import features
from t5x_like.data import preprocessors as pp
from t5x_like.data import sources
from t5x_like.data.dataset_providers import TaskRegistry
from t5x_like.data.preference import TokenizePair
from t5x_like.metrics import rewards

CLOZE_PREFERENCE = "embedded_austen_cloze_preference"
ARITHMETIC = "embedded_arithmetic"
ARITHMETIC_SIZES = {"train": 8000, "validation": 500, "test": 500}


def cloze_pairs(split: str) -> list[dict]:
    """Three pairs per cloze point of ``split``: (context, answer, distractor)."""
    examples = TaskRegistry.get("embedded_austen_cloze").source.get(split)
    pairs = []
    for example in examples:
        answer = example["options"][example["label"]]
        for option in example["options"]:
            if option != answer:
                pairs.append({"prompt": example["context"], "chosen": answer, "rejected": option,
                              "margin": 0.0, "conversational": False,
                              "label": int(example["label"])})
    return pairs


@functools.cache
def arithmetic_examples() -> dict[str, list[dict]]:
    """Every ``a+b`` with 0 <= a, b < 100 in a seeded order, cut into the splits."""
    problems = [(a, b) for a in range(100) for b in range(100)]
    random.Random("embedded_arithmetic").shuffle(problems)
    splits, start = {}, 0
    for split in ("test", "validation", "train"):
        chosen = problems[start:start + ARITHMETIC_SIZES[split]]
        start += ARITHMETIC_SIZES[split]
        splits[split] = [{"inputs": f"{a}+{b}=", "targets": str(a + b)} for a, b in chosen]
    return splits


def _arithmetic_split(split: str) -> list[dict]:
    return arithmetic_examples()[split]


def _register() -> None:
    for name, fn in rewards.BUILTIN.items():
        rewards.RewardRegistry.add(name, fn)
    if CLOZE_PREFERENCE in TaskRegistry.names():
        return
    TaskRegistry.add(
        CLOZE_PREFERENCE,
        sources.FunctionSource(functools.partial(cloze_pairs), splits=bench.SPLITS),
        [TokenizePair()], features("prompt", "chosen", "rejected", add_eos=False),
        description="Austen context -> its next word preferred over each distractor of "
                    "embedded_austen_cloze (3 pairs per cloze point).")
    TaskRegistry.add(
        ARITHMETIC, sources.FunctionSource(_arithmetic_split, splits=bench.SPLITS),
        [pp.Tokenize(copy_pretokenized=True), pp.AppendEos(), pp.Truncate()],
        features("inputs", "targets"), postprocess_fn=bench.text_postprocess,
        metric_fns=[metrics.accuracy],
        description="a+b= -> the sum (two-digit operands): a verifiable reward for RL.")


_register()
