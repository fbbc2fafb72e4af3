"""Record verl 0.9.1's own rows and tensors as fixtures for Dew's verl interop tests.

Run it in the shared reference environment (never in Dew's own venv)::

    "$(tools/reference_env.sh | tail -n 1)" tools/verl_interop_reference.py [--wheel-sha256 HEX]

What it writes to ``tests/fixtures/verl_interop/``:

* ``gsm8k_tool_agent.parquet``: the four train rows verl's own
  ``examples/data_preprocess/gsm8k_tool_agent_loop.py`` writes (copied byte for byte into
  ``tools/reference/verl_gsm8k_tool_agent_loop.py.txt`` from the verl repository), run here on
  a small GSM8K-shaped dataset this script makes in a temporary folder (a ``main`` config of
  question/answer parquet files, the layout of the Hub's ``openai/gsm8k``), so nothing is
  downloaded.
* ``rows.json`` + ``arrays.npz``: two ``verl.experimental.agent_loop.agent_loop.AgentLoopOutput``
  rows, dumped with verl's own ``model_dump()``; arrays (routed experts,
  video frames and the processor output) are stored in ``arrays.npz`` and referenced from the
  JSON as ``{"__array__": key}``:

  - ``tool_loop``: verl's own ``ToolAgentLoop.run`` on the first gsm8k parquet row (its
    messages and ``tools_kwargs``), with verl's hermes tool parser and Qwen3's real chat
    template (``tests/fixtures/chat_templates/qwen3.jinja``) on a small BPE tokenizer trained
    here. The model is a scripted stand-in for verl's LLM server client: two replies (a
    ``calc_gsm8k_reward`` tool call, then the answer), each with log-probs, routed experts over
    prompt + reply, and the policy version in ``extra_fields``. The tool scores with verl's
    ``verl.utils.reward_score.gsm8k``; ``AgentLoopWorker._agent_loop_postprocess`` then adds
    ``raw_prompt`` and the reward (a stand-in reward-loop handle running the same scorer);
  - ``video``: a video turn whose ``mm_processor_output`` is what
    ``AgentLoopBase.build_sglang_video_payload`` returns for the video and its processor
    output. The processor output (``pixel_values_videos``, ``video_grid_thw``) is built here
    in Qwen2-VL's patch layout (temporal patch 2, patch 14), because transformers' video
    processor needs torchvision, which the CPU reference env does not install.

* ``tensors.npz``: for each row, ``<row>__as_dict__<key>`` (``AgentLoopOutput.as_dict()``:
  ``prompts``, ``responses``, ``response_mask``, ``rollout_log_probs``, ``routed_experts``,
  ``rm_scores``) and ``<row>__batch__<key>``, the padded batch verl's
  ``AgentLoopWorker._agent_loop_postprocess`` then ``_postprocess`` build (``prompts``,
  ``responses``, ``input_ids``, ``attention_mask``, ``position_ids``, ``response_mask``,
  ``rollout_log_probs``, ``routed_experts``, ``rm_scores``).
* ``verl_interop.json``: package, version, wheel sha256, the sha256 of the verl sources used,
  the upstream commit of the preprocessing script, torch version and the padding lengths.

``--check ROWS.pkl`` instead feeds rows Dew's ``to_verl`` wrote (a pickled list) through verl's
``AgentLoopOutput``, its ``as_dict()`` and the worker's post-processing, and checks that verl's
tensors hold every id and mask.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch
import verl
import verl.experimental.agent_loop.agent_loop as agent_loop
import verl.experimental.agent_loop.tool_agent_loop as tool_agent_loop
from omegaconf import OmegaConf
from reference_wheel import atomic_write, source_sha256, wheel_sha256
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast
from verl.experimental.agent_loop.agent_loop import (
    AgentLoopBase,
    AgentLoopMetrics,
    AgentLoopOutput,
    AgentLoopWorker,
    DictConfigWrap,
    ToolListWrap,
)
from verl.experimental.agent_loop.tool_agent_loop import ToolAgentLoop
from verl.tools.base_tool import BaseTool
from verl.tools.schemas import OpenAIFunctionToolSchema, ToolResponse
from verl.utils.dataset.rl_dataset import RLHFDataset
from verl.utils.reward_score import gsm8k
from verl.workers.rollout.replica import TokenOutput

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "tests" / "fixtures" / "verl_interop"
SCRIPT = ROOT / "tools" / "reference" / "verl_gsm8k_tool_agent_loop.py.txt"
SCRIPT_COMMIT = "b178a3cd56f58b2d502255daba591e92833930a7"  # last changed in dfa3933a
VERL_VERSION = "0.9.1"
SEED = 20261130
TEMPLATE = ROOT / "tests" / "fixtures" / "chat_templates" / "qwen3.jinja"
PROMPT_LENGTH = 512
RESPONSE_LENGTH = 160
REPLIES = [
    "<think>\nAnn has 3 apples and buys 4 more, so 3 + 4 = 7.\n</think>\n\n"
    '<tool_call>\n{"name": "calc_gsm8k_reward", "arguments": {"answer": "7"}}\n</tool_call><|im_end|>',
    "<think>\nThe tool agrees.\n</think>\n\n3 + 4 = 7\n#### 7<|im_end|>",
]
TOOL_SCHEMA = {
    "type": "function",
    "function": {
        "name": "calc_gsm8k_reward",
        "description": "A tool for calculating the reward of gsm8k",
        "parameters": {
            "type": "object",
            "properties": {"answer": {"type": "string", "description": "The model's answer"}},
            "required": ["answer"],
        },
    },
}

QUESTIONS = [
    (
        "Ann has 3 apples and buys 4 more. How many apples does she have?",
        "3 + 4 = <<3+4=7>>7\n#### 7",
    ),
    ("A box holds 12 pens. How many pens are in 5 boxes?", "12 * 5 = <<12*5=60>>60\n#### 60"),
    ("Tom had 1,250 dollars and spent 250. How much is left?", "1250 - 250 = 1000\n#### 1,000"),
    ("Half of 18 children went home. How many stayed?", "18 / 2 = <<18/2=9>>9\n#### 9"),
    ("What is 6 times 7?", "6 * 7 = 42\n#### 42"),
    ("A train goes 30 km per hour for 2 hours. How far?", "30 * 2 = 60\n#### 60"),
]


# ---------------------------------------------------------------- gsm8k parquet


def gsm8k_parquet(workdir: Path) -> Path:
    """Run verl's preprocessing script on a local GSM8K-shaped dataset; the train parquet."""
    data = workdir / "gsm8k"
    (data / "main").mkdir(parents=True)
    (data / "README.md").write_text(
        "---\nconfigs:\n- config_name: main\n  data_files:\n"
        "  - split: train\n    path: main/train-*.parquet\n"
        "  - split: test\n    path: main/test-*.parquet\n---\n"
    )
    for split, rows in (("train", QUESTIONS[:4]), ("test", QUESTIONS[4:])):
        table = pa.table({"question": [q for q, _ in rows], "answer": [a for _, a in rows]})
        pq.write_table(table, data / "main" / f"{split}-00000-of-00001.parquet")
    saved = workdir / "out"
    subprocess.run(
        [
            sys.executable,
            str(SCRIPT),
            "--local_dataset_path",
            str(data),
            "--local_save_dir",
            str(saved),
        ],
        check=True,
        env={"HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"},
    )
    return saved / "train.parquet"


