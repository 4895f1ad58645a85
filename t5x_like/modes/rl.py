"""Online RL's rollouts (``config.rl``): each step samples completions of the task's
prompts with the policy being trained, scores them, and hands the trainer a batch of
rollout rows (``structures/reinforcement.py``).

One step, in ``Rollouts.next``:

1. the next ``batch_size / num_generations`` rows of the task's stream (this process's
   share; their position is the checkpoint's data state, as any run's), each prompt
   repeated ``num_generations`` times, consecutive;
2. completions sampled by ``decoding.generate_padded`` (temperature, top-k, top-p) with
   the current params, jitted on the run's mesh (no second framework, no copy of the
   weights), with the key ``fold_in(key(seed + 2), step)``: the rollout randomness is a
   function of the step, which the checkpoint holds, so a resumed run samples exactly
   what an uninterrupted one did;
3. rewards: each of ``rl.rewards`` (``t5x_like.metrics.rewards.RewardRegistry``) on the decoded
   completions and the rows' prompt and answer texts, and ``rl.reward_model``'s scores
   (a ``preference.objective='reward_model'`` checkpoint, run jitted on the same mesh),
   weighted and summed;
4. with ``rl.dynamic_sampling_rounds`` (DAPO's dynamic sampling), groups whose rewards
   are all equal are dropped and steps 1-3 repeat on the next prompts until the batch
   holds groups with signal (``Rollouts._sampled_groups``);
5. the rows: the start id, the prompt, the completion up to and with its EOS; GRPO's
   advantages normalised within each prompt's group (``objectives.preference.
   group_advantages``);
6. with ``rl.iterations`` > 1, the sampling policy's log-probability of each row's next
   tokens (``old_log_probs``), jitted on the mesh with the params that sampled the
   completions: the batch serves ``rl.iterations`` updates (the loop reuses it,
   ``loop.Loop``), and every one of them reads its ratio against these.

PPO (``rl.algorithm='ppo'``) samples one completion a prompt and, in place of 5-6, runs
``_ppo_fn`` once on the mesh over the whole batch: the policy's and the reference's
log-probabilities, the value model's values, and from them and the scores the
KL-penalised rewards, GAE's advantages (whitened over every process's completion
tokens) and returns (``objectives.ppo.rollout_targets``); its value model starts from a
reward model (``value_model_params``, the mode's ``init_params``).

What it logs beside the update's metrics: the mean reward and each reward's mean (over
every completion sampled), the share of the batch's groups whose rewards are all equal
(no signal; with dynamic sampling also ``sampled_groups_without_signal``, over every
group sampled, and ``sampling_rounds``), the completions' mean length,
and the rollout's time and tokens per second (goodput books the rollout apart from the
update). A batch reused for a later update logs only ``REUSED_METRICS`` of these: the
rollout happened once, so its reward and time are logged once, on the step that
sampled it.
"""

from __future__ import annotations

import dataclasses
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import traverse_util
from jax.experimental import multihost_utils

from t5x_like import structures
from t5x_like.checkpoints import param_sources
from t5x_like.config.evals import RolloutsSpec
from t5x_like.data import get_task_or_mixture, pipeline
from t5x_like.engine import partitioning
from t5x_like.engine import trainer as trainer_lib
from t5x_like.errors import UserError
from t5x_like.evaluation.in_training.base import TrainingEvaluator
from t5x_like.generation import engine as engine_lib
from t5x_like.metrics.rewards import RewardRegistry
from t5x_like.models import decoding
from t5x_like.modes import preference
from t5x_like.modes.registry import Mode, register
from t5x_like.objectives import ppo
from t5x_like.objectives.preference import group_advantages
from t5x_like.structures import reinforcement
from t5x_like.structures.decoder import prompts_from_batch

# What of a rollout's metrics the later updates of its batch log again: properties of
# the batch the update reads, not of the sampling. The divergence rules read
# ``groups_without_signal`` on every step (a batch without signal gives every one of its
# updates a zero gradient).
REUSED_METRICS = ("groups_without_signal",)


@dataclasses.dataclass
class Rollout:
    """One rollout's rows (process-local numpy) and what its sampling step logs."""

    batch: dict
    metrics: dict

    @property
    def reused_metrics(self) -> dict:
        """What a later update of this batch logs (``REUSED_METRICS``)."""
        return {key: self.metrics[key] for key in REUSED_METRICS if key in self.metrics}


