"""Upstream's side of the step oracle: verl 0.9.0's V1 training steps on its FSDP engine, on a CPU.

Run only as ``python -I -m pytest_verl_compat.conformance.step.upstream OUT_DIR`` through
`pytest_verl_compat.upstream.oracle.runner.run_module`, once per data-parallel rank (the request
arrives on stdin, see `plan.request_json`; with several ranks the runner starts one process per
rank and they meet in one gloo process group). It imports verl once and runs every requested
case the way `verl/trainer/ppo/v1/trainer_base.py` runs a step (`_step_once`, :536-586), minus
Ray and TransferQueue, for as many consecutive steps as the case asks:

- the composed config (`_compose`): verl's own `ppo_trainer` tree with the case's step settings,
  the shape and the optimizer variant as overrides (`plan.step_settings`); the optimizers'
  horizon is the trainer's total steps, as `trainer_base.py:711-729` sets it;
- workers as `trainer_base._setup` builds them: the actor
  (`engine_workers.ActorRolloutRefWorker(role="actor")`), a reference worker
  (`role="ref"`, the initial weights) unless LoRA makes the actor with its adapter off the
  reference (`trainer_base.py:317-322`), the critic (`engine_workers.TrainingWorker` with
  `losses.value_loss`) when `need_critic`, and the in-reward KL controller (`:131`);
- per step: V1's padding of the batch to the multiple its updates need
  (`_get_required_batch_multiple`, :1434-1451, with `padding_utils`' own template) and its
  balance over ranks (`_balance_batch`, :1453-1477); old log-probs and entropy, reference
  log-probs, values (`_compute_old_log_prob`, `_compute_ref_log_prob`, `_compute_values`), each
  rank on its contiguous share, as V1's dispatch splits it; rewards after
  `ray_trainer.apply_kl_penalty` and advantages from `ray_trainer.compute_advantage` on the
  whole batch (what the controller holds); `_update_critic`, then `_update_actor` once
  `trainer.critic_warmup <= global_steps` (:582), with the `extra_info` those methods set.

The CPU workarounds are all in `upstream_patches`. Rank 0 writes ``OUT_DIR/<case>.<variant>.pt``.
"""

from __future__ import annotations

import functools
import json
import math
import os
import sys
import time
from dataclasses import dataclass
from typing import Any

from pytest_verl_compat.conformance.step import upstream_patches
from pytest_verl_compat.conformance.step.plan import fixed_rollout, hydra_overrides, settings_key

ACTOR = "actor_rollout_ref.actor"


def _compose(model_dir: str, s: dict[str, Any]) -> Any:
    import verl
    from hydra import compose, initialize_config_dir

    def model(role: str, path: str) -> list[str]:
        return [
            f"{role}.path={path}",
            f"{role}.use_remove_padding=True",
            f"{role}.enable_gradient_checkpointing=False",
            f"+{role}.override_config.attn_implementation=eager",
        ]

    leaves = s["overrides"]
    total = leaves.get("trainer.total_training_steps") or s["steps"]
    overrides = [
        *model("actor_rollout_ref.model", os.path.join(model_dir, "policy")),
        *model("critic.model", os.path.join(model_dir, "critic")),
        *upstream_patches.cpu_overrides(f"{ACTOR}.fsdp_config"),
        *upstream_patches.cpu_overrides("actor_rollout_ref.ref.fsdp_config"),
        *upstream_patches.cpu_overrides("critic.fsdp"),
        f"{ACTOR}.strategy=fsdp2",
        "actor_rollout_ref.ref.strategy=fsdp2",
        "critic.strategy=fsdp2",
        *hydra_overrides(leaves),
        f"{ACTOR}.optim.total_training_steps={total}",
        f"critic.optim.total_training_steps={total}",
    ]
    if s["lora"] is not None:
        path = os.path.join(model_dir, s["lora"]["adapter"])
        overrides.append(f"+actor_rollout_ref.model.lora_adapter_path={path}")
    config_dir = os.path.join(os.path.dirname(verl.__file__), "trainer", "config")
    with initialize_config_dir(config_dir=config_dir, version_base=None):
        return compose(config_name="ppo_trainer", overrides=overrides)


