"""The import arrows of docs/architecture.md, checked by parsing every source file.

Nothing is imported: each file under ``packages/*/src`` is parsed with ``ast``
and its import statements are resolved to absolute module names (relative
imports included). The rules:

* ``dew.rl`` imports only jax, numpy, the standard library and itself;
* inside the ``dew`` distribution, only ``dew.objectives``, ``dew.sessions`` (advantages) and
  ``dew.rollouts`` (GAE at collection) may import ``dew.rl``;
* ``dew`` never imports ``dew.rollout``, ``dew.sandbox`` or ``dew.flow``;
* ``dew.flow`` reads ``dew`` and ``dew.rl`` but not ``dew.rollout`` or ``dew.sandbox``;
* only ``dew.quickstart`` itself and ``dew.cli`` import ``dew.quickstart`` (the demo is no
  library: what other modules need from it lives elsewhere, the PNG writer in ``dew.png``, the
  arithmetic task and its tokenizer in ``dew.data``, held-out accuracy in ``dew.rewards``);
  the scripts under ``examples/`` and ``tools/`` are held to this rule too (to it alone);
* no import cycle (``import_cycles``) between the modules of all five distributions: none
  through the imports that run at module level (not inside functions, not under
  ``if TYPE_CHECKING:``), and, stricter, none even counting the imports inside functions;
* inside ``dew`` (``inner_violations``): ``dew.data``, ``dew.models`` and ``dew.sampling``
  import nothing else of ``dew``, ``dew.inference`` only ``dew.models`` and ``dew.sampling``,
  ``dew.rewards`` only ``dew.data``, ``dew.inference`` and ``dew.sampling``, ``dew.sessions``
  only ``dew.rl``, ``dew.rollouts`` only ``dew.sessions``, ``dew.rl``, ``dew.data``,
  ``dew.inference``, ``dew.models`` and ``dew.sampling``; ``dew.trainer`` no
  objective (only the protocol in ``dew.objectives.base``), no session and no collector
  (only the protocol in ``dew.rollouts.protocol``); ``dew.objectives`` no collector but
  ``dew.rollouts.policy`` (``PPOObjective.policy``); all of them may use the leaves
  ``dew.files``, ``dew.checks``, ``dew.progress``, ``dew.lazy``, ``dew.processes``,
  ``dew.compile_cache`` and ``dew.mesh``,
  which import nothing of ``dew``, and neither does ``dew.rollouts.protocol``; ``dew.png``
  and the leaf ``dew.journal_files`` import nothing of ``dew`` but the other leaves.

The checkers are also run on planted violations (and the cycle finder on planted two- and
three-module cycles and an acyclic set), so a checker that silently accepts everything
fails here too.
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
#: The only modules that may import dew.quickstart: the quickstart itself and the CLI.
QUICKSTART_READERS = ("dew.quickstart", "dew.cli")


def module_name(path: pathlib.Path, src: pathlib.Path) -> str:
    """``src/dew/rl/_gae.py`` -> ``dew.rl._gae``; ``__init__.py`` names its package."""
    parts = list(path.relative_to(src).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _from_target(node: ast.ImportFrom, package: str) -> str:
    """The absolute module ``from <target> import ...`` reads (relative imports resolved)."""
    if not node.level:
        return node.module or ""
    base = package.split(".")
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def imported_modules(source: str, module: str, is_package: bool) -> list[tuple[int, str]]:
    """Absolute names of everything ``source`` imports, with line numbers."""
    found: list[tuple[int, str]] = []
    package = module if is_package else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.extend((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            target = _from_target(node, package)
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
    return bad + quickstart_violations(module, imports)


def quickstart_violations(module: str, imports: list[tuple[int, str]]) -> list[str]:
    """Which of ``imports`` made by ``module`` read ``dew.quickstart`` without being one of
    ``QUICKSTART_READERS``."""
    return [
        f"{module}:{line} only {', '.join(QUICKSTART_READERS)} import {name}"
        for line, name in imports
        if _within(name, "dew.quickstart")
        and not any(_within(module, reader) for reader in QUICKSTART_READERS)
    ]


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
    ("dew.flow.quickstart", "from dew.quickstart.png import write_png\n"),
    ("dew.recipes.train", "from dew import quickstart\n"),
    ("dew.cli_flags", "def f():\n    import dew.quickstart.report\n"),
    ("dew.sandbox.quickstart", "from dew.quickstart.command import run_command\n"),
]


@pytest.mark.parametrize(("module", "source"), PLANTED)
def test_planted_violation_is_caught(module: str, source: str) -> None:
    assert check_source(textwrap.dedent(source), module), f"missed: {module}: {source!r}"


#: Folders of scripts that use Dew as its users do; they may import no dew.quickstart.
SCRIPT_FOLDERS = ("examples", "tools")


def script_files() -> list[tuple[pathlib.Path, str]]:
    """Every script under ``SCRIPT_FOLDERS``, named like a module (``examples.train_rlvr``).

    Hidden folders are left out: ``tools/.envs`` holds the recorders' virtualenvs, whose
    third-party files are not the project's scripts."""
    return [
        (path, module_name(path, ROOT))
        for folder in SCRIPT_FOLDERS
        for path in sorted((ROOT / folder).rglob("*.py"))
        if not any(part.startswith(".") for part in path.relative_to(ROOT).parts)
    ]