def reward_functions(spec):
    """``[(name, fn, weight)]`` of ``rl.rewards`` (the reward model's weight comes last)."""
    weights = spec.rl.reward_weights or (1.0,) * (len(spec.rl.rewards) + bool(spec.rl.reward_model))
    found = []
    for name, weight in zip(spec.rl.rewards, weights, strict=False):
        try:
            found.append((name, RewardRegistry.get(name), float(weight)))
        except KeyError:
            raise UserError(f"rl.rewards names {name!r}, which is not a registered reward; "
                            f"registered: {', '.join(RewardRegistry.names()) or 'none'} "
                            "(add yours with t5x_like.metrics.rewards.RewardRegistry.add in a "
                            "--module).") from None
    return found


def check(spec) -> None:
    """What can be checked before anything runs: the rewards are registered, a reward
    model is a reward-model run, learned positions hold prompt and completion."""
    if not spec.rl.algorithm:
        return
    reward_functions(spec)
    limit = structures.structure_class(spec.model.family).learned_positions(spec.model)
    lengths = spec.task_feature_lengths
    needed = 1 + int(lengths["inputs"]) + int(lengths["targets"])
    if limit and needed > limit:
        raise UserError(f"Rollouts hold the start id, a prompt of {lengths['inputs']} and a "
                        f"completion of {lengths['targets']} tokens ({needed} positions); the "
                        f"model has model.positions.max_length={limit}. Shorten "
                        "task_feature_lengths.inputs.")
    if spec.rl.reward_model:
        reward_model_spec(spec)
    if spec.rl.algorithm == "ppo":
        check_ppo(spec)
    if spec.rl.sampler == "engine":
        check_engine(spec)


def check_engine(spec) -> None:
    """``rl.sampler=engine``: the engine decodes on one process, with a policy that reads
    a paged cache (``decoding.check_paged``)."""
    if jax.process_count() > 1:
        raise UserError(f"rl.sampler='engine' samples on one process; this run has "
                        f"{jax.process_count()}. Use --config.rl.sampler=static.")
    try:
        decoding.check_paged(structures.for_config(spec).policy_model)
    except engine_lib.UnpagedModel as e:
        raise UserError(f"rl.sampler='engine': {e} Use --config.rl.sampler=static.") from None


def check_ppo(spec) -> None:
    """A value model that cannot start from the checkpoint named (``RunSpec`` refuses
    the settings PPO does not take)."""
    source = value_model_source(spec)
    if source:
        saved = reward_model_spec(spec, *source)
        if saved.model != spec.model:
            raise UserError(f"{source[1]}={source[0]!r} is a reward model of another "
                            "architecture than the policy's; the value model is a tower of the "
                            "policy's architecture. Train the reward model from the policy's SFT "
                            "checkpoint, or set rl.value_model to one that is.")


def value_model_source(spec) -> tuple[str, str] | None:
    """``(path, config key)`` of the reward-model run PPO's value model starts from, or
    None (the policy's trunk and a fresh head)."""
    if spec.rl.value_model:
        return spec.rl.value_model, "rl.value_model"
    if spec.rl.reward_model:
        return spec.rl.reward_model, "rl.reward_model"
    return None


def reward_model_spec(spec, path: str | None = None, key: str = "rl.reward_model"):
    """The run spec of ``rl.reward_model``'s checkpoint (``path`` under ``key``: a
    reward-model run)."""
    path = path or spec.rl.reward_model
    saved = param_sources.config_from_saved(param_sources.newest_saved(path, key)[2])
    if saved.preference.objective != "reward_model":
        raise UserError(f"{key}={path!r} is not a reward model (its run trained "
                        f"preference.objective={saved.preference.objective!r}); train one with "
                        "--config.preference.objective=reward_model.")
    if saved.model.vocab_size != spec.model.vocab_size:
        raise UserError(f"{key}={path!r} reads {saved.model.vocab_size} token ids and "
                        f"the policy writes {spec.model.vocab_size}; use a reward model trained "
                        "with the policy's tokenizer.")
    return saved


def value_model_params(spec, flat_params: dict, mesh) -> dict:
    """PPO's start: ``init_from``'s params (as ``PpoStructure.params_from_pretrained``
    laid them out) with the value model's replaced by the reward model's
    (``value_model_source``), as InstructGPT and TRL start the value model."""
    source = None if spec.rl.algorithm != "ppo" else value_model_source(spec)
    if source is None:
        return flat_params
    saved = reward_model_spec(spec, *source)
    params, _ = param_sources.base_params(source[0], saved, mesh)
    flat = traverse_util.flatten_dict(jax.device_get(params))
    return {**flat_params, **{("value", *key): value for key, value in flat.items()}}


