"""Tasks and the registry users add them to, in Python (seqio's vocabulary).

A Task is a source of raw examples plus a list of preprocessing steps and the
output features they produce. ``Task.get_dataset`` builds a grain pipeline:
one shard of the split (``Source.shard``), shuffled per epoch from the seed,
repeated, then the steps. Every random choice comes from the seed and the example's
position, so a pipeline is a pure function of its arguments and a grain
iterator state restores it exactly.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
from collections.abc import Callable, Mapping, Sequence

import grain
import numpy as np

from t5x_like.data import cache as cache_lib
from t5x_like.data import preprocessors as pp
from t5x_like.data.sources import Source, located
from t5x_like.errors import DataError


@dataclasses.dataclass(frozen=True)
class Feature:
    """An output feature: its vocabulary, and whether ``AppendEos`` adds EOS to it."""

    vocabulary: object
    add_eos: bool = True
    required: bool = True


def suggest(name: str, known: Sequence[str]) -> str:
    close = difflib.get_close_matches(name, known, n=3, cutoff=0.6)
    return f" Did you mean {', '.join(repr(c) for c in close)}?" if close else ""


@dataclasses.dataclass(frozen=True, eq=False)
class Task:
    """A source, its preprocessing steps and output features, and how to evaluate it.

    Evaluation metadata uses seqio's names: ``postprocess_fn(text, example=...,
    is_target=...)`` turns decoded text (and the target text) into what the metrics
    compare; ``metric_fns`` are ``fn(targets, predictions) -> dict``;
    ``score_metric_fns`` are ``fn(targets, scores) -> dict`` over each example's summed
    log-likelihood of its targets. ``label_options`` (the target texts of a
    classification task) turn prediction into rank classification: every option is
    scored and the most likely one is the prediction; examples may also carry their own
    ``options`` (multiple choice) and the index of the right one in ``label``.
    """

    name: str
    source: Source
    preprocessors: tuple = ()
    output_features: Mapping[str, Feature] = dataclasses.field(default_factory=dict)
    postprocess_fn: Callable | None = None
    metric_fns: tuple = ()
    description: str = ""
    score_metric_fns: tuple = ()
    label_options: tuple[str, ...] = ()

    def __post_init__(self):
        object.__setattr__(self, "preprocessors",
                           tuple(pp.as_step(p) for p in self.preprocessors))
        cache_lib.check_steps(self.name, self.preprocessors)
        object.__setattr__(self, "metric_fns", tuple(self.metric_fns))
        object.__setattr__(self, "score_metric_fns", tuple(self.score_metric_fns))
        object.__setattr__(self, "label_options", tuple(self.label_options))

    @property
    def has_metrics(self) -> bool:
        return bool(self.metric_fns or self.score_metric_fns)

    def postprocess(self, text, example=None, is_target: bool = False):
        """``postprocess_fn`` applied to decoded (or target) text; identity without one."""
        if self.postprocess_fn is None:
            return text
        return self.postprocess_fn(text, example=example, is_target=is_target)

    @property
    def splits(self) -> tuple[str, ...]:
        return tuple(self.source.splits)

    @property
    def tasks(self) -> list[Task]:
        """The leaf tasks: this one (a ``Mixture`` answers with its tasks)."""
        return [self]

    @property
    def vocabulary(self):
        """The vocabulary of ``targets`` (or the first feature): what decoding uses."""
        feature = self.output_features.get("targets") or next(iter(self.output_features.values()))
        return feature.vocabulary

    def num_input_examples(self, split: str) -> int:
        return self.source.num_examples(split)

    def record_without(self, split: str, fields: Sequence[str]) -> str | None:
        """Where this task's first raw record lacking one of ``fields`` is (messages)."""
        if split not in self.splits:
            return None
        return self.source.record_without(split, fields)

    def missing_validation(self) -> str | None:
        """Why this task has no held-out examples, with how to give it some; ``None`` when
        its validation split has examples (training's held-out loss reads them)."""
        if "validation" in self.splits and self.num_input_examples("validation") > 0:
            return None
        return f"task {self.name!r} has no validation examples ({self.source.validation_hint()})"

    def context(self, split: str, task_feature_lengths: Mapping[str, int],
                records: Sequence[dict] | None = None) -> pp.Context:
        """``records``: the shard being read (steps that draw other documents use it)."""
        return pp.Context(task_name=self.name, split=split,
                          task_feature_lengths=dict(task_feature_lengths),
                          output_features=self.output_features,
                          source=self.source.get(split) if records is None else records)

    def check(self, split: str, task_feature_lengths: Mapping[str, int]) -> None:
        """Every step's own check (lengths, sentinels, a mask token) without reading data:
        the ``ValueError`` ``get_dataset`` would raise, before anything is built."""
        ctx = self.context(split, task_feature_lengths, records=[])
        for step in self.preprocessors:
            step.check(ctx)

    def get_dataset(self, split: str, task_feature_lengths: Mapping[str, int], *,
                    seed: int = 0, shuffle: bool = True, num_epochs: int | None = None,
                    shard_index: int = 0, num_shards: int = 1,
                    use_cached: bool | None = None) -> grain.IterDataset:
        """This shard's examples (``Source.shard``: every ``num_shards``-th record, or whole
        files), shuffled each epoch. Each shard draws its random numbers from its own
        seed, so shards read side by side (the streams of one batch) are not correlated.

        A task with a ``pp.CacheMarker()`` reads its preprocessing cache when a cache
        directory (``T5X_LIKE_CACHE_DIR``) has one, with the same outputs (``data/cache.py``);
        ``use_cached``: ``True`` insists on the cache, ``False`` reads the source."""
        if split not in self.splits:
            raise ValueError(f"Task {self.name!r} has no split {split!r}; it has {self.splits}.")
        if not 0 <= shard_index < num_shards:
            raise ValueError(f"shard_index={shard_index} is not in [0, num_shards={num_shards}).")
        cached = cache_lib.lookup(self, split, use_cached)  # None: read the source
        read = cached.shard if cached is not None else functools.partial(self.source.shard, split)
        try:
            records = read(shard_index, num_shards)
            if len(records) == 0 and num_epochs is None:
                # Fewer examples than shards: a one-pass read leaves this shard empty, but a
                # repeating stream (training) needs examples, so it repeats one of them.
                total = len(read(0, 1))
                records = read(shard_index % total, total)
        except DataError as e:
            raise e.within(f"Task {self.name!r}") from None
        except ValueError as e:
            raise ValueError(f"Task {self.name!r}: {e}") from None
        ctx = self.context(split, task_feature_lengths, records if cached is None else
                           cache_lib.SourceShard(self.source, split, shard_index, num_shards))
        seed = shard_seed(seed, shard_index, num_shards)
        if getattr(records, "windowed", False):  # TFRecord, Parquet: read in order, windowed
            ds = records.dataset(seed, shuffle, num_epochs)
        else:
            # Index -> record through a plain map: grain's MapDataset.source records metrics
            # on every read, which costs as much as tokenizing a one-line document.
            ds = grain.MapDataset.range(len(records)).map(records.__getitem__)
            if shuffle:
                ds = ds.shuffle(seed=seed)  # a new permutation every epoch once repeated
            ds = ds.repeat(num_epochs)
        # Reading a list by index needs no threads; grain's thread prefetch costs more than it saves.
        ds = ds.to_iter_dataset(grain.ReadOptions(num_threads=0, prefetch_buffer_size=0))
        if cached is not None:  # the steps after the marker, on the cached examples
            ds = cached.apply_steps(ds, self.preprocessors, ctx, seed)
        else:
            ds = pp.apply_steps(ds, self.preprocessors, ctx, seed)
        return naming_records(ds, self, split)


