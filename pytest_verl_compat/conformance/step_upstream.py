"""Upstream's side of the step oracle: verl 0.9.0's V1 training step on its FSDP engine, on a CPU.

Run only as ``python -I -m pytest_verl_compat.conformance.step_upstream OUT_DIR`` through
`pytest_verl_compat.upstream.runner.run_module` (the request arrives on stdin, see
`step_plan.request_json`). It imports verl once and runs every requested case in this one
process, the way `verl/trainer/ppo/v1/trainer_base.py` runs a step, minus Ray and TransferQueue:

- actor: `verl.workers.engine_workers.ActorRolloutRefWorker(role="actor")` over the FSDP engine;
- critic (GAE): `engine_workers.TrainingWorker` with `verl.workers.utils.losses.value_loss`, built
  as `trainer_base._setup` builds it;
- old log-probs and entropy (`trainer_base._compute_old_log_prob`), reference log-probs
  (`_compute_ref_log_prob`: the actor with its adapter off for LoRA; at step 1 the reference
  weights are the actor's), values (`_compute_values`);
- `_balance_batch` (`get_seqlen_balanced_partitions` over `calculate_workload`, one DP rank);
- rewards after `ray_trainer.apply_kl_penalty`, advantages from `ray_trainer.compute_advantage`
  (what V1's `compute_advantage_for_multi_trajectories` computes with one output per session);
- `_update_critic` then `_update_actor`, with the same `extra_info` those methods set.

The batch goes in V1's layout (jagged nested tensors). The CPU workarounds are all in
`step_upstream_patches`. Results go to ``OUT_DIR/<case>.<variant>.pt``.
"""

from __future__ import annotations

import functools
import json
import os
import sys
import time
from typing import Any

from pytest_verl_compat.conformance import step_upstream_patches
from pytest_verl_compat.conformance.step_plan import settings_key


def _compose(model_dir: str, s: dict[str, Any]) -> Any:
    import verl
    from hydra import compose, initialize_config_dir

    actor, critic = s["actor"], s["critic"]
    policy = os.path.join(model_dir, "policy")

    def model(role: str, path: str) -> list[str]:
        return [
            f"{role}.path={path}",
            f"{role}.use_remove_padding=True",
            f"{role}.enable_gradient_checkpointing=False",
            f"+{role}.override_config.attn_implementation=eager",
        ]

    def optim(role: str, o: dict[str, Any]) -> list[str]:
        out = [
            f"{role}.optim.optimizer={o['name']}",
            f"{role}.optim.lr={o['lr']}",
            f"{role}.optim.weight_decay={o['weight_decay']}",
            f"{role}.optim.clip_grad={o['clip_grad']}",
        ]
        if o["name"] == "AdamW":
            out.append(f"{role}.optim.betas=[{o['betas'][0]},{o['betas'][1]}]")
        else:  # torch.optim.SGD takes no betas
            out.append(f"{role}.optim.betas=null")
        return out

    def null(value: Any) -> str:
        return "null" if value is None else str(value)

    a = "actor_rollout_ref.actor"
    overrides = [
        *model("actor_rollout_ref.model", policy),
        f"algorithm.adv_estimator={s['adv_estimator']}",
        f"algorithm.gamma={s['gamma']}",
        f"algorithm.lam={s['lam']}",
        f"algorithm.norm_adv_by_std_in_grpo={s['norm_adv_by_std_in_grpo']}",
        f"algorithm.use_kl_in_reward={s['use_kl_in_reward']}",
        f"algorithm.kl_penalty={s['kl_penalty']}",
        f"algorithm.kl_ctrl.kl_coef={s['kl_coef']}",
        f"actor_rollout_ref.rollout.n={s['n']}",
        f"actor_rollout_ref.rollout.temperature={s['temperature']}",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4",
        *step_upstream_patches.cpu_overrides(f"{a}.fsdp_config"),
        f"{a}.strategy=fsdp2",
        f"{a}.ppo_mini_batch_size={actor['ppo_mini_batch_size']}",
        f"{a}.ppo_micro_batch_size_per_gpu={actor['micro_batch_size']}",
        f"{a}.ppo_epochs={actor['ppo_epochs']}",
        f"{a}.clip_ratio={actor['clip_ratio']}",
        f"{a}.clip_ratio_low={actor['clip_ratio_low']}",
        f"{a}.clip_ratio_high={actor['clip_ratio_high']}",
        f"{a}.clip_ratio_c={actor['clip_ratio_c']}",
        f"{a}.policy_loss.loss_mode={actor['policy_loss_mode']}",
        f"{a}.loss_agg_mode={actor['loss_agg_mode']}",
        f"{a}.loss_scale_factor={null(actor['loss_scale_factor'])}",
        f"{a}.entropy_coeff={actor['entropy_coeff']}",
        f"{a}.use_kl_loss={actor['use_kl_loss']}",
        f"{a}.kl_loss_coef={actor['kl_loss_coef']}",
        f"{a}.kl_loss_type={actor['kl_loss_type']}",
        f"{a}.shuffle={actor['shuffle']}",
        f"{a}.data_loader_seed={actor['data_loader_seed']}",
        *optim(a, actor["optim"]),
    ]
    if s["lora"] is not None:
        lora = s["lora"]
        overrides += [
            f"actor_rollout_ref.model.lora_rank={lora['rank']}",
            f"actor_rollout_ref.model.lora_alpha={lora['alpha']}",
            f"+actor_rollout_ref.model.lora_adapter_path={os.path.join(model_dir, lora['adapter'])}",
        ]
    if critic is not None:
        overrides += [
            *model("critic.model", os.path.join(model_dir, "critic")),
            *step_upstream_patches.cpu_overrides("critic.fsdp"),
            "critic.strategy=fsdp2",
            f"critic.ppo_mini_batch_size={critic['ppo_mini_batch_size']}",
            f"critic.ppo_micro_batch_size_per_gpu={critic['micro_batch_size']}",
            f"critic.ppo_epochs={critic['ppo_epochs']}",
            f"critic.cliprange_value={critic['cliprange_value']}",
            f"critic.loss_agg_mode={critic['loss_agg_mode']}",
            f"critic.loss_scale_factor={null(critic['loss_scale_factor'])}",
            f"critic.shuffle={critic['shuffle']}",
            f"critic.data_loader_seed={critic['data_loader_seed']}",
            *optim("critic", critic["optim"]),
        ]
    config_dir = os.path.join(os.path.dirname(verl.__file__), "trainer", "config")
    with initialize_config_dir(config_dir=config_dir, version_base=None):
        return compose(config_name="ppo_trainer", overrides=overrides)