class Rollouts:
    """The rollout side of an RL run (see the module docstring)."""

    def __init__(self, spec, trainer, structure, vocabulary, prompt_batches):
        self.spec, self.trainer, self.structure = spec, trainer, structure
        self.vocabulary = vocabulary
        self.prompt_batches = prompt_batches  # HostBatchIterator of the task's rows
        self.group = structure.samples_per_prompt
        lengths = dict(spec.task_feature_lengths)
        self.prompt_width = 1 + int(lengths["inputs"])
        self.completion_length = int(lengths["targets"])
        self.rewards = reward_functions(spec)
        self.eos_id = int(getattr(structure.policy_model.config, "eos_id", 1))
        self._sample = jax.jit(self._sample_fn, static_argnames=("greedy",))
        self._log_probs = (jax.jit(self._log_probs_fn)
                           if structure.keeps_old_log_probs else None)
        # PPO: the targets its updates read, computed once a rollout (``_ppo_fn``).
        self._ppo = jax.jit(self._ppo_fn) if spec.rl.algorithm == "ppo" else None
        self._reference = (preference.reference_structure(preference.reference_spec(
            spec, preference.reference_source(spec))) if self._ppo is not None else None)
        self._reward_model = self._load_reward_model() if spec.rl.reward_model else None
        self._engine: engine_lib.Engine | None = None  # rl.sampler=engine: made at first use
        self.last_rewards: dict[str, np.ndarray] = {}  # score's values per reward, and "reward"

    # -- sampling ---------------------------------------------------------------------------
    def _sample_fn(self, params, tokens, lengths, rng, greedy=False):
        rl = self.spec.rl
        return decoding.generate_padded(
            self.structure.policy_model, self.structure.policy_params(params), tokens, lengths,
            max_new_tokens=self.completion_length, rng=rng,
            temperature=0.0 if greedy else rl.temperature, top_k=rl.top_k, top_p=rl.top_p,
            eos_id=self.eos_id)

    def sample(self, params, rows: dict, rng, greedy: bool = False):
        """``(prompt tokens [n, 1 + inputs], prompt lengths [n], completions [n, targets])``
        of this process's decoder ``rows`` (host numpy), sampled by ``rl.sampler``'s
        sampler."""
        prompts, lengths = (np.asarray(x) for x in prompts_from_batch(rows))
        prompts = prompts[:, :self.prompt_width]
        lengths = np.minimum(lengths, self.prompt_width).astype(np.int32)
        sample = self._engine_sample if self.spec.rl.sampler == "engine" else self._static_sample
        return prompts, lengths, sample(params, prompts, lengths, rng, greedy)

    def _static_sample(self, params, prompts, lengths, rng, greedy: bool) -> np.ndarray:
        """``[n, targets]`` completions of this process's rows, one padded batch sampled
        on the mesh (``decoding.generate_padded``)."""
        placed = partitioning.global_batch({"tokens": prompts, "lengths": lengths},
                                           self.trainer.mesh, self.trainer.rules)
        with self.trainer._context():
            completions = self._sample(params, placed["tokens"], placed["lengths"], rng,
                                       greedy=greedy)
        return _local_rows(completions, prompts.shape[0])

    def _engine_sample(self, params, prompts, lengths, rng, greedy: bool) -> np.ndarray:
        """``[n, targets]`` completions of the rows' prompts by the continuous-batching
        engine (``rl.sampler=engine``): one request a row, a slot a row, each sampled
        from its own seed drawn from ``rng`` (the step's key: a resumed run samples the
        same), ended by EOS (kept) or the completion length; zeros after. The engine
        takes the params of this step, and forgets the prompt pages the last params
        computed."""
        rl, rows = self.spec.rl, len(prompts)
        policy_params = self.structure.policy_params(params)
        if self._engine is None:
            self._engine = engine_lib.Engine(
                self.structure.policy_model, policy_params, slots=rows,
                max_length=self.prompt_width + self.completion_length,
                context=self.trainer._context)
        else:
            self._engine.params = policy_params
            self._engine.clear_prefix_cache()
        seeds = (np.zeros(rows, np.int64) if rng is None  # greedy: no draw
                 else np.asarray(jax.random.randint(rng, (rows,), 0, 2**31 - 1)))
        return engine_lib.complete(
            self._engine, [prompts[i, :lengths[i]] for i in range(rows)],
            self.completion_length, seeds=seeds, stop_ids=(self.eos_id,),
            temperature=0.0 if greedy else rl.temperature, top_k=rl.top_k, top_p=rl.top_p)

    def _log_probs_fn(self, params, tokens):
        # The trainer's model: the one the update's loss reads (quantized training's too),
        # so the first update of a batch has a ratio of 1.
        return self.structure.token_log_probs(self.trainer.model, params, tokens)

    def old_log_probs(self, params, tokens) -> np.ndarray:
        """``[n, width - 1]``: each next token's log-probability under ``params`` (the
        policy that sampled ``tokens``, this process's rollout rows) at the sampling
        temperature, computed on the mesh as the update computes its own."""
        placed = partitioning.global_batch({"tokens": tokens}, self.trainer.mesh,
                                           self.trainer.rules)
        with self.trainer._context():
            values = self._log_probs(params, placed["tokens"])
        return _local_rows(values, tokens.shape[0]).astype(np.float32)

    def _ppo_fn(self, params, reference_params, tokens, weights, scores, has_eos):
        """PPO's rollout features of the whole batch (``objectives.ppo.rollout_targets``):
        the sampling policy's log-probabilities and the value model's values (the update
        params), the reference's log-probabilities (for the KL penalty), GAE's advantages
        whitened over the batch's completion tokens, the returns, and each value
        position's share of the batch's (``value_weights``); and what is logged of them."""
        model, rl = self.trainer.model, self.spec.rl
        logps = self.structure.token_log_probs(model, params, tokens) * weights
        values = self.structure.values(model, params, tokens)
        reference = self._reference
        ref_logps = reference.token_log_probs(reference.model, reference_params, tokens) * weights
        targets, metrics = ppo.rollout_targets(
            scores, logps, ref_logps, values, weights,
            completion_length=self.completion_length, kl_coef=rl.kl_coef,
            kl_estimator=rl.kl_estimator, gamma=rl.gamma, lam=rl.lam,
            whiten_rewards=rl.whiten_rewards, has_eos=has_eos,
            missing_eos_penalty=rl.missing_eos_penalty)
        features = {"old_log_probs": logps, "old_values": values * targets["value_mask"],
                    "advantages": targets["advantages"], "returns": targets["returns"],
                    "value_weights": ppo.value_shares(targets["value_mask"])}
        return features, metrics

    def ppo_features(self, params, tokens, weights, scores, completions) -> tuple[dict, dict]:
        """``_ppo_fn`` on this process's rollout rows (numpy), run on the mesh over every
        process's: ``(this process's rows of each feature, metrics of the whole batch)``."""
        has_eos = (np.asarray(completions) == self.eos_id).any(axis=1).astype(np.float32)
        placed = partitioning.global_batch(
            {"tokens": tokens, "weights": weights, "scores": scores.astype(np.float32),
             "has_eos": has_eos}, self.trainer.mesh, self.trainer.rules)
        with self.trainer._context():
            features, metrics = self._ppo(params, self.trainer.frozen_params, placed["tokens"],
                                          placed["weights"], placed["scores"],
                                          placed["has_eos"])
        rows = tokens.shape[0]
        return ({key: _local_rows(value, rows).astype(np.float32)
                 for key, value in features.items()},
                {key: float(value) for key, value in jax.device_get(metrics).items()})

    # -- texts and rewards ------------------------------------------------------------------
    def _texts(self, tokens) -> str:
        """The text of ``tokens`` up to their first EOS (what follows it is padding; id 0
        is a real token in some tokenizers, GPT-2's "!", so nothing else is dropped)."""
        ids = [int(t) for t in tokens]
        if self.eos_id in ids:
            ids = ids[:ids.index(self.eos_id)]
        return self.vocabulary.decode(ids)

    def examples(self, rows: dict) -> list[dict]:
        """Each row's prompt and answer texts (the inputs and the targets it was built
        from), what reward functions compare completions with."""
        targets, weights = rows["decoder_target_tokens"], rows["decoder_loss_weights"]
        out = []
        for tokens, row_weights in zip(targets, weights, strict=True):
            answer = [t for t, w in zip(tokens, row_weights, strict=True) if w > 0]
            first = int(np.argmax(row_weights > 0)) if row_weights.any() else len(tokens)
            out.append({"prompt": self._texts(tokens[:first]), "answer": self._texts(answer)})
        return out

    def score(self, prompts, lengths, completions, examples, step: int | None = None):
        """``(total reward [n], {name: mean})``: the weighted sum of every reward. A reward
        that is not finite stops the run in one line naming the reward, the completion and
        the training step it was for (``step``; the run's checkpoints stay as saved)."""
        during = f" for step {step}" if step is not None else " in an evaluation"
        texts = [self._texts(c) for c in completions]
        total = np.zeros(len(texts), np.float64)
        means, self.last_rewards = {}, {}
        for name, fn, weight in self.rewards:
            try:
                values = list(fn(texts, examples))
            except Exception as e:  # noqa: BLE001
                raise UserError(f"rl.rewards: reward {name!r} raised {type(e).__name__}: {e}; "
                                "fix the function (it gets the completions' texts and one "
                                "{'prompt', 'answer'} dict each).") from None
            if len(values) != len(texts):
                raise UserError(f"rl.rewards: reward {name!r} returned {len(values)} values "
                                f"for {len(texts)} completions; return one each.")
            try:
                array = np.asarray([0.0 if v is None else float(v) for v in values], np.float64)
            except (TypeError, ValueError):
                raise UserError(f"rl.rewards: reward {name!r} returned a value that is not a "
                                f"number ({values[:3]!r}...); return floats (or None).") from None
            _check_finite(f"rl.rewards: reward {name!r}", array, texts, during,
                          "return finite floats (None scores 0)")
            means[name] = float(array.mean())
            self.last_rewards[name] = array
            total += weight * array
        if self._reward_model is not None:
            weight = (self.spec.rl.reward_weights or (1.0,) * (len(self.rewards) + 1))[-1]
            scores = self._reward_model_scores(prompts, lengths, completions)
            _check_finite(f"rl.reward_model={self.spec.rl.reward_model}", scores, texts, during,
                          "the reward model's params are not finite; retrain it or use "
                          "an earlier checkpoint")
            means["reward_model"] = float(scores.mean())
            self.last_rewards["reward_model"] = scores
            total += float(weight) * scores
        self.last_rewards["reward"] = total
        return total.astype(np.float32), means

    def _load_reward_model(self):
        spec = reward_model_spec(self.spec).replace(partitioning=self.spec.partitioning)
        structure = structures.for_config(spec)
        params, _ = param_sources.base_params(self.spec.rl.reward_model, spec, self.trainer.mesh)
        reward_trainer = trainer_lib.build_trainer(spec, self.trainer.mesh)
        placed = reward_trainer.place_params(params)
        scorer = jax.jit(structure.rewards)
        return structure, placed, scorer, reward_trainer

    def _reward_model_scores(self, prompts, lengths, completions) -> np.ndarray:
        _, params, scorer, reward_trainer = self._reward_model
        tokens, mask, _ = self.rows(prompts, lengths, completions)
        placed = partitioning.global_batch({"tokens": tokens, "mask": mask},
                                           reward_trainer.mesh, reward_trainer.rules)
        with reward_trainer._context():
            scores = scorer(params, placed["tokens"], placed["mask"])
        return _local_rows(scores, tokens.shape[0]).astype(np.float64)

    # -- rows -------------------------------------------------------------------------------
    def rows(self, prompts, lengths, completions):
        """``rollout_rows`` at this run's widths and EOS."""
        return rollout_rows(prompts, lengths, completions, self.eos_id,
                            self.prompt_width + self.completion_length)

    # -- a step -----------------------------------------------------------------------------
    def next(self, params, step: int) -> Rollout:
        """The rollout rows of the step after ``step``, sampled with ``params`` (see the
        module docstring); with ``rl.dynamic_sampling_rounds``, the groups without signal
        dropped and refilled (``_sampled_groups``)."""
        began = time.monotonic()
        groups, sampled = self._sampled_groups(params, step)
        prompts, lengths, completions, rewards = (np.concatenate([g[i] for g in groups])
                                                  for i in range(4))
        tokens, _, weights = self.rows(prompts, lengths, completions)
        batch = {"tokens": tokens, "completion_loss_weights": weights}
        targets_metrics = {}
        if self._ppo is not None:
            features, targets_metrics = self.ppo_features(params, tokens, weights, rewards,
                                                          completions)
            batch.update(features)
        else:
            batch["advantages"] = np.asarray(group_advantages(
                jnp.asarray(rewards), self.group, self.spec.rl.scale_rewards), np.float32)
            if self._log_probs is not None:
                batch["old_log_probs"] = self.old_log_probs(params, tokens)
        seconds = time.monotonic() - began
        # Every process's rows: a run logs what its whole batch did, not process 0's share.
        every = _across_processes(sampled["rewards"])  # every completion sampled, each round's
        grouped = _across_processes(rewards).reshape(-1, self.group)  # the batch's groups
        batch_tokens, sampled_tokens = _across_processes(np.array(
            [[weights.sum(), sampled["completion_tokens"]]], np.float64)).sum(axis=0)
        metrics = {"reward": float(every.mean()), "reward_std": float(every.std()),
                   **{f"rewards/{name}": float(_across_processes(np.concatenate(values)).mean())
                      for name, values in sampled["by_name"].items()},
                   "completion_length": float(batch_tokens) / grouped.size,
                   "rollout_seconds": seconds,
                   "rollout_tokens_per_sec": float(sampled_tokens) / max(seconds, 1e-9),
                   **targets_metrics}
        if self.group > 1:  # GRPO's groups (PPO samples one completion a prompt)
            metrics["groups_without_signal"] = float(np.mean(grouped.std(axis=1) == 0))
        if self.spec.rl.dynamic_sampling_rounds:
            metrics["sampling_rounds"] = float(sampled["rounds"])
            metrics["sampled_groups_without_signal"] = float(np.mean(
                every.reshape(-1, self.group).std(axis=1) == 0))
        return Rollout(batch, metrics)

    def _sampled_groups(self, params, step: int) -> tuple[list[tuple], dict]:
        """This process's groups for the step after ``step`` (each ``(prompts, lengths,
        completions, rewards)`` of its ``num_generations`` rows), and what was sampled.

        A round takes the next prompts of the stream, samples them under the step's key
        (the first round) or that key folded with the round, and scores them. Without
        dynamic sampling one round is the batch. With it (DAPO, Yu et al. 2025), groups
        whose rewards are all equal give no gradient and are set aside; rounds go on
        while any process lacks groups with signal (every process samples in every
        round: the sampling program runs on the whole mesh), at most
        ``dynamic_sampling_rounds`` more; a process still short fills its batch with the
        groups it set aside, in order. Which prompts a round reads and how it samples
        follow from the step and the data state, so a resumed run samples the same."""
        rl, size = self.spec.rl, self.group
        key = jax.random.fold_in(jax.random.key(self.spec.seed + 2), step)
        kept, dropped, wanted = [], [], None
        sampled = {"rewards": [], "by_name": {}, "rounds": 0, "completion_tokens": 0.0}
        for round_ in range(1 + rl.dynamic_sampling_rounds):
            rows = self._next_prompts()
            repeated = {k: np.repeat(value, size, axis=0) for k, value in rows.items()}
            rng = key if round_ == 0 else jax.random.fold_in(key, round_)
            prompts, lengths, completions = self.sample(params, repeated, rng)
            rewards, _ = self.score(prompts, lengths, completions, self.examples(repeated),
                                    step=step + 1)
            sampled["rounds"] += 1
            sampled["rewards"].append(rewards)
            for name, values in self.last_rewards.items():
                if name != "reward":
                    sampled["by_name"].setdefault(name, []).append(values)
            sampled["completion_tokens"] += completion_tokens(completions, self.eos_id)
            count = len(rewards) // size
            wanted = count if wanted is None else wanted
            for g in range(count):
                rows_of = slice(g * size, (g + 1) * size)
                group = (prompts[rows_of], lengths[rows_of], completions[rows_of],
                         rewards[rows_of])
                signal = not rl.dynamic_sampling_rounds or has_signal(group[3])
                (kept if signal else dropped).append(group)
            if (round_ == rl.dynamic_sampling_rounds
                    or not partitioning.any_process(len(kept) < wanted)):
                break
        sampled["rewards"] = np.concatenate(sampled["rewards"])
        return (kept + dropped)[:wanted], sampled

    def _next_prompts(self) -> dict:
        """The stream's next rows for a rollout: ``rl.num_mini_batches`` steps' worth (a
        PPO rollout serves that many minibatches an epoch; one step's otherwise)."""
        parts = [next(self.prompt_batches) for _ in range(self.spec.rl.num_mini_batches)]
        return parts[0] if len(parts) == 1 else {
            key: np.concatenate([part[key] for part in parts]) for key in parts[0]}

    # -- evaluation -------------------------------------------------------------------------
    def evaluate(self, params, batches, num_batches: int, samples: int = 1,
                 step: int = 0) -> dict:
        """Mean reward (and each reward's) of greedy completions of ``num_batches`` of
        ``batches`` (decoder rows of held-out prompts; rows of padding count for
        nothing); with ``samples`` > 1 also the best of that many sampled completions per
        prompt (best-of-n)."""
        totals, count, best_total = {}, 0.0, 0.0
        for index in range(num_batches):
            rows = next(batches)
            real = (rows["decoder_loss_weights"].sum(axis=1) > 0).astype(np.float64)
            prompts, lengths, completions = self.sample(params, rows, None, greedy=True)
            rewards, _ = self.score(prompts, lengths, completions, self.examples(rows))
            for name, values in self.last_rewards.items():
                totals[name] = totals.get(name, 0.0) + float((values * real).sum())
            if samples > 1:
                repeated = {key: np.repeat(value, samples, axis=0) for key, value in rows.items()}
                rng = jax.random.fold_in(jax.random.key(self.spec.seed + 3),
                                         step * 1000 + index)
                p, n, c = self.sample(params, repeated, rng)
                sampled, _ = self.score(p, n, c, self.examples(repeated))
                best_total += float((sampled.reshape(-1, samples).max(axis=1) * real).sum())
            count += float(real.sum())
        # Summed over every process's prompts (each scored its own rows).
        names = sorted(totals)
        summed = _across_processes(np.array(
            [[count, best_total, *(totals[n] for n in names)]], np.float64)).sum(axis=0)
        count, best_total = float(summed[0]), float(summed[1])
        out = {name: float(value) / max(count, 1.0) for name, value in zip(names, summed[2:],
                                                                           strict=True)}
        if samples > 1:
            out[f"best_of_{samples}_reward"] = best_total / max(count, 1.0)
        out["prompts"] = count
        return out


