"""The reference RL trainer: verl's update semantics on a tiny model, on one CPU.

One training step, in labelled and timed phases (`timing_s/<phase>`):
rollout → score → old/ref log-probs (→ values) → advantages (KL in reward first, when set)
→ update critic, then actor → log → checkpoint.

Where this departs from verl 0.9.0, and why (each change is also written to the run's
`adaptations.json` ledger with the upstream and local values):
- sampling is our KV-cache engine (`rollout.py`, falling back to the HF model) with an explicit
  generator, not vLLM/SGLang; the no-gradient old/ref log-prob passes run on it too, and the
  training passes pack real tokens (`packing.py`, verl's use_remove_padding);
- batch sizes, lengths, learning rates and the step budget are scaled to a CPU (`LocalBudget`);
- prompts are the shipped arithmetic set (`reference_trainer/data/prompts.jsonl`), not gsm8k;
- float32 on one device, one torch thread (bit-reproducible; 2 threads were *slower* here);
- the learning-rate scheduler steps once per training step, as verl's workers do.

This module holds the state and the loop; the parts live next to it: `budget` (the local
budget and the adaptations ledger), `generation` (sampling and the model passes), `reward`
(the score phase), `batching` (the rollout batch, group filtering, mini-/micro-batches),
`updates` (the critic and actor updates), `models` (LoRA, critic, optimizers), `run_files`
(metrics, samples, ledger and HF export) and `checkpoint` (the checkpoint format).
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import random
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from reference_trainer.batching import (
    Batch,
    batch_metrics,
    concat_batches,
    group_filter_metric,
    informative_groups,
)
from reference_trainer.budget import LocalBudget, adapt, check_bindings
from reference_trainer.checkpoint import (
    MANIFEST,
    RESUMABLE,
    CheckpointError,
    checkpoint_step,
    config_differences,
    load_checkpoint,
    resume_folder,
    retire_role,
    save_checkpoint,
)
from reference_trainer.config import ReferenceTrainerConfig
from reference_trainer.data import Prompt, PromptSampler, fitting_prompts, load_prompts
from reference_trainer.generation import (
    generate,
    inference_logits,
    response_values,
    sampling_generator,
    sampling_settings,
)
from reference_trainer.math.advantages import ADVANTAGE_ESTIMATORS
from reference_trainer.math.aggregation import agg_loss, unpadded_scale
from reference_trainer.math.kl import apply_kl_in_reward, kl_controller
from reference_trainer.math.logprobs import entropy_from_logits, log_probs_from_logits
from reference_trainer.models import build_critic, build_optimizer, frozen_reference, wrap_lora
from reference_trainer.reasoning_gym_prompts import check_reasoning_gym_prompts
from reference_trainer.reward import RewardModelScorer, score_batch
from reference_trainer.run_files import (
    append_row,
    append_samples,
    claim_run_folder,
    export_hf,
    locked_run_folder,
    plot_metrics,
    reset_logs,
    write_csv,
    write_ledger,
)
from reference_trainer.tiny import load_policy
from reference_trainer.tracking import Progress, Tracking, silence_library_bars
from reference_trainer.updates import actor_update, critic_update


@dataclass
class RunResult:
    out: Path
    metrics: list[dict[str, float]]
    final_step: int
    export: Path | None


class ReferenceTrainer:
    """Holds the whole training state; `run()` is the loop."""

    def __init__(
        self,
        cfg: ReferenceTrainerConfig,
        budget: LocalBudget,
        out: str | Path,
        *,
        progress: bool = True,
    ) -> None:
        torch.set_num_threads(1)
        # Nothing here should draw from the global generators (sampling, data order and
        # mini-batch order have their own); seeding them once anyway makes a stray use
        # reproducible, and resume restores their saved state instead of re-seeding.
        torch.manual_seed(budget.seed)
        np.random.seed(budget.seed)
        random.seed(budget.seed)
        self.upstream = cfg
        self.cfg, self.ledger = adapt(cfg, budget)
        self.budget = budget
        self.out = Path(out)
        self.progress = progress
        self.seed = budget.seed
        check_bindings(self.cfg, budget)
        # Refused before any work, as upstream refuses it at its first sampling.
        self.group_metric = group_filter_metric(self.cfg.algorithm)
        if not progress:
            silence_library_bars()
        loaded = load_policy(self.cfg.model.path, self.seed)
        self.tokenizer = loaded.tokenizer
        # Training-side passes drop the padding (verl's use_remove_padding; same function).
        self.pad_id = self.tokenizer.pad_token_id
        self.train_prompts = self._fitting(load_prompts(budget.prompts_path, "train"))
        self.val_prompts = self._fitting(load_prompts(budget.prompts_path, "val"))
        self.val_prompts = self.val_prompts[: budget.val_prompts]
        if budget.reward == "reasoning-gym" and not self.cfg.reward.reward_model_enable:
            check_reasoning_gym_prompts(self.train_prompts + self.val_prompts, budget.prompts_path)
        self.base_model = loaded.model
        self.lora = self.cfg.model.lora_rank > 0
        self.policy = (
            wrap_lora(loaded.model, self.cfg.model, self.seed) if self.lora else loaded.model
        )
        # LoRA: the reference is the policy with its adapter disabled, so the frozen base
        # (never a trained adapter, TRL #3194). Full fine-tuning: a frozen copy of the start.
        self.ref = frozen_reference(self.cfg, self.policy)
        # A critic whenever the config has one (critic.enable, else GAE decides), as verl's
        # need_critic (verl/trainer/ppo/utils.py:96-107): V1 trains it also under GRPO.
        self.critic = (
            build_critic(self.cfg.critic_model, self.base_model.config, self.seed)
            if self.cfg.critic is not None
            else None
        )
        self.scorer = (
            RewardModelScorer.load(self.cfg.reward.reward_model_path or "")
            if self.cfg.reward.reward_model_enable
            else None
        )
        # verl's budget: total_training_steps when set, else total_epochs over the data set's
        # full batches (drop_last; verl/trainer/ppo/v1/trainer_base.py:710-716).
        self.steps_per_epoch = len(self.train_prompts) // self.cfg.data.train_batch_size
        total = self.cfg.trainer.total_training_steps
        if total is None:
            total = self.steps_per_epoch * self.cfg.trainer.total_epochs
        self.actor_optimizer, self.actor_scheduler = build_optimizer(
            self.policy, self.cfg.actor.optim, total
        )
        self.critic_optimizer = self.critic_scheduler = None
        if self.critic is not None and self.cfg.critic is not None:
            self.critic_optimizer, self.critic_scheduler = build_optimizer(
                self.critic, self.cfg.critic.optim, total
            )
        self.sampler = PromptSampler(
            len(self.train_prompts),
            self.cfg.data.train_batch_size,
            seed=self.cfg.data.seed,
            shuffle=self.cfg.data.shuffle,
        )
        self.kl_controller = kl_controller(self.cfg.algorithm)
        self.step = 0
        self.actor_updates = 0
        self.critic_updates = 0
        self.total_steps = total
        # The checkpoints this process saved, per role, oldest first: what retention counts
        # (the engine's checkpoint manager keeps this list in memory, checkpoint_manager.py:59).
        self.saved: dict[str, list[Path]] = {"actor": [], "critic": []}

    def _fitting(self, prompts: list[Prompt]) -> list[Prompt]:
        data = self.cfg.data
        return fitting_prompts(
            prompts,
            self.tokenizer,
            data.max_prompt_length,
            drop_overlong=data.filter_overlong_prompts,
        )

    def actor_updates_now(self) -> bool:
        """verl skips the actor while critic_warmup > global_steps, global_steps counting from 1
        (v1/trainer_base.py:582): the actor first updates at step critic_warmup (step 1 when it
        is 0 or 1)."""
        warmup = self.cfg.critic.warmup_steps if self.cfg.critic else 0
        return self.step + 1 >= warmup

    def reference_context(self) -> AbstractContextManager[Any]:
        return self.policy.disable_adapter() if self.lora else nullcontext()

    # -- the loop --------------------------------------------------------------------------------

    def run(
        self, *, resume: bool = False, stop_after: int | None = None, overwrite: bool = False
    ) -> RunResult:
        """Train to `total_training_steps`; `stop_after` ends early (a simulated interruption).

        The run folder is locked for the run; a fresh run refuses an earlier run's files
        unless `overwrite` (see `run_files`). `trainer.logger` is honoured by `tracking`.
        """
        with locked_run_folder(self.out):
            claim_run_folder(self.out, resume=resume, overwrite=overwrite)
            trainer_cfg = self.cfg.trainer
            self.tracking = Tracking(
                trainer_cfg.logger,
                self.out,
                trainer_cfg.project_name,
                trainer_cfg.experiment_name,
                self.cfg.to_dict(),
            )
            try:
                return self._run(resume=resume, stop_after=stop_after)
            finally:
                self.tracking.finish()

    def _run(self, *, resume: bool, stop_after: int | None) -> RunResult:
        metrics_path = self.out / "metrics.jsonl"
        trainer_cfg = self.cfg.trainer
        # Where verl resumes from (trainer_base.py:789-815); a fresh run folder holds no
        # checkpoint, so only resume_path resumes it.
        found = resume_folder(
            self.out / "checkpoints", trainer_cfg.resume_mode, trainer_cfg.resume_from_path
        )
        if found is not None:
            self.load(found)
        self.resumed_from = found
        history = reset_logs(self.out, self.step, resume=resume)
        ledger = self.ledger + self.tracking.ledger
        write_ledger(self.out / "adaptations.json", self.cfg, self.upstream, ledger)
        # verl validates before training on a resumed run too, at the resumed step (:414-420).
        if trainer_cfg.val_before_train:
            history.append(append_row(metrics_path, {"step": self.step, **self.validate()}))
            self.tracking.log({k: v for k, v in history[-1].items() if k != "step"}, self.step)
        last = self.total_steps if stop_after is None else min(stop_after, self.total_steps)
        bar = _progress(self.progress, self.step, self.total_steps, self.cfg.case_id)
        # verl's loop also ends after the last epoch (:443, :498), whatever the step budget.
        while self.step < last and not self._epochs_done():
            metrics = self.train_step()
            is_last_step = self.step >= self.total_steps
            # verl saves, then validates, each at its cadence and at the last step (:457-473);
            # a simulated interruption (`stop_after`) saves too, so that it can be resumed.
            if (
                trainer_cfg.save_freq > 0
                and (is_last_step or self.step % trainer_cfg.save_freq == 0)
            ) or (self.step == last and not is_last_step):
                self.save()
            if trainer_cfg.test_freq > 0 and (
                is_last_step or self.step % trainer_cfg.test_freq == 0
            ):
                metrics.update(self.validate())
            history.append(append_row(metrics_path, {"step": self.step, **metrics}))
            self.tracking.log(metrics, self.step)
            append_samples(self.out / "samples.jsonl", self.step, self.last_batch)
            if bar is not None:
                bar.update(1)
                live = {
                    "reward": f"{metrics['critic/score/mean']:.3f}",
                    "tok/s": f"{metrics['perf/throughput']:.0f}",
                }
                if "actor/ref_kl" in metrics:
                    live["kl"] = f"{metrics['actor/ref_kl']:.4f}"
                bar.set_postfix(live)
        if bar is not None:
            bar.close()
        export = None
        if self.step >= self.total_steps or self._epochs_done():
            export = self.export(self.out / "final")
            write_csv(self.out / "metrics.csv", history)
            plot_metrics(self.out / "metrics.png", history)
        return RunResult(self.out, history, self.step, export)

    def _epochs_done(self) -> bool:
        return self.step // self.steps_per_epoch >= self.cfg.trainer.total_epochs

    def train_step(self) -> dict[str, float]:
        timing: dict[str, float] = {}

        @contextmanager
        def phase(name: str) -> Iterator[None]:
            start = time.perf_counter()
            yield
            timing[f"timing_s/{name}"] = time.perf_counter() - start

        metrics: dict[str, float] = {}
        with phase("step"):
            with phase("gen"):
                self.policy.eval()
                batch, gen_metrics = self.rollout()
            metrics.update(gen_metrics)
            self.last_batch = batch
            with phase("old_log_prob"):
                metrics.update(self.log_probs(batch))
            with phase("adv"):
                metrics.update(self.advantages(batch))
            if self.critic is not None:
                with phase("update_critic"):
                    metrics.update(self.update_critic(batch))
            if self.actor_updates_now():
                with phase("update_actor"):
                    metrics.update(self.update_actor(batch))
        self.step += 1
        metrics.update(batch_metrics(batch))
        metrics.update(timing)
        metrics["actor/num_updates"] = float(self.actor_updates)
        metrics["critic/num_updates"] = float(self.critic_updates)
        tokens = float(batch.response_mask.sum() + batch.prompt_mask.sum())
        metrics["perf/throughput"] = tokens / max(timing["timing_s/step"], 1e-9)
        return metrics

    # -- phases ----------------------------------------------------------------------------------

    def rollout(self) -> tuple[Batch, dict[str, float]]:
        """One step's batch; with group filtering, generate until enough informative groups."""
        rollout = self.cfg.rollout
        kept: list[Batch] = []
        groups = 0
        generated = 0
        while True:
            prompts = self.next_prompts()
            batch = generate(
                self.policy,
                self.tokenizer,
                prompts,
                sampling=sampling_settings(rollout, validate=False),
                max_prompt_length=self.cfg.data.max_prompt_length,
                max_new_tokens=self.cfg.data.max_response_length,
                generator=sampling_generator(self.seed, self.step, generated),
                uid_prefix=f"{generated}:",
            )
            generated += 1
            self.score(batch)
            if self.group_metric is None:
                return batch, {}
            # verl records a scorer's one float as the trajectory's `acc` (group_filter_metric).
            rows, informative = informative_groups(batch.uids, batch.tensors["score"])
            kept.append(batch.select(rows))
            groups += informative
            if groups >= self.cfg.data.train_batch_size:
                merged = concat_batches(kept, self.tokenizer.pad_token_id)
                merged = merged.select(list(range(self.cfg.data.train_batch_size * rollout.n)))
                return merged, {"train/num_gen_batches": float(generated)}
            # max_num_gen_batches is not a bound here: verl's V1 trainer warns that its replay
            # buffer ignores it and refills until the batch is full (v1/trainer_base.py:208-214).

    def next_prompts(self) -> list[Prompt]:
        """The prompts of the next generation batch, in the sampler's order."""
        return [self.train_prompts[i] for i in self.sampler.next_batch()]

    def score(self, batch: Batch) -> None:
        """Token-level scores, accuracy and decoded texts into `batch` (`reward.score_batch`)."""
        score_batch(
            batch,
            self.tokenizer,
            scorer=self.scorer,
            reward=self.budget.reward,
            length_target=self.budget.length_target,
        )

    @torch.no_grad()
    def log_probs(self, batch: Batch) -> dict[str, float]:
        """Old and reference log-probs (and values) into `batch`; returns `actor/entropy`.

        As verl's V1 trainer, `actor/entropy` is the old-log-prob pass's entropy over the whole
        batch, aggregated with the actor's loss_agg_mode (v1/trainer_base.py:1519-1530).
        """
        temperature = self.cfg.rollout.temperature
        self.policy.eval()
        logits = inference_logits(self.policy, batch, self.pad_id)
        batch.tensors["old_log_probs"] = log_probs_from_logits(logits, batch.responses, temperature)
        actor = self.cfg.actor
        entropy = agg_loss(
            entropy_from_logits(logits, temperature),
            batch.response_mask,
            actor.loss_agg_mode,
            loss_scale_factor=unpadded_scale(
                actor.loss_scale_factor, actor.loss_agg_mode, batch.response_mask
            ),
        )
        del logits
        if self.cfg.use_reference_policy:
            with self.reference_context():
                ref_model = self.policy if self.lora else self.ref
                ref_logits = inference_logits(ref_model, batch, self.pad_id)
            batch.tensors["ref_log_prob"] = log_probs_from_logits(
                ref_logits, batch.responses, temperature
            )
        if self.critic is not None:
            self.critic.eval()
            batch.tensors["values"] = response_values(self.critic, batch, self.pad_id)
        return {"actor/entropy": float(entropy)}

    def advantages(self, batch: Batch) -> dict[str, float]:
        metrics: dict[str, float] = {}
        alg = self.cfg.algorithm
        rewards = batch.tensors["token_level_scores"]
        if alg.use_kl_in_reward:
            rewards, metrics = apply_kl_in_reward(
                rewards,
                batch.tensors["old_log_probs"],
                batch.tensors["ref_log_prob"],
                batch.response_mask,
                self.kl_controller,
                alg.kl_penalty,
            )
        batch.tensors["token_level_rewards"] = rewards
        estimator = ADVANTAGE_ESTIMATORS[alg.adv_estimator]
        available: dict[str, Any] = {
            "token_level_rewards": rewards,
            "values": batch.tensors.get("values"),
            "response_mask": batch.response_mask,
            "index": batch.uids,
            "gamma": alg.gamma,
            "lam": alg.lam,
            "norm_adv_by_std_in_grpo": alg.norm_adv_by_std_in_grpo,
        }
        wanted = inspect.signature(estimator).parameters
        adv, returns = estimator(**{k: v for k, v in available.items() if k in wanted})
        batch.tensors["advantages"], batch.tensors["returns"] = adv, returns
        return metrics

    def update_critic(self, batch: Batch) -> dict[str, float]:
        assert self.critic is not None and self.cfg.critic is not None
        metrics, updates = critic_update(
            self.critic,
            self.critic_optimizer,
            self.critic_scheduler,
            batch,
            self.cfg.critic,
            n=self.cfg.rollout.n,
            step=self.step,
            pad_id=self.pad_id,
        )
        self.critic_updates += updates
        return metrics

    def update_actor(self, batch: Batch) -> dict[str, float]:
        metrics, updates = actor_update(
            self.policy,
            self.actor_optimizer,
            self.actor_scheduler,
            batch,
            self.cfg.actor,
            n=self.cfg.rollout.n,
            temperature=self.cfg.rollout.temperature,
            step=self.step,
            pad_id=self.pad_id,
        )
        self.actor_updates += updates
        return metrics

    @torch.no_grad()
    def validate(self) -> dict[str, float]:
        rollout = self.cfg.rollout
        self.policy.eval()
        batch = generate(
            self.policy,
            self.tokenizer,
            self.val_prompts,
            sampling=sampling_settings(rollout, validate=True),
            max_prompt_length=self.cfg.data.max_prompt_length,
            max_new_tokens=self.cfg.data.max_response_length,
            generator=sampling_generator(self.seed, self.step, 10_000),
        )
        self.score(batch)
        return {
            "val/reward/mean": float(batch.tensors["score"].mean()),
            "val/acc": float(batch.tensors["acc"].mean()),
            "val/response_length/mean": float(batch.response_mask.sum(-1).mean()),
        }

    # -- state -----------------------------------------------------------------------------------

    def _policy_tensors(self) -> dict[str, torch.Tensor]:
        if self.lora:
            # Only the adapter trains; the base is rebuilt from the seed or the folder.
            return {k: v for k, v in self.policy.named_parameters() if v.requires_grad}
        return dict(self.policy.state_dict())

    def save(self) -> Path:
        tensors = {"actor": self._policy_tensors()}
        torch_objects: dict[str, Any] = {
            "actor_optimizer": self.actor_optimizer.state_dict(),
            "actor_scheduler": self.actor_scheduler.state_dict(),
            "torch_rng": torch.get_rng_state(),
        }
        if self.critic is not None:
            tensors["critic"] = dict(self.critic.state_dict())
            torch_objects["critic_optimizer"] = self.critic_optimizer.state_dict()
            torch_objects["critic_scheduler"] = self.critic_scheduler.state_dict()
        np_state = np.random.get_state()
        py_state = random.getstate()
        state = {
            "step": self.step,
            "actor_updates": self.actor_updates,
            "critic_updates": self.critic_updates,
            "sampler": self.sampler.state_dict(),
            "kl_controller": dataclasses.asdict(self.kl_controller),
            "numpy_rng": [np_state[0], np_state[1].tolist(), *np_state[2:]],
            "python_rng": [py_state[0], list(py_state[1]), py_state[2]],
            "seed": self.seed,
        }
        folder = save_checkpoint(
            self.out / "checkpoints",
            self.step,
            tensors=tensors,
            torch_objects=torch_objects,
            json_objects={
                "trainer_state": state,
                "config": self.cfg.to_dict(),
                "budget": dataclasses.asdict(self.budget),
            },
            keep=None,
        )
        # Each role's part is retired on its own count (v1/trainer_base.py:895-931).
        keep = {
            "actor": self.cfg.trainer.max_actor_ckpt_to_keep,
            "critic": self.cfg.trainer.max_critic_ckpt_to_keep,
        }
        for role in ("actor", "critic") if self.critic is not None else ("actor",):
            self.saved[role] = retire_role([*self.saved[role], folder], role, keep[role])
        return folder

    def load(self, folder: Path) -> None:
        loaded = load_checkpoint(folder)
        for name in ("config", "trainer_state", "actor", "actor_optimizer", "actor_scheduler"):
            if name not in loaded:
                raise CheckpointError(f"{folder / MANIFEST}: lists no {name} file")
        step = (
            loaded["trainer_state"].get("step")
            if isinstance(loaded["trainer_state"], dict)
            else None
        )
        if type(step) is not int or step != checkpoint_step(folder):
            raise CheckpointError(
                f"{folder / 'trainer_state.json'}: step {step!r} is not the folder's step "
                f"{checkpoint_step(folder)}"
            )
        differing = config_differences(
            loaded["config"], json.loads(json.dumps(self.cfg.to_dict())), ignore=RESUMABLE
        )
        if differing:
            shown = ", ".join(differing[:8]) + (", ..." if len(differing) > 8 else "")
            raise CheckpointError(
                f"{folder / 'config.json'}: the checkpoint's resolved config differs from "
                f"this run's in {shown}"
            )
        try:
            self._restore(folder, loaded)
        except (RuntimeError, ValueError, KeyError, TypeError, IndexError) as exc:
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            raise CheckpointError(f"{folder}: does not fit this run ({first[:300]})") from None

    def _restore(self, folder: Path, loaded: dict[str, Any]) -> None:
        actor = loaded["actor"]
        if self.lora:
            params = dict(self.policy.named_parameters())
            if set(actor) != {k for k, v in params.items() if v.requires_grad}:
                raise CheckpointError(f"{folder / 'actor.safetensors'}: adapter keys differ")
            with torch.no_grad():
                for name, value in actor.items():
                    params[name].copy_(value)
        else:
            self.policy.load_state_dict(actor)
        self.actor_optimizer.load_state_dict(loaded["actor_optimizer"])
        self.actor_scheduler.load_state_dict(loaded["actor_scheduler"])
        if self.critic is not None:
            self.critic.load_state_dict(loaded["critic"])
            self.critic_optimizer.load_state_dict(loaded["critic_optimizer"])
            self.critic_scheduler.load_state_dict(loaded["critic_scheduler"])
        state = loaded["trainer_state"]
        self.step = state["step"]
        self.actor_updates, self.critic_updates = state["actor_updates"], state["critic_updates"]
        self.sampler.load_state_dict(state["sampler"])
        for key, value in state["kl_controller"].items():
            setattr(self.kl_controller, key, value)
        torch.set_rng_state(loaded["torch_rng"])
        np_state = state["numpy_rng"]
        np.random.set_state((np_state[0], np.array(np_state[1], dtype=np.uint32), *np_state[2:]))
        py_state = state["python_rng"]
        random.setstate((py_state[0], tuple(py_state[1]), py_state[2]))

    # -- handoff ---------------------------------------------------------------------------------

    def export(self, folder: Path) -> Path:
        """The final actor in HF format; LoRA: the adapter, its base, and a merged model."""
        return export_hf(folder, self.policy, self.tokenizer, self.cfg, lora=self.lora)


def _progress(enabled: bool, initial: int, total: int, case: str) -> Progress:
    """A tqdm bar on a terminal, a line per step elsewhere, silence when disabled (`tracking`)."""
    return Progress(enabled, initial, total, case)
