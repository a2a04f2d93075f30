"""Semantic checks: what verl 0.9.0 would only report at trainer start, or never, said statically.

Each finding cites the upstream 0.9.0 source that makes it true. Errors reject the case;
warnings keep it accepted but are reported.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pytest_verl_compat.compile import LeafVerdict

FILTER_METRICS = ("acc", "score", "seq_reward", "seq_final_reward")


@dataclass(frozen=True)
class Finding:
    """``LEVEL path: message (fix)``, with the upstream evidence."""

    level: str  # "error" | "warning" | "info"
    path: str
    message: str
    fix: str = ""
    evidence: str = ""

    def to_json(self) -> dict[str, str]:
        return {
            "level": self.level,
            "path": self.path,
            "message": self.message,
            "fix": self.fix,
            "evidence": self.evidence,
        }

    def line(self) -> str:
        fix = f" ({self.fix})" if self.fix else ""
        return f"{self.level.upper()} {self.path}: {self.message}{fix}"


def _get(resolved: Mapping[str, Any], dotted: str) -> Any:
    node: Any = resolved
    for part in dotted.split("."):
        node = node[part]
    return node


def need_critic(resolved: Mapping[str, Any]) -> bool:
    """As upstream's verl/trainer/ppo/utils.py need_critic: critic.enable, else GAE decides."""
    enable = resolved["critic"].get("enable")
    return bool(enable) if enable is not None else resolved["algorithm"]["adv_estimator"] == "gae"


def need_reference_policy(resolved: Mapping[str, Any]) -> bool:
    return bool(
        resolved["actor_rollout_ref"]["actor"]["use_kl_loss"]
        or resolved["algorithm"]["use_kl_in_reward"]
    )


def _batch_findings(resolved: Mapping[str, Any]) -> list[Finding]:
    findings = []
    train = int(resolved["data"]["train_batch_size"])
    n = int(resolved["actor_rollout_ref"]["rollout"]["n"])
    roles = [("actor_rollout_ref.actor", resolved["actor_rollout_ref"]["actor"])]
    if need_critic(resolved):
        roles.append(("critic", resolved["critic"]))
    for prefix, role in roles:
        mini = int(role["ppo_mini_batch_size"])
        if mini <= 0:
            findings.append(
                Finding("error", f"{prefix}.ppo_mini_batch_size", f"must be positive, got {mini}")
            )
            continue
        if mini > train:
            findings.append(
                Finding(
                    "error",
                    f"data.train_batch_size, {prefix}.ppo_mini_batch_size",
                    f"the mini-batch ({mini} prompts = {mini * n} responses) is larger than the batch "
                    f"({train} prompts = {train * n} responses); no optimizer step would see a full mini-batch",
                    fix=f"set {prefix}.ppo_mini_batch_size to a divisor of {train}",
                    evidence="verl/workers/config/actor.py:231 (ActorConfig.validate, skipped when use_dynamic_bsz=True)",
                )
            )
        elif train % mini:
            findings.append(
                Finding(
                    "error",
                    f"data.train_batch_size, {prefix}.ppo_mini_batch_size",
                    f"{train} prompts × n={n} = {train * n} responses per step do not split into mini-batches "
                    f"of {mini} prompts × {n} = {mini * n} responses ({train * n} / {mini * n} = {train * n / (mini * n):.2f})",
                    fix=f"use a mini-batch size that divides {train}",
                    evidence="verl/trainer/ppo/ray_trainer.py _update_actor/_update_critic split the batch by ppo_mini_batch_size * rollout.n",
                )
            )
    return findings


def _kl_findings(resolved: Mapping[str, Any]) -> list[Finding]:
    findings = []
    algo = resolved["algorithm"]
    actor = resolved["actor_rollout_ref"]["actor"]
    ctrl = algo["kl_ctrl"]
    if (
        algo["use_kl_in_reward"]
        and ctrl["type"] == "adaptive"
        and (ctrl["horizon"] <= 0 or ctrl["target_kl"] <= 0)
    ):
        findings.append(
            Finding(
                "error",
                "algorithm.kl_ctrl.horizon, algorithm.kl_ctrl.target_kl",
                f"the adaptive KL controller needs a positive horizon and target (got {ctrl['horizon']}, {ctrl['target_kl']})",
                evidence="verl/trainer/ppo/core_algos.py AdaptiveKLController.update divides by horizon and target",
            )
        )
    if (algo["use_kl_in_reward"] and ctrl["kl_coef"] < 0) or (
        actor["use_kl_loss"] and actor["kl_loss_coef"] < 0
    ):
        findings.append(
            Finding(
                "error",
                "algorithm.kl_ctrl.kl_coef, actor_rollout_ref.actor.kl_loss_coef",
                "a negative KL coefficient rewards moving away from the reference",
            )
        )
    if algo["use_kl_in_reward"] and actor["use_kl_loss"]:
        findings.append(
            Finding(
                "warning",
                "algorithm.use_kl_in_reward, actor_rollout_ref.actor.use_kl_loss",
                "KL to the reference is applied twice: once in the reward and once as a loss",
                fix="keep one of them (GRPO recipes use the KL loss)",
                evidence="verl/utils/config.py:170 prints only a NOTICE (verl #265)",
            )
        )
    return findings


