"""The ``dew`` command line: ``dew train lm|sft|dpo|grpo|ppo``, ``dew chain``, ``dew quickstart``,
``dew generate`` and ``dew eval`` (``dew.recipes.generate_cli``).

``dew train KIND`` builds its run from three layers, later ones winning: the defaults of
``dew.recipes.train_config``, a YAML or JSON file (``--config``), the flags, and ``--set
section.key=value`` overrides. Every flag is a key of that config (``--lr`` is
``optimizer.learning_rate``); ``--help`` names each flag's key. The whole config is checked
before anything is read or trained (``dew.recipes.train``).

Errors print one line on stderr, ``dew: error: <where>: <what was expected, what came>``,
and exit with status 2 when the input is at fault (a flag, a config key, a data file, a
path: what ``ValueError``, ``TypeError``, ``LookupError``, ``ImportError`` and the missing-path
``OSError`` subclasses say), 1 when the run itself fails (a non-finite loss, a full disk),
130/143 on SIGINT/SIGTERM; ``--debug`` shows the traceback instead.
"""

from __future__ import annotations

import argparse
import os
import sys
import warnings
from collections.abc import Sequence
from importlib import metadata
from pathlib import Path
from typing import Any, NoReturn

from dew.cli_flags import FLAGS as _FLAGS
from dew.cli_flags import SWITCHES as _SWITCHES

_EXAMPLES = {
    "lm": "dew train lm --tokens tokens.bin --run-dir runs/lm --steps 1000 --lr 3e-4 "
    "--schedule cosine --warmup 100",
    "sft": "dew train sft --data chat.jsonl --tokenizer tok/ --run-dir runs/sft --steps 500 "
    "--pretrained hf-model/ --export out/",
    "dpo": "dew train dpo --data pairs.jsonl --tokenizer tok/ --pretrained runs/sft-export "
    "--run-dir runs/dpo --steps 200 --lr 1e-6 --beta 0.1",
    "grpo": "dew train grpo --data prompts.jsonl --tokenizer tok/ --pretrained hf-model/ "
    "--run-dir runs/grpo --steps 100 --reward my_rewards:exact_match",
    "ppo": "dew train ppo --data prompts.jsonl --tokenizer tok/ --pretrained hf-model/ "
    "--run-dir runs/ppo --steps 100 --reward my_rewards:exact_match --lam 0.95",
}
_DESCRIPTIONS = {
    "lm": "Train a decoder on a flat token file (next-token loss, or masked or block diffusion "
    "with --objective masked_diffusion / block_diffusion --block-size N).",
    "sft": "Fine-tune on chat conversations; the loss counts assistant tokens.",
    "dpo": "Direct preference optimisation on prompt/chosen/rejected pairs.",
    "grpo": "GRPO: sample groups of completions per prompt, reward them, update the policy.",
    "ppo": "PPO: sample completions per prompt, reward them, update the policy and a critic.",
}