def naming_records(ds: grain.IterDataset, provider, split: str) -> grain.IterDataset:
    """``ds`` as it is, except that a ``DataError`` raised while reading it without its
    place, but with what its record holds or lacks (``DataError.lookup``: a step or a
    feature converter sees the example, not its record), is re-raised naming the record
    of ``provider``'s tasks it came from (``Source.locate``). The state is ``ds``'s, so
    checkpoints of the stream are unchanged."""
    return _NamingRecords(ds, provider, split)


class _NamingRecordsIterator(grain.DatasetIterator):
    def __init__(self, parent, provider, split: str):
        super().__init__(parent)
        self._provider, self._split = provider, split

    def __next__(self):
        try:
            return next(self._parent)
        except DataError as e:
            if not e.lookup:
                raise
            found = located(e, [task.source for task in self._provider.tasks], self._split,
                            f"Task {self._provider.name!r}")
            raise found.with_traceback(e.__traceback__) from None

    def get_state(self):
        return self._parent.get_state()

    def set_state(self, state):
        self._parent.set_state(state)


class _NamingRecords(grain.IterDataset):
    def __init__(self, parent, provider, split: str):
        super().__init__(parent)
        self._provider, self._split = provider, split

    def __iter__(self):
        return _NamingRecordsIterator(self._parent.__iter__(), self._provider, self._split)


