"""RolloutScheduler on the real vLLM CPU engine (the session's `vllm_engine` fixture): a few
GRPO updates one batch ahead, the policy pushed after each update through
`SafetensorsReload` behind a `Publication`, drawn by `OpenAIRolloutServer` and scored by a
`PromptSource` on its thread pool."""

from __future__ import annotations

import httpx
import jax
import numpy as np
import optax
from rollout_engine import SERVED_NAME

from dew import Trainer
from dew.data import Dataset
from dew.objectives.rl.grpo import GRPOObjective
from dew.rollout import (
    OpenAICompletion,
    OpenAIRolloutServer,
    PromptSource,
    Publication,
    RolloutScheduler,
    prompt_tasks,
)
from dew.sampling import Sampling

B, G, P, R = 2, 2, 4, 8


def even_share(data_source, completion, ground_truth, extra_info):
    ids = [int(t) for t in completion.split()]
    return sum(i % 2 == 0 for i in ids) / max(1, len(ids))


def prompts(partition, start=0):
    i = start
    while True:
        rng = np.random.default_rng([11, i])
        yield {"prompt": rng.integers(1, 128, (B, P)).astype(np.int32),
               "prompt_length": np.full((B,), P, np.int32)}  # fmt: skip
        i += 1


def test_a_few_updates_one_batch_ahead_on_real_vllm(vllm_engine, pretrained):
    start = pretrained.variables
    objective = GRPOObjective(pretrained.model, seq_len=P + R - 1, behavior_importance=2.0,
                              pretrained=start)  # fmt: skip
    publication = Publication(vllm_engine.reload, version=0)
    publication.load(start, 0)  # other tests may have left other weights on the engine
    records = []
    with httpx.Client(base_url=vllm_engine.engine.url, timeout=120) as client:
        completion = OpenAICompletion(SERVED_NAME, client, provider="vllm")
        with OpenAIRolloutServer(completion, Sampling(), publication,
                                 processed_logprobs=True) as server:  # fmt: skip
            source = PromptSource(server, even_share, max_new_tokens=R)
            scheduler = RolloutScheduler(objective, source, publication, width=P + R,
                                         rows=B * G, tasks=prompt_tasks, groups=G, ahead=1,
                                         truncation="score", log=records.append)  # fmt: skip
            trainer = Trainer(objective, optax.adam(1e-2), key=jax.random.key(2),
                              rollout=scheduler, progress=False)  # fmt: skip
            state = trainer.fit(scheduler.tasks(Dataset(train=prompts, batch=B)), steps=3)
            scheduler.close()
            source.close()
    # batch i was drawn by the engine under the weights pushed after update i - 1
    assert [r.pushed for r in records] == [None, 1, 2] and publication.version == 2
    assert [r.version for r in records] == [0, 0, 1]
    assert [r.lag for r in records] == [0, 1, 1]
    assert all(r.admitted_groups == B and r.resubmitted == {} for r in records)
    sessions = scheduler.last_sessions
    assert all(s.calls[0].raw_log_probs is None for s in sessions)  # remote: behavior only
    after = jax.device_get(state.params)
    moved = [float(np.abs(a - b).max()) for a, b in zip(jax.tree.leaves(start),
                                                         jax.tree.leaves(after))]  # fmt: skip
    assert max(moved) > 0
