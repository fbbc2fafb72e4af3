"""Record MDLM's ancestral sampler and LLaDA's low-confidence remasking as fixtures.

Run it in the shared reference environment (never in Dew's own venv)::

    "$(tools/reference_env.sh | tail -n 1)" tools/parity_canvas.py

References, kept verbatim under ``tools/reference/`` with their licences:

- MDLM, github.com/kuleshov-group/mdlm at ``parity_mdlm.COMMIT`` (Apache-2.0): from
  ``diffusion.py`` (blob ``parity_mdlm.DIFFUSION_BLOB``) lines ``MDLM_LINES`` joined by one
  blank line in ``mdlm_diffusion_sampler.py.txt`` (blob ``MDLM_EXCERPT_BLOB``):
  ``_sample_categorical``, ``_subs_parameterization``, ``_sample_prior``,
  ``_ddpm_caching_update``, ``_ddpm_update`` and ``_sample``; the noise schedule is
  ``noise_schedule.py`` as ``parity_mdlm`` loads it. The methods run in a bare class with
  the attributes they read (SUBS, no time conditioning, noise removal on); ``forward`` is
  the one stand-in: the backbone is ``logits_of`` below, then the verbatim SUBS method.
- LLaDA, github.com/ML-GSAI/LLaDA at ``LLADA_COMMIT`` (MIT; the last commit whose tree
  holds the licence, ``llada_LICENSE.txt``, blob ``LLADA_LICENSE_BLOB``; ``generate.py`` is
  unchanged since): ``generate.py`` whole in ``llada_generate.py.txt`` (blob
  ``LLADA_BLOB``), its ``generate`` called with a stand-in model returning ``logits_of``.

``logits_of(x)``: no network, a fixed function of the canvas: ``table[l] + pair[x[l - 1]]``
(the previous column wrapping around), float32, so the choices depend on what is already
unmasked. Every ``torch.rand_like`` the references call returns the next array of a seeded
numpy stream instead (recorded as ``draws``). Each case records the canvas after each step
(``steps``), the final canvas, ``order`` (the step at which each position was unmasked,
MDLM's noise removal counting as step ``steps``, -1 for the prompt) and ``margin``: the
smallest relative gap between the best and second-best score of a token the sampler drew
and, for LLaDA, ``rank_margin``: the smallest relative gap between the last confidence kept
and the next one, which bound how much float noise the parity test tolerates.

Writes ``tests/fixtures/canvas/canvas.npz`` and ``canvas.json`` only when they change.
"""

from __future__ import annotations

import importlib.util
import json
import sys
import textwrap
import types
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import parity_mdlm  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
REFERENCE = ROOT / "tools" / "reference"
OUT = ROOT / "tests" / "fixtures" / "canvas"
MDLM_LINES = [(24, 28), (261, 277), (588, 637), (657, 698)]
MDLM_EXCERPT_BLOB = "5e948c424af12c301046a43cf91df9a14e2cdb8d"
LLADA_REPOSITORY = "https://github.com/ML-GSAI/LLaDA"
LLADA_COMMIT = "1ef4ead784c310a1855716f3898dc6e29236e180"
LLADA_BLOB = "3f71e513d55df4d9e1e231d1cc12b027016fcf5f"
LLADA_LICENSE_BLOB = "f6802a560469a292d6be29ee29c6dea9829badac"
V = 10
MASK = V - 1
MDLM_CASES = {  # name: (sampler, batch, length, steps, eps, seed)
    "mdlm_ddpm": ("ddpm", 3, 12, 6, 1e-5, 21),
    "mdlm_cache": ("ddpm_cache", 3, 12, 6, 0.25, 22),
}
LLADA_CASES = {  # name: (batch, prompt, gen_length, block_length, steps, temperature, seed)
    "llada_blocks": (2, 3, 8, 4, 4, 0.7, 31),
    "llada_greedy": (2, 2, 6, 6, 3, 0.0, 32),
}


