"""SampledRollout: the Trainer's ``rollout=`` hook for GRPO with a reward function.

Each step the Trainer hands over a ``Prompts`` batch (``prompt`` ``[B, P]`` left-padded,
``prompt_length`` ``[B]`` and the UTF-8 byte columns ``data_source``, ``ground_truth``,
``extra_info``) and the current variables. The rollout

1. samples ``groups`` completions of at most ``max_new_tokens`` ids per prompt with
   ``dew.inference.TextGeneration`` (one compiled sampling loop over all ``B * G`` contexts),
2. decodes each completion (EOS and padding left out) and scores it with
   ``reward(data_source, completion, ground_truth, extra_info) -> float``,
3. turns each completion into a one-call ``Session`` (task = prompt row, sample = group
   member; a completion that ran out of budget is TRUNCATED and still scored) and
4. packs them with ``dew.sessions.pack`` into ``N = B * G`` rows of width ``P + R``.

The returned batch holds ``pack``'s columns (with ``old_log_probs``: the raw-policy
likelihoods recorded while sampling, and ``behavior_log_probs``: those of the distribution
actually sampled from) plus ``rewards`` ``[N]`` (completion ``row * G + g``) for metrics.
With ``rescore=True``, or when the objective scores at a ``sampling_temperature``,
``old_log_probs`` are recomputed by ``objective.packed_log_probs`` on the packed rows.

Reward shaping (``dew.rollouts.shaping``): with ``overlong`` each session's reward is its
score plus DAPO's overlong penalty, and ``rewards`` holds those shaped numbers (what the
advantage sees); with ``kl_in_reward`` each session's reward also loses its summed KL
charge against the objective's starting policy (scored on the packed rows, so the rows are
packed twice) and the controller steps once per batch.

``last_timings`` keeps the seconds each phase of the latest call took (``generation``,
``reward``, ``pack``, ``rescoring``); ``last_metrics`` what the shaping did (empty without
it), which the Trainer adds to its log line; ``state_dict``/``load_state_dict`` carry the
KL controller's coefficient through a checkpoint.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import jax
import numpy as np

from dew.checks import is_int
from dew.data.prompts import decode_text
from dew.inference import TextGeneration
from dew.inference.canvas.config import refuse_canvas
from dew.sampling import Sampling
from dew.sessions.advantages import check_estimator
from dew.sessions.packing import pack
from dew.sessions.records import Call, Session, Status

if TYPE_CHECKING:
    from dew.rollouts.correction_caps import AdaptiveCorrection
    from dew.rollouts.dynamic_sampling import DynamicSampling
    from dew.rollouts.shaping import KLInReward, Overlong

Reward = Callable[[str, str, str, str], float]


def default_decode(ids: Any) -> str:
    """Token ids separated by spaces (the default text a reward reads)."""
    return " ".join(str(int(i)) for i in np.asarray(ids).reshape(-1))


class RewardError(RuntimeError):
    """A reward function raised or returned something that is not a finite number."""


class SampledRollout:
    """Sample ``groups`` completions per prompt, score them and pack a GRPO batch.

    Args:
      objective: the ``GRPOObjective`` being trained (its model samples, its width
        ``seq_len + 1`` must equal ``P + max_new_tokens``).
      reward: ``reward(data_source, completion, ground_truth, extra_info) -> float``.
      groups: completions per prompt, at least 2 (a group of one has no baseline).
      max_new_tokens: response budget R.
      sampling: ``dew.sampling.Sampling`` (temperature, top-k/p, min-p, EOS ids).
      decode: ids -> text for the reward; default: ids separated by spaces.
      estimator: ``"group"``, ``"mean"``, ``"rloo"`` or a registered name (as ``pack`` takes
        them: ``dew.rl``'s registry of advantage estimators).
      rescore: recompute ``old_log_probs`` with the objective's own forward pass.
      baseline: whether the group is the baseline (GRPO: ``groups >= 2``). False lets
        ``groups`` be 1, for a learner with its own baseline (PPO's critic, which replaces
        the packed group advantages).
      overlong: ``dew.rollouts.shaping.Overlong``: DAPO's overlong penalty added to each
        score; its buffer must fit ``max_new_tokens``.
      kl_in_reward: ``dew.rollouts.shaping.KLInReward``: each session's reward loses its
        summed KL charge against ``objective.pretrained`` (required then).
      dynamic_sampling: ``dew.rollouts.dynamic_sampling.DynamicSampling``: train on its
        ``groups`` groups whose scores differ, drawing the prompts again up to its cap; the
        batch then holds ``groups * groups_per_prompt`` rows.
      correction: ``dew.rollouts.correction_caps.AdaptiveCorrection``: the batch carries the
        TIS cap (or IcePop band) measured from its own ratios of ``old_log_probs`` to
        ``behavior_log_probs`` (``behavior_cap``, ``behavior_floor``), which the loss uses
        in place of ``behavior_importance``'s constants.
    """

    def __init__(
        self,
        objective: Any,
        reward: Reward,
        groups: int,
        max_new_tokens: int,
        sampling: Sampling | None = None,
        decode: Callable[[Any], str] | None = None,
        estimator: str = "group",
        rescore: bool = False,
        *,
        baseline: bool = True,
        overlong: Overlong | None = None,
        kl_in_reward: KLInReward | None = None,
        dynamic_sampling: DynamicSampling | None = None,
        correction: AdaptiveCorrection | None = None,
    ) -> None:
        refuse_canvas("sampling", sampling, "SampledRollout")
        if not baseline and (not is_int(groups) or groups < 1):
            raise ValueError(f"groups: expected a positive integer, got {groups!r}")
        if baseline and (not is_int(groups) or groups < 2):
            raise ValueError(
                f"groups: expected an integer >= 2 (a group of one has no baseline), got {groups!r}"
            )
        if not is_int(max_new_tokens):
            raise TypeError(f"max_new_tokens: expected a positive integer, got {max_new_tokens!r}")
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens: expected a positive integer, got {max_new_tokens}")
        if not callable(reward):
            raise TypeError(f"reward: expected a callable, got {type(reward).__name__}")
        check_estimator(estimator)
        sampling = Sampling() if sampling is None else sampling
        if not isinstance(sampling, Sampling):
            raise TypeError(f"sampling: expected a dew.sampling.Sampling, got {type(sampling)}")
        for name in ("model", "width", "packed_log_probs"):
            if not hasattr(objective, name):
                raise TypeError(f"objective: expected a GRPOObjective, it has no {name!r}")
        self.objective = objective
        self.reward = reward
        self.groups = groups
        self.max_new_tokens = max_new_tokens
        self.sampling = sampling
        self.decode = default_decode if decode is None else decode
        self.estimator = estimator
        self.rescore = bool(rescore) or getattr(objective, "sampling_temperature", None) is not None
        self.generation = TextGeneration(objective.model)
        self._rescorer = jax.jit(objective.packed_log_probs)
        self.last_timings: dict[str, float] = {}
        self.last_rewards: np.ndarray | None = None
        self.last_metrics: dict[str, float] = {}
        self.overlong = overlong
        if overlong is not None:
            overlong.penalties(np.zeros(1), max_new_tokens)  # its buffer fits the budget
        self.kl_in_reward = kl_in_reward
        self.dynamic_sampling = dynamic_sampling
        self.correction = correction
        self._reference: Any = None
        if kl_in_reward is not None:
            from dew.rollouts.shaping import reference_of

            self._reference = reference_of(objective)

    def _contexts(self, batch: Mapping[str, Any]) -> list[np.ndarray]:
        for name in ("prompt", "prompt_length"):
            if name not in batch:
                raise KeyError(f"batch[{name!r}]: missing; SampledRollout reads a Prompts batch")
        prompt = np.asarray(batch["prompt"])
        lengths = np.asarray(batch["prompt_length"]).reshape(-1)
        if prompt.ndim != 2 or lengths.shape[0] != prompt.shape[0]:
            raise ValueError(
                f"batch['prompt'], batch['prompt_length']: expected [B, P] and [B], got "
                f"{prompt.shape} and {lengths.shape}"
            )
        width = prompt.shape[1]
        if width + self.max_new_tokens != self.objective.width:
            raise ValueError(
                f"objective.seq_len: prompts are {width} wide and max_new_tokens is "
                f"{self.max_new_tokens}, so expected GRPOObjective(seq_len={width} + "
                f"{self.max_new_tokens} - 1 = {width + self.max_new_tokens - 1}), got "
                f"seq_len={self.objective.width - 1}"
            )
        contexts = []
        for row, n in enumerate(lengths.tolist()):
            if not 1 <= n <= width:
                raise ValueError(f"batch['prompt_length'][{row}]: expected 1..{width}, got {n}")
            contexts.append(prompt[row, width - n :].astype(np.int32))
        return contexts

    def _metadata(self, batch: Mapping[str, Any], row: int) -> tuple[str, str, str]:
        out = []
        for name in ("data_source", "ground_truth", "extra_info"):
            column = batch.get(name)
            out.append("" if column is None else decode_text(np.asarray(column)[row]))
        return out[0], out[1], out[2]

    def _score(
        self, batch: Mapping[str, Any], row: int, context: np.ndarray, ids: np.ndarray
    ) -> float:
        eos = set(self.sampling.eos_ids)
        text_ids = ids[:-1] if ids.size and int(ids[-1]) in eos else ids
        data_source, ground_truth, extra_info = self._metadata(batch, row)
        completion = self.decode(text_ids)
        try:
            value = self.reward(data_source, completion, ground_truth, extra_info)
        except Exception as err:
            raise RewardError(
                f"reward: raised {type(err).__name__}: {err} for prompt row {row} "
                f"(prompt {self.decode(context)!r}, data_source {data_source!r}, completion "
                f"{completion!r})"
            ) from err
        try:
            number = float(value)
        except (TypeError, ValueError):
            number = math.nan
        if isinstance(value, bool) or not math.isfinite(number):
            raise RewardError(
                f"reward: expected a finite float for prompt row {row} (prompt "
                f"{self.decode(context)!r}, completion {completion!r}), got {value!r}"
            )
        return number

    def __call__(
        self, variables: Mapping[str, Any], batch: Mapping[str, Any], key: jax.Array
    ) -> dict[str, Any]:
        """Sample, score and pack one batch; returns the packed GRPO batch."""
        timings: dict[str, float] = {"generation": 0.0, "reward": 0.0}
        contexts = self._contexts(batch)
        self.generation.bind(variables)
        metrics: dict[str, float] = {}

        def draw(draw_key: jax.Array) -> tuple[list[Any], np.ndarray]:
            return self._draw(batch, contexts, draw_key, timings)

        if self.dynamic_sampling is None:
            drawn, scores = draw(key)
            rows = np.arange(len(contexts))
        else:
            drawn, scores, rows, picked = self.dynamic_sampling.collect(
                draw, key, len(contexts), self.groups
            )
            metrics.update(picked)
        start = time.perf_counter()
        rewards = scores
        if self.overlong is not None:
            penalties = self.overlong.penalties([d.ids.size for d in drawn], self.max_new_tokens)
            rewards = scores + penalties
            metrics["reward/score"] = float(np.mean(scores))
            metrics["reward/overlong_share"] = float(np.mean(penalties < 0))
        sessions = [
            self._session(contexts[rows[i // self.groups]], i, one, float(rewards[i]))
            for i, one in enumerate(drawn)
        ]
        timings["reward"] += time.perf_counter() - start

        start = time.perf_counter()
        out = self._pack(sessions, drawn)
        timings["pack"] = time.perf_counter() - start

        timings["rescoring"] = 0.0
        old_log_probs = None
        if self.rescore or self.kl_in_reward is not None:
            start = time.perf_counter()
            old_log_probs = self._rescored(variables, out)
            timings["rescoring"] = time.perf_counter() - start
        if self.kl_in_reward is not None:
            assert old_log_probs is not None
            sessions, rewards = self._charge_kl(out, old_log_probs, sessions, rewards, metrics)
            out = self._pack(sessions, drawn)
        if self.rescore:
            out["old_log_probs"] = old_log_probs
        if self.correction is not None:
            if "old_log_probs" not in out:
                raise ValueError(
                    "correction: the adaptive bounds compare old_log_probs with "
                    "behavior_log_probs, and this batch has no old_log_probs (rescore=True "
                    "adds them)"
                )
            columns, measured = self.correction.observe(
                out, out["old_log_probs"], out["behavior_log_probs"]
            )
            out.update(columns)
            metrics.update(measured)
        out["rewards"] = rewards
        self.last_timings = timings
        self.last_rewards = rewards
        self.last_metrics = metrics
        return out

    def _draw(
        self,
        batch: Mapping[str, Any],
        contexts: list[np.ndarray],
        key: jax.Array,
        timings: dict[str, float],
    ) -> tuple[list[Any], np.ndarray]:
        """``groups`` completions of every prompt (prompt-major) and their scores."""
        repeated = [c for c in contexts for _ in range(self.groups)]
        start = time.perf_counter()
        drawn = self.generation(repeated, self.max_new_tokens, key, self.sampling)  # type: ignore[arg-type]
        assert isinstance(drawn, list)
        timings["generation"] += time.perf_counter() - start
        start = time.perf_counter()
        scores = np.zeros(len(repeated), np.float32)
        for index, one in enumerate(drawn):
            row = index // self.groups
            scores[index] = self._score(batch, row, contexts[row], one.ids)
        timings["reward"] += time.perf_counter() - start
        return drawn, scores

    def _session(self, context: np.ndarray, index: int, draw: Any, reward: float) -> Session:
        """Completion ``index`` (group ``index // groups`` of the batch) of ``context`` as a
        one-call session with its (shaped) reward."""
        row, member = divmod(index, self.groups)
        support = None
        if draw.support is not None:
            support = [kept[kept >= 0] for kept in draw.support]
        call = Call(
            prompt_ids=context,
            sampled_ids=draw.ids,
            behavior_log_probs=draw.behavior_log_probs,
            raw_log_probs=draw.raw_log_probs,
            finish_reason="stop" if draw.eos else "length",
            support=support,
        )
        status = Status.COMPLETED if draw.eos else Status.TRUNCATED
        return Session(task=row, sample=member, calls=(call,), status=status, reward=reward)

    def _pack(self, sessions: list[Session], drawn: list[Any]) -> dict[str, Any]:
        """The sessions packed one per row (``pack``), with the sampling support's room."""
        width = self.objective.width
        capacity = None
        if self.sampling.return_support:
            kept = max((d.support.shape[1] for d in drawn if d.support is not None), default=1)
            capacity = max(1, kept * (width - 1))
        return dict(
            pack(
                sessions,
                width,
                rows=len(sessions),
                estimator=self.estimator,
                truncation="score",
                support_capacity=capacity,
                eos_ids=self.sampling.eos_ids or None,
            )
        )

    def _rescored(self, variables: Mapping[str, Any], out: Mapping[str, Any]) -> np.ndarray:
        """``[B, W]`` log-probs of the packed ids under ``variables`` (the objective's forward)."""
        return np.asarray(jax.device_get(self._rescorer(variables, dict(out))), np.float32)

    def _charge_kl(
        self,
        out: Mapping[str, Any],
        log_probs: np.ndarray,
        sessions: list[Session],
        rewards: np.ndarray,
        metrics: dict[str, float],
    ) -> tuple[list[Session], np.ndarray]:
        """Each session's reward less its summed KL charge; steps the controller."""
        shaping = self.kl_in_reward
        assert shaping is not None
        charges = shaping.charge(out, log_probs, self._rescored(self._reference, out), metrics)
        index = np.asarray(out["session_index"])
        charged = index >= 0
        totals = np.bincount(index[charged], weights=charges[charged], minlength=len(sessions))
        rewards = (rewards - totals).astype(np.float32)
        shaped = [
            dataclasses.replace(s, reward=float(r)) for s, r in zip(sessions, rewards, strict=True)
        ]
        return shaped, rewards

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint keeps of this rollout: its controllers' states (KL coefficient,
        correction bounds), if it has any."""
        parts = {"kl_in_reward": self.kl_in_reward, "correction": self.correction}
        return {name: part.state_dict() for name, part in parts.items() if part is not None}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue from ``state_dict``'s output (a checkpoint without a part leaves it)."""
        for name, part in (("kl_in_reward", self.kl_in_reward), ("correction", self.correction)):
            if part is not None and name in state:
                part.load_state_dict(state[name])


__all__ = ["RewardError", "SampledRollout", "default_decode"]
