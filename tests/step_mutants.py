"""Seeded bugs in the reference trainer's training loop, and wrong values of its settings.

A helper module for `test_step_conformance.py` and `test_step_coverage.py`, not a test file.

`SOURCE_MUTANTS` are one-line source edits of the kind a developer makes in a training loop
(temperature left out of the training forward, the entropy bonus without its gradient, the
scheduler stepped per mini-batch, clip_ratio_low read for clip_ratio_high, weight decay left to
the library's default, ...). Each is applied by recompiling the edited function from its own
source and patching it in wherever the trainer or the oracle holds it, and names the step
cases (and optimizer variants) that must fail with it: the settings those cases train off
verl's defaults are what make the bug show.

`wrong_value` gives a setting of the step's config a value other than the one upstream trained
with, for the coverage test's check that the variant a row names does see it.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import sys
import textwrap
from dataclasses import dataclass
from typing import Any

import pytest


@dataclass(frozen=True)
class SourceMutant:
    """`old` replaced by `new` (each once) in `target` (`module:function` or `module:Class.method`)."""

    name: str
    target: str
    old: str
    new: str
    caught_by: tuple[tuple[str, str], ...]
    """(step case, variant) pairs whose step must fail with the bug."""

    def apply(self, monkeypatch: pytest.MonkeyPatch) -> None:
        # Our side's modules first: one imported later would bind the bug for good.
        importlib.import_module("pytest_verl_compat.conformance.step.reference")
        module_name, qualname = self.target.split(":")
        module = importlib.import_module(module_name)
        *owners, attr = qualname.split(".")
        owner: Any = module
        for part in owners:
            owner = getattr(owner, part)
        original = owner.__dict__[attr]
        source = textwrap.dedent(inspect.getsource(original))
        assert source.count(self.old) == 1, (
            f"{self.name}: {self.old!r} is not once in {self.target}"
        )
        namespace = dict(module.__dict__)
        code = compile(
            source.replace(self.old, self.new),
            inspect.getsourcefile(original) or module_name,
            "exec",
            flags=annotations.compiler_flag,
            dont_inherit=True,
        )
        exec(code, namespace)
        mutated = namespace[attr]
        monkeypatch.setattr(owner, attr, mutated)
        if owner is module:
            _patch_references(original, mutated, monkeypatch)


def _patch_references(original: Any, mutated: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every module of ours that imported `original` by name, and every registry holding it."""
    for name, other in list(sys.modules.items()):
        if not name.startswith(("reference_trainer", "pytest_verl_compat")) or other is None:
            continue
        for key, value in list(vars(other).items()):
            if value is original:
                monkeypatch.setattr(other, key, mutated)
            entries = getattr(value, "_entries", None)  # reference_trainer.math.registry.Registry
            if isinstance(entries, dict):
                for entry, held in list(entries.items()):
                    if held is original:
                        monkeypatch.setitem(entries, entry, mutated)


UPDATES = "reference_trainer.updates"
TRAINER = "reference_trainer.trainer"
MODELS = "reference_trainer.models"
KL = "reference_trainer.math.kl"
LOSSES = "reference_trainer.math.losses"
ADVANTAGES = "reference_trainer.math.advantages"

GAE = "step/gae-two-steps"
GRPO = "step/grpo-two-steps"
RLOO = "step/rloo-two-steps"
RPP = "step/reinforce-plus-plus-two-steps"
RPP_BASELINE = "step/reinforce-plus-plus-baseline-two-steps"
LORA = "step/lora-two-steps"
WARMUP = "step/grpo-critic-warmup"
RANKS = "step/two-ranks"

