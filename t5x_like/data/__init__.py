"""Data: vocabularies, sources, preprocessors, tasks, mixtures and the input streams.

A library: importing it registers nothing (seqio's ``__init__`` registers nothing
either). The built-in tasks and mixtures register with ``import
t5x_like.builtin_tasks``; every command imports them before the user's ``--module``.
"""

from t5x_like.data import preprocessors
from t5x_like.data.dataset_providers import (
    Feature,
    Mixture,
    MixtureRegistry,
    Task,
    TaskRegistry,
    TemplateRegistry,
    get_task_or_mixture,
    instruction_task,
    rate_num_examples,
    temperature_rates,
)
from t5x_like.data.feature_converters import DecoderFeatureConverter, EncDecFeatureConverter, EncoderFeatureConverter
from t5x_like.data.hf_datasets import HfDatasetSource
from t5x_like.data.parquet import ParquetSource
from t5x_like.data.pipeline import build_dataset, get_dataset
from t5x_like.data.sources import FunctionSource, InMemorySource, JsonlSource, TextFilesSource, TfdsSource
from t5x_like.data.streams import HostBatchIterator, merge_states
from t5x_like.data.vocabularies import ByteVocabulary, SentencePieceVocabulary, WordPieceVocabulary

__all__ = [
    "ByteVocabulary", "DecoderFeatureConverter", "EncDecFeatureConverter",
    "EncoderFeatureConverter", "Feature", "FunctionSource", "HfDatasetSource", "HostBatchIterator", "InMemorySource",
    "JsonlSource", "Mixture", "MixtureRegistry", "ParquetSource", "SentencePieceVocabulary", "Task", "TaskRegistry",
    "TemplateRegistry", "TextFilesSource", "TfdsSource", "WordPieceVocabulary", "build_dataset", "get_dataset",
    "get_task_or_mixture", "instruction_task", "merge_states", "preprocessors", "rate_num_examples",
    "temperature_rates",
]