def shard_seed(seed: int, shard_index: int, num_shards: int) -> int:
    """The seed of one shard; a single shard keeps ``seed`` (unsharded streams unchanged)."""
    if num_shards == 1:
        return seed
    return int(np.random.SeedSequence([seed, num_shards, shard_index]).generate_state(1)[0])


class TaskRegistry:
    """Global name -> Task map. Add tasks from your own module and import it."""

    _tasks: dict[str, Task] = {}

    @classmethod
    def add(cls, name: str | Task, source: Source | None = None, preprocessors: Sequence = (),
            output_features: Mapping[str, Feature] | None = None, postprocess_fn=None,
            metric_fns: Sequence = (), description: str = "", score_metric_fns: Sequence = (),
            label_options: Sequence[str] = ()) -> Task:
        task = name if isinstance(name, Task) else Task(
            name=name, source=source, preprocessors=tuple(preprocessors),
            output_features=dict(output_features or {}), postprocess_fn=postprocess_fn,
            metric_fns=tuple(metric_fns), description=description,
            score_metric_fns=tuple(score_metric_fns), label_options=tuple(label_options))
        if task.name in cls._tasks or task.name in MixtureRegistry._mixtures:
            raise ValueError(f"Task {task.name!r} is already registered; pick another name or "
                             "call TaskRegistry.remove first.")
        if task.source is None or not task.output_features:
            raise ValueError(f"Task {task.name!r} needs a source and output_features.")
        cls._tasks[task.name] = task
        return task

    @classmethod
    def remove(cls, name: str) -> None:
        cls._tasks.pop(name, None)

    @classmethod
    def names(cls) -> list[str]:
        return sorted(cls._tasks)

    @classmethod
    def get(cls, name: str) -> Task:
        if name not in cls._tasks:
            hint = suggest(name, cls.names() + MixtureRegistry.names())
            raise KeyError(f"No task named {name!r}.{hint} Registered tasks: {cls.names()}."
                           f"{_builtins_hint()}")
        return cls._tasks[name]


class TemplateRegistry:
    """Task name -> its instruction templates (FLAN's and T0's phrasings), registered in
    Python beside the task; ``instruction_task`` makes a task that uses them."""

    _templates: dict[str, tuple[pp.Template, ...]] = {}

    @classmethod
    def add(cls, task_name: str, templates: Sequence[pp.Template]) -> None:
        """Adds ``templates`` to ``task_name``'s (names must be new for the task)."""
        have = cls._templates.get(task_name, ())
        names = [t.name for t in have] + [t.name for t in templates]
        if len(set(names)) != len(names):
            raise ValueError(f"Templates of {task_name!r} repeat a name: {names}.")
        cls._templates[task_name] = have + tuple(templates)

    @classmethod
    def get(cls, task_name: str) -> tuple[pp.Template, ...]:
        return cls._templates.get(task_name, ())

    @classmethod
    def names(cls) -> list[str]:
        return sorted(cls._templates)


INSTRUCTION_SUFFIX = "_instruct"


