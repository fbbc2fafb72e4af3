"""Record BD3-LM's block diffusion loss, its gradient and its attention mask as fixtures.

Run it in the shared reference environment (never in Dew's own venv)::

    "$(tools/reference_env.sh | tail -n 1)" tools/parity_bd3lm.py

The reference is github.com/kuleshov-group/bd3lms at commit ``COMMIT`` (Apache-2.0,
``tools/reference/bd3lm_LICENSE.txt``), three files kept verbatim under ``tools/reference/``,
each checked against its git blob before it runs:

- ``noise_schedule.py`` whole (``bd3lm_noise_schedule.py.txt``, blob ``NOISE_BLOB``): it
  imports torch only and gives ``LogLinearNoise`` (mask rate ``t``, loss scale ``-1/t``).
- from ``diffusion.py`` (blob ``DIFFUSION_BLOB``), lines ``DIFFUSION_LINES`` joined by one
  blank line (``bd3lm_diffusion_loss.py.txt``, blob ``EXCERPT_BLOB``): the ``Loss`` record,
  ``_subs_parameterization``, ``_process_sigma``, ``forward``, ``q_xt``, ``_sigma_from_p``,
  ``_sample_t``, ``_maybe_sub_sample``, ``_forward_pass_diffusion`` and ``_loss``. The
  Lightning module around them needs hydra, lightning and a DiT, so the methods are compiled
  into a bare class and run with the attributes they read (bd3lm.yaml's ``subs``,
  ``cross_attn``, no time conditioning, continuous time, antithetic times, ``resample``
  off; ``ignore_bos`` off, so every real token may be masked). The one stand-in is the
  backbone: it checks that it is handed ``[x_t, x_0]`` and returns a fixed float32 logits
  tensor for the noised half (a leaf with a gradient), as the DiT returns ``x[:, :n]``.
- from ``models/dit.py`` (blob ``DIT_BLOB``), lines ``DIT_LINES``: ``block_diff_mask``
  (``bd3lm_block_diff_mask.py.txt``, blob ``MASK_BLOB``), evaluated on the ``[2L, 2L]`` grid
  as the DiT's ``gen_mask`` does for its sdpa backend.

Each case (a block size and a clip of the mask rate) seeds torch, runs ``_loss(x0,
attention_mask)`` and records the uniform draws behind the block times and the masks
(replayed from the same seed, and checked against the ids it masked), the per-token times,
the noised ids, the SUBS output, the per-token ``nlls``, the token loss, its gradient with
respect to the logits and the attention mask. The attention mask drops the tail of two rows.

Writes ``tests/fixtures/bd3lm/bd3lm_loss.npz`` and ``bd3lm_loss.json``, each only when its
content changed, so a second run leaves both byte-identical.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import sys
import textwrap
import types
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from parity_mdlm import blob, write_if_changed  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
REFERENCE = ROOT / "tools" / "reference"
OUT = ROOT / "tests" / "fixtures" / "bd3lm"
REPOSITORY = "https://github.com/kuleshov-group/bd3lms"
COMMIT = "1c3e8f43d88dfbcee5ff2aa6932a9e74b31ae1d7"
DIFFUSION_BLOB = "377a2b9babcf061a8955b5ee6c275798176b29da"
DIFFUSION_LINES = [(31, 35), (275, 291), (308, 348), (502, 536), (702, 703), (768, 891)]
EXCERPT_BLOB = "c19924921c0c645b514a31dd815a2a546fc73df7"
DIT_BLOB = "7c0ebe64d86674428806b4acbf527e7fe3f21469"
DIT_LINES = [(30, 74)]
MASK_BLOB = "342edfe4066255ab192e18d25e02024605f3251c"
NOISE_BLOB = "64ccd24c5a3c6959e8388d49630bba9c9c1a7735"
LICENSE_BLOB = "261eeb9e9f8b2b4b0d119366dda99c6fd7d35c64"

B, L, V = 4, 16, 10  # ids 0..8 are real, 9 is the mask
MASK = V - 1
LENGTHS = [16, 16, 11, 7]  # real tokens per row; the rest is padding
# name: (block size, sampling_eps_min, sampling_eps_max, seed)
CASES = {
    "block4": (4, 1e-3, 1.0, 21),
    "block1_ar": (1, 1.0, 1.0, 22),
    "block4_clip": (4, 0.3, 0.8, 23),
    "block2_high_clip": (2, 0.6, 0.9, 24),
    "block16": (16, 1e-3, 1.0, 25),
}


def load(path: Path, want: str, name: str) -> types.ModuleType:
    """A verbatim reference file run as a module, after the blob check."""
    blob(path, want)
    spec = importlib.util.spec_from_loader(name, loader=None)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    module.__dict__["torch"] = torch
    exec(compile(path.read_text(), name, "exec"), module.__dict__)
    return module


def load_methods() -> type:
    """The verbatim ``diffusion.py`` excerpt compiled into a bare class ``BD3LMExcerpt``."""
    path = REFERENCE / "bd3lm_diffusion_loss.py.txt"
    blob(path, EXCERPT_BLOB)
    head, methods = path.read_text().split("\n  def ", 1)
    source = head + "\nclass BD3LMExcerpt:\n  def " + methods
    utils = types.SimpleNamespace(print_nans=lambda tensor, name: None)
    namespace = {"torch": torch, "np": np, "dataclass": dataclasses.dataclass, "utils": utils}
    exec(compile(textwrap.dedent(source), "diffusion.py", "exec"), namespace)
    return namespace["BD3LMExcerpt"]


def make_reference(methods: type, noise: object, logits: torch.Tensor, case: tuple) -> object:
    """An object with the attributes the excerpt reads; it records what it computes."""
    size, eps_min, eps_max, _ = case

    class Reference(methods):  # type: ignore[misc, valid-type]
        def __init__(self) -> None:
            self.mask_index, self.neg_infinity, self.noise = MASK, -1000000.0, noise
            self.antithetic_sampling, self.block_size, self.num_tokens = True, size, L
            self.parameterization, self.T, self.time_conditioning = "subs", 0, False
            self.cross_attn, self.ignore_bos, self.mdlm_loss_scale = True, False, False
            self.training = True
            self.sampling_eps_min = torch.tensor(eps_min)  # bd3lms' register_buffer
            self.sampling_eps_max = torch.tensor(eps_max)
            algo = types.SimpleNamespace(name="bd3lm", backbone="dit")
            self.config = types.SimpleNamespace(
                model=types.SimpleNamespace(length=L),
                training=types.SimpleNamespace(resample=False),
                algo=algo,
            )
            self.record: dict[str, torch.Tensor] = {}

        def backbone(self, x, sigma, store_kv=False, sample_mode=False):  # noqa: ANN001, ANN202
            self.record["backbone_input"] = x
            return logits.clone()

        def _subs_parameterization(self, logits, xt):  # noqa: ANN001, ANN202
            self.record["subs"] = super()._subs_parameterization(logits, xt)
            return self.record["subs"]

        def _sample_t(self, *args, **kwargs):  # noqa: ANN002, ANN003, ANN202
            self.record["t"] = super()._sample_t(*args, **kwargs)
            return self.record["t"]

        def q_xt(self, *args, **kwargs):  # noqa: ANN002, ANN003, ANN202
            self.record["xt"] = super().q_xt(*args, **kwargs)
            return self.record["xt"]

    return Reference()


def run_case(methods: type, noise_module: types.ModuleType, mask_fn: object, name: str) -> dict:
    """One call of BD3-LM's ``_loss`` with autograd; every recorded quantity as float32/int."""
    size, _, _, seed = CASES[name]
    rng = np.random.default_rng(seed)
    x0 = torch.from_numpy(rng.integers(0, MASK, (B, L)).astype(np.int64))
    attention = torch.from_numpy(
        (np.arange(L)[None] < np.array(LENGTHS)[:, None]).astype(np.float32)
    )
    logits = torch.from_numpy(rng.normal(0.0, 2.0, (B, L, V)).astype(np.float32)).requires_grad_()
    reference = make_reference(methods, noise_module.LogLinearNoise(), logits, CASES[name])
    torch.manual_seed(seed)
    loss = reference._loss(x0, attention)
    loss.loss.backward()
    torch.manual_seed(seed)  # replay the two draws: block times, then the masks
    u_time, u_mask = torch.rand((B, L // size)), torch.rand(B, L)
    t = torch.broadcast_to(reference.record["t"].detach(), (B, L))
    xt = reference.record["xt"]
    if not torch.equal(xt == MASK, u_mask <= t):
        sys.exit(f"{name}: the replayed mask draws do not give the recorded x_t")
    if not torch.equal(reference.record["backbone_input"], torch.cat((xt, x0), dim=-1)):
        sys.exit(f"{name}: the backbone was not handed [x_t, x_0]")
    idx = torch.arange(2 * L)
    mask = mask_fn(b=None, h=None, q_idx=idx[:, None], kv_idx=idx[None, :], block_size=size, n=L)
    out = {
        "x0": x0.numpy().astype(np.int32),
        "attention": attention.numpy(),
        "logits": logits.detach().numpy(),
        "u_time": u_time.numpy(),
        "u_mask": u_mask.numpy(),
        "t": t.numpy(),
        "xt": xt.numpy().astype(np.int32),
        "subs": reference.record["subs"].detach().numpy(),
        "nlls": loss.nlls.detach().numpy(),
        "loss": loss.loss.detach().numpy(),
        "grad_logits": logits.grad.numpy(),
        "attention_mask_2L": mask.numpy().astype(np.int32),
    }
    return {k: a if a.dtype == np.int32 else np.asarray(a, np.float32) for k, a in out.items()}


def main() -> None:
    torch.set_num_threads(1)
    blob(REFERENCE / "bd3lm_LICENSE.txt", LICENSE_BLOB)
    noise = load(REFERENCE / "bd3lm_noise_schedule.py.txt", NOISE_BLOB, "noise_schedule")
    dit = load(REFERENCE / "bd3lm_block_diff_mask.py.txt", MASK_BLOB, "dit")
    methods = load_methods()
    fixture = {}
    for name in CASES:
        for key, value in run_case(methods, noise, dit.block_diff_mask, name).items():
            fixture[f"{name}/{key}"] = value
    sidecar = {
        "package": "bd3lms",
        "repository": REPOSITORY,
        "revision": COMMIT,
        "diffusion_blob": DIFFUSION_BLOB,
        "diffusion_lines": DIFFUSION_LINES,
        "excerpt_blob": EXCERPT_BLOB,
        "dit_blob": DIT_BLOB,
        "dit_lines": DIT_LINES,
        "mask_blob": MASK_BLOB,
        "noise_schedule_blob": NOISE_BLOB,
        "licence": "Apache-2.0",
        "torch": torch.__version__,
        "dtype": "float32",
        "shape": [B, L, V],
        "mask_index": MASK,
        "lengths": LENGTHS,
        "cases": {
            k: {"block_size": v[0], "eps_min": v[1], "eps_max": v[2]} for k, v in CASES.items()
        },
        "arrays": sorted(fixture),
    }
    wrote = [
        write_if_changed(OUT / "bd3lm_loss.npz", fixture, None),
        write_if_changed(
            OUT / "bd3lm_loss.json", None, json.dumps(sidecar, indent=2, sort_keys=True) + "\n"
        ),
    ]
    print(f"bd3lm_loss: {sum(wrote)} of 2 files rewritten in {OUT}")


if __name__ == "__main__":
    main()