def check_script(source: str, module: str, is_package: bool = False) -> list[str]:
    return quickstart_violations(module, imported_modules(source, module, is_package))


def test_no_example_or_tool_imports_the_quickstart() -> None:
    files = script_files()
    assert {module.partition(".")[0] for _, module in files} == set(SCRIPT_FOLDERS)
    bad: list[str] = []
    for path, module in files:
        bad += check_script(path.read_text(), module, path.name == "__init__.py")
    assert not bad, "scripts that import dew.quickstart:\n" + "\n".join(bad)


SCRIPT_PLANTED = [
    ("examples.train_rlvr", "from dew.quickstart.stages import run_sft\n"),
    ("examples.flow_grpo", "from dew import quickstart\n"),
    ("tools.parity_dpo", "def f():\n    import dew.quickstart.evaluate\n"),
    ("tools.bench.bench_sft", "from dew.quickstart.config import Settings as S\n"),
]


@pytest.mark.parametrize(("module", "source"), SCRIPT_PLANTED)
def test_planted_script_violation_is_caught(module: str, source: str) -> None:
    assert check_script(textwrap.dedent(source), module), f"missed: {module}: {source!r}"


def test_scripts_may_read_the_rooms_the_quickstart_reads_too() -> None:
    source = (
        "from dew.data.arithmetic import split\nfrom dew.rewards import Evaluator\n"
        "from dew.flow.quickstart import main\nimport dew.rl\n"
    )
    assert check_script(source, "examples.train_rlvr") == []


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
    ("dew.cli", "def f():\n    from dew.quickstart.command import run_command\n"),
    ("dew.quickstart.report", "from dew.quickstart.plot import write_plot\nfrom . import plot\n"),
    ("dew.flow.quickstart", "from dew.png import write_png\nfrom dew.files import write_json\n"),
]


@pytest.mark.parametrize(("module", "source"), ALLOWED)
def test_allowed_import_passes(module: str, source: str) -> None:
    assert check_source(source, module, module.count(".") < 2 and "._" not in module) == []