def _state(engine: Any, trainable_only: bool) -> dict[str, Any]:
    """Full parameters (a collective with several ranks: every rank takes part)."""
    names = {n for n, p in engine.module.named_parameters() if p.requires_grad}
    out = {}
    for key, value in engine.module.state_dict().items():
        if trainable_only and key not in names:
            continue
        full = value.full_tensor() if hasattr(value, "full_tensor") else value
        out[key] = full.detach().clone()
    return out


def _metrics(raw: dict[str, Any]) -> tuple[dict[str, float], dict[str, list[float]]]:
    """Per-mini-batch lists reduced by their mean, as `reduce_metrics` does for the trainer,
    and the lists themselves (what the case's activity claims read)."""
    import numpy as np

    lists = {
        k: [float(x) for x in (v if isinstance(v, list) else [v])] for k, v in sorted(raw.items())
    }
    return {k: float(np.mean(v)) for k, v in lists.items()}, lists


def _required_multiple(config: Any, dp: int, use_critic: bool, global_step: int) -> int:
    """trainer_base._get_required_batch_multiple (:1434-1451; the v1 package cannot be imported
    without transfer_queue, v1/__init__.py:15)."""
    multiple = dp
    n = config.actor_rollout_ref.rollout.n
    if use_critic:
        multiple = math.lcm(multiple, config.critic.ppo_mini_batch_size * n)
    if config.trainer.critic_warmup <= global_step:
        multiple = math.lcm(multiple, config.actor_rollout_ref.actor.ppo_mini_batch_size * n)
    return multiple


def _nested(xs: Any) -> Any:
    import torch

    return torch.nested.as_nested_tensor(list(xs), layout=torch.jagged)


@dataclass
class _Rows:
    """One step's trajectories as V1 holds them: the rollout's, then its padding rows; `order`
    is the balanced order of all of them, `mine` this rank's contiguous share of it."""

    prompts: list[Any]
    responses: list[Any]
    masks: list[Any]
    scores: list[float]
    offsets: list[Any]
    uids: list[str]
    real: int
    order: list[int]
    mine: list[int]

    def tensordict(self) -> Any:
        """This rank's rows in V1's layout (jagged nested tensors)."""
        import torch
        from verl.utils import tensordict_utils as tu

        ids = [torch.cat([self.prompts[j], self.responses[j]]) for j in self.mine]
        return tu.get_tensordict(
            {
                "prompts": _nested(self.prompts[j] for j in self.mine),
                "responses": _nested(self.responses[j] for j in self.mine),
                "input_ids": _nested(ids),
                "position_ids": _nested(torch.arange(len(x)) for x in ids),
                "response_mask": _nested(self.masks[j] for j in self.mine),
                "loss_mask": _nested(self.masks[j] for j in self.mine),
            }
        )

    def padded(self, by_row: dict[int, Any] | list[Any]) -> Any:
        """Per-row values in the balanced order, right-padded with zeros."""
        import torch

        width = max(len(r) for r in self.responses)
        out = torch.zeros(len(self.order), width)
        for i, j in enumerate(self.order):
            out[i, : len(by_row[j])] = by_row[j]
        return out


