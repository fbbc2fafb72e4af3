"""The same Flow-GRPO step as bench_flow.py in plain PyTorch (reference venv; a JSON-lines worker).

The model mirrors ``dew.flow.SimpleDiT`` layer for layer (patch convolution, learned
positions, sinusoidal time embedding, adaLN-zero blocks with multi-head self-attention and a
tanh-GELU MLP, zero-initialised final layer, a label embedding added to the time embedding).
The step follows Flow-GRPO's ``scripts/train_sd3.py`` (commit ``ac4c86e``): sampling with the
released ``sde_step_with_logprob`` under ``torch.no_grad`` collecting latents and log-probs,
the reward, per-group advantages (population std, eps 1e-4, clamp 5), then one pass over the
timesteps computing ``compute_log_prob`` per timestep, the clipped surrogate (clip 1e-4), a
backward per timestep (gradients accumulate) and one clipped (norm 1) AdamW step.

Protocol: prints ``{"torch": version, "threads": n}``; then reads ``{"time": k}`` and answers
``{"sampling_s": [...], "rewards_s": [...], "update_s": [...]}`` for ``k`` steps, until
``{"quit": true}``. Usage: python torch_flow_step.py CONFIG_JSON
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from parity_flow import _Scheduler, grid, load_reference  # noqa: E402


def timestep_embedding(t: torch.Tensor, features: int) -> torch.Tensor:
    half = features // 2
    freqs = torch.exp(-math.log(10000.0) * torch.arange(half, dtype=torch.float32) / half)
    args = 1000.0 * t[:, None] * freqs[None]
    return torch.cat([torch.cos(args), torch.sin(args)], dim=-1)


class Block(nn.Module):
    def __init__(self, e: int, heads: int, mlp_ratio: float) -> None:
        super().__init__()
        self.adaln = nn.Linear(e, 6 * e)
        nn.init.zeros_(self.adaln.weight)
        nn.init.zeros_(self.adaln.bias)
        self.norm1 = nn.LayerNorm(e, elementwise_affine=False, eps=1e-6)
        self.attn = nn.MultiheadAttention(e, heads, batch_first=True)
        self.norm2 = nn.LayerNorm(e, elementwise_affine=False, eps=1e-6)
        hidden = int(round(e * mlp_ratio))
        self.mlp = nn.Sequential(nn.Linear(e, hidden), nn.GELU("tanh"), nn.Linear(hidden, e))

    def forward(self, x: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        s1, sc1, g1, s2, sc2, g2 = self.adaln(nn.functional.silu(c)).chunk(6, dim=-1)
        h = self.norm1(x) * (1 + sc1[:, None]) + s1[:, None]
        x = x + g1[:, None] * self.attn(h, h, h, need_weights=False)[0]
        h = self.norm2(x) * (1 + sc2[:, None]) + s2[:, None]
        return x + g2[:, None] * self.mlp(h)


class DiT(nn.Module):
    def __init__(self, cfg: dict) -> None:
        super().__init__()
        e, p, c = cfg["emb_features"], cfg["patch_size"], cfg["channels"]
        self.e, self.p, self.c = e, p, c
        tokens = (cfg["size"] // p) ** 2
        self.patches = nn.Conv2d(c, e, p, stride=p)
        self.position = nn.Parameter(torch.randn(1, tokens, e) * 0.02)
        self.time_in, self.time_out = nn.Linear(e, e), nn.Linear(e, e)
        self.label = nn.Embedding(cfg["labels"], e)
        self.condition = nn.Linear(e, e)
        self.blocks = nn.ModuleList(
            Block(e, cfg["num_heads"], cfg["mlp_ratio"]) for _ in range(cfg["num_layers"])
        )
        self.final_adaln = nn.Linear(e, 2 * e)
        self.final_norm = nn.LayerNorm(e, elementwise_affine=False, eps=1e-6)
        self.final = nn.Linear(e, p * p * c)
        for layer in (self.final_adaln, self.final):
            nn.init.zeros_(layer.weight)
            nn.init.zeros_(layer.bias)

    def forward(self, x: torch.Tensor, t: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        b, _, hgt, wid = x.shape
        h = self.patches(x).flatten(2).transpose(1, 2) + self.position
        c = self.time_out(nn.functional.silu(self.time_in(timestep_embedding(t, self.e))))
        c = c + self.condition(self.label(labels))
        for block in self.blocks:
            h = block(h, c)
        shift, scale = self.final_adaln(nn.functional.silu(c)).chunk(2, dim=-1)
        h = self.final(self.final_norm(h) * (1 + scale[:, None]) + shift[:, None])
        gh, gw, p = hgt // self.p, wid // self.p, self.p
        h = h.reshape(b, gh, gw, p, p, self.c).permute(0, 5, 1, 3, 2, 4)
        return h.reshape(b, self.c, hgt, wid)


def red_share(images: torch.Tensor) -> torch.Tensor:
    """The example's reward: share of pixels within 0.5 of red in every channel (float64)."""
    target = torch.tensor([230, 40, 40], dtype=torch.float64) / 127.5 - 1.0
    x = images.double().permute(0, 2, 3, 1)
    close = ((x - target).abs() <= 0.5).all(dim=-1)
    return close.flatten(1).double().mean(dim=1)


