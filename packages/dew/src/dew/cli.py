"""The ``dew`` command line: ``dew train lm`` and ``dew train sft``.

``dew train lm --tokens FILE --run-dir DIR --steps N`` trains a decoder on a token file
(``dew.data.TokenFile``) with ``LMObjective``. ``dew train sft --data FILE --tokenizer DIR
--run-dir DIR --steps N`` fine-tunes on conversations (``dew.data.chat.ChatMessages``) with
the loss on assistant tokens. Both resume when ``DIR`` already holds a checkpoint: the run's
settings are kept in ``DIR/config.json`` and a resumed run must use the same model and data
settings. ``--pretrained`` starts from a Hugging Face model directory; ``--export`` writes the
final weights back in that layout.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from typing import Any

_MODEL_KEYS = ("model", "emb_features", "layers", "heads", "kv_heads", "mlp_features", "vocab_size",
               "seq_len", "pretrained", "dtype")  # fmt: skip


def _add_common(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("run")
    g.add_argument(
        "--run-dir",
        required=True,
        help="run directory: checkpoints, metrics.jsonl, config.json; resumed when it holds a checkpoint",
    )
    g.add_argument("--steps", type=int, required=True, help="train until this many steps in total")
    g.add_argument("--batch", type=int, default=8, help="global batch size in rows (default 8)")
    g.add_argument(
        "--seq-len",
        type=int,
        default=256,
        help="tokens predicted per row, L; rows hold L + 1 (default 256)",
    )
    g.add_argument(
        "--microbatches",
        type=int,
        default=1,
        help="gradient accumulation: split each batch into this many (default 1)",
    )
    g.add_argument(
        "--fsdp", action="store_true", help="shard parameters and optimizer state over devices"
    )
    g.add_argument(
        "--seed", type=int, default=0, help="seed of initialisation and data order (default 0)"
    )
    g.add_argument(
        "--log-every", type=int, default=10, help="write metrics every N steps (default 10)"
    )
    g.add_argument(
        "--eval-every",
        type=int,
        default=None,
        help="validate every N steps (needs validation data)",
    )
    g.add_argument(
        "--checkpoint-every",
        type=int,
        default=100,
        help="checkpoint every N steps (default 100; the last step is always saved)",
    )
    g.add_argument("--keep", type=int, default=3, help="checkpoints to keep (default 3)")
    g.add_argument(
        "--tensorboard",
        action="store_true",
        help="also write TensorBoard event files under RUN_DIR/tensorboard",
    )
    g.add_argument(
        "--export",
        default=None,
        help="after training, write the weights as a Hugging Face directory here",
    )
    o = p.add_argument_group("optimizer (AdamW)")
    o.add_argument("--lr", type=float, default=3e-4, help="peak learning rate (default 3e-4)")
    o.add_argument(
        "--warmup",
        type=int,
        default=0,
        help="linear warmup steps, then cosine decay to 10%% (default 0)",
    )
    o.add_argument(
        "--weight-decay", type=float, default=0.01, help="AdamW weight decay (default 0.01)"
    )
    o.add_argument(
        "--clip",
        type=float,
        default=1.0,
        help="global gradient-norm clip, 0 to disable (default 1.0)",
    )
    o.add_argument(
        "--ema-decay",
        type=float,
        default=None,
        help="keep a moving average of the weights with this decay (default: none)",
    )
    m = p.add_argument_group("model (ignored with --pretrained)")
    m.add_argument(
        "--pretrained",
        default=None,
        help="start from this Hugging Face model directory (safetensors + config.json)",
    )
    m.add_argument(
        "--model",
        default="qwen3",
        help="model family: causal_transformer, llama, mistral, qwen2, qwen3 (default qwen3)",
    )
    m.add_argument("--emb-features", type=int, default=256, help="model width (default 256)")
    m.add_argument("--layers", type=int, default=4, help="decoder layers (default 4)")
    m.add_argument("--heads", type=int, default=4, help="attention heads (default 4)")
    m.add_argument("--kv-heads", type=int, default=None, help="key/value heads (default: --heads)")
    m.add_argument("--mlp-features", type=int, default=None, help="MLP width (default 4 x width)")
    m.add_argument(
        "--dtype",
        default="float32",
        help="compute dtype: float32 or bfloat16 (parameters stay float32)",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="dew", description="Dew: post-training for JAX models.")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    train = commands.add_parser("train", help="train a model", description="Train a model.")
    kinds = train.add_subparsers(dest="kind", required=True, metavar="KIND")
    lm = kinds.add_parser("lm", help="next-token training on a token file",
                          description="Train a decoder on a flat token file (next-token loss).")  # fmt: skip
    lm.add_argument(
        "--tokens", required=True, help="token file: .npy, or raw ids (.bin) of --token-dtype"
    )
    lm.add_argument(
        "--token-dtype", default="uint16", help="dtype of a raw token file (default uint16)"
    )
    lm.add_argument(
        "--vocab-size",
        type=int,
        required=False,
        default=None,
        help="vocabulary size (default: largest id + 1)",
    )
    lm.add_argument(
        "--eos-id",
        type=int,
        default=None,
        help="document separator id: packed documents do not see each other",
    )
    lm.add_argument("--val-tokens", default=None, help="a token file for validation")
    lm.add_argument(
        "--val-batches", type=int, default=None, help="validate on at most this many batches"
    )
    _add_common(lm)
    sft = kinds.add_parser("sft", help="supervised fine-tuning on conversations",
                           description="Fine-tune on chat conversations; the loss counts assistant tokens.")  # fmt: skip
    sft.add_argument(
        "--data",
        required=True,
        help="conversations: .jsonl, .parquet or a Hub dataset id (hf extra)",
    )
    sft.add_argument(
        "--tokenizer",
        required=True,
        help="tokenizer directory with tokenizer.json and a chat template in tokenizer_config.json",
    )
    sft.add_argument(
        "--column",
        default="messages",
        help="messages column (default messages; rows without it use 'prompt')",
    )
    sft.add_argument("--val-data", default=None, help="separate conversations for validation")
    sft.add_argument(
        "--all-tokens",
        action="store_true",
        help="count every token in the loss, not only assistant tokens",
    )
    _add_common(sft)
    from dew.recipes.cli import add_chain_command

    add_chain_command(commands)  # ``dew chain CONFIG`` (dew.recipes.cli)
    from dew.quickstart.command import add_command as add_quickstart_command

    add_quickstart_command(commands)  # ``dew quickstart`` (dew.quickstart)
    return parser


def _optimizer(args: argparse.Namespace) -> Any:
    import optax

    if args.warmup > 0:
        lr = optax.warmup_cosine_decay_schedule(0.0, args.lr, args.warmup, max(args.steps, args.warmup + 1),
                                                end_value=args.lr * 0.1)  # fmt: skip
    else:
        lr = args.lr
    chain = [optax.clip_by_global_norm(args.clip)] if args.clip > 0 else []
    chain.append(
        optax.inject_hyperparams(optax.adamw)(learning_rate=lr, weight_decay=args.weight_decay)
    )
    return optax.chain(*chain)


def _model(args: argparse.Namespace, vocab_size: int) -> tuple[Any, Any]:
    from dew import models

    if args.pretrained:
        pre = models.load_pretrained(args.pretrained)
        if pre.config.vocab_size < vocab_size:
            raise SystemExit(
                f"--pretrained: the model's vocabulary ({pre.config.vocab_size}) is smaller than "
                f"the data's ({vocab_size})"
            )
        return pre.model, dict(pre.variables)
    model = models.build(
        args.model,
        vocab_size=vocab_size,
        emb_features=args.emb_features,
        num_layers=args.layers,
        num_heads=args.heads,
        num_kv_heads=args.kv_heads,
        mlp_features=args.mlp_features or 4 * args.emb_features,
        max_seq_len=args.seq_len + 1,
        dtype=args.dtype,
    )
    return model, None


def _check_config(run_dir: str, config: dict[str, Any]) -> None:
    path = os.path.join(run_dir, "config.json")
    if os.path.exists(path):
        with open(path, encoding="utf-8") as f:
            old = json.load(f)
        diff = {k: (old.get(k), config.get(k)) for k in _MODEL_KEYS + ("data", "tokens")
                if old.get(k) != config.get(k)}  # fmt: skip
        if diff:
            raise SystemExit(
                f"--run-dir {run_dir}: it was started with other settings {diff} "
                "(old, new); use a new run directory"
            )
        return
    os.makedirs(run_dir, exist_ok=True)
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(config, f, indent=1, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _train(args: argparse.Namespace) -> int:
    import jax

    from dew.data import TokenFile
    from dew.objectives.lm import LMObjective
    from dew.trainer import Trainer

    if args.kind == "lm":
        from dew.data.tokens import open_tokens

        ids = open_tokens(args.tokens, args.token_dtype)
        vocab = args.vocab_size or int(ids.max()) + 1
        spec = TokenFile(args.tokens, args.seq_len, dtype=args.token_dtype, eos_id=args.eos_id,
                         seed=args.seed, val_path=args.val_tokens, val_batches=args.val_batches)  # fmt: skip
        loss_role = None
        config = {k.replace("-", "_"): v for k, v in vars(args).items()}
        config["vocab_size"] = vocab
    else:
        from dew.data.chat import ChatMessages, Role

        spec = ChatMessages(args.data, args.tokenizer, args.seq_len, column=args.column,
                            val_path=args.val_data, seed=args.seed)  # fmt: skip
        vocab = spec.chat_tokenizer().tokenizer.get_vocab_size()
        loss_role = None if args.all_tokens else Role.ASSISTANT
        config = dict(vars(args))
        config["vocab_size"] = vocab
    config.pop("func", None)
    _check_config(args.run_dir, config)
    model, pretrained = _model(args, vocab)
    data = spec.load(batch=args.batch)
    objective = LMObjective(model, args.seq_len, pretrained=pretrained, loss_role=loss_role,
                            ema_decay=args.ema_decay)  # fmt: skip
    trainer = Trainer(objective, _optimizer(args), key=jax.random.key(args.seed),
                      microbatches=args.microbatches, fsdp=args.fsdp,
                      checkpoint_every=args.checkpoint_every, keep_checkpoints=args.keep,
                      tensorboard=args.tensorboard)  # fmt: skip
    state = trainer.fit(data, steps=args.steps, log_every=args.log_every,
                        eval_every=args.eval_every, run_dir=args.run_dir)  # fmt: skip
    if args.export:
        from dew import models

        models.Pretrained.from_model(model, jax.device_get(state.params),
                                     family=None if args.pretrained else args.model).save(args.export)  # fmt: skip
    print(
        f"trained to step {int(state.step)} ({int(state.updates)} updates); run directory {args.run_dir}"
    )
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``dew`` console script."""
    args = build_parser().parse_args(argv)
    if args.command == "train":
        return _train(args)
    if args.command == "chain":
        from dew.recipes.cli import run_chain

        return run_chain(args)
    if args.command == "quickstart":
        from dew.quickstart.command import run_command

        return run_command(args)
    return 2  # pragma: no cover - argparse requires a command


if __name__ == "__main__":
    sys.exit(main())
