"""PPO's one variables tree holding two models: ``{"params": {"policy": ..., "critic": ...}}``.

The Trainer owns one tree and one optimizer; PPO keeps the policy and the critic as two
subtrees under every collection. ``subtree(variables, POLICY)`` gives a model's own variables
mapping (``{"params": policy}``) and ``join(policy, critic)`` builds the tree from the two.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

POLICY = "policy"
CRITIC = "critic"


def subtree(variables: Mapping[str, Any], part: str) -> dict[str, Any]:
    """The ``part`` subtree of every collection that has one, as a variables mapping.

    ``subtree({"params": {"policy": p, "critic": c}}, POLICY) == {"params": p}``; a
    collection without ``part`` is left out. Raises ``ValueError`` when ``variables`` has no
    ``params`` collection and ``KeyError`` (naming the subtrees found) when ``params`` has
    no ``part``.
    """
    if not hasattr(variables, "keys") or "params" not in variables:
        raise ValueError(
            f"variables: expected a mapping with a 'params' collection, got "
            f"{type(variables).__name__}"
        )
    params = variables["params"]
    if not hasattr(params, "keys") or part not in params:
        keys = sorted(params.keys()) if hasattr(params, "keys") else type(params).__name__
        raise KeyError(
            f"variables['params'][{part!r}]: missing; a PPO variables tree holds 'policy' and "
            f"'critic' subtrees, got {keys}"
        )
    return {
        name: tree[part]
        for name, tree in variables.items()
        if hasattr(tree, "keys") and part in tree
    }


def join(policy: Mapping[str, Any], critic: Mapping[str, Any]) -> dict[str, Any]:
    """One variables tree with ``policy`` and ``critic`` under every collection.

    The inverse of :func:`subtree`: a collection only one side has holds only that side.
    """
    out: dict[str, Any] = {}
    for name in sorted(set(policy) | set(critic)):
        out[name] = {}
        if name in policy:
            out[name][POLICY] = policy[name]
        if name in critic:
            out[name][CRITIC] = critic[name]
    return out


__all__ = ["CRITIC", "POLICY", "join", "subtree"]
