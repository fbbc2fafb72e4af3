"""The MDLM and BD3-LM training steps in PyTorch on CPU (reference venv; a JSON-lines worker).

Run by ``bench_diffusion_step.py`` (never by hand)::

    python torch_diffusion_step.py DIRECTORY B L CONFIG_JSON BLOCKS

The model: the reference repositories train a DiT (adaLN blocks, time embedding; the
kuleshov-group code needs flash-attn or a compiled flex_attention for its fast paths), which
is a different network from Dew's decoder. To time the same network on both sides, this
worker builds a random ``transformers`` Qwen3 of the shape in ``CONFIG_JSON`` (tied
embeddings), saves it to ``DIRECTORY`` so that Dew loads the very same weights, and runs its
decoder with torch's ``scaled_dot_product_attention`` (the ``sdpa`` backend) and an explicit
boolean ``[B, 1, T, T]`` mask: all true for MDLM (bidirectional), and BD3-LM's
``block_diff_mask`` on the ``[2L, 2L]`` grid for the two-copy pass, evaluated once per block
size as the DiT's sdpa path does. The decoder's output layer runs on the first ``L`` rows
only (the noised copy), as Dew's does.

The loss around it is the references' own code, kept verbatim under ``tools/reference/`` and
loaded by the parity recorders' helpers (``tools/parity_mdlm.py``: kuleshov-group/mdlm at
``c112c52``; ``tools/parity_bd3lm.py``: kuleshov-group/bd3lms at ``1c3e8f4``), each file
checked against its pinned git blob:

- MDLM: ``_loss`` -> ``_forward_pass_diffusion`` (antithetic ``_sample_t``, log-linear
  ``noise``, ``q_xt``, continuous-time SUBS weight ``dsigma / expm1(sigma)``). MDLM's own
  ``forward`` lies outside the excerpt; its stand-in here calls the decoder on ``x_t`` and
  then the verbatim ``_subs_parameterization``, which is what that ``forward`` does without
  time conditioning.
- BD3-LM: ``_loss`` -> ``_forward_pass_diffusion`` -> the verbatim ``forward`` (SUBS,
  ``cross_attn``: the backbone reads ``[x_t, x_0]`` and returns the noised half), with
  bd3lm.yaml's settings (antithetic block times, ``[1e-3, 1]``, no resampling, no
  ``ignore_bos``, no time conditioning). The backbone is the decoder above with positions
  ``0..L-1`` on both copies.

A step is ``zero_grad``, ``_loss(x0, ones).loss``, ``backward`` and ``torch.optim.AdamW``
(lr 1e-4), timed end to end; each contender owns its copy of the model and optimiser. Ids
are drawn from ``0 .. V-2``; ``V-1`` is the mask id.

Protocol (``WORKER_LOOP`` of ``_rounds.py``): prints ``{"params", "torch", "threads", ...}``
and serves ``{"op": "mdlm" | "bd3lm_<S>", "steps": k}`` -> ``{"step_s": [k floats]}`` and
``{"op": "peak", "reps": n}`` -> ``{"flops_per_s": x}``.
"""

from __future__ import annotations

import json
import sys
import time
import types
from collections.abc import Callable
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))
import parity_bd3lm  # noqa: E402
import parity_mdlm  # noqa: E402
from _rounds import WORKER_LOOP  # noqa: E402

NEG_INFINITY = -1000000.0


class Decoder:
    """A Qwen3 causal-LM module run with an explicit attention mask.

    ``__call__(ids [B, T], mask bool [B, 1, T, T], positions [B, T], keep)`` -> float32
    logits ``[B, keep, V]`` of the first ``keep`` rows (the head skips the rest).
    """

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model

    def __call__(
        self, ids: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor, keep: int
    ) -> torch.Tensor:
        out = self.model.model(input_ids=ids, attention_mask=mask, position_ids=positions)
        return self.model.lm_head(out.last_hidden_state[:, :keep]).float()


def mdlm_reference(decoder: Decoder, length: int, mask_id: int) -> object:
    """MDLM's verbatim excerpt with the attributes it reads and ``decoder`` as its backbone."""
    methods = parity_mdlm.load_methods()
    noise = parity_mdlm.load_noise().LogLinearNoise()

    class Reference(methods):  # type: ignore[misc, valid-type]
        def __init__(self) -> None:
            self.mask_index, self.neg_infinity = mask_id, NEG_INFINITY
            self.antithetic_sampling, self.sampling_eps = True, 1e-3
            self.importance_sampling, self.change_of_variables = False, False
            self.parameterization, self.T, self.noise = "subs", 0, noise
            self.config = types.SimpleNamespace(model=types.SimpleNamespace(length=length))

        def forward(self, x, sigma):  # noqa: ANN001, ANN202
            b, n = x.shape
            full = torch.ones(1, 1, n, n, dtype=torch.bool).expand(b, 1, n, n)
            positions = torch.arange(n).expand(b, n)
            logits = decoder(x, full, positions, n)
            return self._subs_parameterization(logits=logits, xt=x)

    return Reference()