class _Case:
    """The workers and controller state of one case, kept across its steps."""

    def __init__(self, model_dir: str, s: dict[str, Any], eos: int) -> None:
        import torch
        import torch.distributed as dist
        from verl.trainer.ppo.core_algos import get_kl_controller
        from verl.trainer.ppo.utils import need_critic, need_reference_policy
        from verl.utils.config import omega_conf_to_dataclass
        from verl.workers.config import CriticConfig, TrainingWorkerConfig
        from verl.workers.engine_workers import ActorRolloutRefWorker, TrainingWorker
        from verl.workers.utils.losses import value_loss

        torch.manual_seed(0)
        self.eos = eos
        self.config = config = _compose(model_dir, s)
        self.dp, self.rank = dist.get_world_size(), dist.get_rank()
        self.lora = s["lora"] is not None
        self.actor = ActorRolloutRefWorker(config=config.actor_rollout_ref, role="actor")
        self.actor.init_model()
        self.use_ref = bool(need_reference_policy(config))
        self.ref = None
        if self.use_ref and not self.lora:  # trainer_base.py:317-322: ref_in_actor with LoRA
            self.ref = ActorRolloutRefWorker(config=config.actor_rollout_ref, role="ref")
            self.ref.init_model()
        self.critic = None
        if need_critic(config):  # trainer_base._setup, minus Ray
            critic_cfg = omega_conf_to_dataclass(config.critic)
            assert isinstance(critic_cfg, CriticConfig)
            critic_cfg.engine.infer_max_token_len_per_gpu = (
                critic_cfg.ppo_infer_max_token_len_per_gpu
            )
            critic_cfg.engine.max_token_len_per_gpu = critic_cfg.ppo_infer_max_token_len_per_gpu
            self.critic = TrainingWorker(
                config=TrainingWorkerConfig(
                    model_type="value_model",
                    model_config=critic_cfg.model,
                    engine_config=critic_cfg.engine,
                    optimizer_config=critic_cfg.optim,
                    checkpoint_config=critic_cfg.checkpoint,
                )
            )
            self.critic.reset()
            self.critic.set_loss_fn(functools.partial(value_loss, config=critic_cfg))
        self.kl_ctrl = (
            get_kl_controller(config.algorithm.kl_ctrl)
            if config.algorithm.use_kl_in_reward
            else None
        )

    def gather(self, local: list[Any]) -> list[Any]:
        """Every rank's rows, rank by rank (each rank holds a contiguous share)."""
        import torch.distributed as dist

        if self.dp == 1:
            return local
        parts: list[Any] = [None] * self.dp
        dist.all_gather_object(parts, local)
        return [row for part in parts for row in part]

    def rows(self, rollout: dict[str, Any], global_step: int) -> _Rows:
        """trainer_base._balance_batch: the rollout padded to the multiple the updates need,
        with V1's own no-op template (prompt and response one EOS each, response and loss masks
        zero), then balanced over the ranks; this rank's rows are its contiguous share."""
        import torch
        from verl.trainer.ppo.padding_utils import construct_minimal_padding_template
        from verl.utils.seqlen_balancing import calculate_workload, get_seqlen_balanced_partitions

        prompts = [torch.tensor(p) for p in rollout["prompts"]]
        responses = [torch.tensor(r) for r in rollout["responses"]]
        scores = list(rollout["scores"])
        offsets = [torch.tensor(o) for o in rollout["ref_offsets"]]
        uids = list(rollout["uids"])
        real = len(prompts)
        pad = -real % _required_multiple(self.config, self.dp, self.critic is not None, global_step)
        if pad:
            template, _ = construct_minimal_padding_template(
                {"prompts": prompts[0], "responses": responses[0]}, {}, self.eos
            )
            prompts += [template["prompts"]] * pad
            responses += [template["responses"]] * pad
            scores += [0.0] * pad
            offsets += [torch.zeros(1)] * pad
            uids += ["pad"] * pad
        masks = [torch.ones(len(r), dtype=torch.int64) for r in responses[:real]]
        masks += [torch.zeros(1, dtype=torch.int64)] * pad
        seqlen = torch.tensor([len(p) + len(r) for p, r in zip(prompts, responses, strict=True)])
        partitions = get_seqlen_balanced_partitions(
            calculate_workload(seqlen),  # as trainer_base passes it
            k_partitions=self.dp,
            equal_size=True,
        )
        order = [j for partition in partitions for j in partition]
        share = len(order) // self.dp
        return _Rows(
            prompts,
            responses,
            masks,
            scores,
            offsets,
            uids,
            real,
            order,
            order[self.rank * share : (self.rank + 1) * share],
        )

    def step(self, rollout: dict[str, Any], global_step: int) -> dict[str, Any]:
        """trainer_base._step_once from the balanced batch on (its steps 4-9)."""
        from verl.trainer.ppo.core_algos import agg_loss
        from verl.utils import tensordict_utils as tu
        from verl.workers.utils.padding import response_from_nested, response_to_nested

        actor_cfg = self.config.actor_rollout_ref.actor
        temperature = self.config.actor_rollout_ref.rollout.temperature
        passes_started = time.perf_counter()
        rows = self.rows(rollout, global_step)
        td = rows.tensordict()

        def ask(worker_call: Any, keys: tuple[str, ...], **extra: Any) -> list[dict[int, Any]]:
            """Each of `keys` for the rows of every rank, by row."""
            query = td.clone(recurse=False)
            tu.assign_non_tensor(query, temperature=temperature, **extra)
            out = worker_call(query)
            found = []
            for key in keys:
                mine = response_from_nested(tu.get(out, key), td["response_mask"]).unbind()
                everyone = self.gather([x.clone() for x in mine])
                found.append(dict(zip(rows.order, everyone, strict=True)))
            return found

        # trainer_base._compute_old_log_prob
        old, entropy = ask(
            self.actor.compute_log_prob,
            ("log_probs", "entropy"),
            calculate_entropy=True,
            compute_loss=False,
        )
        result: dict[str, Any] = {
            "order": rows.order,
            "real": rows.real,
            "old_log_probs": rows.padded(old),
            "entropy": rows.padded(entropy),
        }
        ref_log_prob = None
        if self.use_ref:  # trainer_base._compute_ref_log_prob
            extra = {"calculate_entropy": False, "compute_loss": False}
            if self.lora:
                (ref,) = ask(
                    self.actor.compute_log_prob, ("log_probs",), no_lora_adapter=True, **extra
                )
            else:
                assert self.ref is not None
                (ref,) = ask(self.ref.compute_ref_log_prob, ("log_probs",), **extra)
            result["ref_log_prob"] = rows.padded(ref)
            ref_log_prob = {j: x + rows.offsets[j][: len(x)] for j, x in ref.items()}
        values: dict[int, Any] = {}
        if self.critic is not None:  # trainer_base._compute_values
            (values,) = ask(self.critic.infer_batch, ("values",), compute_loss=False)
            result["values"] = rows.padded(values)

        data, kl_metrics = self.advantages(rows, old, ref_log_prob, values)
        for key in ("token_level_rewards", "advantages", "returns"):
            result[key] = data.batch[key].clone()
        position = [rows.order.index(j) for j in rows.mine]
        td["old_log_probs"] = _nested(old[j] for j in rows.mine)
        if ref_log_prob is not None:
            td["ref_log_prob"] = _nested(ref_log_prob[j] for j in rows.mine)
        for key in ("advantages", "returns"):
            td[key] = response_to_nested(data.batch[key][position], td["response_mask"])
        if values:
            td["values"] = _nested(values[j] for j in rows.mine)

        started = time.perf_counter()
        result["pass_seconds"] = started - passes_started
        metrics, raw, states = self.update(td, global_step)
        metrics["actor"].update(kl_metrics)  # trainer_base._compute_advantage's metrics
        # trainer_base._compute_old_log_prob's actor/entropy: the old-log-prob pass, whole batch.
        metrics["actor"]["actor/entropy"] = float(
            agg_loss(
                loss_mat=rows.padded(entropy),
                loss_mask=rows.padded([m.float() for m in rows.masks]),
                loss_agg_mode=actor_cfg.loss_agg_mode,
                loss_scale_factor=actor_cfg.loss_scale_factor,
            )
        )
        result.update(states, metrics=metrics, raw_metrics=raw)
        result["update_seconds"] = time.perf_counter() - started
        return result

    def advantages(
        self,
        rows: _Rows,
        old: dict[int, Any],
        ref_log_prob: dict[int, Any] | None,
        values: dict[int, Any],
    ) -> tuple[Any, dict[str, float]]:
        """trainer_base._compute_advantage, on the whole batch as the controller holds it."""
        import numpy as np
        import torch
        from verl import DataProto
        from verl.trainer.ppo.ray_trainer import apply_kl_penalty, compute_advantage

        algorithm = self.config.algorithm
        mask = rows.padded([m.float() for m in rows.masks])
        token_scores = torch.zeros_like(mask)
        for i, j in enumerate(rows.order):
            if j < rows.real:
                token_scores[i, len(rows.responses[j]) - 1] = rows.scores[j]
        batch = {
            "response_mask": mask,
            "token_level_scores": token_scores,
            "old_log_probs": rows.padded(old),
            "responses": rows.padded([r.float() for r in rows.responses]).long(),
            "attention_mask": torch.cat([torch.ones(len(rows.order), 1), mask], dim=1),
        }
        if ref_log_prob is not None:
            batch["ref_log_prob"] = rows.padded(ref_log_prob)
        if values:
            batch["values"] = rows.padded(values)
        uids = np.array([rows.uids[j] for j in rows.order], dtype=object)
        data = DataProto.from_dict(tensors=batch, non_tensors={"uid": uids})
        kl_metrics: dict[str, float] = {}
        if self.kl_ctrl is not None:
            data, found = apply_kl_penalty(
                data, kl_ctrl=self.kl_ctrl, kl_penalty=algorithm.kl_penalty
            )
            kl_metrics = {k: float(v) for k, v in found.items()}
        else:
            data.batch["token_level_rewards"] = data.batch["token_level_scores"]
        # V1's compute_advantage_for_multi_trajectories (verl/trainer/ppo/v1/utils.py:148) hands
        # every estimator but GRPO to this function (v1/utils.py:167-176); for GRPO it groups only
        # each session's final output, and here every trajectory is its session's only output.
        data = compute_advantage(
            data,
            adv_estimator=algorithm.adv_estimator,
            gamma=algorithm.gamma,
            lam=algorithm.lam,
            num_repeat=self.config.actor_rollout_ref.rollout.n,
            norm_adv_by_std_in_grpo=algorithm.get("norm_adv_by_std_in_grpo", True),
            config=algorithm,
        )
        return data, kl_metrics

    def update(
        self, td: Any, global_step: int
    ) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
        """trainer_base._update_critic, then _update_actor once critic_warmup <= global_steps
        (:582), with the extra_info they set: metrics, per-mini-batch metrics, parameters."""
        from verl.utils import tensordict_utils as tu

        config = self.config
        n = config.actor_rollout_ref.rollout.n
        temperature = config.actor_rollout_ref.rollout.temperature
        metrics: dict[str, Any] = {"actor": {}}
        raw: dict[str, Any] = {}
        states: dict[str, Any] = {}
        if self.critic is not None:
            critic_cfg = config.critic
            mini = critic_cfg.ppo_mini_batch_size * n
            query = td.clone(recurse=False)
            tu.assign_non_tensor(
                query,
                global_batch_size=mini,
                mini_batch_size=mini,
                epochs=critic_cfg.ppo_epochs,
                seed=critic_cfg.data_loader_seed,
                dataloader_kwargs={"shuffle": critic_cfg.shuffle},
                temperature=temperature,
            )
            metrics["critic"], raw["critic"] = _metrics(
                tu.get(self.critic.train_mini_batch(query), "metrics")
            )
            states["critic"] = _state(self.critic.engine, trainable_only=True)
        if config.trainer.critic_warmup <= global_step:
            actor_cfg = config.actor_rollout_ref.actor
            mini = actor_cfg.ppo_mini_batch_size * n
            query = td.clone(recurse=False)
            tu.assign_non_tensor(
                query,
                calculate_entropy=actor_cfg.calculate_entropy or actor_cfg.entropy_coeff != 0.0,
                distillation_use_topk=False,
                distillation_only=False,
                global_batch_size=mini,
                mini_batch_size=mini,
                epochs=actor_cfg.ppo_epochs,
                seed=actor_cfg.data_loader_seed,
                dataloader_kwargs={"shuffle": actor_cfg.shuffle},
                temperature=temperature,
            )
            metrics["actor"], raw["actor"] = _metrics(
                tu.get(self.actor.update_actor(query), "metrics")
            )
        states["actor"] = _state(
            self.actor.actor.engine,  # built by init_model
            trainable_only=self.lora,
        )
        return metrics, raw, states


def run_case(model_dir: str, s: dict[str, Any], eos: int, vocab: range) -> dict[str, Any]:
    case = _Case(model_dir, s, eos)
    steps = [
        case.step(fixed_rollout(vocab, eos, spec), global_step)
        for global_step, spec in enumerate(s["rollouts"], 1)
    ]
    return {"steps": steps}


def main(argv: list[str]) -> int:
    import torch
    import torch.distributed as dist

    out_dir = argv[0]
    torch.set_num_threads(1)
    upstream_patches.install()
    request = json.loads(sys.stdin.read())
    for s in request["cases"]:
        started = time.perf_counter()
        result = run_case(request["model_dir"], s, request["eos"], range(*request["vocab"]))
        result["seconds"] = time.perf_counter() - started
        name = settings_key(s)
        if dist.get_rank() == 0:
            torch.save(result, os.path.join(out_dir, f"{name}.pt"))
            print(json.dumps({"case": name, "seconds": round(result["seconds"], 2)}), flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