class DrawStream:
    """A ``torch`` stand-in whose ``rand_like`` hands out seeded numpy draws, recorded."""

    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.draws: list[np.ndarray] = []
        self.gaps: list[float] = []

    def __getattr__(self, name: str) -> object:
        return getattr(torch, name)

    def topk(self, values: torch.Tensor, k: object) -> object:
        """LLaDA's choice of the k most confident positions; records the relative gap between
        the k-th and the next finite confidence."""
        top = torch.sort(values.to(torch.float64), descending=True).values
        n = int(k)  # type: ignore[call-overload]
        if n and n < top.numel() and torch.isfinite(top[n]):
            self.gaps.append(float((top[n - 1] - top[n]) / top[n - 1]))
        return torch.topk(values, k=k)

    def rand_like(self, like: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
        dtype = like.dtype if dtype is None else dtype
        u = self.rng.random(tuple(like.shape))
        u = u.astype(np.float64 if dtype == torch.float64 else np.float32)
        self.draws.append(u)
        return torch.from_numpy(u.copy())


def logit_tables(seed: int, width: int) -> tuple[np.ndarray, np.ndarray]:
    """``(table [width, V], pair [V, V])`` float32; the mask id's logit is -30 + 0."""
    rng = np.random.default_rng(seed + 1000)
    table = rng.normal(0.0, 2.0, (width, V)).astype(np.float32)
    pair = rng.normal(0.0, 1.5, (V, V)).astype(np.float32)
    table[:, MASK], pair[:, MASK] = -30.0, 0.0
    return table, pair


def logits_of(x: torch.Tensor, table: np.ndarray, pair: np.ndarray) -> torch.Tensor:
    """float32 ``[B, W, V]``: ``table[l] + pair[x[:, l - 1]]`` (column -1 wraps)."""
    prev = torch.roll(x, 1, dims=1)
    return torch.from_numpy(table)[None] + torch.from_numpy(pair)[prev]


def order_of(steps: list[np.ndarray], start: np.ndarray) -> np.ndarray:
    """int32 ``[B, W]``: the first step whose canvas no longer holds the mask id there."""
    order = np.full(start.shape, -1, np.int32)
    before = start
    for i, x in enumerate(steps):
        newly = (before == MASK) & (x != MASK)
        order[newly] = i
        before = x
    return order


def load_mdlm(stream: DrawStream) -> type:
    path = REFERENCE / "mdlm_diffusion_sampler.py.txt"
    parity_mdlm.blob(path, MDLM_EXCERPT_BLOB)
    head, methods = path.read_text().split("\n  def ", 1)
    source = head + "\nclass MDLMSampler:\n  def " + methods
    namespace = {"torch": stream, "np": np}
    exec(compile(textwrap.dedent(source), "diffusion.py", "exec"), namespace)
    race = namespace["_sample_categorical"]

    def recorded(probs):  # noqa: ANN001, ANN202
        stream.scores = getattr(stream, "scores", []) + [probs.clone()]
        return race(probs)

    namespace["_sample_categorical"] = recorded
    return namespace["MDLMSampler"]


def mdlm_case(name: str) -> dict[str, np.ndarray]:
    sampler, batch, length, steps, eps, seed = MDLM_CASES[name]
    stream = DrawStream(seed)
    table, pair = logit_tables(seed, length)
    noise = parity_mdlm.load_noise().LogLinearNoise()
    record: list[np.ndarray] = []

    class Reference(load_mdlm(stream)):  # type: ignore[misc]
        mask_index, neg_infinity, device, time_conditioning = MASK, -1000000.0, "cpu", False
        parameterization, sampler = "subs", MDLM_CASES[name][0]
        config = types.SimpleNamespace(
            loader=types.SimpleNamespace(eval_batch_size=batch),
            model=types.SimpleNamespace(length=length),
            sampling=types.SimpleNamespace(steps=steps, noise_removal=True),
            noise=types.SimpleNamespace(type="loglinear"),
        )
        noise = None
        calls = 0

        def forward(self, x, sigma):  # noqa: ANN001, ANN202
            self.calls += 1
            return self._subs_parameterization(logits_of(x, table, pair), x)

        def _ddpm_update(self, x, t, dt):  # noqa: ANN001, ANN202
            out = super()._ddpm_update(x, t, dt)
            record.append(out.numpy().copy())
            return out

        def _ddpm_caching_update(self, x, t, dt, p_x0=None):  # noqa: ANN001, ANN202
            p, out = super()._ddpm_caching_update(x, t, dt, p_x0=p_x0)
            record.append(out.numpy().copy())
            return p, out

    reference = Reference()
    reference.noise = noise
    with torch.no_grad():
        final = reference._sample(num_steps=steps, eps=eps).numpy()
    start = np.full((batch, length), MASK, np.int64)
    margins = [race_margin(p.numpy(), u) for p, u in zip(stream.scores, stream.draws)]
    return {
        "draws": np.stack(stream.draws).astype(np.float32),
        "table": table,
        "pair": pair,
        "final": final.astype(np.int32),
        "order": order_of([*record, final], start),
        "margin": np.float64(min(margins)),
        "forwards": np.int32(reference.calls),
    }


def race_margin(probs: np.ndarray, uniforms: np.ndarray) -> float:
    """Smallest relative gap between the two best scores of MDLM's race (masked rows)."""
    score = probs.astype(np.float64) / (1e-10 - np.log(uniforms.astype(np.float64) + 1e-10))
    top = np.sort(score, axis=-1)[..., -2:]
    return float(np.min((top[..., 1] - top[..., 0]) / top[..., 1]))


def load_llada(stream: DrawStream) -> types.ModuleType:
    path = REFERENCE / "llada_generate.py.txt"
    parity_mdlm.blob(path, LLADA_BLOB)
    spec = importlib.util.spec_from_loader("llada_generate", loader=None)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    exec(compile(path.read_text(), "generate.py", "exec"), module.__dict__)
    module.torch = stream  # the rand_like draws; everything else is torch
    return module


def llada_case(name: str) -> dict[str, np.ndarray]:
    batch, prompt_len, gen, block, steps, temperature, seed = LLADA_CASES[name]
    stream = DrawStream(seed)
    width = prompt_len + gen
    table, pair = logit_tables(seed, width)
    prompt = np.random.default_rng(seed).integers(0, MASK, (batch, prompt_len))
    record: list[np.ndarray] = []
    gaps: list[float] = []

    class Model:
        device = "cpu"

        def __call__(self, x, attention_mask=None):  # noqa: ANN001, ANN204
            record.append(x.numpy().copy())
            return types.SimpleNamespace(logits=logits_of(x, table, pair))

    module = load_llada(stream)
    noisy = module.add_gumbel_noise

    def recorded(logits, temperature):  # noqa: ANN001, ANN202
        out = noisy(logits, temperature)
        top = torch.topk(out.to(torch.float64), 2, dim=-1).values
        gaps.append(float(((top[..., 0] - top[..., 1]) / top[..., 0].abs()).min()))
        return out

    module.add_gumbel_noise = recorded
    final = module.generate(Model(), torch.from_numpy(prompt), steps=steps, gen_length=gen,
                            block_length=block, temperature=temperature,
                            remasking="low_confidence", mask_id=MASK).numpy()  # fmt: skip
    start = np.concatenate([prompt, np.full((batch, gen), MASK)], axis=1)
    draws = np.stack(stream.draws) if stream.draws else np.zeros((0, batch, width, V))
    return {
        "draws": draws.astype(np.float64),
        "table": table,
        "pair": pair,
        "prompt": prompt.astype(np.int32),
        "final": final.astype(np.int32),
        "order": order_of([*record[1:], final], start),
        "margin": np.float64(min(gaps)),
        "rank_margin": np.float64(min(stream.gaps)),
    }


def main() -> None:
    torch.set_num_threads(1)
    parity_mdlm.blob(REFERENCE / "mdlm_LICENSE.txt", parity_mdlm.LICENSE_BLOB)
    parity_mdlm.blob(REFERENCE / "llada_LICENSE.txt", LLADA_LICENSE_BLOB)
    fixture: dict[str, np.ndarray] = {}
    for name in MDLM_CASES:
        fixture.update({f"{name}/{k}": np.asarray(a) for k, a in mdlm_case(name).items()})
    for name in LLADA_CASES:
        fixture.update({f"{name}/{k}": np.asarray(a) for k, a in llada_case(name).items()})
    sidecar = {
        "mdlm": {
            "repository": parity_mdlm.REPOSITORY,
            "revision": parity_mdlm.COMMIT,
            "diffusion_blob": parity_mdlm.DIFFUSION_BLOB,
            "lines": MDLM_LINES,
            "excerpt_blob": MDLM_EXCERPT_BLOB,
            "licence": "Apache-2.0",
            "cases": MDLM_CASES,
        },
        "llada": {
            "repository": LLADA_REPOSITORY,
            "revision": LLADA_COMMIT,
            "generate_blob": LLADA_BLOB,
            "licence": "MIT",
            "licence_blob": LLADA_LICENSE_BLOB,
            "cases": LLADA_CASES,
        },
        "torch": torch.__version__,
        "vocab": V,
        "mask_id": MASK,
        "arrays": sorted(fixture),
    }
    text = json.dumps(sidecar, indent=2, sort_keys=True) + "\n"
    wrote = [
        parity_mdlm.write_if_changed(OUT / "canvas.npz", fixture, None),
        parity_mdlm.write_if_changed(OUT / "canvas.json", None, text),
    ]
    print(f"canvas: {sum(wrote)} of 2 files rewritten in {OUT}")
    for name in [*MDLM_CASES, *LLADA_CASES]:
        ranks = fixture.get(f"{name}/rank_margin")
        extra = "" if ranks is None else f", confidence ranking {float(ranks):.3g}"
        print(
            f"{name}: smallest margin of a token draw {float(fixture[f'{name}/margin']):.3g}{extra}"
        )


if __name__ == "__main__":
    main()