# ----------------------------------------------------------------------------- inside dew
#: Helpers any part of dew may use.
LEAVES = (
    "dew.files",
    "dew.checks",
    "dew.progress",
    "dew.lazy",
    "dew.processes",
    "dew.mesh",
    "dew.journal_files",
    "dew.compile_cache",
)
INNER = {  # a part of dew -> the parts of dew (besides itself and the leaves) it may import
    "dew.data": (),
    "dew.models": (),
    "dew.sampling": (),
    "dew.png": (),
    "dew.journal_files": (),
    "dew.inference": ("dew.models", "dew.sampling"),
    "dew.rewards": ("dew.data", "dew.inference", "dew.sampling"),
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
#: Modules that import nothing of dew: the leaves (but ``dew.journal_files``, which reads
#: ``dew.files``), and the protocol the trainer reads.
SELF_CONTAINED = (
    "dew.files",
    "dew.checks",
    "dew.progress",
    "dew.lazy",
    "dew.processes",
    "dew.mesh",
    "dew.compile_cache",
    "dew.rollouts.protocol",
)


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
    ("dew.progress", "from dew.trainer import Trainer\n"),
    ("dew.lazy", "from dew.files import write_json\n"),
    ("dew.processes", "from dew.files import atomic_write\n"),
    ("dew.journal_files", "from dew.rollouts.episodes import EpisodeJournal\n"),
    ("dew.png", "import dew.models\n"),
    ("dew.png", "from dew.quickstart.plot import write_plot\n"),
    ("dew.rewards.accuracy", "from dew.trainer import Trainer\n"),
    ("dew.rewards.math_reward", "from dew.objectives.rl import GRPOObjective\n"),
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
    ("dew.processes", "import signal\nimport subprocess\n"),
    ("dew.journal_files", "import fcntl\nfrom dew.files import write_json\n"),
    ("dew.rollouts.episodes.journal", "from dew.journal_files import lock, rank_file\n"),
    ("dew.testing.processes", "from dew.processes import start, stop\n"),
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
    ("dew.png", "import zlib\nimport numpy as np\nfrom dew.files import atomic_write\n"),
    ("dew.flow.quickstart", "from dew.png import Canvas\n"),
    (
        "dew.rewards.accuracy",
        "from dew.data.chat.template import prompt_ids\nfrom dew.inference import TextGeneration\n",
    ),
]


@pytest.mark.parametrize(("module", "source"), INNER_ALLOWED)
def test_allowed_inner_import_passes(module: str, source: str) -> None:
    assert check_source(source, module) == []


# ----------------------------------------------------------------------------- no cycles
def module_level_imports(
    source: str, module: str, is_package: bool, *, functions: bool = False
) -> list[tuple[int, list[str]]]:
    """What ``source`` imports when it is imported: ``(line, [target, *target.names])``.

    Imports inside functions run later and are left out (unless ``functions``), and so are
    those under ``if TYPE_CHECKING:`` (its ``else`` branch counts); class bodies, ``try``,
    ``with`` and other blocks at module level count. ``from x import y`` lists ``x`` and
    ``x.y`` (``y`` may be a submodule); ``import_graph`` decides which one is read.
    """
    package = module if is_package else module.rpartition(".")[0]
    found: list[tuple[int, list[str]]] = []

    def type_checking(test: ast.expr) -> bool:
        return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
            isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
        )

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if not isinstance(child, (ast.stmt, ast.excepthandler, ast.match_case)):
                continue
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)) and not functions:
                continue
            if isinstance(child, ast.If) and type_checking(child.test):
                for branch in child.orelse:
                    visit(ast.Module(body=[branch], type_ignores=[]))
                continue
            if isinstance(child, ast.Import):
                found.extend((child.lineno, [alias.name]) for alias in child.names)
            elif isinstance(child, ast.ImportFrom):
                target = _from_target(child, package)
                names = [f"{target}.{alias.name}" for alias in child.names]
                found.append((child.lineno, [target, *names]))
            visit(child)

    visit(ast.parse(source))
    return found


def import_graph(
    sources: dict[str, tuple[str, bool]], *, functions: bool = False
) -> dict[str, set[str]]:
    """module -> the modules of ``sources`` it imports (``sources``: module -> text, package?).

    ``import a.b.c`` reads the innermost of ``a.b.c``, ``a.b``, ``a`` that is in the set;
    ``from a import b`` reads ``a.b`` when that is a module of the set, else ``a``.
    """
    graph: dict[str, set[str]] = {}
    for module, (source, is_package) in sources.items():
        edges: set[str] = set()
        for _, names in module_level_imports(source, module, is_package, functions=functions):
            target, submodules = names[0], names[1:]
            reads = [n for n in submodules if n in sources] if submodules else []
            if not reads or len(reads) < len(submodules):
                reads.append(target)
            for name in reads:
                while name and name not in sources:
                    name = name.rpartition(".")[0]
                if name and name != module:
                    edges.add(name)
        graph[module] = edges
    return graph


