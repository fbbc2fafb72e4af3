"""Helpers for tests of code built on dew, shared so that no test suite writes its own.

- ``tiny_decoder(vocab_size, max_seq_len)`` builds a one-layer ``causal_transformer`` (16
  features, 2 heads, a 32-wide MLP) that compiles in seconds on a CPU. Keywords override any
  ``DecoderConfig`` field (``init_std``, ``emb_features``, ...).
- ``dew.testing.processes``: real multi-process JAX runs on CPU (``jax.distributed`` on
  127.0.0.1): ``ProcessGroup``/``run_processes`` start the ranks of a worker script and
  collect what they print; ``join_cpu`` is what each worker calls before using JAX.
- ``load_script(path)``: an example script loaded as a module, so a test calls its
  functions and sees what they return.
- ``wait_for_checkpoint(process, run_dir, timeout)`` and ``checkpoint_arrays(run_dir)``
  (``dew.testing.runs``): stop a run between two checkpoints, and compare the arrays of two
  runs' newest checkpoints.
- ``TerminalStream(tty)``: an in-memory stream whose ``isatty()`` says ``tty``, for what is
  drawn only on a terminal.

Nothing here is used by dew itself; it ships so that the tests of dew and of the
distributions built on it share one model and one launcher. Importing this package imports
neither JAX nor the models (``tiny_decoder`` imports them when called), so a worker process
can import it before it configures JAX.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from dew.testing.processes import (
    Finished,
    ProcessGroup,
    ProcessGroupError,
    alive,
    cpu_env,
    free_port,
    join_cpu,
    process_arguments,
    run_processes,
)
from dew.testing.runs import checkpoint_arrays, wait_for_checkpoint
from dew.testing.scripts import load_script
from dew.testing.terminal import TerminalStream

if TYPE_CHECKING:
    from dew.models import CausalTransformer

TINY = {"emb_features": 16, "num_layers": 1, "num_heads": 2, "mlp_features": 32}


def tiny_decoder(vocab_size: int, max_seq_len: int, **overrides: Any) -> CausalTransformer:
    """A one-layer ``causal_transformer`` over ``vocab_size`` ids and ``max_seq_len`` positions.

    Args:
      vocab_size: ids ``0 .. vocab_size - 1``.
      max_seq_len: the longest row it reads.
      overrides: any ``DecoderConfig`` field, replacing the ``TINY`` defaults.
    """
    from dew.models import build

    return build(
        "causal_transformer",
        **{**TINY, "vocab_size": vocab_size, "max_seq_len": max_seq_len, **overrides},
    )


__all__ = [
    "TINY",
    "Finished",
    "ProcessGroup",
    "ProcessGroupError",
    "TerminalStream",
    "alive",
    "checkpoint_arrays",
    "cpu_env",
    "free_port",
    "join_cpu",
    "load_script",
    "process_arguments",
    "run_processes",
    "tiny_decoder",
    "wait_for_checkpoint",
]