def has_signal(rewards: np.ndarray) -> bool:
    """Whether a group's rewards differ: where they are all equal its advantages are 0,
    and so is its gradient (what dynamic sampling drops)."""
    return bool(np.std(rewards) > 0)


def _check_finite(what: str, values: np.ndarray, texts: list[str], during: str,
                  fix: str) -> None:
    """One line naming the first completion whose reward is NaN or infinite."""
    bad = np.flatnonzero(~np.isfinite(values))
    if bad.size:
        first = int(bad[0])
        raise UserError(f"{what} gave {values[first]} for completion {first} "
                        f"({texts[first][:60]!r}){during} ({bad.size} of {len(values)} not "
                        f"finite); {fix}. Nothing of this step was saved.")


def rollout_rows(prompts, lengths, completions, eos_id: int, width: int):
    """``(tokens [n, width], mask (1 on real tokens), completion weights [n, width - 1])``:
    each prompt (its first ``lengths`` tokens, the start id included), then its
    completion up to and with its first ``eos_id`` (all of it when it has none); the
    weights mark the positions whose next token is the completion's."""
    n = len(prompts)
    tokens = np.zeros((n, width), np.int32)
    mask = np.zeros((n, width), np.int32)
    weights = np.zeros((n, width - 1), np.float32)
    for i in range(n):
        completion = [int(t) for t in completions[i]]
        if eos_id in completion:
            completion = completion[:completion.index(eos_id) + 1]
        length = int(lengths[i])
        row = [int(t) for t in prompts[i][:length]] + completion
        tokens[i, :len(row)] = row
        mask[i, :len(row)] = 1
        weights[i, length - 1:length - 1 + len(completion)] = 1.0
    return tokens, mask, weights


