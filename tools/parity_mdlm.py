"""Record MDLM's masked diffusion loss, its parts and its gradient as fixtures.

Run it in the shared reference environment (never in Dew's own venv)::

    "$(tools/reference_env.sh | tail -n 1)" tools/parity_mdlm.py

The reference is github.com/kuleshov-group/mdlm at commit ``COMMIT`` (Apache-2.0,
``tools/reference/mdlm_LICENSE.txt``):

- ``noise_schedule.py`` whole, kept verbatim in ``tools/reference/mdlm_noise_schedule.py.txt``
  (its git blob equals the upstream file's, ``NOISE_BLOB``); it imports torch only, so it is
  loaded as a module and its ``LogLinearNoise`` and ``CosineNoise`` give sigma and its rate.
- from ``diffusion.py`` (blob ``DIFFUSION_BLOB``), lines ``DIFFUSION_LINES`` joined by one
  blank line, kept verbatim in ``tools/reference/mdlm_diffusion_loss.py.txt``: the ``Loss``
  record, ``_subs_parameterization``, ``q_xt``, ``_sample_t``, ``_maybe_sub_sample``,
  ``_reconstruction_loss``, ``_forward_pass_diffusion`` and ``_loss``. The Lightning module
  around them needs hydra, lightning and a backbone, so the methods are compiled into a bare
  class here and run with the attributes they read (MDLM's defaults: continuous time
  ``T = 0``, SUBS, antithetic times, ``sampling_eps = 1e-3``, no importance sampling, no
  change of variables). The one stand-in is ``forward``: instead of a backbone it takes a
  fixed float32 logits tensor (a leaf with a gradient) and applies the verbatim SUBS method
  to a copy, exactly as MDLM's ``forward`` does to the backbone's output.

Each case (a schedule) seeds torch, runs ``_loss(x0, attention_mask)`` and records the drawn
times, the noisy ids (which positions were masked), the logits, the SUBS output, sigma, its
rate and the mask probability, the per-token ``nlls``, the token loss and its gradient with
respect to the logits. The attention mask drops the tail of two rows (padding).

Writes ``tests/fixtures/mdlm/mdlm_loss.npz`` and ``mdlm_loss.json``, each only when its content
changed, so a second run leaves both byte-identical.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import subprocess
import sys
import textwrap
import types
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
REFERENCE = ROOT / "tools" / "reference"
OUT = ROOT / "tests" / "fixtures" / "mdlm"
REPOSITORY = "https://github.com/kuleshov-group/mdlm"
COMMIT = "c112c526d193436838c98d81455ee51f90309470"
DIFFUSION_BLOB = "9442f021f8a91a06e1a7c1d872bee11a60ba1355"
DIFFUSION_LINES = [(37, 41), (261, 277), (575, 586), (800, 916)]
EXCERPT_BLOB = "54d11d070e1a41f5d59ec6911cf4ecc0b5566af4"
NOISE_BLOB = "c5d4416aab545536a4e2aec58717c9fe76df2fe7"
LICENSE_BLOB = "1ac0d9851b8040241ceddffc3110288c45cf9707"

B, T, V = 4, 16, 10  # ids 0..8 are real, 9 is the mask
MASK = V - 1
LENGTHS = [16, 16, 11, 7]  # real tokens per row; the rest is padding
CASES = {"loglinear": "LogLinearNoise", "cosine": "CosineNoise"}
SEEDS = {"loglinear": 11, "cosine": 12}


def blob(path: Path, want: str) -> None:
    """Exit unless ``path`` is the pinned git blob."""
    got = subprocess.run(
        ["git", "hash-object", str(path)], capture_output=True, text=True, check=True
    ).stdout.strip()
    if got != want:
        sys.exit(f"{path}: git blob {got}, expected {want}")


def load_noise() -> types.ModuleType:
    """MDLM's ``noise_schedule.py`` as a module, after the blob check."""
    path = REFERENCE / "mdlm_noise_schedule.py.txt"
    blob(path, NOISE_BLOB)
    spec = importlib.util.spec_from_loader("mdlm_noise_schedule", loader=None)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    exec(compile(path.read_text(), "noise_schedule.py", "exec"), module.__dict__)
    return module


def load_methods() -> type:
    """The verbatim ``diffusion.py`` excerpt compiled into a bare class ``MDLMExcerpt``."""
    path = REFERENCE / "mdlm_diffusion_loss.py.txt"
    blob(path, EXCERPT_BLOB)
    text = path.read_text()
    head, methods = text.split("\n  def ", 1)
    source = head + "\nclass MDLMExcerpt:\n  def " + methods
    utils = types.SimpleNamespace(print_nans=lambda tensor, name: None)
    namespace = {"torch": torch, "np": np, "dataclass": dataclasses.dataclass, "utils": utils}
    exec(compile(textwrap.dedent(source), "diffusion.py", "exec"), namespace)
    return namespace["MDLMExcerpt"]


