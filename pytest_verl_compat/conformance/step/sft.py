"""The SFT step oracle: the reference trainer's SFT steps against verl 0.9.0's, case by case.

Each case of `corpus/sft_step.yaml` is a list of Hydra overrides of verl's `sft_trainer_engine`
tree, composed, compiled against the SFT profile and lowered (`pipeline.sft.lower_sft`: only an
accepted case trains), trained for two consecutive steps on fixed batches of the shipped
conversations, in each optimizer variant. Upstream's steps run in one sandboxed subprocess for
every case and variant (`sft_upstream`, started through the runner the caller passes: verl is
imported once); ours in process (`reference_trainer.sft_step.sft_update`, the trainer's own
step, on the lowered config). Compared after each step: the metrics both report (`train/loss`,
`train/grad_norm`, `train/lr`) and every trainable parameter (the adapter with LoRA); the
report holds per case, variant and step the largest difference of each.

The shared starting point is the RL step oracle's (`reference.prepare_models`: the tiny policy
and one adapter per LoRA setting, with non-zero A and B).
"""

from __future__ import annotations

import dataclasses
import json
import math
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from pytest_verl_compat.conformance.step.compare import QuantityResult, summarise
from pytest_verl_compat.conformance.step.plan import StepTolerance
from pytest_verl_compat.pipeline.sft import lower_sft, sft_case_overrides, sft_cases_path
from reference_trainer.config import SFTConfig

SFT_UPSTREAM_MODULE = "pytest_verl_compat.conformance.step.sft_upstream"
SFT_STEPS = 2
QUANTITIES = ("metrics", "weights")
METRICS = ("train/loss", "train/grad_norm", "train/lr")


class SFTOracleError(RuntimeError):
    """The upstream side did not run (its stderr's tail is the message)."""


@dataclass(frozen=True)
class SFTVariant:
    name: str
    optimizer: str
    lr: float
    eps: float | None = None

    def overrides(self) -> list[str]:
        """The variant as verl's overrides (eps through override_optimizer_config,
        verl/workers/config/optimizer.py:335-336)."""
        found = [f"optim.optimizer={self.optimizer}", f"optim.lr={self.lr}"]
        if self.eps is not None:
            found.append(f"optim.override_optimizer_config={{eps:{self.eps}}}")
        return found


@dataclass(frozen=True)
class SFTStepCase:
    id: str
    overrides: tuple[str, ...]
    why: str
    config: SFTConfig


@dataclass(frozen=True)
class SFTStepPlan:
    variants: Mapping[str, SFTVariant]
    tolerances: Mapping[str, Mapping[str, StepTolerance]]
    first_row: int
    two_turn_every: int
    cases: tuple[SFTStepCase, ...]


def load_sft_step_plan(path: Path | None = None) -> SFTStepPlan:
    """The plan with every case lowered through the compile gate (`NotAccepted` otherwise)."""
    path = path or sft_cases_path()
    raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    variants = {
        name: SFTVariant(name, str(v["optimizer"]), float(v["lr"]), v.get("eps"))
        for name, v in raw["variants"].items()
    }
    tolerances = {
        name: {q: StepTolerance(float(t["atol"]), float(t["rtol"])) for q, t in per.items()}
        for name, per in raw["tolerances"].items()
    }
    for name, per in tolerances.items():
        if set(per) != set(QUANTITIES) or name not in variants:
            raise ValueError(f"{path}: tolerances.{name} needs a variant and exactly {QUANTITIES}")
    why = {entry["id"]: entry["why"] for entry in raw["cases"]}
    cases = []
    for case_id, overrides in sft_case_overrides(path).items():
        _, config = lower_sft(overrides, case_id=case_id)
        cases.append(SFTStepCase(case_id, tuple(overrides), why[case_id], config))
    if not cases:
        raise ValueError(f"{path}: no SFT case")
    data = raw["conversations"]
    return SFTStepPlan(
        variants, tolerances, int(data["first_row"]), int(data["two_turn_every"]), tuple(cases)
    )


def run_key(case_id: str, variant: str) -> str:
    return f"{case_id.replace('/', '-')}.{variant}"


# --------------------------------------------------------------------------- the batches


