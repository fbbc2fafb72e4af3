"""Rollout servers and weight publication for asynchronous RL.

Servers (each a `RolloutServer`: `submit(prompt_ids, max_new_tokens, seed=) -> Future[Draw]`,
`load(variables, version)`):

* `NativeRolloutServer`: Dew's continuous-batching `Server` on a background thread;
* `OpenAIRolloutServer` over `OpenAICompletion`: vLLM's or SGLang's `/v1/completions`;
* `VLLMGenerateServer`: vLLM's token route, with each draw's kept ids.

Recording gateway: `Gateway` (an rllm-model-gateway's readiness, version stamp and a
session's calls from its traces) and `SandboxProxy` (the path-restricted door sandboxes
use to reach it); `HarborSource` runs each sample as one Harbor trial through them
(re-graded by Harbor when given a `HarborRegrade`).

Publishers: `SafetensorsReload` (a shared checkpoint directory that every replica
reloads), `AdapterReload` (only a LoRA adapter, loaded by vLLM under a new name per
version), `NCCLPush` (NCCL broadcast into vLLM, via an `NCCLLibrary`) and `Publication`
(a version that moves only when a push and its stamp both succeed).

Engines: `engine_server` starts (`launch_engine`) or joins a vLLM or SGLang engine and
returns an `OpenAIRolloutServer` with its weight pushes wired. Nothing in `dew` imports
this package.
"""

from dew.rollout.adapter_reload import AdapterReload
from dew.rollout.draw import Draw, RolloutServer
from dew.rollout.engines import engine_server
from dew.rollout.errors import (
    EngineError,
    EngineHTTPError,
    EngineRefused,
    EngineTimeout,
    EngineUnreachable,
    MalformedResponse,
    PushFailed,
    SamplingRefused,
)
from dew.rollout.gateway import Gateway, GatewayError, GatewayNotReady
from dew.rollout.harbor import HarborSource
from dew.rollout.harbor_regrade import HarborRegrade
from dew.rollout.launch import EngineExited, launch_engine
from dew.rollout.native import NativeRolloutServer, ServerClosed
from dew.rollout.nccl import NCCLPush
from dew.rollout.nccl_library import CtypesNCCL, NCCLError, NCCLLibrary
from dew.rollout.openai import OpenAICompletion, OpenAIRolloutServer
from dew.rollout.proxy import SandboxProxy
from dew.rollout.publication import Publication
from dew.rollout.reload import SafetensorsReload
from dew.rollout.remote import NoPublisher
from dew.rollout.scheduler.journal import WeightJournal
from dew.rollout.scheduler.packer import TokenPacker
from dew.rollout.scheduler.record import SchedulerRecord
from dew.rollout.scheduler.scheduler import RolloutScheduler
from dew.rollout.scheduler.tasks import prompt_tasks, task_ids
from dew.rollout.sources.environment import EnvironmentSource
from dew.rollout.sources.prompt import PromptSource, prompt_task
from dew.rollout.traces import MalformedTrace
from dew.rollout.vllm_generate import VLLMGenerateServer

__all__ = [
    "AdapterReload",
    "CtypesNCCL",
    "Draw",
    "EngineError",
    "EngineExited",
    "EnvironmentSource",
    "EngineHTTPError",
    "EngineRefused",
    "EngineTimeout",
    "EngineUnreachable",
    "Gateway",
    "GatewayError",
    "GatewayNotReady",
    "HarborRegrade",
    "HarborSource",
    "MalformedResponse",
    "MalformedTrace",
    "NCCLError",
    "NCCLLibrary",
    "NCCLPush",
    "NativeRolloutServer",
    "NoPublisher",
    "OpenAICompletion",
    "OpenAIRolloutServer",
    "PromptSource",
    "Publication",
    "PushFailed",
    "RolloutScheduler",
    "RolloutServer",
    "SafetensorsReload",
    "SamplingRefused",
    "SchedulerRecord",
    "TokenPacker",
    "SandboxProxy",
    "ServerClosed",
    "VLLMGenerateServer",
    "WeightJournal",
    "engine_server",
    "launch_engine",
    "prompt_task",
    "prompt_tasks",
    "task_ids",
]