# ---------------------------------------------------------------- AgentLoopOutput rows


def chat_tokenizer() -> PreTrainedTokenizerFast:
    """A small byte-level BPE with Qwen3's special tokens and its real chat template."""
    template = TEMPLATE.read_text()
    special = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>"]
    special += ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    corpus = [template, *(q + " " + a for q, a in QUESTIONS), *REPLIES] * 3
    trainer = trainers.BpeTrainer(
        vocab_size=800,
        special_tokens=special,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus, trainer)
    hf = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=special[3:],
    )
    hf.chat_template = template
    return hf


class CalcGsm8kReward(BaseTool):
    """The gsm8k example's ``calc_gsm8k_reward`` tool: verl's own gsm8k scorer on the answer."""

    async def create(
        self, instance_id: str | None = None, **kwargs: Any
    ) -> tuple[str, ToolResponse]:
        self.ground_truth = kwargs.get("create_kwargs", {}).get("ground_truth")
        return instance_id or "calc-0", ToolResponse()

    async def execute(
        self, instance_id: str, parameters: dict[str, Any], **kwargs: Any
    ) -> tuple[ToolResponse, float, dict]:
        answer = str(parameters.get("answer", ""))
        reward = float(gsm8k.compute_score("#### " + answer, self.ground_truth, method="flexible"))
        return ToolResponse(text=f"Current parsed answer={answer!r} reward={reward}"), reward, {}