def main() -> None:
    cfg = json.loads(Path(sys.argv[1]).read_text())
    threads = cfg.get("threads") or int(os.environ.get("DEW_BENCH_THREADS", "0"))
    if threads:
        torch.set_num_threads(threads)
    torch.manual_seed(0)
    step_fn = load_reference()
    model = DiT(cfg)
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg["lr"], weight_decay=0.0)
    sched = _Scheduler(torch.from_numpy(grid(cfg["steps"], 1.0)))
    n, g = cfg["rows"] * cfg["groups"], cfg["groups"]
    labels = torch.arange(cfg["rows"]).repeat_interleave(g) % cfg["labels"]
    shape = (n, cfg["channels"], cfg["size"], cfg["size"])
    clip, adv_max = 1e-4, 5.0
    print(json.dumps({"torch": torch.__version__, "threads": torch.get_num_threads()}), flush=True)
    for line in sys.stdin:
        cmd = json.loads(line)
        if cmd.get("quit") or cmd.get("op") == "quit":
            break
        out: dict[str, list[float]] = {"sampling_s": [], "rewards_s": [], "update_s": []}
        for _ in range(int(cmd["time"])):
            start = time.perf_counter()
            model.eval()
            with torch.no_grad():
                latents = torch.randn(shape)
                all_latents, all_log_probs, all_t = [latents], [], []
                for i in range(cfg["steps"] - 1):
                    t = sched.timesteps[i].expand(n)
                    v = model(latents, t / 1000.0, labels)
                    latents, log_prob, _, _ = step_fn(sched, v, t, latents, noise_level=0.7)
                    all_latents.append(latents)
                    all_log_probs.append(log_prob)
                    all_t.append(t)
            out["sampling_s"].append(time.perf_counter() - start)
            start = time.perf_counter()
            rewards = red_share(latents.clamp(-1, 1)).reshape(-1, g)
            adv = (rewards - rewards.mean(1, keepdim=True)) / (
                rewards.std(1, keepdim=True, unbiased=False) + 1e-4
            )
            advantages = adv.reshape(-1).float()
            out["rewards_s"].append(time.perf_counter() - start)
            start = time.perf_counter()
            model.train()
            optimizer.zero_grad()
            train = cfg["steps"] - 1
            for j in range(train):
                v = model(all_latents[j], all_t[j] / 1000.0, labels)
                _, log_prob, _, _ = step_fn(
                    sched,
                    v,
                    all_t[j],
                    all_latents[j],
                    noise_level=0.7,
                    prev_sample=all_latents[j + 1],
                )
                a = torch.clamp(advantages, -adv_max, adv_max)
                ratio = torch.exp(log_prob - all_log_probs[j])
                loss = torch.mean(
                    torch.maximum(-a * ratio, -a * torch.clamp(ratio, 1 - clip, 1 + clip))
                )
                (loss / train).backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            out["update_s"].append(time.perf_counter() - start)
        print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
