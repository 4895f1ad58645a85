"""TFDS tasks: C4 (span corruption, causal LM), Wikipedia MLM, and mC4 as a temperature mixture.

They read prepared array_record datasets through ``tfds.data_source`` (no
TensorFlow). The vocabularies are the embedded 8k SentencePiece model for
English and ByT5-style bytes for mC4, so the tasks run with nothing else
downloaded; register your own variant (``register_c4_tasks(vocabulary=...)``)
for a production vocabulary such as T5's 32k model.
"""

from __future__ import annotations

from t5x_like.builtin_tasks import pretraining as tasks
from t5x_like.data.dataset_providers import MixtureRegistry, TaskRegistry
from t5x_like.data.sources import TfdsSource

C4 = "c4/en:3.1.0"
WIKIPEDIA = "wikipedia/20230601.en"
MC4 = "c4/multilingual:3.1.0"
# A spread of scripts and sizes; extend with register_mc4(languages=[...]).
MC4_LANGUAGES = ("af", "ar", "bn", "de", "en", "es", "fr", "hi", "id", "it", "ja", "ko", "nl",
                 "pl", "pt", "ru", "sw", "th", "tr", "vi", "zh")


def register_c4_tasks(prefix: str = "c4", vocabulary=None, data_dir: str | None = None) -> None:
    source = TfdsSource(C4, data_dir=data_dir, builder_module="tensorflow_datasets.text.c4")
    TaskRegistry.add(f"{prefix}_span_corruption", source, tasks.span_corruption_steps(),
                     tasks.features("inputs", "targets", vocabulary=vocabulary),
                     description="T5 span corruption on C4 (en 3.1.0), as T5 pretrained.")
    TaskRegistry.add(f"{prefix}_lm", source, tasks.lm_steps(),
                     tasks.features("targets", vocabulary=vocabulary),
                     description="Causal LM over concatenated C4 (en 3.1.0) documents.")


def register_wikipedia_mlm(name: str = "wikipedia_mlm", vocabulary=None,
                           data_dir: str | None = None) -> None:
    source = TfdsSource(WIKIPEDIA, data_dir=data_dir,
                        split_map=(("train", "train[1%:]"), ("validation", "train[:1%]")),
                        builder_module="tensorflow_datasets.text.wikipedia")
    TaskRegistry.add(name, source, tasks.mlm_steps(),
                     tasks.features("inputs", "targets", vocabulary=vocabulary),
                     description="BERT masked LM on English Wikipedia (20230601); validation is "
                                 "the first 1% of train.")


def register_mc4(languages=MC4_LANGUAGES, alpha: float = 0.3, data_dir: str | None = None) -> None:
    """``mc4_{lang}_span_corruption`` per language and ``mc4_span_corruption``, q_i ∝ p_i^α."""
    names = []
    for lang in languages:
        source = TfdsSource(MC4, data_dir=data_dir,
                            split_map=(("train", lang), ("validation", f"{lang}-validation")),
                            builder_module="tensorflow_datasets.text.c4")
        name = f"mc4_{lang}_span_corruption"
        TaskRegistry.add(name, source, tasks.span_corruption_steps(),
                         tasks.features("inputs", "targets", vocabulary=tasks.byte_vocabulary()),
                         description=f"ByT5-style byte span corruption on mC4 {lang!r}.")
        names.append(name)
    MixtureRegistry.add("mc4_span_corruption", names, temperature_alpha=alpha,
                        description=f"mC4 span corruption over {len(names)} languages, sampled "
                                    f"q_i ∝ p_i^{alpha} (mT5, XLM-R).")


def _register() -> None:
    if "c4_span_corruption" in TaskRegistry.names():
        return
    register_c4_tasks()
    register_wikipedia_mlm()
    register_mc4()


_register()