class ScriptedServer:
    """Stands in for verl's LLM server client: each generate() returns the next scripted reply,
    tokenized, with log-probs, routed experts over prompt + reply, and the policy version."""

    def __init__(self, tokenizer: PreTrainedTokenizerFast, rng: np.random.Generator) -> None:
        self.tokenizer, self.rng, self.calls = tokenizer, rng, 0

    async def generate(
        self, request_id: str, prompt_ids: list[int], sampling_params: dict[str, Any], **_: Any
    ) -> TokenOutput:
        ids = self.tokenizer.encode(REPLIES[self.calls], add_special_tokens=False)
        self.calls += 1
        version = 2 + self.calls
        logprobs = [round(float(-abs(x)), 6) for x in self.rng.normal(0.6, 0.4, len(ids))]
        routed = self.rng.integers(0, 8, (len(prompt_ids) + len(ids), 2, 2)).astype(np.int32)
        return TokenOutput(
            token_ids=ids,
            log_probs=logprobs,
            routed_experts=routed,
            stop_reason="completed",
            extra_fields={"min_global_steps": version, "max_global_steps": version},
        )


class RewardHandle:
    """Stands in for a reward-loop worker's Ray handle: verl's gsm8k scorer on the response."""

    def __init__(self, tokenizer: PreTrainedTokenizerFast, ground_truth: str) -> None:
        self.compute_score = SimpleNamespace(remote=self._score)
        self.tokenizer, self.ground_truth = tokenizer, ground_truth

    async def _score(self, data: Any) -> dict[str, Any]:
        text = self.tokenizer.decode(data.batch["responses"][-1].tolist())
        score = float(gsm8k.compute_score(text, self.ground_truth))
        return {"reward_score": score, "reward_extra_info": {"acc": score}}


def tool_loop_row(
    tokenizer: PreTrainedTokenizerFast, row: dict[str, Any], rng: np.random.Generator
) -> tuple[AgentLoopOutput, dict[str, np.ndarray]]:
    """verl's ToolAgentLoop on a gsm8k parquet row, scored and post-processed by verl's worker.

    Returns the ``AgentLoopOutput`` (after the worker's post-processing, which adds
    ``raw_prompt``, the reward and ``reward_extra_info``) and verl's padded batch of it.
    """
    config = OmegaConf.create(
        {
            "actor_rollout_ref": {
                "rollout": {
                    "prompt_length": PROMPT_LENGTH,
                    "response_length": RESPONSE_LENGTH,
                    "full_determinism": True,
                    "multi_turn": {
                        "max_user_turns": 2,
                        "max_assistant_turns": 2,
                        "max_parallel_calls": 1,
                        "max_tool_response_length": 256,
                        "tool_response_truncate_side": "middle",
                        "format": "hermes",
                    },
                }
            }
        }
    )
    tool = CalcGsm8kReward({}, OpenAIFunctionToolSchema.model_validate(TOOL_SCHEMA))
    loop = ToolAgentLoop(
        trainer_config=DictConfigWrap(config),
        server_manager=ScriptedServer(tokenizer, rng),
        tokenizer=tokenizer,
        processor=None,
        dataset_cls=RLHFDataset,
        data_config=DictConfigWrap(OmegaConf.create({})),
        tools=ToolListWrap([tool]),
        hf_model_type="qwen3",
    )
    messages = [dict(m) for m in row["prompt"]]
    tools_kwargs = row["extra_info"]["tools_kwargs"]
    output = loop.loop.run_until_complete(
        loop.run({"temperature": 1.0}, raw_prompt=messages, tools_kwargs=tools_kwargs)
    )
    w = worker(tokenizer)
    w.reward_loop_worker_handles = [RewardHandle(tokenizer, row["reward_model"]["ground_truth"])]
    internal = loop.loop.run_until_complete(
        w._agent_loop_postprocess(output, False, raw_prompt=messages)
    )
    proto = w._postprocess([internal])
    return output, {key: value.numpy() for key, value in proto.batch.items()}


