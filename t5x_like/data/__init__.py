"""Data: vocabularies, sources, preprocessors, tasks and the per-host pipeline.

Importing this package registers the built-in tasks.
"""

from t5x_like.data import preprocessors
from t5x_like.data.dataset_providers import Task, TaskRegistry
from t5x_like.data.feature_converters import EncDecFeatureConverter
from t5x_like.data.vocabularies import SentencePieceVocabulary
from t5x_like.data import tasks as _builtin_tasks  # noqa: F401  (registers tasks)

__all__ = ["EncDecFeatureConverter", "SentencePieceVocabulary", "Task", "TaskRegistry",
           "preprocessors"]
