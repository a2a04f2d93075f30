"""The step oracle's plan: which settings each case trains with, the fixed rollout, the tolerances.

A step case is an accepted case's lowered `ReferenceTrainerConfig` with its shape scaled to a
CPU (`SHAPE`): a few prompts, `rollout.n = 2`, mini-batches of 2 prompts (so ≥ 2 optimizer
steps per epoch), micro-batches of 2 trajectories (≥ 2 per mini-batch) and 2 epochs. Every
algorithmic setting (estimator, loss aggregation, clip ratios, KL terms, LoRA rank/alpha, ...)
is the case's own. Both sides get the same settings, as plain JSON, and the same rollout
(`fixed_rollout`): prompts, responses and scores drawn once from a seed.

Two optimizer variants run per case (`VARIANTS`): `sgd` (SGD, tight: rounding stays linear)
and `adamw` (the case's AdamW, betas and weight decay; looser, because Adam's first steps are
≈ lr·sign(g) and amplify rounding in near-zero gradients). Tolerances are data, in
`corpus/step.yaml`. This module imports neither torch nor verl.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from reference_trainer.config import OptimConfig, ReferenceTrainerConfig

# The small shape every case is scaled to.
SHAPE = {
    "prompts": 4,
    "n": 2,
    "ppo_mini_batch_size": 2,  # prompts: 4 trajectories, 2 optimizer steps per epoch
    "micro_batch_size": 2,  # trajectories: 2 micro-batches per mini-batch
    "ppo_epochs": 2,
}
RESPONSE_LENGTH = 6
# Learning rates of the comparison: large enough that a wrong gradient shows in the weights.
LEARNING_RATES = {"sgd": 1.0e-2, "adamw": 1.0e-3}
VARIANTS = ("sgd", "adamw")
# The seeded offset added to the reference log-probs on both sides: at step 1 the reference
# policy equals the policy, which would make every KL term (and its gradient) exactly zero.
REF_OFFSET_SCALE = 0.3

QUANTITIES = (
    "old_log_probs",
    "entropy",
    "ref_log_prob",
    "values",
    "token_level_rewards",
    "advantages",
    "returns",
    "metrics",
    "actor",
    "critic",
)


@dataclass(frozen=True)
class StepTolerance:
    atol: float
    rtol: float


def default_tolerance_path() -> Path:
    return Path(__file__).resolve().parents[2] / "corpus" / "step.yaml"


def load_step_tolerances(path: Path | None = None) -> dict[str, dict[str, StepTolerance]]:
    """variant → quantity → tolerance, from `corpus/step.yaml`."""
    source = path or default_tolerance_path()
    raw = yaml.safe_load(source.read_text(encoding="utf-8"))
    out: dict[str, dict[str, StepTolerance]] = {}
    for variant, table in raw["tolerances"].items():
        missing = [q for q in QUANTITIES if q not in table]
        if missing:
            raise ValueError(f"{source}: tolerances.{variant} lacks {missing}")
        out[variant] = {
            q: StepTolerance(float(v["atol"]), float(v["rtol"])) for q, v in table.items()
        }
    if set(out) != set(VARIANTS):
        raise ValueError(f"{source}: tolerances name {sorted(out)}, want {list(VARIANTS)}")
    return out


def _optim(optim: OptimConfig, variant: str) -> dict[str, Any]:
    return {
        "name": "SGD" if variant == "sgd" else "AdamW",
        "lr": LEARNING_RATES[variant],
        "weight_decay": optim.weight_decay,
        "betas": list(optim.betas),
        "clip_grad": optim.grad_clip,
    }


def step_settings(cfg: ReferenceTrainerConfig, variant: str) -> dict[str, Any]:
    """The settings both sides train one step with: the case's algorithm at the small shape."""
    alg = cfg.algorithm
    actor = cfg.actor
    settings: dict[str, Any] = {
        "case": cfg.case_id,
        "variant": variant,
        "n": SHAPE["n"],
        "temperature": cfg.rollout.temperature,
        "adv_estimator": alg.adv_estimator,
        "gamma": alg.gamma,
        "lam": alg.lam,
        "norm_adv_by_std_in_grpo": alg.norm_adv_by_std_in_grpo,
        "use_kl_in_reward": alg.use_kl_in_reward,
        "kl_penalty": alg.kl_penalty,
        "kl_coef": alg.kl_coef,
        "use_reference_policy": cfg.use_reference_policy,
        "actor": {
            "ppo_mini_batch_size": SHAPE["ppo_mini_batch_size"],
            "micro_batch_size": SHAPE["micro_batch_size"],
            "ppo_epochs": SHAPE["ppo_epochs"],
            "clip_ratio": actor.clip_ratio,
            "clip_ratio_low": actor.clip_ratio_low,
            "clip_ratio_high": actor.clip_ratio_high,
            "clip_ratio_c": actor.clip_ratio_c,
            "policy_loss_mode": actor.policy_loss_mode,
            "loss_agg_mode": actor.loss_agg_mode,
            "loss_scale_factor": actor.loss_scale_factor,
            "entropy_coeff": actor.entropy_coeff,
            "use_kl_loss": actor.use_kl_loss,
            "kl_loss_coef": actor.kl_loss_coef,
            "kl_loss_type": actor.kl_loss_type,
            "shuffle": actor.shuffle,
            "data_loader_seed": actor.data_loader_seed,
            "optim": _optim(actor.optim, variant),
        },
        "critic": None,
        "lora": None,
    }
    if cfg.critic is not None:
        critic = cfg.critic
        settings["critic"] = {
            "ppo_mini_batch_size": SHAPE["ppo_mini_batch_size"],
            "micro_batch_size": SHAPE["micro_batch_size"],
            "ppo_epochs": SHAPE["ppo_epochs"],
            "cliprange_value": critic.cliprange_value,
            "loss_agg_mode": critic.loss_agg_mode,
            "loss_scale_factor": critic.loss_scale_factor,
            "shuffle": critic.shuffle,
            "data_loader_seed": critic.data_loader_seed,
            "optim": _optim(critic.optim, variant),
        }
    if cfg.model.lora_rank > 0:
        targets = cfg.model.target_modules
        settings["lora"] = {
            "adapter": f"lora-r{cfg.model.lora_rank}-a{cfg.model.lora_alpha}",
            "rank": cfg.model.lora_rank,
            "alpha": cfg.model.lora_alpha,
            "target_modules": targets if isinstance(targets, str) else list(targets),
        }
    return settings