def instruction_task(task_name: str, templates: Sequence[pp.Template] | None = None,
                     name: str | None = None, postprocess_fn=None,
                     metric_fns: Sequence = (), steps: Sequence | None = None) -> Task:
    """Registers (and returns) ``task_name`` phrased by its templates: the same source and
    steps, with ``ApplyTemplates`` first, so each example reads as one of the
    instructions (picked by the pipeline's seed and the example's position). Named
    ``<task>_instruct`` unless ``name`` is given; ``templates`` default to the task's
    registered ones.

    An example's answer choices (the template's, the example's own, or the task's label
    options) become its ``options``, which evaluation ranks. The metrics are given
    here, not taken from the task: a templated answer ("yes") is not what the task's
    postprocessor reads; ``postprocess_fn`` and ``metric_fns`` compare the answer
    texts. ``steps``: what runs after the templates, where a task's first steps format
    the raw record the templates read instead (GLUE's T5 formatting); default, every
    step of the task."""
    task = TaskRegistry.get(task_name)
    templates = tuple(templates if templates is not None else TemplateRegistry.get(task_name))
    if not templates:
        raise ValueError(f"Task {task_name!r} has no templates; register them with "
                         "TemplateRegistry.add or pass templates=.")
    step = pp.ApplyTemplates(templates, task.label_options)
    return TaskRegistry.add(
        name or task_name + INSTRUCTION_SUFFIX, task.source,
        (step, *(task.preprocessors if steps is None else steps)),
        task.output_features, postprocess_fn=postprocess_fn, metric_fns=metric_fns,
        description=f"{task_name} as instructions: {len(templates)} templates "
                    f"({sum(t.lists_options for t in templates)} listing options).")


# Rates: a number, or a function of the split that computes it (sizes, temperature).
Rate = float | Callable[[str], float]


@dataclasses.dataclass(frozen=True, eq=False)
class Mixture:
    """Tasks or mixtures sampled at fixed proportions; nested mixtures multiply out."""

    name: str
    components: tuple[tuple[str, Rate], ...]
    description: str = ""
    retokenize_with: object = None    # set by with_vocabulary: every task tokenized with it

    def task(self, name: str) -> Task:
        """A leaf task, in the mixture's vocabulary when one was given."""
        task = TaskRegistry.get(name)
        return with_vocabulary(task, self.retokenize_with)

    def leaf_rates(self, split: str) -> dict[str, float]:
        """``{task name: rate}`` with nested mixtures flattened (rates multiplied)."""
        rates: dict[str, float] = {}
        weights = [(n, float(r(split) if callable(r) else r)) for n, r in self.components]
        total = sum(w for _, w in weights)
        if total <= 0:
            raise ValueError(f"Mixture {self.name!r} has no positive rate: {weights}.")
        for component, weight in weights:
            if weight < 0:
                raise ValueError(f"Mixture {self.name!r}: rate of {component!r} is {weight} < 0.")
            if component in MixtureRegistry._mixtures:
                for task, rate in MixtureRegistry.get(component).leaf_rates(split).items():
                    rates[task] = rates.get(task, 0.0) + weight / total * rate
            else:
                TaskRegistry.get(component)
                rates[component] = rates.get(component, 0.0) + weight / total
        return {task: rate for task, rate in rates.items() if rate > 0}

    @property
    def tasks(self) -> list[Task]:
        return [self.task(n) for n in self.leaf_rates(self._any_split())]

    def _any_split(self) -> str:
        first = self.components[0][0]
        if first in MixtureRegistry._mixtures:
            return MixtureRegistry.get(first)._any_split()
        return TaskRegistry.get(first).splits[0]

    @property
    def output_features(self):
        return self.tasks[0].output_features

    @property
    def vocabulary(self):
        return self.tasks[0].vocabulary

    def get_dataset(self, split: str, task_feature_lengths: Mapping[str, int], *, seed: int = 0,
                    shuffle: bool = True, num_epochs: int | None = None, shard_index: int = 0,
                    num_shards: int = 1, use_cached: bool | None = None) -> grain.IterDataset:
        """Interleaves the tasks' streams deterministically at the mixture's rates.

        Each task's stream repeats (``num_epochs`` applies to each); the mix ends when
        any finite task stream ends.
        """
        rates = self.leaf_rates(split)
        datasets = [
            self.task(task).get_dataset(
                split, task_feature_lengths, seed=pp.base.step_seed(seed, 1000 + i),
                shuffle=shuffle, num_epochs=num_epochs, shard_index=shard_index,
                num_shards=num_shards, use_cached=use_cached)
            for i, task in enumerate(sorted(rates))]
        return grain.IterDataset.mix(datasets, [rates[t] for t in sorted(rates)])


