"""The import arrows of docs/architecture.md, checked by parsing every source file.

Nothing is imported: each file under ``packages/*/src`` is parsed with ``ast``
and its import statements are resolved to absolute module names (relative
imports included). The rules:

* ``dew.rl`` imports only jax, numpy, the standard library and itself;
* inside the ``dew`` distribution, only ``dew.objectives``, ``dew.sessions`` (advantages) and
  ``dew.rollouts`` (GAE at collection) may import ``dew.rl``;
* ``dew`` never imports ``dew.rollout``, ``dew.sandbox`` or ``dew.flow``;
* ``dew.flow`` reads ``dew`` and ``dew.rl`` but not ``dew.rollout`` or ``dew.sandbox``;
* inside ``dew`` (``inner_violations``): ``dew.data``, ``dew.models`` and ``dew.sampling``
  import nothing else of ``dew``, ``dew.inference`` only ``dew.models`` and ``dew.sampling``,
  ``dew.sessions`` only ``dew.rl``, ``dew.rollouts`` only ``dew.sessions``, ``dew.rl``,
  ``dew.data``, ``dew.inference``, ``dew.models`` and ``dew.sampling``; ``dew.trainer`` no
  objective (only the protocol in ``dew.objectives.base``), no session and no collector
  (only the protocol in ``dew.rollouts.protocol``); ``dew.objectives`` no collector but
  ``dew.rollouts.policy`` (``PPOObjective.policy``); all of them may use the leaves
  ``dew.files``, ``dew.checks`` and ``dew.progress``, which import nothing of ``dew``, and
  neither does ``dew.rollouts.protocol``.

The checker is also run on planted violations, so a checker that silently
accepts everything fails here too.
"""

from __future__ import annotations

import ast
import pathlib
import sys
import textwrap

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
SATELLITES = ("dew.rollout", "dew.sandbox", "dew.flow")
RL_ALLOWED_THIRD_PARTY = {"jax", "jaxlib", "numpy"}
#: The parts of the dew distribution that may read dew.rl: the losses, the session helpers
#: that compute advantages, and the collectors that compute GAE at collection time.
RL_READERS = ("dew.objectives", "dew.sessions", "dew.rollouts")