class _Parser(argparse.ArgumentParser):
    """An ``argparse`` parser whose errors are one line (no usage block)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see '{self.prog} --help')\n")


def _version() -> str:
    def get(name: str) -> str:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            return "not installed"

    return f"dew {get('dew')} (dew-rl {get('dew-rl')}, jax {get('jax')})"


def _default(kind: str, key: str) -> Any:
    import dataclasses

    from dew.recipes import builder, train_config

    section, name = key.split(".")
    classes = {"run": train_config.RunConfig, "model": builder.ModelConfig,
               "optimizer": builder.OptimizerConfig, "schedule": builder.ScheduleConfig,
               "data": train_config.DATA[kind], "objective": train_config.OBJECTIVES[kind],
               "lora": train_config.LoraSection}  # fmt: skip
    for field in dataclasses.fields(classes[section]):
        if field.name == name:
            return field.default
    raise KeyError(key)  # pragma: no cover - the table names real keys


def _add_train_kind(kinds: Any, kind: str) -> None:
    import dataclasses

    parser = kinds.add_parser(
        kind,
        help=_DESCRIPTIONS[kind].split(";")[0].rstrip("."),
        description=_DESCRIPTIONS[kind] + " Each flag is a config key (shown as [key]).",
        epilog=f"example:\n  {_EXAMPLES[kind]}\n  dew train {kind} --config {kind}.yaml "
        "--set optimizer.learning_rate=1e-5",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--config", default=None, metavar="FILE",
                        help="a YAML or JSON config; flags and --set override its keys")  # fmt: skip
    parser.add_argument("--set", dest="overrides", action="append", default=[],
                        metavar="KEY=VALUE",
                        help="override one config key, e.g. optimizer.learning_rate=1e-5 "
                        "(repeatable)")  # fmt: skip
    for name, key, text in _SWITCHES:
        parser.add_argument(f"--{name}", action=argparse.BooleanOptionalAction,
                            default=argparse.SUPPRESS, dest=key, help=f"{text} [{key}]")  # fmt: skip
    parser.add_argument("--debug", action="store_true", help="show the traceback of an error")
    for flags, key, kind_type, text, kinds_for in _FLAGS:
        if kinds_for is not None and kind not in kinds_for:
            continue
        default = _default(kind, key)
        shown = (
            ""
            if "default" in text or "required" in text or default in (dataclasses.MISSING, "")
            else f" (default {default})"
        )
        options: dict[str, Any] = {"dest": key, "default": argparse.SUPPRESS,
                                   "help": f"{text}{shown} [{key}]"}  # fmt: skip
        if kind_type is bool:
            options["action"] = "store_const"
            options["const"] = True
        else:
            options["type"] = kind_type
            options["metavar"] = key.split(".")[1].upper()
        parser.add_argument(*flags, **options)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="dew",
        description="Dew: post-training for JAX models.",
        epilog="example:\n  dew train sft --data chat.jsonl --tokenizer tok/ --run-dir runs/sft "
        "--steps 500\n  dew chain chain.yaml\n  dew quickstart --run-dir runs/quickstart",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=_version())
    parser.add_argument("--debug", action="store_true", help="show the traceback of an error")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    train = commands.add_parser(
        "train",
        help="train a model (lm, sft, dpo, grpo, ppo)",
        description="Train a model.",
        epilog=f"example:\n  {_EXAMPLES['sft']}",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    kinds = train.add_subparsers(dest="kind", required=True, metavar="KIND")
    for kind in _EXAMPLES:
        _add_train_kind(kinds, kind)
    from dew.recipes.flow_cli import add_flow_kind

    add_flow_kind(kinds)  # ``dew train flow`` (dew-flow, through an entry point)
    from dew.recipes.cli import add_chain_command

    add_chain_command(commands)  # ``dew chain CONFIG`` (dew.recipes.cli)
    from dew.quickstart.command import add_command as add_quickstart_command

    add_quickstart_command(commands)  # ``dew quickstart`` (dew.quickstart)
    from dew.recipes.generate_cli import add_commands

    add_commands(commands)  # ``dew generate``, ``dew eval`` (dew.recipes.generate_cli)
    quickstart = commands.choices.get("quickstart")
    if quickstart is not None and not quickstart.epilog:
        quickstart.epilog = "example:\n  dew quickstart --size small --run-dir runs/quickstart"
        quickstart.formatter_class = argparse.RawDescriptionHelpFormatter
    return parser


def _file_config(path: str) -> dict[str, Any]:
    """A config file's mapping, its relative paths read from the file's directory."""
    from dew.recipes.schema import load_file
    from dew.recipes.source_config import file_arguments, regrade_paths
    from dew.recipes.train_config import PATH_KEYS

    config = load_file(path)
    base = Path(path).resolve().parent
    for section, keys in PATH_KEYS.items():
        values = config.get(section)
        if not isinstance(values, dict):
            continue
        for key in keys:
            value = values.get(key)
            if isinstance(value, str) and not os.path.isabs(os.path.expanduser(value)):
                local = base / value
                if section == "run" or local.exists() or value.startswith("."):
                    values[key] = str(local)
    if isinstance(source := config.get("source"), dict):  # its files
        for key in ("command", "harbor"):
            if key in source:
                source[key] = file_arguments(source[key], base)
        if isinstance(source.get("regrade"), dict):  # its verifier's input files
            source["regrade"] = regrade_paths(source["regrade"], base)
        for node in (source, source.get("regrade")):  # kind harbor: task directories
            if not isinstance(node, dict):
                continue
            tasks = node.get("tasks")
            if isinstance(tasks, str) and not os.path.isabs(os.path.expanduser(tasks)):
                if (base / tasks).is_dir():
                    node["tasks"] = str(base / tasks)
    return config


def train_mapping(args: argparse.Namespace) -> dict[str, Any]:
    """The config mapping of a parsed ``dew train`` command line: file, flags, ``--set``."""
    from dew.recipes.schema import apply_override

    config: dict[str, Any] = _file_config(args.config) if args.config else {}
    for key, value in vars(args).items():
        if "." in key:
            section, name = key.split(".")
            node = config.setdefault(section, {})
            if not isinstance(node, dict):
                from dew.recipes.schema import ConfigError

                raise ConfigError(f"{section}: expected a mapping of keys, got {node!r}")
            node[name] = value
    for assignment in args.overrides:
        apply_override(config, assignment)
    return config


def _flag_of(key: str, kind: str) -> str | None:
    for flags, k, _, _, kinds_for in _FLAGS:
        if k == key and (kinds_for is None or kind in kinds_for):
            return flags[0]
    return None


def _train(args: argparse.Namespace) -> int:
    from dew.recipes.schema import ConfigError
    from dew.recipes.train import run_train
    from dew.recipes.train_config import train_config

    if args.kind in ("flow", "flow-grpo"):
        from dew.recipes.flow_cli import run_flow

        return run_flow(train_mapping(args))
    try:
        config = train_config(train_mapping(args), args.kind)
    except ConfigError as err:
        text = str(err)
        if text.endswith("required, missing"):
            key = text.split(":", 1)[0]
            flag = _flag_of(key, args.kind)
            if flag:
                raise ConfigError(f"{flag} ({key}): required, missing") from None
        raise
    state = run_train(config)
    print(
        f"trained to step {int(state.step)} ({int(state.updates)} updates); run directory "
        f"{config.run.run_dir}"
    )
    return 0


def _one_line(err: BaseException) -> str:
    text = str(err) or type(err).__name__
    if isinstance(err, KeyError) and len(err.args) == 1:
        text = str(err.args[0])
    known = (ValueError, TypeError, OSError, ImportError, KeyError, FloatingPointError)
    if not isinstance(err, known):
        text = f"{type(err).__name__}: {text} (--debug shows the traceback)"
    return " ".join(part.strip() for part in text.splitlines() if part.strip())


def _warning_line(message: Any, category: Any, filename: str, lineno: int, line: Any = None) -> str:
    return f"dew: warning: {' '.join(str(message).split())}\n"


def _unrecognized(
    parser: argparse.ArgumentParser, args: argparse.Namespace, extra: list[str]
) -> None:
    """Refuse unknown arguments from the sub-command's parser, naming the nearest flag."""
    from dew.recipes.schema import nearest

    sub: Any = parser
    for name in ("command", "kind"):
        value = getattr(args, name, None)
        actions = [a for a in sub._actions if isinstance(a, argparse._SubParsersAction)]
        if value is None or not actions:
            break
        sub = actions[0].choices[value]
    flags = [flag for action in sub._actions for flag in action.option_strings]
    # a config key's own name as a flag (--learning-rate for optimizer.learning_rate)
    by_key = {
        "--" + action.dest.rsplit(".", 1)[-1].replace("_", "-"): action.option_strings[0]
        for action in sub._actions
        if action.option_strings and "." in action.dest
    }
    given = extra[0].split("=", 1)[0]
    near = None
    if given.startswith("-"):
        near = by_key.get(given) or nearest(given, flags)
    hint = f"; did you mean {near}?" if near else ""
    sub.error(f"unrecognized arguments: {' '.join(extra)}{hint}")


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _join_negative_values(argv: list[str]) -> list[str]:
    """``--lr -1e-3`` -> ``--lr=-1e-3``: argparse takes ``-1e-3`` for an option (its
    negative-number rule misses exponents), so a negative value after a long flag is joined
    to it; the config check then names the key and the bound."""
    out: list[str] = []
    for token in argv:
        previous = out[-1] if out else ""
        joinable = previous.startswith("--") and "=" not in previous and previous != "--"
        if joinable and token.startswith("-") and _is_number(token):
            out[-1] = f"{previous}={token}"
        else:
            out.append(token)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``dew`` console script."""
    from dew import interrupts

    with interrupts.recording():  # before anything slow: a signal is never lost or half-raised
        status = _main(list(sys.argv[1:] if argv is None else argv))
    if argv is None and status == 1:
        # The run failed (a full disk, a non-finite loss) and its line is printed; orbax's
        # writer threads can still print tracebacks while the interpreter shuts down, so
        # the console script leaves without that shutdown. In-process callers get a status.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(status)
    return status


def _main(argv: list[str]) -> int:
    from dew import interrupts

    argv = _join_negative_values(argv)
    debug = "--debug" in argv
    if not debug:
        warnings.formatwarning = _warning_line
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra:
        _unrecognized(parser, args, extra)
    try:
        status = _dispatch(args)
    except KeyboardInterrupt as err:
        if debug:
            raise
        name = getattr(err, "signal_name", None)  # TrainingInterrupted: saved at a step
        if name is not None:
            print(f"dew: {err}", file=sys.stderr)
            return interrupts.exit_status(name)
        name = interrupts.pending() or "SIGINT"
        print(f"dew: interrupted by {name}", file=sys.stderr)
        return interrupts.exit_status(name)
    except Exception as err:
        if debug:
            raise
        print(f"dew: error: {_one_line(err)}", file=sys.stderr)
        return 2 if isinstance(err, _INPUT_ERRORS) else 1
    name = interrupts.pending()
    if name is not None:  # arrived after the last training step (or with none to stop)
        print(f"dew: interrupted by {name} (after the work in flight finished)", file=sys.stderr)
        return interrupts.exit_status(name)
    return status


# What the input's fault raises (exit 2); anything else is the run failing (exit 1).
_INPUT_ERRORS = (
    ValueError,
    TypeError,
    LookupError,
    ImportError,
    FileNotFoundError,
    NotADirectoryError,
    IsADirectoryError,
    FileExistsError,
)


def _dispatch(args: argparse.Namespace) -> int:
    if args.command != "train":  # dew train: run_train follows run.compile_cache
        from dew.compile_cache import configure

        configure()
    if args.command == "train":
        return _train(args)
    if args.command == "chain":
        from dew.recipes.cli import run_chain

        return run_chain(args)
    if args.command == "quickstart":
        from dew.quickstart.command import run_command

        return run_command(args)
    if args.command in ("generate", "eval"):
        from dew.recipes import generate_cli

        return (
            generate_cli.run_generate(args)
            if args.command == "generate"
            else generate_cli.run_eval(args)
        )
    return 2  # pragma: no cover - argparse requires a command


if __name__ == "__main__":
    sys.exit(main())
