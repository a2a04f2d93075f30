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

# Upstream 0.9.0's registries, read from its source (file:line in each entry's evidence).
REGISTRIES: dict[str, tuple[tuple[str, ...], str]] = {
    "algorithm.adv_estimator": (
        (
            "gae",
            "grpo",
            "reinforce_plus_plus",
            "reinforce_plus_plus_baseline",
            "remax",
            "rloo",
            "opo",
            "grpo_passk",
            "gpg",
            "rloo_vectorized",
            "grpo_vectorized",
            "optimal_token_baseline",
            "tir_optimal_token_baseline",
            "gdpo",
        ),
        "verl/trainer/ppo/core_algos.py:88 (AdvantageEstimator)",
    ),
    "actor_rollout_ref.actor.policy_loss.loss_mode": (
        (
            "vanilla",
            "dppo_tv",
            "dppo_kl",
            "gspo",
            "sapo",
            "gpg",
            "clip_cov",
            "kl_cov",
            "geo_mean",
            "dro",
            "cispo",
            "bypass_mode",
        ),
        "verl/trainer/ppo/core_algos.py:1285-2412 (register_policy_loss)",
    ),
    "actor_rollout_ref.actor.kl_loss_type": (
        (
            "kl",
            "k1",
            "abs",
            "mse",
            "k2",
            "low_var_kl",
            "k3",
            "full",
            "kl+",
            "k1+",
            "abs+",
            "mse+",
            "k2+",
            "low_var_kl+",
            "k3+",
        ),
        "verl/trainer/ppo/core_algos.py:2227 (kl_penalty_forward; a trailing + selects straight-through)",
    ),
    "algorithm.kl_penalty": (
        ("kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3", "full"),
        "verl/trainer/ppo/core_algos.py:2227 (kl_penalty_forward)",
    ),
    "reward.reward_manager.name": (
        ("naive", "batch", "dapo", "prime", "gdpo", "remote"),
        "verl/workers/reward_manager/*.py and verl/experimental/reward_loop/reward_manager/*.py (@register)",
    ),
    "actor_rollout_ref.rollout.name": (
        ("vllm", "sglang", "trtllm"),
        "verl/workers/rollout/base.py:88 (_ROLLOUT_REGISTRY)",
    ),
    "actor_rollout_ref.rollout.mode": (
        ("async",),
        "verl/workers/rollout/base.py:88 (_ROLLOUT_REGISTRY: async only)",
    ),
    "actor_rollout_ref.actor.loss_agg_mode": (
        (
            "token-mean",
            "token-sum",
            "seq-mean-token-sum",
            "seq-mean-token-mean",
            "seq-mean-token-sum-norm",
        ),
        "verl/workers/config/actor.py:216 (valid_loss_agg_modes)",
    ),
}

# Legacy top-level reward keys that 0.9.0 no longer reads, and the key that replaced each.
LEGACY_REWARD_KEYS: dict[str, str] = {
    "reward_model.reward_manager": "reward.reward_manager.name",
    "reward_model.reward_kwargs": "reward.reward_kwargs (via +reward.reward_kwargs.*)",
    "reward_model.enable": "reward.reward_model.enable",
    "reward_model.model.path": "reward.reward_model.model_path",
    "reward_model.enable_resource_pool": "reward.reward_model.enable_resource_pool",
    "custom_reward_function.path": "reward.custom_reward_function.path",
    "custom_reward_function.name": "reward.custom_reward_function.name",
}


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


def _field_key(field: str) -> str:
    """The dotted key of an override (``+a.b=1`` → ``a.b``)."""
    return field.split("=", 1)[0].lstrip("+~")


def _explicit_field_findings(
    explicit_fields: Sequence[str], leaves: Sequence[LeafVerdict]
) -> list[Finding]:
    """Explicit launch fields that no 0.9.0 code path reads."""
    findings = []
    # Names, output folders and profiler switches are set on purpose; flag only the fields whose
    # setting suggests an intent 0.9.0 ignores: legacy keys, deprecated keys, disabled features.
    no_effect = ("Legacy", "Deprecated", "disables")
    inert = {
        leaf.path
        for leaf in leaves
        if leaf.klass == "inert" and any(w in leaf.reason for w in no_effect)
    }
    for field in explicit_fields:
        key = _field_key(field)
        replacement = next(
            (
                new
                for old, new in LEGACY_REWARD_KEYS.items()
                if key == old or key.startswith(old + ".")
            ),
            None,
        )
        if replacement:
            findings.append(
                Finding(
                    "error",
                    key,
                    f"`{field}` sets a legacy top-level reward key that verl 0.9.0 silently ignores "
                    "(its migration to reward.* was dropped)",
                    fix=f"set {replacement} instead",
                    evidence="verl/trainer/config/legacy_reward_impl.yaml (kept for compatibility, never read); verl PR #7331, #5558, #6172",
                )
            )
        elif key in inert or any(
            path.startswith(key + ".") or path.startswith(key + "[") for path in inert
        ):
            findings.append(
                Finding(
                    "warning",
                    key,
                    f"`{field}` lands on a field with no effect on training here (profile class inert)",
                    evidence="profile verl-0.9.0-single-device",
                )
            )
    return findings