SOURCE_MUTANTS = (
    SourceMutant(
        "temperature-left-out-of-the-training-forward",
        f"{UPDATES}:actor_update",
        "log_probs_from_logits(logits, micro.responses, temperature)",
        "log_probs_from_logits(logits, micro.responses)",
        ((GRPO, "sgd"),),
    ),
    SourceMutant(
        "temperature-left-out-of-the-old-log-prob-pass",
        f"{TRAINER}:ReferenceTrainer.log_probs",
        'batch.tensors["old_log_probs"] = log_probs_from_logits(logits, batch.responses, temperature)',
        'batch.tensors["old_log_probs"] = log_probs_from_logits(logits, batch.responses)',
        ((GAE, "sgd"),),
    ),
    SourceMutant(
        "entropy-bonus-without-its-gradient",
        f"{UPDATES}:actor_update",
        "if spec.entropy_coeff == 0:",
        "if True:",
        ((GRPO, "sgd"),),
    ),
    SourceMutant(
        "entropy-bonus-with-the-wrong-sign",
        f"{LOSSES}:actor_loss",
        "loss = loss - entropy_coeff * entropy_term",
        "loss = loss + entropy_coeff * entropy_term",
        ((RPP, "sgd"),),
    ),
    SourceMutant(
        "scheduler-stepped-per-mini-batch",
        f"{UPDATES}:actor_update",
        "            updates += 1\n",
        "            updates += 1\n            scheduler.step()\n",
        ((GAE, "sgd"),),
    ),
    SourceMutant(
        "warm-up-counted-from-one",
        f"{MODELS}:schedule",
        "return step / max(1, warmup)",
        "return (step + 1) / max(1, warmup)",
        ((RLOO, "sgd"),),
    ),
    SourceMutant(
        "warm-up-share-of-total-steps-ignored",
        f"{MODELS}:schedule",
        "else int(optim.lr_warmup_steps_ratio * total_steps)",
        "else 0",
        ((RLOO, "sgd"),),
    ),
    SourceMutant(
        "cosine-counted-from-zero-whatever-zero_indexed_step",
        f"{MODELS}:schedule",
        'if optim.lr_scheduler_type == "cosine" and not optim.zero_indexed_step:',
        "if False:",
        ((GAE, "sgd"),),
    ),
    SourceMutant(
        "decay-floor-min_lr_ratio-dropped",
        f"{MODELS}:schedule",
        "return max(0.0, cosine) * (1.0 - optim.min_lr_ratio) + optim.min_lr_ratio",
        "return max(0.0, cosine)",
        ((RPP, "sgd"),),
    ),
    SourceMutant(
        "num_cycles-ignored",
        f"{MODELS}:schedule",
        "math.pi * optim.num_cycles * 2.0 * progress",
        "math.pi * 0.5 * 2.0 * progress",
        ((RPP, "sgd"),),
    ),
    SourceMutant(
        "clip_ratio_low-read-for-both-bounds",
        f"{UPDATES}:actor_update",
        "clip_ratio_high=spec.clip_ratio_high,",
        "clip_ratio_high=spec.clip_ratio_low,",
        ((GRPO, "sgd"),),
    ),
    SourceMutant(
        "clip_ratio_c-left-at-its-default",
        f"{UPDATES}:actor_update",
        "clip_ratio_c=spec.clip_ratio_c,",
        "clip_ratio_c=3.0,",
        ((GRPO, "sgd"),),
    ),
    SourceMutant(
        "null-clip-bound-not-falling-back-to-clip_ratio",
        f"{LOSSES}:vanilla_policy_loss",
        "low = clip_ratio if clip_ratio_low is None else clip_ratio_low",
        "low = 0.2 if clip_ratio_low is None else clip_ratio_low",
        ((RPP_BASELINE, "sgd"),),
    ),
    SourceMutant(
        "weight-decay-left-to-adamws-default",
        f"{MODELS}:build_optimizer",
        "weight_decay=optim.weight_decay, fused=True",
        "fused=True",
        ((GRPO, "adamw"), (LORA, "adamw")),
    ),
    SourceMutant(
        "betas-left-to-adamws-default",
        f"{MODELS}:build_optimizer",
        "betas=optim.betas, ",
        "",
        ((GRPO, "adamw"),),
    ),
    SourceMutant(
        "every-actor-gradient-doubled",
        f"{UPDATES}:actor_update",
        "                loss.backward()\n                share",
        "                (2 * loss).backward()\n                share",
        ((RPP, "sgd"),),
    ),
    SourceMutant(
        "critic-clipped-at-the-default-clip",
        f"{UPDATES}:critic_update",
        "clip_grad_norm_(critic.parameters(), spec.optim.grad_clip)",
        "clip_grad_norm_(critic.parameters(), 1.0)",
        ((GAE, "sgd"),),
    ),
    SourceMutant(
        "rewards-distorted-monotonically-before-the-group-statistics",
        f"{ADVANTAGES}:grpo_advantages",
        "scores = token_level_rewards.sum(dim=-1)",
        "scores = token_level_rewards.sum(dim=-1) ** 3",
        ((GRPO, "sgd"),),
    ),
    SourceMutant(
        "abs-kl-estimator-without-its-abs",
        f"{KL}:absolute",
        "return (log_prob - ref_log_prob).abs()",
        "return log_prob - ref_log_prob",
        ((GRPO, "sgd"), (RPP, "sgd")),
    ),
    SourceMutant(
        "straight-through-kl-loses-k2s-gradient",
        f"{KL}:kl_penalty",
        "return KL_PENALTIES[kl_penalty](log_prob, ref_log_prob)",
        'return KL_PENALTIES[kl_penalty.rstrip("+")](log_prob, ref_log_prob)',
        ((GRPO, "sgd"),),
    ),
    SourceMutant(
        "adaptive-kl-controller-never-moves",
        f"{KL}:AdaptiveKLController.update",
        "self.value *= 1.0 + error * n_steps / self.horizon",
        "self.value *= 1.0",
        ((RPP, "sgd"),),
    ),
    SourceMutant(
        "kl-controller-always-fixed",
        f"{KL}:kl_controller",
        'if algorithm.kl_ctrl_type == "adaptive":',
        "if False:",
        ((GRPO, "sgd"),),
    ),
    SourceMutant(
        "reference-policy-follows-the-actor",
        f"{MODELS}:frozen_reference",
        "return copy.deepcopy(policy).eval().requires_grad_(False)",
        "return policy",
        ((RPP_BASELINE, "sgd"),),
    ),
    SourceMutant(
        "adam-moments-cleared-every-training-step",
        f"{UPDATES}:actor_update",
        "    shuffle = shuffle_generator(spec.shuffle, spec.data_loader_seed)\n",
        "    optimizer.state.clear()\n    shuffle = shuffle_generator(spec.shuffle, spec.data_loader_seed)\n",
        ((GRPO, "adamw"),),
    ),
    SourceMutant(
        "actor-shuffle-seed-left-at-its-default",
        f"{UPDATES}:actor_update",
        "shuffle = shuffle_generator(spec.shuffle, spec.data_loader_seed)",
        "shuffle = shuffle_generator(spec.shuffle, 42)",
        ((GRPO, "sgd"),),
    ),
    SourceMutant(
        "critic-shuffle-seed-left-at-its-default",
        f"{UPDATES}:critic_update",
        "shuffle = shuffle_generator(spec.shuffle, spec.data_loader_seed)",
        "shuffle = shuffle_generator(spec.shuffle, 42)",
        ((GAE, "sgd"),),
    ),
    SourceMutant(
        "gae-lambda-ignored",
        f"{ADVANTAGES}:gae_advantages",
        "td_error + gamma * lam * running",
        "td_error + gamma * running",
        ((GAE, "sgd"),),
    ),
    SourceMutant(
        "reinforce-plus-plus-undiscounted",
        f"{ADVANTAGES}:reinforce_plus_plus_advantages",
        "token_level_rewards[:, t] + gamma * running",
        "token_level_rewards[:, t] + running",
        ((RPP, "sgd"),),
    ),
    SourceMutant(
        "critic-warm-up-off-by-one",
        f"{TRAINER}:ReferenceTrainer.actor_updates_now",
        "return self.step + 1 >= warmup",
        "return self.step >= warmup",
        ((WARMUP, "sgd"),),
    ),
    SourceMutant(
        "actor-loss_scale_factor-ignored",
        f"{UPDATES}:actor_update",
        "spec.loss_scale_factor, spec.loss_agg_mode, micro.response_mask",
        "None, spec.loss_agg_mode, micro.response_mask",
        ((RLOO, "sgd"),),
    ),
    SourceMutant(
        "value-clip-ignored",
        f"{LOSSES}:value_loss",
        "clipped_vpreds = torch.clamp(vpreds, values - cliprange_value, values + cliprange_value)",
        "clipped_vpreds = vpreds",
        ((GAE, "sgd"),),
    ),
    SourceMutant(
        "lora-scaled-by-one-alpha-read-as-rank",
        f"{MODELS}:wrap_lora",
        "lora_alpha=spec.lora_alpha,",
        "lora_alpha=spec.lora_rank,",
        ((LORA, "sgd"),),
    ),
    SourceMutant(
        "lora-exclude_modules-dropped",
        f"{MODELS}:wrap_lora",
        "exclude_modules=(",
        "exclude_modules=None and (",
        ((LORA, "sgd"),),
    ),
    SourceMutant(
        "tokens-normalised-per-micro-batch",
        f"{UPDATES}:actor_update",
        "                    batch_num_tokens=tokens,\n",
        "                    batch_num_tokens=micro.response_mask.sum(),\n",
        (("grpo", "sgd"), (LORA, "sgd")),
    ),
    SourceMutant(
        "sequences-counted-without-v1s-padding",
        f"{UPDATES}:actor_update",
        "                    global_batch_size=mini,\n",
        "                    global_batch_size=len(rows),\n",
        ((RANKS, "sgd"),),
    ),
    SourceMutant(
        "critic-sequences-counted-per-micro-batch",
        f"{UPDATES}:critic_update",
        "                    global_batch_size=mini,\n",
        "                    global_batch_size=len(micro_rows),\n",
        ((RANKS, "sgd"),),
    ),
)