def import_cycles(graph: dict[str, set[str]]) -> list[str]:
    """One cycle ``a -> b -> ... -> a`` for each strongly connected group of modules."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[set[str]] = []

    def connect(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.add(w)
                if w == v:
                    break
            if len(group) > 1:
                groups.append(group)

    for v in sorted(graph):
        if v not in index:
            connect(v)
    cycles = []
    for group in groups:  # the shortest way from the group's first module back to itself
        start = min(group)
        parent: dict[str, str | None] = {start: None}
        queue = [start]
        for v in queue:  # breadth first; the queue grows as it is read
            if start in graph[v]:
                path = [start]
                step: str | None = v
                while step is not None:
                    path.append(step)
                    step = parent[step]
                cycles.append(" -> ".join(reversed(path)))
                break
            for w in sorted(graph[v] & group):
                if w not in parent:
                    parent[w] = v
                    queue.append(w)
    return sorted(cycles)


def project_sources() -> dict[str, tuple[str, bool]]:
    return {m: (path.read_text(), path.name == "__init__.py") for path, m in source_files()}


def test_no_import_cycle_at_module_level() -> None:
    sources = project_sources()
    graph = import_graph(sources)
    assert sum(len(edges) for edges in graph.values()) > len(graph)  # the graph is not empty
    cycles = import_cycles(graph)
    assert not cycles, "import cycles at module level:\n" + "\n".join(cycles)


def test_no_import_cycle_even_through_imports_inside_functions() -> None:
    """Lazy imports too: a cycle hidden in a function is still a tangle of the arrows."""
    cycles = import_cycles(import_graph(project_sources(), functions=True))
    assert not cycles, "import cycles through imports inside functions:\n" + "\n".join(cycles)


def _planted(**modules: str) -> dict[str, tuple[str, bool]]:
    """``pkg_x_one="..."`` -> ``{"pkg.x.one": (text, is_package)}``; a package has submodules."""
    names = {key.replace("_", "."): textwrap.dedent(text) for key, text in modules.items()}
    return {
        name: (text, any(other.startswith(name + ".") for other in names))
        for name, text in names.items()
    }


def test_a_planted_two_module_cycle_is_found() -> None:
    sources = _planted(pkg_a="import pkg.b\n", pkg_b="from pkg import a\n")
    assert import_cycles(import_graph(sources)) == ["pkg.a -> pkg.b -> pkg.a"]


def test_a_planted_three_module_cycle_is_found() -> None:
    sources = _planted(
        pkg_x_one="from . import two\n",  # pkg.x.one -> pkg.x.two
        pkg_x_two="try:\n    from ..y import three\nexcept ImportError:\n    pass\n",
        pkg_y_three="class C:\n    from pkg.x.one import f\n",
        pkg_y="import os\n",
    )
    assert import_cycles(import_graph(sources)) == [
        "pkg.x.one -> pkg.x.two -> pkg.y.three -> pkg.x.one"
    ]


def test_a_planted_acyclic_set_passes_and_late_imports_do_not_count() -> None:
    sources = _planted(
        pkg_a="import pkg.b\nimport pkg.c as c\n",
        pkg_b="from pkg.c import f\n",
        pkg_c="""\
            from typing import TYPE_CHECKING
            if TYPE_CHECKING:
                from pkg.a import A
            def f():
                from pkg import a
            """,
    )
    graph = import_graph(sources)
    assert graph == {"pkg.a": {"pkg.b", "pkg.c"}, "pkg.b": {"pkg.c"}, "pkg.c": set()}
    assert import_cycles(graph) == []
    late = import_cycles(import_graph(sources, functions=True))
    assert late == ["pkg.a -> pkg.c -> pkg.a"]  # the import inside f, counted on request