def _filter_findings(resolved: Mapping[str, Any]) -> list[Finding]:
    groups = resolved["algorithm"]["filter_groups"]
    if not groups["enable"]:
        return []
    findings = []
    if not groups["metric"]:
        findings.append(
            Finding(
                "error",
                "algorithm.filter_groups.metric",
                "group filtering is enabled but no metric is set; upstream raises only at trainer start",
                fix=f"set algorithm.filter_groups.metric to one of {', '.join(FILTER_METRICS)}",
                evidence="verl/trainer/ppo/v1/trainer_base.py:199 (_resolve_filter_groups_metric)",
            )
        )
    reward_model = resolved["reward"]["reward_model"]
    if reward_model["enable"] and not reward_model["enable_resource_pool"]:
        findings.append(
            Finding(
                "error",
                "algorithm.filter_groups.enable, reward.reward_model.enable_resource_pool",
                "group filtering needs rewards at sampling time, which a colocated reward model does not give",
                fix="set reward.reward_model.enable_resource_pool=True or use a rule reward",
                evidence="verl/trainer/ppo/v1/trainer_base.py:203",
            )
        )
    if groups["max_num_gen_batches"] > 0:
        findings.append(
            Finding(
                "warning",
                "algorithm.filter_groups.max_num_gen_batches",
                f"upstream 0.9.0's V1 replay buffer ignores max_num_gen_batches={groups['max_num_gen_batches']}; "
                "the reference trainer honours it as the refill limit",
                fix="bound concurrency with algorithm.filter_groups.max_inflight_gen_batches",
                evidence="verl/trainer/ppo/v1/trainer_base.py:211",
            )
        )
    return findings


def _upstream_validation_findings(resolved: Mapping[str, Any]) -> list[Finding]:
    """The checks of upstream's validate_config (verl/utils/config.py), statically."""
    findings = []
    trainer = resolved["trainer"]
    arr = resolved["actor_rollout_ref"]
    n_gpus = int(trainer["n_gpus_per_node"]) * int(trainer["nnodes"])
    actor, rollout = arr["actor"], arr["rollout"]
    if not actor["use_dynamic_bsz"]:
        responses = int(resolved["data"]["train_batch_size"]) * int(rollout["n"])
        if n_gpus and responses % n_gpus:
            findings.append(
                Finding(
                    "error",
                    "data.train_batch_size, actor_rollout_ref.rollout.n, trainer.n_gpus_per_node",
                    f"{responses} responses per step do not divide over {n_gpus} GPUs",
                    evidence="verl/utils/config.py:110",
                )
            )
        if actor["ppo_micro_batch_size"] is None and actor["ppo_micro_batch_size_per_gpu"] is None:
            findings.append(
                Finding(
                    "error",
                    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu",
                    "dynamic batch size is off and no micro-batch size is set",
                    fix="set actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu",
                    evidence="verl/workers/config/actor.py:212",
                )
            )
        sections = [("actor_rollout_ref.rollout", rollout)]
        if need_reference_policy(resolved):
            sections.append(("actor_rollout_ref.ref", arr["ref"]))
        for prefix, section in sections:
            if (
                section["log_prob_micro_batch_size"] is None
                and section["log_prob_micro_batch_size_per_gpu"] is None
            ):
                findings.append(
                    Finding(
                        "error",
                        f"{prefix}.log_prob_micro_batch_size_per_gpu",
                        "dynamic batch size is off and no log-prob micro-batch size is set",
                        fix=f"set {prefix}.log_prob_micro_batch_size_per_gpu",
                        evidence="verl/utils/config.py:141",
                    )
                )
    if rollout["val_kwargs"]["do_sample"] and rollout["temperature"] <= 0:
        findings.append(
            Finding(
                "error",
                "actor_rollout_ref.rollout.val_kwargs.do_sample, actor_rollout_ref.rollout.temperature",
                "sampled validation needs a positive temperature",
                evidence="verl/utils/config.py:187",
            )
        )
    if actor["ulysses_sequence_parallel_size"] > 1 and not arr["model"]["use_remove_padding"]:
        findings.append(
            Finding(
                "error",
                "actor_rollout_ref.actor.ulysses_sequence_parallel_size, actor_rollout_ref.model.use_remove_padding",
                "sequence parallelism needs use_remove_padding=True",
                evidence="verl/workers/config/actor.py:339 (FSDPActorConfig.validate)",
            )
        )
    return findings


def semantic_findings(
    resolved: Mapping[str, Any], explicit_fields: Sequence[str], leaves: Sequence[LeafVerdict]
) -> list[Finding]:
    """Every finding for one resolved mapping, in a stable order."""
    findings = (
        _batch_findings(resolved)
        + _kl_findings(resolved)
        + _filter_findings(resolved)
        + _upstream_validation_findings(resolved)
    )
    return sorted(
        findings, key=lambda f: ({"error": 0, "warning": 1, "info": 2}[f.level], f.path, f.message)
    )