def _registry_findings(resolved: Mapping[str, Any]) -> list[Finding]:
    import difflib

    findings = []
    for path, (names, evidence) in REGISTRIES.items():
        value = _get(resolved, path)
        if value in names:
            continue
        close = difflib.get_close_matches(str(value), names, n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        findings.append(
            Finding(
                "error",
                path,
                f"{value!r} is not registered in verl 0.9.0; valid: {', '.join(names)}",
                fix=f"{hint}use one of the registered names",
                evidence=evidence,
            )
        )
    return findings


def _dynamic_batch_findings(resolved: Mapping[str, Any]) -> list[Finding]:
    """Batch arithmetic in GPU units and token budgets, which upstream skips under dynamic batch size."""
    findings = []
    arr, trainer, data = resolved["actor_rollout_ref"], resolved["trainer"], resolved["data"]
    n = int(arr["rollout"]["n"])
    n_gpus = int(trainer["n_gpus_per_node"]) * int(trainer["nnodes"])
    sp = int(arr["actor"]["ulysses_sequence_parallel_size"])
    dp = max(n_gpus // max(sp, 1), 1)
    train, mini = int(data["train_batch_size"]), int(arr["actor"]["ppo_mini_batch_size"])
    responses, mini_responses = train * n, mini * n
    if mini <= train and not train % mini and mini_responses % dp:
        findings.append(
            Finding(
                "error",
                "actor_rollout_ref.actor.ppo_mini_batch_size, trainer.n_gpus_per_node",
                f"a mini-batch of {mini} prompts × n={n} = {mini_responses} responses does not split over "
                f"{dp} data-parallel ranks ({n_gpus} GPUs / sequence parallel {sp}): "
                f"{mini_responses} / {dp} = {mini_responses / dp:.2f} responses per GPU",
                fix=f"use a mini-batch whose responses divide by {dp}",
                evidence="verl/utils/config.py:110 checks only when use_dynamic_bsz=False; the update splits mini-batches across ranks (verl PR #552)",
            )
        )
    if responses % dp:
        pad = dp - responses % dp
        findings.append(
            Finding(
                "error",
                "data.train_batch_size, actor_rollout_ref.rollout.n, trainer.n_gpus_per_node",
                f"{train} prompts × n={n} = {responses} responses per step do not divide over {dp} "
                f"data-parallel ranks; a trainer would pad {pad} dummy responses or fail",
                fix=f"make train_batch_size × n a multiple of {dp}",
                evidence="verl/utils/config.py:110 (skipped when use_dynamic_bsz=True); verl #473, PR #559",
            )
        )
    longest = int(data["max_prompt_length"]) + int(data["max_response_length"])
    budgets = [
        (
            "actor_rollout_ref.actor",
            arr["actor"].get("use_dynamic_bsz"),
            "ppo_max_token_len_per_gpu",
            arr["actor"],
        ),
        (
            "actor_rollout_ref.rollout",
            arr["rollout"].get("log_prob_use_dynamic_bsz"),
            "log_prob_max_token_len_per_gpu",
            arr["rollout"],
        ),
    ]
    if need_reference_policy(resolved):
        budgets.append(
            (
                "actor_rollout_ref.ref",
                arr["ref"].get("log_prob_use_dynamic_bsz"),
                "log_prob_max_token_len_per_gpu",
                arr["ref"],
            )
        )
    if need_critic(resolved):
        critic = resolved["critic"]
        budgets.append(
            ("critic", critic.get("use_dynamic_bsz"), "ppo_max_token_len_per_gpu", critic)
        )
        budgets.append(
            ("critic", critic.get("use_dynamic_bsz"), "forward_max_token_len_per_gpu", critic)
        )
    for prefix, dynamic, key, section in budgets:
        budget = section.get(key)
        if dynamic and budget is not None and int(budget) * sp < longest:
            findings.append(
                Finding(
                    "error",
                    f"{prefix}.{key}, data.max_response_length",
                    f"one sequence can be {data['max_prompt_length']} + {data['max_response_length']} = {longest} "
                    f"tokens, more than the per-GPU token budget {budget} × sequence parallel {sp}",
                    fix=f"raise {prefix}.{key} to at least {-(-longest // sp)}",
                    evidence="verl/utils/seqlen_balancing.py rearrange_micro_batches asserts max_token_len >= the longest sequence, after the first rollout (verl #571)",
                )
            )
    return findings


def _global_micro_batch_findings(resolved: Mapping[str, Any]) -> list[Finding]:
    """Deprecated global micro-batch sizes, which 0.9.0 no longer divides by the GPU count."""
    findings = []
    arr, trainer = resolved["actor_rollout_ref"], resolved["trainer"]
    n_gpus = max(int(trainer["n_gpus_per_node"]) * int(trainer["nnodes"]), 1)
    sections = [
        ("actor_rollout_ref.actor", arr["actor"], "ppo_micro_batch_size", "use_dynamic_bsz"),
        (
            "actor_rollout_ref.rollout",
            arr["rollout"],
            "log_prob_micro_batch_size",
            "log_prob_use_dynamic_bsz",
        ),
        (
            "actor_rollout_ref.ref",
            arr["ref"],
            "log_prob_micro_batch_size",
            "log_prob_use_dynamic_bsz",
        ),
    ]
    if need_critic(resolved):
        sections.append(("critic", resolved["critic"], "ppo_micro_batch_size", "use_dynamic_bsz"))
    for prefix, section, key, dynamic in sections:
        value = section.get(key)
        if value is None or section.get(dynamic):
            continue
        per_gpu = max(int(value) // n_gpus, 1)
        findings.append(
            Finding(
                "error",
                f"{prefix}.{key}",
                f"the global micro-batch size {value} is deprecated and no longer converted to a per-GPU "
                f"size; over {n_gpus} GPUs it means {value} / {n_gpus} = {per_gpu} per GPU",
                fix=f"set {prefix}.{key}_per_gpu={per_gpu} and remove {prefix}.{key}",
                evidence="verl/workers/config/actor.py:203 and verl/utils/config.py:141 treat it as deprecated; verl PR #833",
            )
        )
    return findings


def _cross_field_findings(resolved: Mapping[str, Any]) -> list[Finding]:
    findings = []
    arr, algo = resolved["actor_rollout_ref"], resolved["algorithm"]
    model, rollout = arr["model"], arr["rollout"]
    lora = int(model.get("lora_rank") or 0) > 0 or int(model["lora"].get("rank") or 0) > 0
    if lora and rollout["name"] == "sglang" and not model["lora"].get("merge"):
        findings.append(
            Finding(
                "error",
                "actor_rollout_ref.rollout.name, actor_rollout_ref.model.lora.merge",
                "LoRA with the SGLang rollout needs the adapter merged into the weights",
                fix="set actor_rollout_ref.model.lora.merge=True or use rollout.name=vllm",
                evidence="verl 0.9.0 LoRA docs (docs/advance/ppo_lora.rst); verl PR #5220",
            )
        )
    if lora and rollout["name"] == "vllm" and rollout["load_format"] == "dummy":
        findings.append(
            Finding(
                "warning",
                "actor_rollout_ref.rollout.load_format",
                "LoRA with vLLM starts from dummy weights; the official LoRA script uses safetensors",
                fix="set actor_rollout_ref.rollout.load_format=safetensors",
                evidence="examples/tuning/lora/run_qwen3_8b_fsdp.sh (load_format=safetensors, layered_summon=True)",
            )
        )
    group_estimators = {
        "grpo",
        "rloo",
        "grpo_passk",
        "opo",
        "gpg",
        "rloo_vectorized",
        "grpo_vectorized",
        "gdpo",
    }
    if algo["adv_estimator"] in group_estimators and int(rollout["n"]) < 2:
        findings.append(
            Finding(
                "warning" if algo["adv_estimator"].startswith("grpo") else "error",
                "actor_rollout_ref.rollout.n",
                f"{algo['adv_estimator']} compares responses within a group, but n={rollout['n']}: "
                "every group has one response (GRPO then uses mean 0 and std 1, so the advantage is the raw score)",
                fix="set actor_rollout_ref.rollout.n to 2 or more",
                evidence="verl/trainer/ppo/core_algos.py compute_grpo_outcome_advantage (groups of one)",
            )
        )
    trainer = resolved["trainer"]
    n_gpus = int(trainer["n_gpus_per_node"]) * int(trainer["nnodes"])
    tp = int(rollout["tensor_model_parallel_size"]) * int(rollout["pipeline_model_parallel_size"])
    if n_gpus and (tp > n_gpus or n_gpus % tp):
        findings.append(
            Finding(
                "error",
                "actor_rollout_ref.rollout.tensor_model_parallel_size, trainer.n_gpus_per_node",
                f"rollout replicas of {tp} GPUs (tensor × pipeline parallel) do not fit {n_gpus} GPUs",
                evidence="verl/workers/rollout/replica.py builds n_gpus / (tp × pp) replicas",
            )
        )
    sp = int(arr["actor"]["ulysses_sequence_parallel_size"])
    if n_gpus and n_gpus % sp:
        findings.append(
            Finding(
                "error",
                "actor_rollout_ref.actor.ulysses_sequence_parallel_size",
                f"sequence parallel size {sp} does not divide {n_gpus} GPUs",
                evidence="verl/workers/engine/fsdp device mesh (dp × sp = world size)",
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
        + _explicit_field_findings(explicit_fields, leaves)
        + _registry_findings(resolved)
        + _dynamic_batch_findings(resolved)
        + _cross_field_findings(resolved)
        + _global_micro_batch_findings(resolved)
    )
    return sorted(
        findings, key=lambda f: ({"error": 0, "warning": 1, "info": 2}[f.level], f.path, f.message)
    )