def _state(engine: Any, trainable_only: bool) -> dict[str, Any]:
    names = {n for n, p in engine.module.named_parameters() if p.requires_grad}
    out = {}
    for key, value in engine.module.state_dict().items():
        if trainable_only and key not in names:
            continue
        full = value.full_tensor() if hasattr(value, "full_tensor") else value
        out[key] = full.detach().clone()
    return out


def _metrics(raw: dict[str, Any]) -> dict[str, float]:
    """Per-mini-batch lists reduced by their mean, as `reduce_metrics` does for the trainer."""
    import numpy as np

    return {k: float(np.mean(v)) for k, v in sorted(raw.items())}


def run_case(model_dir: str, s: dict[str, Any], rollout: dict[str, Any]) -> dict[str, Any]:
    import numpy as np
    import torch
    from verl import DataProto
    from verl.trainer.ppo.core_algos import agg_loss, get_kl_controller
    from verl.trainer.ppo.ray_trainer import apply_kl_penalty, compute_advantage
    from verl.utils import tensordict_utils as tu
    from verl.utils.config import omega_conf_to_dataclass
    from verl.utils.seqlen_balancing import calculate_workload, get_seqlen_balanced_partitions
    from verl.workers.config import CriticConfig, TrainingWorkerConfig
    from verl.workers.engine_workers import ActorRolloutRefWorker, TrainingWorker
    from verl.workers.utils.losses import value_loss
    from verl.workers.utils.padding import response_from_nested, response_to_nested

    torch.manual_seed(0)
    config = _compose(model_dir, s)
    actor = ActorRolloutRefWorker(config=config.actor_rollout_ref, role="actor")
    actor.init_model()
    critic = None
    if s["critic"] is not None:  # trainer_base._setup, minus Ray
        critic_cfg = omega_conf_to_dataclass(config.critic)
        assert isinstance(critic_cfg, CriticConfig)
        critic_cfg.engine.infer_max_token_len_per_gpu = critic_cfg.ppo_infer_max_token_len_per_gpu
        critic_cfg.engine.max_token_len_per_gpu = critic_cfg.ppo_infer_max_token_len_per_gpu
        critic = TrainingWorker(
            config=TrainingWorkerConfig(
                model_type="value_model",
                model_config=critic_cfg.model,
                engine_config=critic_cfg.engine,  # type: ignore[arg-type]
                optimizer_config=critic_cfg.optim,
                checkpoint_config=critic_cfg.checkpoint,
            )
        )
        critic.reset()
        critic.set_loss_fn(functools.partial(value_loss, config=critic_cfg))

    passes_started = time.perf_counter()
    prompts = [torch.tensor(p) for p in rollout["prompts"]]
    responses = [torch.tensor(r) for r in rollout["responses"]]
    rows = len(prompts)
    # trainer_base._balance_batch with one DP rank: the order the update sees.
    seqlen = torch.tensor([len(p) + len(r) for p, r in zip(prompts, responses, strict=True)])
    partitions = get_seqlen_balanced_partitions(
        calculate_workload(seqlen),  # type: ignore[arg-type]  # as trainer_base passes it
        k_partitions=1,
        equal_size=True,
    )
    order = [j for partition in partitions for j in partition]
    prompts = [prompts[j] for j in order]
    responses = [responses[j] for j in order]
    uids = [rollout["uids"][j] for j in order]
    offsets = [torch.tensor(rollout["ref_offsets"][j]) for j in order]
    scores = [rollout["scores"][j] for j in order]

    def nested(xs: Any) -> Any:
        return torch.nested.as_nested_tensor(list(xs), layout=torch.jagged)

    ids = [torch.cat([p, r]) for p, r in zip(prompts, responses, strict=True)]
    ones = [torch.ones(len(r), dtype=torch.int64) for r in responses]
    td = tu.get_tensordict(
        {
            "prompts": nested(prompts),
            "responses": nested(responses),
            "input_ids": nested(ids),
            "position_ids": nested(torch.arange(len(x)) for x in ids),
            "response_mask": nested(ones),
            "loss_mask": nested(ones),
        }
    )
    temperature = s["temperature"]
    width = max(len(r) for r in responses)
    mask = td["response_mask"].to_padded_tensor(0).float()

    def padded(x: Any) -> Any:
        out = x.to_padded_tensor(0.0)
        return torch.nn.functional.pad(out, (0, width - out.shape[1]))

    # trainer_base._compute_old_log_prob
    query = td.clone(recurse=False)
    tu.assign_non_tensor(query, calculate_entropy=True, compute_loss=False, temperature=temperature)
    out = actor.compute_log_prob(query)
    old_log_probs = response_from_nested(tu.get(out, "log_probs"), td["response_mask"])
    entropy = response_from_nested(tu.get(out, "entropy"), td["response_mask"])
    result: dict[str, Any] = {
        "order": order,
        "old_log_probs": padded(old_log_probs),
        "entropy": padded(entropy),
    }
    ref_log_prob = None
    if s["use_reference_policy"]:  # trainer_base._compute_ref_log_prob
        query = td.clone(recurse=False)
        extra = {"calculate_entropy": False, "compute_loss": False, "temperature": temperature}
        if s["lora"] is not None:
            extra["no_lora_adapter"] = True
        tu.assign_non_tensor(query, **extra)
        ref_pass = response_from_nested(
            tu.get(actor.compute_log_prob(query), "log_probs"), td["response_mask"]
        )
        result["ref_log_prob"] = padded(ref_pass)
        ref_log_prob = nested(x + o for x, o in zip(ref_pass.unbind(), offsets, strict=True))
    values = None
    if critic is not None:  # trainer_base._compute_values
        query = td.clone(recurse=False)
        tu.assign_non_tensor(query, compute_loss=False, temperature=temperature)
        values = response_from_nested(
            tu.get(critic.infer_batch(query), "values"), td["response_mask"]
        )
        result["values"] = padded(values)

    # trainer_base._compute_advantage
    token_scores = torch.zeros(rows, width)
    for i, r in enumerate(responses):
        token_scores[i, len(r) - 1] = scores[i]
    batch = {
        "response_mask": mask,
        "token_level_scores": token_scores,
        "old_log_probs": padded(old_log_probs),
        "responses": padded(td["responses"]).long(),
        "attention_mask": torch.cat([torch.ones(rows, 1), mask], dim=1),
    }
    if ref_log_prob is not None:
        batch["ref_log_prob"] = padded(ref_log_prob)
    if values is not None:
        batch["values"] = padded(values)
    data = DataProto.from_dict(tensors=batch, non_tensors={"uid": np.array(uids, dtype=object)})
    if s["use_kl_in_reward"]:
        kl_ctrl = get_kl_controller(config.algorithm.kl_ctrl)  # type: ignore[no-untyped-call]
        data, kl_metrics = apply_kl_penalty(data, kl_ctrl=kl_ctrl, kl_penalty=s["kl_penalty"])
        result["kl_metrics"] = {k: float(v) for k, v in kl_metrics.items()}
    else:
        data.batch["token_level_rewards"] = data.batch["token_level_scores"]
    # V1's compute_advantage_for_multi_trajectories (verl/trainer/ppo/v1/utils.py:148) hands
    # every estimator but GRPO to this function (v1/utils.py:167-176); for GRPO it groups only
    # each session's final output, and here every trajectory is its session's only output. The
    # v1 package itself cannot be imported without transfer_queue (v1/__init__.py:15).
    data = compute_advantage(
        data,
        adv_estimator=s["adv_estimator"],
        gamma=s["gamma"],
        lam=s["lam"],
        num_repeat=s["n"],
        norm_adv_by_std_in_grpo=s["norm_adv_by_std_in_grpo"],
        config=config.algorithm,
    )
    for key in ("token_level_rewards", "advantages", "returns"):
        result[key] = data.batch[key].clone()
    td["old_log_probs"] = old_log_probs
    if ref_log_prob is not None:
        td["ref_log_prob"] = ref_log_prob
    td["advantages"] = response_to_nested(data.batch["advantages"], td["response_mask"])
    td["returns"] = response_to_nested(data.batch["returns"], td["response_mask"])
    if values is not None:
        td["values"] = values

    started = time.perf_counter()
    result["pass_seconds"] = started - passes_started
    metrics: dict[str, dict[str, float]] = {}
    if critic is not None and s["critic"] is not None:  # trainer_base._update_critic
        c = s["critic"]
        mini = c["ppo_mini_batch_size"] * s["n"]
        query = td.clone(recurse=False)
        tu.assign_non_tensor(
            query,
            global_batch_size=mini,
            mini_batch_size=mini,
            epochs=c["ppo_epochs"],
            seed=c["data_loader_seed"],
            dataloader_kwargs={"shuffle": c["shuffle"]},
            temperature=temperature,
        )
        metrics["critic"] = _metrics(tu.get(critic.train_mini_batch(query), "metrics"))
        result["critic"] = _state(critic.engine, trainable_only=True)
    a = s["actor"]  # trainer_base._update_actor
    mini = a["ppo_mini_batch_size"] * s["n"]
    query = td.clone(recurse=False)
    tu.assign_non_tensor(
        query,
        calculate_entropy=a["entropy_coeff"] != 0.0,
        distillation_use_topk=False,
        distillation_only=False,
        global_batch_size=mini,
        mini_batch_size=mini,
        epochs=a["ppo_epochs"],
        seed=a["data_loader_seed"],
        dataloader_kwargs={"shuffle": a["shuffle"]},
        temperature=temperature,
    )
    metrics["actor"] = _metrics(tu.get(actor.update_actor(query), "metrics"))
    # trainer_base._compute_old_log_prob's actor/entropy: the old-log-prob pass, whole batch.
    metrics["actor"]["actor/entropy"] = float(
        agg_loss(
            loss_mat=padded(entropy),
            loss_mask=mask,
            loss_agg_mode=a["loss_agg_mode"],
            loss_scale_factor=a["loss_scale_factor"],
        )
    )
    result["actor"] = _state(
        actor.actor.engine,  # type: ignore[union-attr]  # built by init_model
        trainable_only=s["lora"] is not None,
    )
    result["metrics"] = metrics
    result["update_seconds"] = time.perf_counter() - started
    return result


def main(argv: list[str]) -> int:
    import torch

    out_dir = argv[0]
    torch.set_num_threads(1)
    step_upstream_patches.install()
    request = json.loads(sys.stdin.read())
    for s in request["cases"]:
        started = time.perf_counter()
        result = run_case(request["model_dir"], s, request["rollout"])
        result["seconds"] = time.perf_counter() - started
        name = settings_key(s)
        torch.save(result, os.path.join(out_dir, f"{name}.pt"))
        print(json.dumps({"case": name, "seconds": round(result["seconds"], 2)}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