def missing_validation(provider: Task | Mixture) -> list[str]:
    """Why each task of a task or mixture has no held-out examples (empty: all have)."""
    return [why for why in (task.missing_validation() for task in provider.tasks) if why]


def with_vocabulary(provider, vocabulary):
    """The task or mixture with every text feature tokenized by ``vocabulary`` (a
    checkpoint's own tokenizer): the preprocessors read the vocabulary from the output
    features, so sentinels, EOS and masks follow it, and metrics still see text."""
    if vocabulary is None:
        return provider
    if isinstance(provider, Mixture):
        return dataclasses.replace(provider, retokenize_with=vocabulary)
    features = {name: dataclasses.replace(feature, vocabulary=vocabulary)
                for name, feature in provider.output_features.items()}
    return dataclasses.replace(provider, output_features=features)


def rate_num_examples(task_name: str, maximum: int | None = None, scale: float = 1.0,
                      temperature: float = 1.0) -> Callable[[str], float]:
    """seqio's size-proportional rate: ``(scale * min(n, maximum)) ** (1 / temperature)``."""

    def rate(split: str) -> float:
        n = TaskRegistry.get(task_name).num_input_examples(split)
        n = min(n, maximum) if maximum is not None else n
        return (scale * n) ** (1.0 / temperature)
    return rate


def temperature_probabilities(sizes: Mapping[str, float], alpha: float) -> dict[str, float]:
    """q_i = p_i^α / Σ_j p_j^α with p_i = size_i / Σ size (XLM-R, Conneau et al. 2020): the
    rates of a temperature-sampled mixture and of the multilingual vocabulary's text."""
    if alpha <= 0:
        raise ValueError(f"alpha must be > 0, got {alpha}.")
    total = float(sum(sizes.values()))
    if total <= 0:
        raise ValueError(f"The sources hold no text: {dict(sizes)}.")
    powered = {name: (size / total) ** alpha for name, size in sizes.items()}
    norm = sum(powered.values())
    return {name: value / norm for name, value in powered.items()}


def temperature_rates(task_names: Sequence[str], alpha: float) -> list[tuple[str, Rate]]:
    """XLM-R's sampling: q_i ∝ p_i^α with p_i the task's share of the examples.

    α = 1 is size-proportional, α -> 0 uniform; XLM-R uses 0.3, mT5 0.3.
    """

    sizes_by_split: dict[str, dict[str, int]] = {}  # read once per split and process

    def rate_for(name):
        def rate(split: str) -> float:
            if split not in sizes_by_split:
                sizes_by_split[split] = {n: TaskRegistry.get(n).num_input_examples(split)
                                         for n in task_names}
            sizes = sizes_by_split[split]
            total = sum(sizes.values())
            return (sizes[name] / total) ** alpha if total else 0.0
        return rate
    return [(n, rate_for(n)) for n in task_names]


