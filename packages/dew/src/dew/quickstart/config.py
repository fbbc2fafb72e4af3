"""The quickstart's settings: model sizes, stage steps and learning rates.

``Settings.for_size(size, steps=..., seed=...)`` gives the preset of a size scaled by
``steps`` (every stage's step count is multiplied and rounded, at least 2 steps each).

The ``small`` preset (a 2-layer, 64-wide decoder, about 148k parameters; 600 SFT, 120 DPO and
200 GRPO steps; 1000 held-out problems) is the default; ``medium`` is the same decoder with
900 SFT steps. ``tiny`` only exercises the machinery (tests); it learns little. Measured
results, with the machine they came from, are in the README.

Why the stages look the way they do. XLA emits different CPU code for AVX2, AVX-512 and
AMX machines, and the rounding follows the code, so after a few hundred optimizer steps two
kinds of CPU hold different models for the same seed. Each stage must therefore lift held-out
accuracy by design, by a margin far above the noise, not by a tuning that happened to work on
one machine. The design gives each stage its own mistake to remove:

* SFT learns from a careless tutor (``sft_slip_rate = 0.7``, ``Problem.careless``): seven
  in ten of the additions whose result reaches 100 are boxed without their hundreds digit,
  and seven in ten of the subtractions that borrow from the tens column forget the borrow.
  Everything else is worked right. SFT trains long enough (600 steps) to learn the digits
  completely, so the policy it leaves is the tutor's: greedy decoding takes the majority
  habit and gets those two kinds of problem wrong (about 0.33 and 0.13 of the held-out
  set), while sampling still finds the right answer three times in ten. The earlier design
  stopped SFT half-way up its learning curve, where seeds ended anywhere between 0.13 and
  0.95 depending on the CPU kind; a converged SFT lands on 0.54-0.59 on every seed.
* DPO is RPO (Pang et al. 2024): the sigmoid preference loss at ``dpo_beta = 0.01`` plus the
  chosen answers' token-mean NLL at weight ``dpo_nll_weight = 1``, on ``dpo_problems =
  2048`` training questions drawn from the additions only (``dpo_operators = "+"``, a
  preference set that covers part of the task, as collected ones do). The pairs are the
  policy's own wrong answers against the right id where they part (on-policy), plus an
  anchor pair (worked answer against a typical slip) for each drawn question it got right.
  It removes the dropped hundreds; the forgotten borrow is left. (With the preference term
  carrying the update, beta 0.1-1, the old design lowered accuracy; the NLL carrying it with
  a small preference term lifts.) Its rate stays at 3e-5 with no warm-up.
* GRPO's reward checks every question, subtractions included. Sampling at ``grpo_temperature
  = 0.3`` the policy still writes the borrow now and then, the exact-answer reward prefers
  those samples within their group, and the habit turns over; what DPO disturbed in the
  other subtractions comes back on the way. Its rate warms up over ``grpo_warmup`` steps:
  the full first step of a fresh Adam dropped the sampled reward from 0.32 to 0.08 in an
  earlier design and it never recovered.

Measured results (each lift at least nine standard errors, on every seed and code path tried)
and the machine they came from are in the README and the getting-started guide.
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
    sft_slip_rate: the share of the problems with a careless answer (``Problem.careless``)
    whose SFT demonstration is that careless answer.
    dpo_batch: pairs per step. grpo_prompts: prompts per GRPO step; grpo_groups: samples each.
    *_lr: peak learning rates (SFT warms up and decays with a cosine; DPO is flat).
    grpo_warmup: GRPO (and ``code``) rises linearly from 0 over this many steps, then stays flat.
    code: add the ``--code`` stage (code questions join the SFT data, then GRPO with
    ``CodeReward``); code_steps: its GRPO steps; code_held_out: held-out code questions.
    lora_rank: 0 trains every weight in every stage; above 0 (``--lora``) the stages after
    SFT (DPO, GRPO, code) each train a LoRA adapter of this rank on every projection of
    the model they start from and hand on the merged weights. SFT trains every weight
    either way: the model starts from random weights, which an adapter has nothing to
    adapt. lora_alpha: the adapters' alpha. lora_lr_scale: the adapter stages' learning
    rates are ``dpo_lr`` and ``grpo_lr`` times this (an adapter moves far fewer weights and
    starts from ``B = 0``, so it takes larger steps, as PEFT recipes do).
    dpo_problems: training questions the SFT policy answers to find its mistakes;
    dpo_samples: sampled answers per question besides the greedy one, at dpo_temperature.
    dpo_max_margin: a pair is kept when the starting policy prefers the right id by less
    than this many nats (or prefers the wrong one).
    dpo_operators: the operators of the questions DPO draws (``"+"``, ``"-"`` or ``"+-"``).
    checkpoint_every: steps between checkpoints inside a stage (a killed run resumes there).
    dpo_beta: DPO's preference scale. dpo_nll_weight: RPO's weight of the chosen answers'
    token-mean NLL (see the module docstring for why DPO is RPO here). grpo_temperature: sampling temperature of the rollouts
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
    sft_slip_rate: float = 0.7
    dpo_batch: int = 32
    dpo_problems: int = 2048
    dpo_samples: int = 2
    dpo_temperature: float = 1.0
    dpo_lr: float = 3e-5
    dpo_beta: float = 0.01
    dpo_nll_weight: float = 1.0
    dpo_max_margin: float = 1.0
    dpo_operators: str = "+"
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
    lora_rank: int = 0
    lora_alpha: float = 16.0
    lora_lr_scale: float = 10.0

    def __post_init__(self) -> None:
        if not 0.0 <= self.sft_slip_rate <= 1.0:
            raise ValueError(
                f"sft_slip_rate: expected a share in [0, 1], got {self.sft_slip_rate!r}"
            )
        if not self.dpo_operators or set(self.dpo_operators) - {"+", "-"}:
            raise ValueError(
                f"dpo_operators: expected '+', '-' or '+-', got {self.dpo_operators!r}"
            )

    @classmethod
    def for_size(
        cls, size: str, steps: float = 1.0, seed: int = 0, code: bool = False, lora: bool = False
    ) -> Settings:
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
                limit=100, held_out=1000, emb_features=64, num_layers=2, num_heads=4,
                mlp_features=256, sft_steps=600, dpo_steps=120, grpo_steps=200,
            )  # fmt: skip
        else:
            base = dict(
                limit=100, held_out=1000, emb_features=64, num_layers=2, num_heads=4,
                mlp_features=256, sft_steps=900, dpo_steps=120, grpo_steps=200,
            )  # fmt: skip
        base.setdefault("code_steps", cls.code_steps)
        for name in ("sft_steps", "dpo_steps", "grpo_steps", "code_steps"):
            base[name] = max(2, int(round(base[name] * steps)))
        if lora:
            base["lora_rank"] = 8
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
        if self.lora_rank:
            rate *= self.lora_lr_scale
        warmup = min(self.grpo_warmup, steps - 1) if stage != "dpo" else 0
        return build_optimizer(
            OptimizerConfig(name="adam", learning_rate=rate, clip=0.0),
            ScheduleConfig(kind="constant", warmup_steps=warmup),
            steps=steps,
        )

    def lora(self, stage: str) -> Any:
        """The ``LoraConfig`` of ``stage`` (every projection), or None when it trains every
        weight: always for SFT, and for every stage without ``--lora``."""
        if not self.lora_rank or stage == "sft":
            return None
        from dew.models.lora import PROJECTIONS, LoraConfig

        return LoraConfig(rank=self.lora_rank, alpha=self.lora_alpha, targets=PROJECTIONS)

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)