def make_reference(methods: type, noise: object, logits: torch.Tensor) -> object:
    """An object with the attributes the excerpt reads; it records what it draws."""

    class Reference(methods):  # type: ignore[misc, valid-type]
        def __init__(self) -> None:
            self.mask_index, self.neg_infinity = MASK, -1000000.0
            self.antithetic_sampling, self.sampling_eps = True, 1e-3
            self.importance_sampling, self.change_of_variables = False, False
            self.parameterization, self.T, self.noise = "subs", 0, noise
            self.config = types.SimpleNamespace(model=types.SimpleNamespace(length=T))
            self.record: dict[str, torch.Tensor] = {}

        def _sample_t(self, n, device):  # noqa: ANN001, ANN202
            self.record["t"] = super()._sample_t(n, device)
            return self.record["t"]

        def q_xt(self, x, move_chance):  # noqa: ANN001, ANN202
            self.record["move_chance"] = move_chance[:, 0]
            self.record["xt"] = super().q_xt(x, move_chance)
            return self.record["xt"]

        def forward(self, x, sigma):  # noqa: ANN001, ANN202
            self.record["sigma_in"] = sigma[:, 0]
            out = self._subs_parameterization(logits=logits.clone(), xt=x)
            self.record["subs"] = out
            return out

    return Reference()


def run_case(methods: type, noise_module: types.ModuleType, name: str) -> dict:
    """One call of MDLM's ``_loss`` with autograd; every recorded quantity as float32/int."""
    rng = np.random.default_rng(SEEDS[name])
    x0 = torch.from_numpy(rng.integers(0, MASK, (B, T)).astype(np.int64))
    attention = torch.from_numpy(
        (np.arange(T)[None] < np.array(LENGTHS)[:, None]).astype(np.float32)
    )
    logits = torch.from_numpy(rng.normal(0.0, 2.0, (B, T, V)).astype(np.float32)).requires_grad_()
    noise = getattr(noise_module, CASES[name])()
    reference = make_reference(methods, noise, logits)
    torch.manual_seed(SEEDS[name])
    loss = reference._loss(x0, attention)
    loss.loss.backward()
    t = reference.record["t"].detach()
    sigma, dsigma = noise(t)
    out = {
        "x0": x0.numpy().astype(np.int32),
        "attention": attention.numpy(),
        "logits": logits.detach().numpy(),
        "t": t.numpy(),
        "xt": reference.record["xt"].numpy().astype(np.int32),
        "move_chance": reference.record["move_chance"].detach().numpy(),
        "sigma": sigma.detach().numpy(),
        "dsigma": dsigma.detach().numpy(),
        "subs": reference.record["subs"].detach().numpy(),
        "nlls": loss.nlls.detach().numpy(),
        "loss": loss.loss.detach().numpy(),
        "grad_logits": logits.grad.numpy(),
    }
    return {k: a if a.dtype == np.int32 else np.asarray(a, np.float32) for k, a in out.items()}


def write_if_changed(path: Path, arrays: dict[str, np.ndarray] | None, text: str | None) -> bool:
    """Write ``arrays`` (npz) or ``text`` unless the file already holds exactly that."""
    if path.exists():
        if text is not None and path.read_text() == text:
            return False
        if arrays is not None:
            with np.load(path) as z:
                same = sorted(z.files) == sorted(arrays) and all(
                    z[k].dtype == a.dtype and np.array_equal(z[k], a) for k, a in arrays.items()
                )
            if same:
                return False
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp" + path.suffix)
    if arrays is not None:
        np.savez(tmp, **arrays)
    else:
        tmp.write_text(text or "")
    tmp.replace(path)
    return True


def main() -> None:
    torch.set_num_threads(1)
    blob(REFERENCE / "mdlm_LICENSE.txt", LICENSE_BLOB)
    noise_module, methods = load_noise(), load_methods()
    fixture = {}
    for name in CASES:
        for key, value in run_case(methods, noise_module, name).items():
            fixture[f"{name}/{key}"] = value
    sidecar = {
        "package": "mdlm",
        "repository": REPOSITORY,
        "revision": COMMIT,
        "diffusion_blob": DIFFUSION_BLOB,
        "diffusion_lines": DIFFUSION_LINES,
        "excerpt_blob": EXCERPT_BLOB,
        "noise_schedule_blob": NOISE_BLOB,
        "licence": "Apache-2.0",
        "torch": torch.__version__,
        "dtype": "float32",
        "shape": [B, T, V],
        "mask_index": MASK,
        "lengths": LENGTHS,
        "cases": CASES,
        "arrays": sorted(fixture),
    }
    wrote = [
        write_if_changed(OUT / "mdlm_loss.npz", fixture, None),
        write_if_changed(
            OUT / "mdlm_loss.json", None, json.dumps(sidecar, indent=2, sort_keys=True) + "\n"
        ),
    ]
    print(f"mdlm_loss: {sum(wrote)} of 2 files rewritten in {OUT}")


if __name__ == "__main__":
    main()
