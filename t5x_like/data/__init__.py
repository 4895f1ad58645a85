"""Data: vocabularies, sources, preprocessors, tasks, mixtures and the input streams.

Importing this package registers the built-in tasks (``tasks``, ``tfds_tasks``, ``glue``).
"""

from t5x_like.data import bench_tasks as _bench_tasks  # noqa: F401
from t5x_like.data import glue as _glue_tasks  # noqa: F401  (registers GLUE, SuperGLUE)
from t5x_like.data import multilingual_tasks as _multilingual_tasks  # noqa: F401
from t5x_like.data import preprocessors
from t5x_like.data import retrieval_tasks as _retrieval_tasks  # noqa: F401
from t5x_like.data import tasks as _builtin_tasks  # noqa: F401  (registers tasks)
from t5x_like.data import tfds_tasks as _tfds_tasks  # noqa: F401  (registers TFDS tasks)
from t5x_like.data.dataset_providers import (
    Feature,
    Mixture,
    MixtureRegistry,
    Task,
    TaskRegistry,
    get_task_or_mixture,
    rate_num_examples,
    temperature_rates,
)
from t5x_like.data.feature_converters import DecoderFeatureConverter, EncDecFeatureConverter, EncoderFeatureConverter
from t5x_like.data.pipeline import build_dataset, get_dataset
from t5x_like.data.sources import FunctionSource, InMemorySource, JsonlSource, TextFilesSource, TfdsSource
from t5x_like.data.streams import HostBatchIterator, merge_states
from t5x_like.data.vocabularies import ByteVocabulary, SentencePieceVocabulary, WordPieceVocabulary

__all__ = [
    "ByteVocabulary", "DecoderFeatureConverter", "EncDecFeatureConverter",
    "EncoderFeatureConverter", "Feature", "FunctionSource", "HostBatchIterator", "InMemorySource",
    "JsonlSource", "Mixture", "MixtureRegistry", "SentencePieceVocabulary", "Task", "TaskRegistry",
    "TextFilesSource", "TfdsSource", "WordPieceVocabulary", "build_dataset", "get_dataset",
    "get_task_or_mixture", "merge_states", "preprocessors", "rate_num_examples",
    "temperature_rates",
]