def step_batches(plan: SFTStepPlan, config: SFTConfig) -> list[list[dict[str, list[int]]]]:
    """Each step's conversations, tokenised by the tiny tokenizer: `train_batch_size` each."""
    from reference_trainer.sft_data import conversations_from_prompts, tokenize_all
    from reference_trainer.tiny import build_tiny_tokenizer

    size = config.data.train_batch_size
    rows = conversations_from_prompts()[plan.first_row :]
    conversations = []
    for k in range(size * SFT_STEPS):
        messages = list(rows[2 * k])
        if k % plan.two_turn_every == 0:
            messages += rows[2 * k + 1]
        conversations.append(messages)
    tokenized = tokenize_all(
        build_tiny_tokenizer(),
        conversations,
        max_length=config.data.max_length,
        truncation=config.data.truncation,
    )
    flat = [
        {"input_ids": s.input_ids.tolist(), "loss_mask": s.loss_mask.tolist()} for s in tokenized
    ]
    return [flat[i * size : (i + 1) * size] for i in range(SFT_STEPS)]


def _adapter(config: SFTConfig) -> dict[str, Any] | None:
    model = config.model
    if model.lora_rank <= 0:
        return None
    targets = model.target_modules
    excluded = model.exclude_modules
    return {
        "adapter": f"sft-adapter-r{model.lora_rank}-a{model.lora_alpha}",
        "rank": model.lora_rank,
        "alpha": model.lora_alpha,
        "target_modules": targets if isinstance(targets, str) else list(targets),
        "exclude_modules": excluded if isinstance(excluded, str | None) else list(excluded),
    }


def _total_steps(config: SFTConfig) -> int:
    return int(config.trainer.total_training_steps or SFT_STEPS)


# --------------------------------------------------------------------------- upstream


def run_sft_upstream(
    plan: SFTStepPlan, run_module: Callable[..., Any], folder: Path
) -> dict[str, Any]:
    """Models under `folder/models`, every case and variant in one upstream process; their
    results by `run_key`."""
    import torch

    from pytest_verl_compat.conformance.step.reference import prepare_models

    (folder / "out").mkdir(parents=True, exist_ok=True)
    adapters = {a["adapter"]: a for c in plan.cases if (a := _adapter(c.config)) is not None}
    prepare_models(folder / "models", [adapters[k] for k in sorted(adapters)])
    requests: list[dict[str, Any]] = []
    for case in plan.cases:
        adapter = _adapter(case.config)
        for variant in plan.variants.values():
            requests.append(
                {
                    "key": run_key(case.id, variant.name),
                    "overrides": [*case.overrides, *variant.overrides()],
                    "adapter": adapter["adapter"] if adapter else None,
                    "total_steps": _total_steps(case.config),
                    "batches": step_batches(plan, case.config),
                }
            )
    stdin = json.dumps({"model_dir": str(folder / "models"), "cases": requests})
    run = run_module(SFT_UPSTREAM_MODULE, [str(folder / "out")], stdin=stdin, timeout=1800)
    if run.returncode != 0:
        raise SFTOracleError(
            f"upstream SFT step failed (exit {run.returncode}): {run.stderr_tail(8)}"
        )
    return {
        r["key"]: torch.load(folder / "out" / f"{r['key']}.pt", weights_only=False)
        for r in requests
    }


# --------------------------------------------------------------------------- ours


def step_config(config: SFTConfig, variant: SFTVariant) -> SFTConfig:
    """The case's lowered config with the variant's optimizer and rate."""
    return dataclasses.replace(
        config,
        optimizer=variant.optimizer,
        optim=dataclasses.replace(config.optim, lr=variant.lr),
    )