def video_row(rng: np.random.Generator) -> AgentLoopOutput:
    """One sampled turn after a video prompt; mm_processor_output from verl's own helper."""
    frames = torch.from_numpy(rng.integers(0, 255, (4, 3, 28, 28), dtype=np.uint8))
    metadata = {"fps": 2.0, "frames_indices": [0, 1, 2, 3], "total_num_frames": 4}
    grid = (2, 2, 2)  # temporal patches, height patches, width patches (patch 14, temporal 2)
    pixel_values = torch.from_numpy(
        rng.normal(0, 1, (int(np.prod(grid)), 3 * 2 * 14 * 14)).astype(np.float32)
    )
    mm_inputs = {"pixel_values_videos": pixel_values, "video_grid_thw": torch.tensor([grid])}
    videos = [(frames, metadata)]
    payload = AgentLoopBase.build_sglang_video_payload(videos, mm_inputs)
    placeholders = int(np.prod(grid)) // 4  # 2x2 spatial merge
    prompt = [151644, 872, 198, 151652] + [151656] * placeholders + [151653, 30, 151645, 198]
    response = rng.integers(10, 90, 5).tolist()
    logprobs = [round(float(-abs(x)), 6) for x in rng.normal(0.6, 0.4, 5)]
    return AgentLoopOutput(
        prompt_ids=prompt,
        response_ids=response,
        response_mask=[1] * 5,
        response_logprobs=logprobs,
        multi_modal_data={"videos": videos},
        reward_score=0.0,
        num_turns=2,
        metrics=AgentLoopMetrics(generate_sequences=0.125),
        extra_fields={
            "min_global_steps": 7,
            "max_global_steps": 7,
            "turn_scores": [],
            "tool_rewards": [],
        },
        mm_processor_kwargs={"do_sample_frames": False},
        mm_processor_output=payload,
    )


def worker(tokenizer: PreTrainedTokenizerFast) -> AgentLoopWorker:
    """An AgentLoopWorker with just what its post-processing reads (no Ray, no servers)."""
    self = AgentLoopWorker.__new__(AgentLoopWorker)
    self.tokenizer = tokenizer
    self.processor = None
    self.mm_processor_kwargs = {}
    self.rollout_config = SimpleNamespace(
        prompt_length=PROMPT_LENGTH, response_length=RESPONSE_LENGTH
    )
    self.reward_loop_worker_handles = None
    self.distillation_enabled = False
    return self


def batch_tensors(
    output: AgentLoopOutput, tokenizer: PreTrainedTokenizerFast
) -> dict[str, np.ndarray]:
    """verl's padded one-row batch for ``output`` (post-processing, then ``_postprocess``)."""
    w = worker(tokenizer)
    copy = AgentLoopOutput(**output.model_dump())
    internal = asyncio.run(w._agent_loop_postprocess(copy, False, raw_prompt=[]))
    proto = w._postprocess([internal])
    return {key: value.numpy() for key, value in proto.batch.items()}


# ---------------------------------------------------------------- JSON with arrays