# ------------------------------------------------------------------ wrong values of a setting


def _get(obj: Any, path: str) -> Any:
    for part in path.split("."):
        name, _, index = part.partition("[")
        obj = getattr(obj, name) if name else obj
        if index:
            obj = obj[int(index[:-1])]
    return obj


def _set(obj: Any, path: str, value: Any) -> Any:
    head, _, rest = path.partition(".")
    name, _, index = head.partition("[")
    current = getattr(obj, name)
    if index:
        items = list(current)
        items[int(index[:-1])] = _set(items[int(index[:-1])], rest, value) if rest else value
        return dataclasses.replace(obj, **{name: tuple(items)})
    return dataclasses.replace(obj, **{name: _set(current, rest, value) if rest else value})


def wrong_value(value: Any, allowed: tuple[Any, ...] | None = None) -> Any:
    """Another value of the same kind: a flipped switch, a float moved by half of itself (plus
    a little, so 0 moves too), the next integer, another allowed name, a module list short of
    its first entry; None (a constant left unset) becomes one."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value + 1
    if isinstance(value, float):
        return value * 0.5 + 0.125
    if isinstance(value, str):
        others = [v for v in allowed or () if v != value and not str(v).endswith("+")]
        assert others, f"no other allowed value than {value!r}"
        return others[0]
    if isinstance(value, tuple) and value:
        return value[1:] if len(value) > 1 else None
    if value is None:
        return 1.0
    if dataclasses.is_dataclass(value):
        return None
    raise TypeError(f"no wrong value for {value!r}")


def with_wrong_value(
    cfg: Any, field: str, allowed: tuple[Any, ...] | None = None, wrong: Any = None
) -> Any:
    """`cfg` (a ReferenceTrainerConfig) with `field` (dotted, `x.y[0]`) given a wrong value:
    `wrong` when given, else `wrong_value`'s."""
    return _set(cfg, field, wrong if wrong is not None else wrong_value(_get(cfg, field), allowed))
