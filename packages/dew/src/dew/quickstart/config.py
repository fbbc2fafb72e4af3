"""The quickstart's settings: model sizes, stage steps and learning rates.

``Settings.for_size(size, steps=..., seed=...)`` gives the preset of a size scaled by
``steps`` (every stage's step count is multiplied and rounded, at least 2 steps each).

The ``small`` preset (a 2-layer, 64-wide decoder, about 148k parameters; 350 SFT, 40 DPO and
200 GRPO steps) is the default; ``medium`` is the same decoder with 500 SFT and 200 GRPO
steps, meant to pass 0.9 held-out accuracy; with 1000 SFT steps seed 0 solved every held-out
problem after SFT, and DPO then found no mistake to learn from in its 1024 questions
(answered greedily and twice by sampling).
Measured results are in the README.

What the tuning found (seed 0, on two CPU cores shared by eight agents): the worked column
format generalises (memorised results did not). GRPO samples at a low temperature (0.3, the
objective scoring at the same temperature); at 0.7-1.0 its updates pushed greedy accuracy
down while the sampled reward barely moved, and a learning rate of 1e-4 gained no more than
5e-5. DPO needs its pairs on-policy and anchored: scoring only the parting ids (the wrong id
against the right one) collapsed held-out accuracy at every learning rate that moved it
(0.735 to 0.64 at 1e-5, 0.44 at 3e-5), while scoring the whole right answer against the wrong
id lifted it (0.735 to 0.755 at 3e-5, beta 1.0; 1e-5 left it unchanged, 1e-4 dropped it to
0.64). Keeping only the pairs the policy ranks wrong (margin below 0) dropped it to 0.67; the
pairs it ranks right by less than one nat are kept (``dpo_max_margin``) and steady the
update. ``tiny`` only exercises the machinery (tests); it learns little.

What the GRPO tuning found (seed 1, from the DPO policy at 0.46 held-out, 150 steps): the
gradient points the right way (a small step raises the sampled right answers' likelihood and
lowers the wrong ones'), and random perturbations of every weight by 3e-4 leave accuracy in
place, but one Adam step of 3e-4 along the gradient's sign drops the sampled reward from 0.32
to 0.08 and it never recovers (also with Adam's epsilon at 1e-3, and at 2e-4 after a 20-step
warm-up). A fresh Adam's first step moves every weight by the full rate, so GRPO warms up
over ``grpo_warmup`` steps. Plain SGD (1e-3, momentum 0.9), scoring at temperature 1 while
sampling at 0.3, and dropping negative advantages all left held-out accuracy at 0.38-0.44.
GRPO from the SFT policy instead (DPO skipped) lifted the same seed 0.335 to 0.50: DPO and
GRPO fix the same mistakes, so the longer DPO runs the less GRPO finds. Halving DPO to 20
steps left GRPO more (seed 2: 0.65 to 0.785) but DPO itself then lowered seed 2 (0.67 to
0.65), so DPO keeps 40 steps and GRPO gets 200 warmed-up steps instead of 150 (seed 1: 0.46
to 0.51; seed 0: 0.695 to 0.755). SFT sits on a cliff around these step counts: 500 SFT steps
put seed 1 at 0.96 held-out, where DPO then dropped it to 0.875, so the default stops SFT at
350 steps and leaves the later stages mistakes to fix.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from dew.recipes.builder import (
    ModelConfig,
    OptimizerConfig,
    ScheduleConfig,
    build_optimizer,
)

SIZES = ("tiny", "small", "medium")


@dataclasses.dataclass(frozen=True)
class Settings:
    """Everything one quickstart run depends on (written to ``RUN_DIR/config.json``).

    limit: operands lie in ``[0, limit)``; held_out: held-out problems.
    emb_features, num_layers, num_heads, mlp_features: the decoder's shape.
    sft_steps, dpo_steps, grpo_steps: optimizer steps per stage.
    sft_batch: packed SFT rows per step (``sft_seq_len + 1`` tokens each).
    dpo_batch: pairs per step. grpo_prompts: prompts per GRPO step; grpo_groups: samples each.
    *_lr: peak learning rates (SFT warms up and decays with a cosine; DPO is flat).
    grpo_warmup: GRPO (and ``code``) rises linearly from 0 over this many steps, then stays flat.
    code: add the ``--code`` stage (code questions join the SFT data, then GRPO with
    ``CodeReward``); code_steps: its GRPO steps; code_held_out: held-out code questions.
    dpo_problems: training questions the SFT policy answers to find its mistakes;
    dpo_samples: sampled answers per question besides the greedy one, at dpo_temperature.
    dpo_max_margin: a pair is kept when the starting policy prefers the right id by less
    than this many nats (or prefers the wrong one).
    checkpoint_every: steps between checkpoints inside a stage (a killed run resumes there).
    dpo_beta: DPO's preference scale. grpo_temperature: sampling temperature of the rollouts
    (the objective scores at the same temperature). max_new_tokens: response budget.
    """

    size: str
    seed: int
    limit: int
    held_out: int
    emb_features: int
    num_layers: int
    num_heads: int
    mlp_features: int
    sft_steps: int
    dpo_steps: int
    grpo_steps: int
    sft_batch: int = 32
    sft_seq_len: int = 63
    sft_lr: float = 3e-3
    dpo_batch: int = 32
    dpo_problems: int = 1024
    dpo_samples: int = 2
    dpo_temperature: float = 1.0
    dpo_lr: float = 3e-5
    dpo_beta: float = 1.0
    dpo_max_margin: float = 1.0
    grpo_prompts: int = 32
    grpo_groups: int = 8
    grpo_lr: float = 5e-5
    grpo_warmup: int = 10
    grpo_temperature: float = 0.3
    max_new_tokens: int = 24
    log_every: int = 5
    checkpoint_every: int = 50
    code: bool = False
    code_steps: int = 10
    code_held_out: int = 64

    @classmethod
    def for_size(cls, size: str, steps: float = 1.0, seed: int = 0, code: bool = False) -> Settings:
        if size not in SIZES:
            raise ValueError(f"size: expected one of {SIZES}, got {size!r}")
        if not steps > 0:
            raise ValueError(f"steps: expected a positive scale, got {steps!r}")
        if size == "tiny":
            base: dict[str, Any] = dict(
                limit=20, held_out=32, emb_features=32, num_layers=1, num_heads=2,
                mlp_features=64, sft_steps=40, dpo_steps=10, grpo_steps=10, sft_batch=8,
                dpo_batch=8, dpo_problems=64, grpo_prompts=4, grpo_groups=4, log_every=2,
                code_steps=4, code_held_out=8, checkpoint_every=2,
            )  # fmt: skip
        elif size == "small":
            base = dict(
                limit=100, held_out=200, emb_features=64, num_layers=2, num_heads=4,
                mlp_features=256, sft_steps=350, dpo_steps=40, grpo_steps=200,
            )  # fmt: skip
        else:
            base = dict(
                limit=100, held_out=200, emb_features=64, num_layers=2, num_heads=4,
                mlp_features=256, sft_steps=500, dpo_steps=40, grpo_steps=200,
            )  # fmt: skip
        base.setdefault("code_steps", cls.code_steps)
        for name in ("sft_steps", "dpo_steps", "grpo_steps", "code_steps"):
            base[name] = max(2, int(round(base[name] * steps)))
        return cls(size=size, seed=seed, code=code, **base)

    def model_config(self) -> ModelConfig:
        """The decoder for ``dew.recipes.builder.build_model`` (vocabulary and width come
        from the tokenizer and the rows)."""
        return ModelConfig(
            name="causal_transformer",
            emb_features=self.emb_features,
            num_layers=self.num_layers,
            num_heads=self.num_heads,
            mlp_features=self.mlp_features,
        )

    def optimizer(self, stage: str) -> Any:
        """The optax transformation of a stage, built by ``dew.recipes.builder``.

        SFT: AdamW (weight decay 0.01) warming up over the first fifteenth of its steps, then
        a cosine down to a tenth of ``sft_lr``. DPO: Adam at a constant rate;
        GRPO: Adam warming up linearly over ``grpo_warmup`` steps, then constant. No
        gradient clipping.
        """
        steps = getattr(self, f"{stage}_steps")
        if stage == "sft":
            return build_optimizer(
                OptimizerConfig(
                    name="adamw", learning_rate=self.sft_lr, weight_decay=0.01, clip=0.0
                ),
                ScheduleConfig(kind="cosine", warmup_steps=max(1, steps // 15), end_fraction=0.1),
                steps=steps,
            )
        rate = {"dpo": self.dpo_lr, "grpo": self.grpo_lr, "code": self.grpo_lr}[stage]
        warmup = min(self.grpo_warmup, steps - 1) if stage != "dpo" else 0
        return build_optimizer(
            OptimizerConfig(name="adam", learning_rate=rate, clip=0.0),
            ScheduleConfig(kind="constant", warmup_steps=warmup),
            steps=steps,
        )

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)