def encode(value: Any, arrays: dict[str, np.ndarray], key: str) -> Any:
    """JSON-able ``value``: arrays and tensors go to ``arrays`` as ``{"__array__": key}``."""
    if isinstance(value, torch.Tensor):
        value = value.numpy()
    if isinstance(value, np.ndarray):
        arrays[key] = value
        return {"__array__": key}
    if isinstance(value, dict):
        return {k: encode(v, arrays, f"{key}.{k}") for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [encode(v, arrays, f"{key}.{i}") for i, v in enumerate(value)]
    return value


def check_rows(path: Path) -> None:
    """Feed rows Dew wrote (a pickled list of ``to_verl`` dicts) through verl's own code."""
    import pickle

    rows = pickle.loads(path.read_bytes())  # a file the caller wrote with to_verl
    tokenizer = chat_tokenizer()
    for index, row in enumerate(rows):
        tensors = AgentLoopOutput(**row).as_dict()
        batch = batch_tensors(AgentLoopOutput(**row), tokenizer)
        real = batch["attention_mask"][0].astype(bool)
        kept = (
            tensors["prompts"].tolist() == list(row["prompt_ids"])
            and tensors["responses"].tolist() == list(row["response_ids"])
            and batch["input_ids"][0][real].tolist() == [*row["prompt_ids"], *row["response_ids"]]
            and batch["response_mask"][0][: len(row["response_mask"])].tolist()
            == row["response_mask"]
        )
        print(
            f"row {index}: AgentLoopOutput, as_dict and post-processing accept it; ids kept: {kept}"
        )
        if not kept:
            sys.exit(f"row {index}: verl's tensors do not hold the row's ids")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--wheel-sha256", default=None)
    parser.add_argument("--check", type=Path, default=None, help="pickled to_verl rows to check")
    args = parser.parse_args()
    if args.check is not None:
        check_rows(args.check)
        return
    if verl.__version__ != VERL_VERSION:
        sys.exit(f"expected verl {VERL_VERSION}, found {verl.__version__}")
    rng = np.random.default_rng(SEED)
    with tempfile.TemporaryDirectory() as tmp:
        parquet = gsm8k_parquet(Path(tmp))
        table = pq.read_table(parquet)
        print(f"gsm8k tool-agent parquet: {table.num_rows} rows, columns {table.column_names}")
        data = parquet.read_bytes()
    atomic_write(args.out / "gsm8k_tool_agent.parquet", lambda p: Path(p).write_bytes(data))

    tokenizer = chat_tokenizer()
    tool_loop, tool_batch = tool_loop_row(tokenizer, table.to_pylist()[0], rng)
    video = video_row(rng)
    outputs = {
        "tool_loop": (tool_loop, tool_batch),
        "video": (video, batch_tensors(video, tokenizer)),
    }
    arrays: dict[str, np.ndarray] = {}
    rows = {}
    tensors: dict[str, np.ndarray] = {}
    for name, (output, batch) in outputs.items():
        rows[name] = encode(output.model_dump(), arrays, name)
        for key, value in output.as_dict().items():
            if isinstance(value, torch.Tensor):
                tensors[f"{name}__as_dict__{key}"] = value.numpy()
        for key, value in batch.items():
            tensors[f"{name}__batch__{key}"] = value
        print(
            f"{name}: {len(output.prompt_ids)} prompt ids, {len(output.response_ids)} response ids"
        )

    text = json.dumps(rows, indent=1) + "\n"
    atomic_write(args.out / "rows.json", lambda p: Path(p).write_text(text))
    atomic_write(args.out / "arrays.npz", lambda p: np.savez(p, **arrays))
    atomic_write(args.out / "tensors.npz", lambda p: np.savez(p, **tensors))
    sidecar = {
        "package": "verl",
        "version": VERL_VERSION,
        "wheel": f"verl-{VERL_VERSION}-py3-none-any.whl",
        "wheel_sha256": wheel_sha256("verl", VERL_VERSION, args.wheel_sha256),
        "source_sha256": source_sha256((agent_loop, tool_agent_loop, gsm8k), verl),
        "preprocess_script": {
            "upstream": "volcengine/verl examples/data_preprocess/gsm8k_tool_agent_loop.py",
            "commit": SCRIPT_COMMIT,
            "copy": "tools/reference/verl_gsm8k_tool_agent_loop.py.txt",
            "sha256": hashlib.sha256(SCRIPT.read_bytes()).hexdigest(),
        },
        "torch": torch.__version__,
        "recorder": "tools/verl_interop_reference.py",
        "seed": SEED,
        "prompt_length": PROMPT_LENGTH,
        "response_length": RESPONSE_LENGTH,
        "tokenizer": "byte-level BPE trained in the recorder, Qwen3 special tokens and chat template",
        "rows": {
            "tool_loop": "ToolAgentLoop.run on gsm8k parquet row 0 (hermes parser, Qwen3 template, "
            "scripted server replies with log-probs, routed experts and versions), then "
            "AgentLoopWorker._agent_loop_postprocess with a reward handle running "
            "verl.utils.reward_score.gsm8k",
            "video": "AgentLoopOutput with multi_modal_data videos, mm_processor_kwargs and "
            "mm_processor_output from AgentLoopBase.build_sglang_video_payload; processor output "
            "built in Qwen2-VL's patch layout (no torchvision in the reference env)",
        },
    }
    text = json.dumps(sidecar, indent=1, sort_keys=True) + "\n"
    atomic_write(args.out / "verl_interop.json", lambda p: Path(p).write_text(text))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
