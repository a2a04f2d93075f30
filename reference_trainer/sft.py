"""The reference SFT trainer: verl 0.9.0's `sft_trainer` loop on a tiny model, on one CPU.

The loop (verl/trainer/sft_trainer.py:308-448), top to bottom: take the next batch of
`data.train_batch_size` conversations (DistributedSampler order, `sft_data.SFTSampler`), one
optimizer step on it (`sft_step.sft_update`), log, validate every `test_freq` steps and at the
last, checkpoint every `save_freq` steps and at the last; the step budget is
`trainer.total_training_steps`, else batches per epoch × `total_epochs` (:181-185).

Where this departs from verl, each also written to the run's `adaptations.json`:
- the conversations are local (`sft_data`), the model the tiny one or a local folder;
- the batch size, sequence length and step budget are scaled to a CPU (`SFTBudget`);
- one device in float32 (verl's mixed precision and sharding are lowered by the profile);
- `trainer.seed` is unused, as in verl; `--seed` seeds the tiny model and LoRA's start only.
A checkpoint holds the whole state (weights or adapter, optimizer, scheduler, sampler, RNG,
step, config), so a resume in a new process continues bit-identically, except as verl's own:
resumed from a checkpoint of an epoch's last batch, verl's loader yields nothing for the next
epoch (`SFTSampler.resumed`), so the run goes on with the epoch after it.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from reference_trainer.checkpoint import (
    MANIFEST,
    RESUMABLE,
    CheckpointError,
    checkpoint_step,
    config_differences,
    load_checkpoint,
    resume_folder,
    save_checkpoint,
)
from reference_trainer.config import SFTConfig
from reference_trainer.data import PROMPTS_PATH
from reference_trainer.models import wrap_lora
from reference_trainer.run_files import (
    append_row,
    claim_run_folder,
    locked_run_folder,
    plot_metrics,
    reset_logs,
    write_atomic,
    write_csv,
)
from reference_trainer.sft_data import SFTSampler, load_conversations, tokenize_all
from reference_trainer.sft_step import build_sft_optimizer, sft_update, sft_validation_loss
from reference_trainer.tiny import load_policy
from reference_trainer.tracking import Tracking, silence_library_bars


@dataclass(frozen=True)
class SFTBudget:
    """What a local run changes against the case: sizes a CPU can train, and its inputs."""

    steps: int | None = 20
    """Optimizer steps (replaces the case's step budget); None keeps the case's:
    ``trainer.total_training_steps``, else batches per epoch × ``trainer.total_epochs``."""
    train_batch_size: int = 8
    """Conversations per step (replaces ``data.train_batch_size``)."""
    max_length: int = 96
    """Tokens per conversation (replaces ``data.max_length``; longer ones are cut)."""
    model: str = "tiny"
    conversations: str = str(PROMPTS_PATH)
    """A JSONL of ``{"messages": [...]}`` rows, or a prompt file (one user and one assistant turn)."""
    seed: int = 0
    save_freq: int | None = None
    test_freq: int | None = None
    val_batches: int = 2


def adapt_sft(cfg: SFTConfig, budget: SFTBudget) -> tuple[SFTConfig, list[dict[str, Any]]]:
    """The local config and the ledger of every field it changes (upstream → local)."""
    changes: dict[str, tuple[Any, Any]] = {
        "data.train_batch_size": (cfg.data.train_batch_size, budget.train_batch_size),
        "data.max_length": (cfg.data.max_length, min(cfg.data.max_length, budget.max_length)),
        "model.path": (cfg.model.path, budget.model),
    }
    if budget.steps is not None:
        changes["trainer.total_training_steps"] = (cfg.trainer.total_training_steps, budget.steps)
    if cfg.data.max_length > budget.max_length:
        changes["data.truncation"] = (cfg.data.truncation, "right")
    if budget.save_freq is not None:
        changes["trainer.save_freq"] = (cfg.trainer.save_freq, budget.save_freq)
    if budget.test_freq is not None:
        changes["trainer.test_freq"] = (cfg.trainer.test_freq, budget.test_freq)
    local = dataclasses.replace(
        cfg,
        data=dataclasses.replace(
            cfg.data,
            train_batch_size=changes["data.train_batch_size"][1],
            max_length=changes["data.max_length"][1],
            truncation=changes.get("data.truncation", (None, cfg.data.truncation))[1],
        ),
        model=dataclasses.replace(cfg.model, path=budget.model),
        trainer=dataclasses.replace(
            cfg.trainer,
            total_training_steps=changes.get(
                "trainer.total_training_steps", (None, cfg.trainer.total_training_steps)
            )[1],
            save_freq=changes.get("trainer.save_freq", (None, cfg.trainer.save_freq))[1],
            test_freq=changes.get("trainer.test_freq", (None, cfg.trainer.test_freq))[1],
        ),
    )
    ledger = [
        {"field": name, "upstream": old, "local": new}
        for name, (old, new) in changes.items()
        if old != new
    ]
    ledger += [
        {"field": name, "upstream": cfg.lowered_values.get(name), "local": how}
        for name, how in sorted(cfg.lowered.items())
    ]
    return local, ledger


def sft_resume_folder(root: Path, mode: str, path: str | None) -> Path | None:
    """The checkpoint an SFT run resumes from, as verl's ``CheckpointHandler`` picks it
    (verl/utils/checkpoint/checkpoint_handler.py:196-219): unlike the RL trainer's, ``auto``
    takes ``resume_from_path`` when it is set (:203-208), else the latest checkpoint."""
    if mode == "auto" and path is not None:
        return resume_folder(root, "resume_path", path)
    return resume_folder(root, mode, path)


class SFTTrainer:
    """Holds the whole SFT training state; `run()` is the loop."""

    def __init__(
        self, cfg: SFTConfig, budget: SFTBudget, out: str | Path, *, progress: bool = True
    ) -> None:
        torch.set_num_threads(1)
        torch.manual_seed(budget.seed)
        self.upstream = cfg
        self.cfg, self.ledger = adapt_sft(cfg, budget)
        self.budget, self.out, self.progress = budget, Path(out), progress
        if not progress:
            silence_library_bars()
        loaded = load_policy(self.cfg.model.path, budget.seed)
        self.tokenizer = loaded.tokenizer
        self.pad_id = int(self.tokenizer.pad_token_id)
        self.lora = self.cfg.model.lora_rank > 0
        self.policy = (
            wrap_lora(loaded.model, self.cfg.model, budget.seed) if self.lora else loaded.model
        )
        data = self.cfg.data

        def tokenized(split: str) -> list[Any]:
            conversations = load_conversations(budget.conversations, split)
            return tokenize_all(
                self.tokenizer,
                conversations,
                max_length=data.max_length,
                truncation=data.truncation,
            )

        self.train_set, self.val_set = tokenized("train"), tokenized("val")
        self.sampler = SFTSampler(len(self.train_set), data.train_batch_size)
        self.total_steps = int(
            self.cfg.trainer.total_training_steps
            or (self.sampler.batches_per_epoch * self.cfg.trainer.total_epochs)
        )
        self.optimizer, self.scheduler = build_sft_optimizer(
            self.policy, self.cfg.optimizer, self.cfg.optim, self.total_steps
        )
        self.step = 0
        # verl's "after_each_epoch" is the batches of one epoch (sft_trainer.py:190-196).
        per_epoch = self.sampler.batches_per_epoch
        loop = self.cfg.trainer
        self.save_freq = per_epoch if loop.save_freq == "after_each_epoch" else int(loop.save_freq)
        self.test_freq = per_epoch if loop.test_freq == "after_each_epoch" else int(loop.test_freq)
        # verl takes each step's remainder by these before it asks whether they are positive
        # (sft_trainer.py:412-413): zero divides by zero at the first step.
        for name, value in (("save_freq", self.save_freq), ("test_freq", self.test_freq)):
            if value == 0:
                raise ValueError(
                    f"trainer.{name}=0: verl 0.9.0's SFT loop divides by it at the first step "
                    "(verl/trainer/sft_trainer.py:412-413); -1 turns it off"
                )
        self.resumed_from: Path | None = None

    # -- the loop ---------------------------------------------------------------------------------

    def run(
        self, *, resume: bool = False, stop_after: int | None = None, overwrite: bool = False
    ) -> list[dict[str, float]]:
        """Train to the step budget; `stop_after` ends early (a simulated interruption)."""
        with locked_run_folder(self.out):
            claim_run_folder(self.out, resume=resume, overwrite=overwrite)
            loop = self.cfg.trainer
            tracking = Tracking(
                loop.logger, self.out, loop.project_name, loop.experiment_name, self.cfg.to_dict()
            )
            try:
                return self._run(tracking, resume=resume, stop_after=stop_after)
            finally:
                tracking.finish()

    def _run(
        self, tracking: Tracking, *, resume: bool, stop_after: int | None
    ) -> list[dict[str, float]]:
        loop = self.cfg.trainer
        # Where verl resumes from (checkpoint_handler.py:143-168, :196-219): none under
        # disable, the latest checkpoint under auto, resume_from_path under resume_path.
        found = sft_resume_folder(self.out / "checkpoints", loop.resume_mode, loop.resume_from_path)
        if resume and found is None and loop.resume_mode == "auto":
            raise CheckpointError(f"{self.out / 'checkpoints'}: no complete checkpoint")
        if found is not None:
            self.load(found)
        self.resumed_from = found
        history = reset_logs(self.out, self.step, resume=resume)
        ledger = self.ledger + [dataclasses.asdict(a) for a in tracking.ledger]
        write_atomic(
            self.out / "adaptations.json",
            json.dumps({"case": self.cfg.case_id, "adaptations": ledger}, indent=1, default=str),
        )
        # verl's loop runs over the epochs from the resumed one (sft_trainer.py:341, :356) and
        # ends at the first step at or past the step budget (:411, :444-448), or with the
        # last epoch, then without a last save or validation.
        while self.sampler.next_epoch < loop.total_epochs:
            if stop_after is not None and self.step >= stop_after:
                break
            started = time.perf_counter()
            batch = [self.train_set[i] for i in self.sampler.next_batch()]
            metrics = sft_update(
                self.policy,
                self.optimizer,
                self.scheduler,
                batch,
                pad_id=self.pad_id,
                grad_clip=self.cfg.optim.grad_clip,
                micro_batch_size=self.cfg.data.micro_batch_size,
                max_token_len=self.cfg.data.max_token_len,
                packed=self.cfg.use_remove_padding,
            )
            self.step += 1
            metrics["timing_s/step"] = time.perf_counter() - started
            is_last_step = self.step >= self.total_steps
            # verl validates at every test_freq-th step and at the last (sft_trainer.py:411-416).
            if self.val_set and (
                is_last_step or (self.test_freq > 0 and self.step % self.test_freq == 0)
            ):
                metrics["val/loss"] = self.validate()
            history.append(append_row(self.out / "metrics.jsonl", {"step": self.step, **metrics}))
            tracking.log(metrics, self.step)
            # verl saves at every save_freq-th step and at the last (:440-442); a simulated
            # interruption saves too, so that it can be resumed.
            if (
                is_last_step
                or (self.save_freq > 0 and self.step % self.save_freq == 0)
                or self.step == stop_after
            ):
                self.save()
            if self.progress:
                print(f"{self.cfg.case_id} step {self.step}: loss {metrics['train/loss']:.4f}")
            if is_last_step:
                break
        if self.step >= self.total_steps or self.sampler.next_epoch >= loop.total_epochs:
            self.export(self.out / "final")
            write_csv(self.out / "metrics.csv", history)
            plot_metrics(self.out / "metrics.png", history)
        return history

    def validate(self) -> float:
        size = self.cfg.data.train_batch_size
        batches = [
            self.val_set[i : i + size] for i in range(0, len(self.val_set) - size + 1, size)
        ][: self.budget.val_batches]
        return sft_validation_loss(
            self.policy, batches, pad_id=self.pad_id, packed=self.cfg.use_remove_padding
        )

    # -- checkpoints ------------------------------------------------------------------------------

    def _weights(self) -> dict[str, torch.Tensor]:
        if self.lora:  # only the adapter trains; the base is rebuilt from the seed or the folder
            return {k: v for k, v in self.policy.named_parameters() if v.requires_grad}
        return dict(self.policy.state_dict())

    def save(self) -> Path:
        return save_checkpoint(
            self.out / "checkpoints",
            self.step,
            tensors={"policy": self._weights()},
            torch_objects={
                "optimizer": self.optimizer.state_dict(),
                "scheduler": self.scheduler.state_dict(),
                "torch_rng": torch.get_rng_state(),
            },
            json_objects={
                "trainer_state": {"step": self.step, "sampler": self.sampler.state_dict()},
                "config": self.cfg.to_dict(),
                "budget": dataclasses.asdict(self.budget),
            },
        )

    def load(self, folder: Path) -> None:
        loaded = load_checkpoint(folder)
        for name in ("config", "trainer_state", "policy", "optimizer", "scheduler", "torch_rng"):
            if name not in loaded:
                raise CheckpointError(f"{folder / MANIFEST}: lists no {name} file")
        state = loaded["trainer_state"]
        step = state.get("step") if isinstance(state, dict) else None
        if type(step) is not int or step != checkpoint_step(folder):
            raise CheckpointError(
                f"{folder / 'trainer_state.json'}: step {step!r} is not the folder's step "
                f"{checkpoint_step(folder)}"
            )
        differing = config_differences(
            loaded["config"], json.loads(json.dumps(self.cfg.to_dict())), ignore=RESUMABLE
        )
        if differing:
            raise CheckpointError(
                f"{folder / 'config.json'}: the checkpoint's config differs from this run's in "
                + ", ".join(differing[:8])
            )
        try:
            weights = loaded["policy"]
            if self.lora:
                params = dict(self.policy.named_parameters())
                with torch.no_grad():
                    for name, value in weights.items():
                        params[name].copy_(value)
            else:
                self.policy.load_state_dict(weights)
            self.optimizer.load_state_dict(loaded["optimizer"])
            self.scheduler.load_state_dict(loaded["scheduler"])
            self.sampler.load_state_dict(state["sampler"])
            self.sampler.resumed()
        except (RuntimeError, ValueError, KeyError, TypeError) as exc:
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            raise CheckpointError(f"{folder}: does not fit this run ({first[:300]})") from None
        torch.set_rng_state(loaded["torch_rng"])
        self.step = step

    def export(self, folder: Path) -> Path:
        """The trained model in HF format; LoRA: the adapter and the merged model too."""
        folder.mkdir(parents=True, exist_ok=True)
        model = self.policy
        if self.lora:
            self.policy.save_pretrained(folder / "adapter")
            model = copy.deepcopy(self.policy).merge_and_unload()
        model.save_pretrained(folder / "hf")
        self.tokenizer.save_pretrained(folder / "hf")
        return folder / "hf"