def bd3lm_reference(decoder: Decoder, length: int, mask_id: int, size: int) -> object:
    """BD3-LM's verbatim excerpt (block ``size``) with ``decoder`` as its two-copy backbone."""
    methods = parity_bd3lm.load_methods()
    reference = parity_bd3lm.REFERENCE
    noise = parity_bd3lm.load(
        reference / "bd3lm_noise_schedule.py.txt", parity_bd3lm.NOISE_BLOB, "noise_schedule"
    ).LogLinearNoise()
    dit = parity_bd3lm.load(
        reference / "bd3lm_block_diff_mask.py.txt", parity_bd3lm.MASK_BLOB, "dit"
    )
    idx = torch.arange(2 * length)
    grid = dit.block_diff_mask(
        b=None, h=None, q_idx=idx[:, None], kv_idx=idx[None, :], block_size=size, n=length
    )

    class Reference(methods):  # type: ignore[misc, valid-type]
        def __init__(self) -> None:
            self.mask_index, self.neg_infinity, self.noise = mask_id, NEG_INFINITY, noise
            self.antithetic_sampling, self.block_size, self.num_tokens = True, size, length
            self.parameterization, self.T, self.time_conditioning = "subs", 0, False
            self.cross_attn, self.ignore_bos, self.mdlm_loss_scale = True, False, False
            self.training = True
            self.sampling_eps_min = torch.tensor(1e-3)
            self.sampling_eps_max = torch.tensor(1.0)
            self.config = types.SimpleNamespace(
                model=types.SimpleNamespace(length=length),
                training=types.SimpleNamespace(resample=False),
                algo=types.SimpleNamespace(name="bd3lm", backbone="dit"),
            )

        def backbone(self, x, sigma, store_kv=False, sample_mode=False):  # noqa: ANN001, ANN202
            b, t = x.shape
            positions = torch.arange(length).repeat(2).expand(b, t)
            return decoder(x, grid.expand(b, 1, t, t), positions, length)

    return Reference()


def stepper(reference: object, model: torch.nn.Module, rows: torch.Tensor, batch: int):  # type: ignore[no-untyped-def]
    """``steps(k) -> {"step_s": [...]}``: ``k`` timed AdamW steps of ``reference._loss``."""
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ones = torch.ones(batch, rows.shape[1])
    cursor = [0]
    chunks = rows.shape[0] // batch

    def steps(steps: int) -> dict:
        times = []
        for _ in range(steps):
            i = cursor[0] % chunks
            cursor[0] += 1
            x0 = rows[i * batch : (i + 1) * batch]
            start = time.perf_counter()
            opt.zero_grad(set_to_none=True)
            loss = reference._loss(x0, ones).loss
            loss.backward()
            opt.step()
            times.append(time.perf_counter() - start)
        return {"step_s": times, "loss": float(loss.detach())}

    return steps


def build(directory: str, cfg: dict, length: int) -> torch.nn.Module:
    """A random float32 Qwen3 causal LM of shape ``cfg``, saved to ``directory`` for Dew."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    config = Qwen3Config(
        **cfg,
        max_position_embeddings=max(1024, length),
        tie_word_embeddings=True,
        rope_theta=10000.0,
        attn_implementation="sdpa",
    )
    model = Qwen3ForCausalLM(config).float()
    model.save_pretrained(directory)
    return model


def main() -> None:
    loop: dict = {}
    exec(WORKER_LOOP, loop)
    threads = loop["torch_threads"](torch)
    directory, batch, length = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    cfg, blocks = json.loads(sys.argv[4]), [int(s) for s in sys.argv[5].split(",") if s]
    base = build(directory, cfg, length)
    vocab = cfg["vocab_size"]
    mask_id = vocab - 1
    gen = torch.Generator().manual_seed(1)
    rows = torch.randint(0, mask_id, (batch * 8, length), generator=gen)

    def copy() -> torch.nn.Module:
        model = type(base)(base.config)
        model.load_state_dict(base.state_dict())
        return model.train()

    handlers: dict[str, Callable] = {}
    model = copy()
    handlers["mdlm"] = stepper(mdlm_reference(Decoder(model), length, mask_id), model, rows, batch)
    for size in blocks:
        model = copy()
        reference = bd3lm_reference(Decoder(model), length, mask_id, size)
        handlers[f"bd3lm_{size}"] = stepper(reference, model, rows, batch)
    for handler in handlers.values():
        handler(1)  # one untimed step each: allocator and kernels warm
    handlers["peak"] = lambda reps: loop["torch_matmul_peak"](torch, reps)
    import transformers

    info = {
        "params": sum(p.numel() for p in base.parameters()),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "threads": threads,
        "mdlm_commit": parity_mdlm.COMMIT,
        "bd3lm_commit": parity_bd3lm.COMMIT,
    }
    loop["serve"](handlers, info)


if __name__ == "__main__":
    main()