def reference_sft_steps(
    config: SFTConfig,
    variant: SFTVariant,
    batches: Sequence[Sequence[Mapping[str, list[int]]]],
    models: Path,
) -> dict[str, Any]:
    """Our consecutive steps from the shared starting point: metrics and trainable weights."""
    import torch
    from transformers import AutoModelForCausalLM

    from reference_trainer.sft_data import TokenizedConversation
    from reference_trainer.sft_step import build_sft_optimizer, sft_update
    from reference_trainer.tiny import ATTENTION, build_tiny_tokenizer

    torch.set_num_threads(1)
    model: torch.nn.Module = AutoModelForCausalLM.from_pretrained(
        models / "policy", attn_implementation=ATTENTION, dtype=torch.float32
    )
    adapter = _adapter(config)
    if adapter is not None:
        from peft import set_peft_model_state_dict
        from safetensors.torch import load_file

        from reference_trainer.models import wrap_lora

        model = wrap_lora(model, config.model, 0)
        weights = load_file(models / adapter["adapter"] / "adapter_model.safetensors")
        set_peft_model_state_dict(model, weights)
    optimizer, scheduler = build_sft_optimizer(
        model, config.optimizer, config.optim, _total_steps(config)
    )
    if variant.eps is not None:  # upstream's override_optimizer_config (SFTVariant.overrides)
        for group in optimizer.param_groups:
            group["eps"] = variant.eps
    pad = int(build_tiny_tokenizer().pad_token_id)
    steps = []
    for rows in batches:
        batch = [
            TokenizedConversation(
                torch.tensor(r["input_ids"], dtype=torch.long),
                torch.tensor(r["loss_mask"], dtype=torch.long),
            )
            for r in rows
        ]
        metrics = sft_update(
            model,
            optimizer,
            scheduler,
            batch,
            pad_id=pad,
            grad_clip=config.optim.grad_clip,
            micro_batch_size=config.data.micro_batch_size,
            max_token_len=config.data.max_token_len,
            packed=config.use_remove_padding,
        )
        weights = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
        steps.append({"metrics": metrics, "weights": weights})
    return {"steps": steps}


# --------------------------------------------------------------------------- comparing


def _name(key: str) -> str:
    """A parameter's name without FSDP's wrapper prefix (upstream's state dict carries it)."""
    return key.replace("_fsdp_wrapped_module.", "")


def compare_sft_steps(
    ours: Mapping[str, Any], up: Mapping[str, Any], tolerances: Mapping[str, StepTolerance]
) -> list[QuantityResult]:
    """Per step and quantity the largest difference; a later step's names carry `@<step>`."""
    import torch

    out: list[QuantityResult] = []
    for index, (a, b) in enumerate(zip(ours["steps"], up["steps"], strict=True), 1):
        suffix = "" if index == 1 else f"@{index}"
        tol = tolerances["metrics"]
        worst, where, passed = 0.0, "", True
        for key in METRICS:
            diff = abs(float(a["metrics"][key]) - float(b["metrics"][key]))
            passed = passed and diff <= tol.atol + tol.rtol * abs(float(b["metrics"][key]))
            if diff >= worst:
                worst, where = diff, key
        out.append(QuantityResult("metrics" + suffix, worst, where, passed))
        tol = tolerances["weights"]
        theirs = {_name(k): v for k, v in b["weights"].items()}
        if set(theirs) != set(a["weights"]):
            missing = sorted(set(theirs) ^ set(a["weights"]))[:3]
            out.append(
                QuantityResult("weights" + suffix, math.inf, f"names differ: {missing}", False)
            )
            continue
        worst, where, passed = 0.0, "", True
        for key, value in a["weights"].items():
            err = (value.double() - theirs[key].double()).abs()
            diff = float(err.max()) if err.numel() else 0.0
            ok = bool((err <= tol.atol + tol.rtol * theirs[key].double().abs()).all())
            passed = passed and ok and bool(torch.isfinite(value).all())
            if diff >= worst:
                worst, where = diff, key
        out.append(QuantityResult("weights" + suffix, worst, where, passed))
    return out


def compare_sft_case(
    plan: SFTStepPlan,
    upstream: Mapping[str, Any],
    models: Path,
    case: SFTStepCase,
    variant: str,
    *,
    config: SFTConfig | None = None,
) -> dict[str, dict[str, Any]]:
    """Our steps of `case` (or of `config`, a changed one) against upstream's: one report entry."""
    chosen = plan.variants[variant]
    ours = reference_sft_steps(
        config or step_config(case.config, chosen),
        chosen,
        step_batches(plan, case.config),
        models,
    )
    results = compare_sft_steps(ours, upstream[run_key(case.id, variant)], plan.tolerances[variant])
    return summarise(results)


def run_sft_steps(plan: SFTStepPlan, run_module: Callable[..., Any]) -> dict[str, Any]:
    """The SFT step report: case → variant → quantity → largest difference."""
    report: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="verl-sft-step-") as tmp:
        upstream = run_sft_upstream(plan, run_module, Path(tmp))
        for case in plan.cases:
            for variant in plan.variants:
                entry = compare_sft_case(plan, upstream, Path(tmp) / "models", case, variant)
                report.setdefault(case.id, {})[variant] = entry
    return report