class MixtureRegistry:
    """Global name -> Mixture map; a mixture may contain mixtures."""

    _mixtures: dict[str, Mixture] = {}

    @classmethod
    def add(cls, name: str, tasks: Sequence, default_rate: Rate | None = None, *,
            temperature_alpha: float | None = None, description: str = "") -> Mixture:
        """``tasks``: ``[(name, rate), ...]``, or names with ``default_rate`` or
        ``temperature_alpha`` (q_i ∝ p_i^α over the tasks' sizes)."""
        if name in cls._mixtures or name in TaskRegistry._tasks:
            raise ValueError(f"Mixture {name!r}: the name is already registered; pick another "
                             "or call MixtureRegistry.remove first.")
        if temperature_alpha is not None:
            components = temperature_rates([t if isinstance(t, str) else t[0] for t in tasks],
                                           temperature_alpha)
        else:
            components = []
            for item in tasks:
                if isinstance(item, str):
                    if default_rate is None:
                        raise ValueError(f"Mixture {name!r}: {item!r} has no rate; give "
                                         "(name, rate) pairs, default_rate or temperature_alpha.")
                    components.append((item, default_rate))
                else:
                    components.append((item[0], item[1]))
        mixture = Mixture(name, tuple(components), description)
        cls._mixtures[name] = mixture
        return mixture

    @classmethod
    def remove(cls, name: str) -> None:
        cls._mixtures.pop(name, None)

    @classmethod
    def names(cls) -> list[str]:
        return sorted(cls._mixtures)

    @classmethod
    def get(cls, name: str) -> Mixture:
        if name not in cls._mixtures:
            hint = suggest(name, cls.names() + TaskRegistry.names())
            raise KeyError(f"No mixture named {name!r}.{hint} Registered mixtures: {cls.names()}."
                           f"{_builtins_hint()}")
        return cls._mixtures[name]


def get_task_or_mixture(name: str) -> Task | Mixture:
    if name in MixtureRegistry._mixtures:
        return MixtureRegistry._mixtures[name]
    if name in TaskRegistry._tasks:
        return TaskRegistry._tasks[name]
    hint = suggest(name, TaskRegistry.names() + MixtureRegistry.names())
    raise KeyError(f"No task or mixture named {name!r}.{hint} Registered: tasks "
                   f"{TaskRegistry.names()}, mixtures {MixtureRegistry.names()}.{_builtins_hint()}")


def _builtins_hint() -> str:
    """Importing the data library registers nothing; an empty registry most likely means
    the built-in tasks were never imported."""
    if TaskRegistry.names() or MixtureRegistry.names():
        return ""
    return " (The built-in tasks register with `import t5x_like.builtin_tasks`.)"


def instruction_mixtures(name: str, clusters: Mapping[str, Sequence[str]],
                         held_out: Sequence[str], maximum: int,
                         suffix: str = INSTRUCTION_SUFFIX) -> tuple[Mixture, Mixture]:
    """T0's split over FLAN's mixing: ``(training mixture, held-out mixture)``.

    ``clusters`` groups tasks by kind (T0: paraphrase, sentence completion, ...); the
    clusters named in ``held_out`` stay out of training entirely, so zero-shot accuracy
    on them measures what instruction tuning carries over. Both mixtures are of the
    tasks' ``*_instruct`` forms (``instruction_task`` first; ``suffix`` names others),
    each at a rate of its number of examples capped at ``maximum`` (FLAN's
    examples-proportional mixing: large tasks do not crowd out small ones). Registered as ``{name}_train`` and
    ``{name}_held_out``."""
    unknown = sorted(set(held_out) - set(clusters))
    if unknown:
        raise ValueError(f"Instruction mixture {name!r}: held-out clusters {unknown} are not "
                         f"among its clusters {sorted(clusters)}.")
    seen: dict[str, str] = {}
    for cluster, tasks in clusters.items():
        for task in tasks:
            if task in seen:
                raise ValueError(f"Instruction mixture {name!r}: {task!r} is in clusters "
                                 f"{seen[task]!r} and {cluster!r}; a task belongs to one.")
            seen[task] = cluster
    parts = {"train": [c for c in clusters if c not in held_out], "held_out": list(held_out)}
    for part, names in parts.items():  # every check before anything is registered
        if not any(clusters[c] for c in names):
            raise ValueError(f"Instruction mixture {name!r}: no cluster left for {part}.")
        for c in names:
            for task in clusters[c]:
                TaskRegistry.get(task + suffix)  # registered by instruction_task
    mixtures = []
    for part, names in parts.items():
        tasks = [t + suffix for c in names for t in clusters[c]]
        mixtures.append(MixtureRegistry.add(
            f"{name}_{part}", [(t, rate_num_examples(t, maximum=maximum)) for t in tasks],
            description=f"instructions of the {'training' if part == 'train' else 'held-out'} "
                        f"clusters {', '.join(names)}; examples-proportional, capped at "
                        f"{maximum:,}"))
    return mixtures[0], mixtures[1]