def module_name(path: pathlib.Path, src: pathlib.Path) -> str:
    """``src/dew/rl/_gae.py`` -> ``dew.rl._gae``; ``__init__.py`` names its package."""
    parts = list(path.relative_to(src).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imported_modules(source: str, module: str, is_package: bool) -> list[tuple[int, str]]:
    """Absolute names of everything ``source`` imports, with line numbers."""
    found: list[tuple[int, str]] = []
    package = module if is_package else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.extend((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            found.append((node.lineno, target))
            # `from dew import rl` imports the submodule dew.rl.
            found.extend((node.lineno, f"{target}.{alias.name}") for alias in node.names)
    return found


def _within(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def violations(module: str, imports: list[tuple[int, str]]) -> list[str]:
    """Which of ``imports`` made by ``module`` break an arrow."""
    bad: list[str] = []
    for line, name in imports:
        top = name.split(".")[0]
        if _within(module, "dew.rl"):
            if top == "dew" and not _within(name, "dew.rl") and name != "dew":
                bad.append(f"{module}:{line} dew.rl imports {name}")
            elif top not in ("dew", *RL_ALLOWED_THIRD_PARTY) and top not in sys.stdlib_module_names:
                bad.append(f"{module}:{line} dew.rl imports third-party {name}")
        elif not any(_within(module, s) for s in SATELLITES):
            if _within(name, "dew.rl") and not any(_within(module, p) for p in RL_READERS):
                bad.append(f"{module}:{line} only {', '.join(RL_READERS)} may import dew.rl")
            for satellite in SATELLITES:
                if _within(name, satellite):
                    bad.append(f"{module}:{line} dew imports {satellite} ({name})")
        if _within(module, "dew.flow"):
            for other in ("dew.rollout", "dew.sandbox"):
                if _within(name, other):
                    bad.append(f"{module}:{line} dew.flow imports {other} ({name})")
    return bad


def source_files() -> list[tuple[pathlib.Path, str]]:
    files = []
    for src in sorted((ROOT / "packages").glob("*/src")):
        for path in sorted(src.rglob("*.py")):
            files.append((path, module_name(path, src)))
    return files


def check_source(source: str, module: str, is_package: bool = False) -> list[str]:
    imports = imported_modules(source, module, is_package)
    return violations(module, imports) + inner_violations(module, imports)


def test_there_are_sources_to_check() -> None:
    modules = {m for _, m in source_files()}
    assert "dew" in modules
    assert any(_within(m, "dew.rl") for m in modules)


def test_every_source_file_respects_the_arrows() -> None:
    bad: list[str] = []
    for path, module in source_files():
        bad += check_source(path.read_text(), module, path.name == "__init__.py")
    assert not bad, "import arrows broken:\n" + "\n".join(bad)


PLANTED = [
    ("dew.rl._gae", "import flax\n"),
    ("dew.rl._gae", "from optax import adam\n"),
    ("dew.rl._gae", "import dew.models\n"),
    ("dew.rl._gae", "from .. import trainer\n"),
    ("dew.trainer.step", "import dew.rl\n"),
    ("dew.trainer.step", "from dew.rl import token_mean\n"),
    ("dew.trainer.step", "from dew import rl\n"),
    ("dew.data.chat", "from ..rl import gae\n"),
    ("dew.models.decoder", "import dew.sandbox\n"),
    ("dew.inference.server", "from dew.rollout import Publication\n"),
    ("dew.objectives.lm", "from dew.flow import presets\n"),
    ("dew.cli", "def f():\n    import dew.sandbox.fleet\n"),
    ("dew.quickstart.command", "from dew.flow.quickstart import run\n"),
    ("dew.flow.grpo", "import dew.rollout\n"),
    ("dew.flow.rollout", "from dew.sandbox import CodeReward\n"),
    ("dew.objectives.rl.grpo", "from dew.rollout.native import NativeRolloutServer\n"),
    ("dew.inference.generation", "from ..rollout import Publication\n"),
    ("dew.inference.server", "from dew.rl import gae\n"),
    ("dew.models.decoder", "import dew.rl\n"),
]


@pytest.mark.parametrize(("module", "source"), PLANTED)
def test_planted_violation_is_caught(module: str, source: str) -> None:
    assert check_source(textwrap.dedent(source), module), f"missed: {module}: {source!r}"


ALLOWED = [
    ("dew.rl._gae", "import functools\nimport jax.numpy as jnp\nimport numpy as np\n"),
    ("dew.rl", "from ._gae import gae\nfrom dew.rl._token_mean import token_mean\n"),
    ("dew.objectives.rl.grpo", "from dew.rl import clipped_surrogate\nfrom ... import rl\n"),
    ("dew.objectives.lm", "import dew.rl\n"),
    ("dew.sessions.advantages", "import dew.rl as rl\n"),
    ("dew.rollouts.ppo", "from dew.rl import gae\n"),
    ("dew.sandbox.fleet", "import dew.models\nfrom dew.sandbox import limits\n"),
    ("dew.flow.objective", "import dew.rl\n"),
    ("dew.flow.grpo", "from dew.objectives.rl import policy_loss_from_log_probs\nimport flax\n"),
    ("dew.rollout.native", "from dew.inference import Server\nimport httpx\n"),
    ("dew.rollout.reload", "from dew.models import Pretrained\nfrom . import http\n"),
    ("dew.trainer.step", "import jax\nfrom dew.models import build\n"),
]


@pytest.mark.parametrize(("module", "source"), ALLOWED)
def test_allowed_import_passes(module: str, source: str) -> None:
    assert check_source(source, module, module.count(".") < 2 and "._" not in module) == []


# ----------------------------------------------------------------------------- inside dew
LEAVES = ("dew.files", "dew.checks", "dew.progress")  # helpers any part of dew may use
INNER = {  # a part of dew -> the parts of dew (besides itself and the leaves) it may import
    "dew.data": (),
    "dew.models": (),
    "dew.sampling": (),
    "dew.inference": ("dew.models", "dew.sampling"),
    "dew.sessions": ("dew.rl",),
    "dew.rollouts": (
        "dew.sessions",
        "dew.rl",
        "dew.data",
        "dew.inference",
        "dew.models",
        "dew.sampling",
    ),
}
#: Modules that import nothing of dew: the leaves, and the protocol the trainer reads.
SELF_CONTAINED = (*LEAVES, "dew.rollouts.protocol")


def inner_violations(module: str, imports: list[tuple[int, str]]) -> list[str]:
    """Which of ``imports`` made by ``module`` break an arrow between the parts of ``dew``."""
    bad: list[str] = []
    for line, name in imports:
        if not _within(name, "dew") or name == "dew":
            continue
        if any(_within(module, alone) for alone in SELF_CONTAINED):
            if not _within(name, module):
                bad.append(f"{module}:{line} {module} imports nothing of dew, not {name}")
            continue
        if any(_within(name, leaf) for leaf in LEAVES):
            continue
        for part, allowed in INNER.items():
            if not _within(module, part) or _within(name, part):
                continue
            if not any(_within(name, a) for a in allowed):
                others = ", ".join(allowed) or "nothing else of dew"
                bad.append(f"{module}:{line} {part} may import {others}, not {name}")
        if (
            _within(module, "dew.trainer")
            and _within(name, "dew.objectives")
            and not _within(name, "dew.objectives.base")
        ):
            bad.append(f"{module}:{line} the trainer knows no objective, only the protocol: {name}")
        if _within(module, "dew.trainer") and (
            _within(name, "dew.sessions")
            or (_within(name, "dew.rollouts") and not _within(name, "dew.rollouts.protocol"))
        ):
            bad.append(
                f"{module}:{line} no session or collector in the trainer, only the protocol: {name}"
            )
        if (
            _within(module, "dew.objectives")
            and _within(name, "dew.rollouts")
            and not _within(name, "dew.rollouts.policy")
        ):
            bad.append(f"{module}:{line} the losses read no collector but SubtreePolicy: {name}")
    return bad


INNER_PLANTED = [
    ("dew.data.prompts", "from dew.sessions import pack\n"),
    ("dew.data.chat.template", "from ...models import build\n"),
    ("dew.data", "import dew.trainer\n"),
    ("dew.models.decoder", "from dew.data import Dataset\n"),
    ("dew.models", "from dew import sampling\n"),
    ("dew.sampling", "from dew.models import build\n"),
    ("dew.inference.server", "from dew.objectives.scoring import target_log_probs\n"),
    ("dew.inference.generation", "def f():\n    from dew.trainer import Trainer\n"),
    ("dew.inference", "from dew.data.prompts import decode_text\n"),
    ("dew.trainer.trainer", "from dew.objectives.lm import LMObjective\n"),
    ("dew.trainer.step", "from dew.objectives.rl import GRPOObjective\n"),
    ("dew.trainer.step", "from dew.objectives import LMObjective\n"),
    ("dew.trainer.step", "from ..rollouts import sampled\n"),
    ("dew.trainer.trainer", "from dew import rollouts\n"),
    ("dew.trainer.trainer", "from dew.sessions import pack\n"),
    ("dew.trainer.trainer", "from dew.rollouts.episodes import EpisodeRollout\n"),
    ("dew.sessions.packing", "from dew.inference import TextGeneration\n"),
    ("dew.sessions.records", "from dew.objectives.scoring import packed_log_probs\n"),
    ("dew.sessions.verl", "from dew.rollouts.sampled import default_decode\n"),
    ("dew.sessions", "from ..models import build\n"),
    ("dew.rollouts.sampled", "from dew.objectives.rl import GRPOObjective\n"),
    ("dew.rollouts.episodes.rollout", "from dew.trainer import Trainer\n"),
    ("dew.rollouts.protocol", "from dew.checks import is_int\n"),
    ("dew.rollouts.protocol", "import dew.sessions\n"),
    ("dew.objectives.rl.grpo", "from dew.rollouts.sampled import SampledRollout\n"),
    ("dew.objectives.rl.ppo", "from dew import rollouts\n"),
    ("dew.files", "from dew.checks import is_int\n"),
    ("dew.checks", "import dew.models\n"),
    ("dew.progress", "from dew.trainer.progress import Progress\n"),
]


@pytest.mark.parametrize(("module", "source"), INNER_PLANTED)
def test_planted_inner_violation_is_caught(module: str, source: str) -> None:
    is_package = module.count(".") < 2
    assert check_source(textwrap.dedent(source), module, is_package), (
        f"missed: {module}: {source!r}"
    )


INNER_ALLOWED = [
    (
        "dew.data.prompts",
        "from dew.data.dataset import Dataset\nfrom dew.files import atomic_write\n",
    ),
    ("dew.data.chat.template", "from ..dataset import Dataset\nfrom dew.checks import is_int\n"),
    ("dew.models.pretrained", "from dew.files import atomic_write\nfrom . import safetensors_io\n"),
    (
        "dew.inference.server",
        "from dew.models.decoder import KVCache\nfrom dew.sampling import draw\n",
    ),
    (
        "dew.trainer.trainer",
        "from dew.objectives.base import Objective\nfrom dew.data import Dataset\n",
    ),
    ("dew.objectives.rl.grpo", "from dew.objectives.scoring import packed_log_probs\n"),
    ("dew.files", "import os\nimport tempfile\n"),
    ("dew.progress", "import sys\nfrom tqdm import tqdm\n"),
    ("dew.rollouts.episodes.rollout", "from dew.progress import TerminalBar\n"),
    (
        "dew.sessions.packing",
        "from dew.checks import is_integer\nfrom dew.sessions.records import Session\n",
    ),
    ("dew.sessions.advantages", "import dew.rl as rl\nfrom .records import check_choice\n"),
    (
        "dew.rollouts.sampled",
        "from dew.inference import TextGeneration\nfrom dew.sessions.packing import pack\n"
        "from dew.data.prompts import decode_text\nfrom dew.sampling import Sampling\n",
    ),
    ("dew.rollouts.ppo", "from dew.rl import gae\n"),
    ("dew.rollouts.policy", "from dew.models import CausalTransformer\n"),
    ("dew.rollouts.protocol", "from collections.abc import Mapping\n"),
    ("dew.trainer.trainer", "from dew.rollouts.protocol import Rollout\n"),
    ("dew.objectives.rl.ppo", "def f():\n    from dew.rollouts.policy import SubtreePolicy\n"),
    ("dew.objectives.rl.sessions", "from dew.sessions.records import Call\n"),
    ("dew.data.prompts", "from dew.progress import TerminalBar\n"),
]


@pytest.mark.parametrize(("module", "source"), INNER_ALLOWED)
def test_allowed_inner_import_passes(module: str, source: str) -> None:
    assert check_source(source, module) == []
