"""Which `Sampling` each engine route can report faithful likelihoods for.

A trainer treats an engine's log-probabilities as the behavior policy, so they must be
the likelihood of the distribution the engine sampled from. The engines differ:

* vLLM's completions route reports the raw model log-probabilities unless the engine
  runs with `--logprobs-mode processed_logprobs`; only then do temperature and filters
  show in them. It never returns which ids a filter kept, so a filtering Sampling (top-k,
  top-p, min-p) cannot be rescored by the trainer on that route at all.
* SGLang's completions route reports `log_softmax(logits / temperature)`, taken before
  its top-k, top-p and min-p filters: any temperature is faithful, no filter is.
* vLLM's token route (`/inference/v1/generate`) returns the kept ids of every draw
  (`sampling_mask`) next to the processed likelihoods, but builds that mask only under
  a finite top-k.

A softcap applied by the sampler (not the model) exists on no engine and is refused.
"""

from __future__ import annotations

from dew.rollout.errors import SamplingRefused
from dew.sampling import Sampling


def filters_of(sampling: Sampling) -> list[str]:
    """The names of the filters `sampling` turns on, e.g. `["top_k=4", "min_p=0.1"]`."""
    found = []
    if sampling.top_k is not None:
        found.append(f"top_k={sampling.top_k}")
    if sampling.top_p < 1:
        found.append(f"top_p={sampling.top_p}")
    if sampling.min_p > 0:
        found.append(f"min_p={sampling.min_p}")
    return found


def _check_sampling(sampling: Sampling, engine: str) -> None:
    """What every route refuses: a non-`Sampling`, and a softcap (no `engine` applies one)."""
    if not isinstance(sampling, Sampling):
        raise TypeError(
            f"sampling: expected a dew.sampling.Sampling, got {type(sampling).__name__}"
        )
    if sampling.softcap is not None:
        raise SamplingRefused(
            f"sampling.softcap: {sampling.softcap} is applied by Dew's sampler only; "
            f"{engine} has no such control"
        )


def check_completions(sampling: Sampling, provider: str, processed_logprobs: bool) -> None:
    """Refuse a `sampling` whose likelihood `provider`'s completions route misreports."""
    _check_sampling(sampling, provider)
    filters = filters_of(sampling)
    if provider == "vllm":
        if filters:
            raise SamplingRefused(
                f"sampling: {', '.join(filters)} filter the distribution, and vLLM's completions "
                "route does not return the kept ids; use VLLMGenerateServer"
            )
        if sampling.temperature != 1 and not processed_logprobs:
            raise SamplingRefused(
                f"sampling.temperature: {sampling.temperature} changes the distribution, but vLLM "
                "reports raw log-probabilities; start it with --logprobs-mode processed_logprobs "
                "and pass processed_logprobs=True"
            )
    elif provider == "sglang":
        if filters:
            raise SamplingRefused(
                f"sampling: {', '.join(filters)} filter the distribution, and SGLang's completions "
                "route reports log-probabilities from before its filters"
            )
    else:
        raise ValueError(f"provider: expected 'vllm' or 'sglang', got {provider!r}")


def check_token_route(sampling: Sampling) -> None:
    """Refuse a `sampling` that vLLM's token route cannot return a sampling mask for."""
    _check_sampling(sampling, "vLLM")
    if sampling.greedy or sampling.top_k is None:
        raise SamplingRefused(
            f"sampling.top_k: expected a finite top-k (vLLM builds the sampling mask only under "
            f"one), got top_k={sampling.top_k} temperature={sampling.temperature}"
        )
