"""The flags of ``dew train KIND``: each is one key of the run's config.

``FLAGS`` rows are ``(flags, config key, type, help, kinds)``: ``kinds`` lists the
``dew train`` kinds that take the flag (None: every kind). ``dew.cli`` turns each row into
an ``argparse`` option whose destination is the key, so ``--help`` names it and the
config layers (defaults, ``--config`` file, flags, ``--set``) merge by key.
"""

from __future__ import annotations

from typing import Any

# (flags, config key, type, help, kinds that take it: None for every kind)
FLAGS: tuple[tuple[tuple[str, ...], str, Any, str, tuple[str, ...] | None], ...] = (
    (("--run-dir",), "run.run_dir", str, "run directory: checkpoints, metrics.jsonl, "
     "config.json; a run directory holding a checkpoint is resumed (required)", None),
    (("--steps",), "run.steps", int, "train until this many steps in total (required)", None),
    (("--batch",), "run.batch", int, "global batch size in rows (GRPO: prompts)", None),
    (("--microbatches",), "run.microbatches", int,
     "gradient accumulation: split each batch into this many", None),
    (("--fsdp",), "run.fsdp", bool, "shard parameters and optimizer state over devices", None),
    (("--seed",), "run.seed", int, "seed of initialisation and data order", None),
    (("--log-every",), "run.log_every", int, "write metrics every N steps", None),
    (("--eval-every",), "run.eval_every", int, "validate every N steps (needs validation data)",
     None),
    (("--checkpoint-every",), "run.checkpoint_every", int,
     "checkpoint every N steps; the last step is always saved", None),
    (("--keep",), "run.keep", int, "checkpoints to keep", None),
    (("--tensorboard",), "run.tensorboard", bool,
     "also write TensorBoard event files under RUN_DIR/tensorboard", None),
    (("--trackers",), "run.trackers", str,
     "more trackers besides RUN_DIR/metrics.jsonl, comma-separated: tensorboard, wandb "
     "(offline unless WANDB_MODE says otherwise; the wandb extra), mlflow (a file store in "
     "RUN_DIR/mlruns unless MLFLOW_TRACKING_URI is set; the mlflow extra)", None),
    (("--export",), "run.export", str,
     "after training, write the weights here as a Hugging Face directory (safetensors in "
     "--export-dtype)", None),
    (("--export-dtype",), "run.export_dtype", str,
     "dtype of the exported weights: bfloat16, float32 or float16", None),
    (("--fresh",), "run.fresh", bool,
     "start over: move an existing RUN_DIR aside to RUN_DIR.old-<time> (nothing is deleted)",
     None),
    (("--resume-from",), "run.resume_from", str,
     "continue from this checkpoint instead of the newest: a step of RUN_DIR's checkpoints "
     "or a checkpoint directory (.../checkpoints/step_NNNNNNNN)", None),
    (("--compile-cache-dir",), "run.compile_cache_dir", str,
     "keep JAX's compiled programs here (default: DEW_COMPILE_CACHE_DIR, else "
     "$XDG_CACHE_HOME/dew/jax; dew.compile_cache)", None),
    (("--lora-rank",), "lora.rank", int, "train a LoRA adapter of this rank on the frozen "
     "base instead of every weight (the adapter is written to RUN_DIR/adapter)",
     None),
    (("--lora-alpha",), "lora.alpha", float, "LoRA scale numerator (scale alpha / rank)",
     None),
    (("--lora-targets",), "lora.targets", str, "projections the adapter wraps, comma-separated "
     "(q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj)",
     None),
    (("--lr",), "optimizer.learning_rate", float, "peak learning rate", None),
    (("--optimizer",), "optimizer.name", str, "adam, adamw or sgd", None),
    (("--weight-decay",), "optimizer.weight_decay", float,
     "AdamW weight decay (default 0.01; adam and sgd take none)", None),
    (("--clip",), "optimizer.clip", float, "global gradient-norm clip, 0 to disable", None),
    (("--schedule",), "schedule.kind", str,
     "learning-rate schedule after the warmup: constant (flat at --lr), cosine or linear "
     "(down to --end-lr-fraction x --lr at the last step)", None),
    (("--warmup",), "schedule.warmup_steps", int,
     "steps of linear warmup from 0 to --lr, before the --schedule", None),
    (("--end-lr-fraction",), "schedule.end_fraction", float,
     "where cosine and linear schedules end, as a fraction of --lr", None),
    (("--pretrained",), "model.pretrained", str,
     "start from this Hugging Face model directory (safetensors + config.json), or a Hub "
     "id (org/name) from the Hugging Face cache; the model size flags are then ignored",
     None),
    (("--model",), "model.name", str, "model family: causal_transformer, llama, mistral, "
     "qwen2, qwen3", None),
    (("--emb-features",), "model.emb_features", int, "model width", None),
    (("--layers",), "model.num_layers", int, "decoder layers", None),
    (("--heads",), "model.num_heads", int, "attention heads", None),
    (("--kv-heads",), "model.num_kv_heads", int, "key/value heads (default: --heads)", None),
    (("--mlp-features",), "model.mlp_features", int, "MLP width (default: 4 x width)", None),
    (("--vocab-size",), "model.vocab_size", int,
     "vocabulary size (default: the tokenizer's, or the largest id in the data + 1)", None),
    (("--dtype",), "model.dtype", str,
     "compute dtype: float32, bfloat16 or float16 (parameters stay float32)", None),
    (("--remat",), "model.remat", str, "recompute each decoder layer's activations in the "
     "backward pass to save memory: none, full, dots_saveable (keep matmul outputs) or "
     "dots_with_no_batch_dims_saveable; weights and checkpoints are the same", None),
    (("--scan-layers",), "model.scan_layers", bool, "run the decoder layers as one "
     "jax.lax.scan: one compiled layer body instead of one per layer (on XLA's CPU backend "
     "it compiled slower); weights and checkpoints are the same", None),
    (("--tokens",), "data.tokens", str, "token file: .npy, or raw ids (.bin) of --token-dtype "
     "(required)", ("lm",)),
    (("--token-dtype",), "data.token_dtype", str, "dtype of a raw token file", ("lm",)),
    (("--eos-id",), "data.eos_id", int,
     "document separator id: packed documents do not see each other", ("lm",)),
    (("--val-tokens",), "data.val_tokens", str, "a token file for validation", ("lm",)),
    (("--val-batches",), "data.val_batches", int, "validate on at most this many batches",
     ("lm",)),
    (("--seq-len",), "data.seq_len", int,
     "tokens predicted per row, L; rows hold L + 1", ("lm", "sft")),
    (("--seq-len",), "data.seq_len", int,
     "row width S of a pair side (prompt and completion)", ("dpo",)),
    (("--data",), "data.path", str,
     "conversations: .jsonl, .parquet or a Hub dataset id (hf extra) (required)", ("sft",)),
    (("--data",), "data.path", str, "preference pairs (prompt/chosen/rejected): .jsonl, "
     ".parquet or a Hub dataset id (hf extra) (required)", ("dpo",)),
    (("--data",), "data.path", str, "prompts with ground_truth: .jsonl, .parquet or a Hub "
     "dataset id (hf extra) (required)", ("grpo", "ppo")),
    (("--tokenizer",), "data.tokenizer", str, "tokenizer directory with tokenizer.json and a "
     "chat template in tokenizer_config.json (required)", ("sft",)),
    (("--tokenizer",), "data.tokenizer", str, "tokenizer directory for text and conversation "
     "rows (not needed for token ids)", ("dpo", "grpo", "ppo")),
    (("--column",), "data.column", str,
     "messages column (rows without it use verl's 'prompt')", ("sft",)),
    (("--val-data",), "data.val_path", str, "separate rows for validation",
     ("sft", "dpo", "grpo", "ppo")),
    (("--max-prompt-len",), "data.max_prompt_len", int,
     "prompt width P; longer prompts keep their last P ids", ("grpo", "ppo")),
    (("--ema-decay",), "objective.ema_decay", float,
     "keep a moving average of the weights with this decay (default: none)", ("lm", "sft")),
    (("--objective",), "objective.name", str, "the loss: next_token (predict each next id), "
     "masked_diffusion (MDLM: a bidirectional model restores masked ids) or block_diffusion "
     "(BD3-LM: blocks restored left to right)", ("lm",)),
    (("--block-size",), "objective.block_size", int, "block_diffusion's tokens per block, "
     "dividing --seq-len (1: autoregressive)", ("lm",)),
    (("--mask-rate-min",), "objective.mask_rate_min", float, "block_diffusion: the lowest "
     "mask rate a block draws, in (0, 1] (default 1e-3)", ("lm",)),
    (("--mask-rate-max",), "objective.mask_rate_max", float, "block_diffusion: the highest "
     "mask rate a block draws, in (0, 1] (default 1)", ("lm",)),
    (("--noise-schedule",), "objective.noise_schedule", str,
     "masked_diffusion's noise schedule: loglinear or cosine", ("lm",)),
    (("--mask-id",), "objective.mask_id", int, "the diffusion mask id, outside the data's "
     "ids (default: --real-tokens; an unset --vocab-size grows by one to hold it)", ("lm",)),
    (("--real-tokens",), "objective.real_tokens", int, "masked_diffusion: the data's ids are "
     "0..N-1 (default: the largest id in the token files + 1)", ("lm",)),
    (("--all-tokens",), "objective.all_tokens", bool,
     "count every token in the loss, not only assistant tokens", ("sft",)),
    (("--beta",), "objective.beta", float, "DPO's preference scale", ("dpo",)),
    (("--beta",), "objective.beta", float, "KL coefficient to the starting policy",
     ("grpo", "ppo")),
    (("--reward",), "objective.reward", str,
     "reward: math, code (programs run by dew-sandbox) or module:object (a class is made "
     "with objective.reward_args)", ("grpo", "ppo")),
    (("--groups",), "objective.groups", int, "completions sampled per prompt (>= 2)", ("grpo",)),
    (("--groups",), "objective.groups", int, "completions sampled per prompt", ("ppo",)),
    (("--max-new-tokens",), "objective.max_new_tokens", int, "response budget",
     ("grpo", "ppo")),
    (("--temperature",), "objective.temperature", float,
     "sampling temperature (the loss scores at the same one)", ("grpo", "ppo")),
    (("--top-k",), "objective.top_k", int, "sample from the k most likely ids (default: all)",
     ("grpo", "ppo")),
    (("--gamma",), "objective.gamma", float, "GAE discount per sampled token, in [0, 1]",
     ("ppo",)),
    (("--lam",), "objective.lam", float, "GAE lambda, in [0, 1]", ("ppo",)),
    (("--value-coefficient",), "objective.value_coefficient", float,
     "weight of the critic's loss", ("ppo",)),
    (("--value-clip",), "objective.value_clip", float,
     "clip the critic's predictions to the recorded values +- this", ("ppo",)),
)  # fmt: skip

#: On/off flags (``--NAME`` / ``--no-NAME``): (name, config key, help); unset, the key keeps
#: its config or default value.
SWITCHES: tuple[tuple[str, str, str], ...] = (
    ("progress", "run.progress", "draw a progress bar (default: only when stderr is a "
     "terminal; otherwise a plain log line every --log-every steps)"),
    ("compile-cache", "run.compile_cache", "keep compiled programs on disk for the next run "
     "(default: on unless DEW_COMPILE_CACHE=0)"),
)  # fmt: skip

__all__ = ["FLAGS", "SWITCHES"]