def fixed_rollout(vocab: range, eos: int, seed: int = 0) -> dict[str, Any]:
    """Prompts, responses and scores of one step, the same for every case (plain lists).

    Tokens are drawn from `vocab` (the tokenizer's ordinary tokens). The `n` responses of a
    prompt share it; lengths vary (ragged prompts, responses that end in
    EOS and responses cut at `RESPONSE_LENGTH`), and scores vary within each group.
    """
    rng = random.Random(seed)
    n = SHAPE["n"]
    prompts: list[list[int]] = []
    responses: list[list[int]] = []
    scores: list[float] = []
    offsets: list[list[float]] = []
    for p in range(SHAPE["prompts"]):
        prompt = [rng.choice(vocab) for _ in range(2 + p % 3)]
        for k in range(n):
            length = rng.randrange(1, RESPONSE_LENGTH + 1)
            response = [rng.choice(vocab) for _ in range(length)]
            if (p + k) % 2 == 0 and length < RESPONSE_LENGTH:
                response.append(eos)
            prompts.append(prompt)
            responses.append(response)
            scores.append(round(rng.uniform(-1.0, 1.0), 4))
            offsets.append([round(rng.gauss(0.0, REF_OFFSET_SCALE), 4) for _ in response])
    return {
        "prompts": prompts,
        "responses": responses,
        "scores": scores,
        "ref_offsets": offsets,
        "uids": [f"p{i // n}" for i in range(len(prompts))],
    }


def request_json(model_dir: str, cases: list[dict[str, Any]], rollout: dict[str, Any]) -> str:
    """What the upstream subprocess reads on stdin."""
    return json.dumps({"model_dir": model_dir, "cases": cases, "rollout": rollout}, sort_keys=True)


def settings_key(settings: dict[str, Any]) -> str:
    """The file name (no folders: case ids may hold "/") of one case and variant's result."""
    return f"{settings['case'].replace('/', '__')}.{settings['variant']}"


def upstream_key(settings: dict[str, Any]) -> str:
    """Everything upstream's step reads of `settings`: all of it but the case's name.

    Two cases with the same key get the same upstream step (the subprocess sees nothing else),
    so it runs once for both; ours still runs per case, from each case's own lowered config.
    """
    return json.dumps({k: v for k, v in settings.items() if k != "case"}, sort_keys=True)