def completion_tokens(completions, eos_id: int) -> float:
    """The tokens ``rollout_rows`` keeps of ``completions``: each up to and with its first
    ``eos_id`` (all of it when it has none)."""
    completions = np.asarray(completions)
    ends = completions == eos_id
    kept = np.where(ends.any(axis=1), ends.argmax(axis=1) + 1, completions.shape[1])
    return float(kept.sum())


def _across_processes(values: np.ndarray) -> np.ndarray:
    """Every process's ``values`` (the same shape on each), concatenated along the first
    axis in process order; ``values`` itself in a single-process run."""
    if jax.process_count() == 1:
        return values
    return np.asarray(multihost_utils.process_allgather(values, tiled=True))


def _local_rows(array, rows: int) -> np.ndarray:
    """This process's ``rows`` of a global array whose rows were laid out by process
    (``partitioning.global_batch``)."""
    if jax.process_count() == 1:
        return np.asarray(jax.device_get(array))
    gathered = np.asarray(multihost_utils.process_allgather(array, tiled=True))
    start = jax.process_index() * rows
    return gathered[start:start + rows]


class RolloutsEvaluator(TrainingEvaluator):
    """Online RL's evaluation during training (``kind='rollouts'``, registered with the
    ``rl`` record): mean reward (each reward's too) of greedy completions of at most
    ``batches`` batches of the task's validation prompts (``Rollouts.evaluate``), and
    with ``samples`` > 1 the best of that many sampled completions per prompt; every
    process runs the same number of batches."""

    KIND = "rollouts"
    SPEC = RolloutsSpec
    DEFAULT_NAME, DEFAULT_PREFIX = "held_out", "eval_"
    DOING = "rollout evaluation"

    @classmethod
    def prepare(cls, name, settings, spec, vocabulary):
        if not spec.rl.algorithm:
            raise UserError("kind='rollouts' scores completions with rl.rewards; set "
                            "rl.algorithm (or use kind='held_out_loss').")
        return None

    def __init__(self, name, settings, prepared, context):
        super().__init__(name, settings, prepared, context)
        spec = context.spec
        self.batch_size = spec.batch_size  # one greedy completion per prompt: a batch of rows
        first_row = next(iter(context.eval_streams(shard_index=0,
                                                   num_shards=context.num_streams)))
        self.padding = {key: np.zeros_like(value) for key, value in first_row.items()}
        vocabulary = context.vocabulary or get_task_or_mixture(spec.task).vocabulary
        self.rollouts = Rollouts(spec, context.trainer, structures.for_config(spec),
                                 vocabulary, None)
        self.num_batches = partitioning.max_over_processes(pipeline.count_batches(
            self._batches(), limit=settings.batches))

    def _batches(self):
        return self.context.host_batches(self.context.eval_streams, self.padding,
                                         batch_size=self.batch_size)

    def due(self, step: int) -> bool:
        return self.num_batches > 0 and super().due(step)

    def evaluate(self, params, step: int) -> dict:
        batches = self._batches()
        metrics = self.rollouts.evaluate(params, _filled(batches, batches.padding_batch()),
                                         self.num_batches,
                                         samples=self.settings.samples, step=step)
        self.context.progress.message(
            f"step {step}: held-out reward {metrics.get('reward', 0.0):.4f} over "
            f"{int(metrics['prompts'])} prompts")
        return metrics


def _filled(batches, padding):
    """``batches``, then padding batches: a process whose streams ended keeps stepping."""
    yield from batches
    while padding is not None:
        yield padding


class RolloutBatches:
    """The loop's batches in online RL (``registry.BatchSource``): a new rollout every
    ``rl.updates_per_rollout`` steps (at steps that are multiples of it, and at a run's
    first step), and from it the batches of the updates until the next (TRL's
    ``generate_every``); the sampling step logs the rollout's metrics, the others
    ``Rollout.reused_metrics``.

    With one minibatch every update reads the whole rollout. With PPO's
    ``rl.num_mini_batches`` = M > 1 each epoch (``rl.iterations`` of them) shuffles the
    rollout's rows and takes them M ways, one minibatch a step, as TRL's PPOTrainer does:
    each process shuffles its own rows (TRL's local batch), by a seed of the run's seed,
    the rollout's step and the epoch, so a resumed run takes the same minibatches. A
    minibatch's value positions are re-weighed to its own count (``minibatch``)."""

    PHASE, DOING = "rollout", "rollouts of step"

    def __init__(self, spec, trainer, structure, vocabulary, prompt_batches):
        self.rollouts = Rollouts(spec, trainer, structure, vocabulary, prompt_batches)
        self.seed, self.minibatches = spec.seed, spec.rl.num_mini_batches
        self.updates_per_batch = spec.rl.updates_per_rollout
        self.last: Rollout | None = None
        self.sampled_at = 0  # the step the last rollout was sampled after

    def due(self, step: int) -> bool:
        return self.last is None or step % self.updates_per_batch == 0

    def next(self, params, step: int) -> tuple[dict, dict]:
        self.last, self.sampled_at = self.rollouts.next(params, step), step
        return self.part(step) or self.last.batch, self.last.metrics

    def part(self, step: int) -> dict | None:
        """This process's rows for the update after ``step``: its minibatch of the last
        rollout, or None when every update reads the whole rollout."""
        if self.minibatches == 1:
            return None
        done = step - self.sampled_at
        epoch, index = divmod(done, self.minibatches)
        rows = len(self.last.batch["tokens"])
        order = np.random.default_rng([self.seed, self.sampled_at, epoch]).permutation(rows)
        size = rows // self.minibatches
        return minibatch(self.last.batch, order[index * size:(index + 1) * size])

    @property
    def reused_metrics(self) -> dict:
        return self.last.reused_metrics


def minibatch(batch: dict, rows: np.ndarray) -> dict:
    """``rows`` of a rollout ``batch`` (this process's), as one update's batch: PPO's value
    positions re-weighed to the minibatch's count over every process (each its share of
    the minibatch's, as ``objectives.ppo.value_shares`` weighs the whole rollout's)."""
    part = {key: value[rows] for key, value in batch.items()}
    if "value_weights" in part:
        in_value = (part["value_weights"] > 0).astype(np.float32)
        count = _across_processes(np.array([in_value.sum()], np.float64)).sum()
        part["value_weights"] = in_value / max(float(count), 1.0)
    return part


def _in_rl_mode(spec) -> bool:
    return bool(spec.rl.algorithm)


MODE = register(Mode("rl", _in_rl_mode, structure=reinforcement.MODE, check=check,
                     frozen=(preference.REFERENCE,), init_params=value_model_params,
                     batches=RolloutBatches, evaluators=(RolloutsEvaluator,)))
