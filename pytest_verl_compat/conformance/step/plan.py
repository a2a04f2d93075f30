"""The step oracle's plan: the step cases, their shapes and optimizer variants, the tolerances.

A step case is an accepted case's resolved verl mapping and its lowered
`ReferenceTrainerConfig`, trained at a small shape (`Shape`: a few prompts, `rollout.n`
responses each, mini- and micro-batches, epochs) for one or more consecutive steps on one or
more data-parallel ranks. Both sides get the same settings (`step_settings`): the verl leaves
upstream composes, which are the case's own values of its step settings (the `case` rows of
`corpus/step_coverage.yaml`), then the shape and the optimizer variant, which the oracle sets
on both sides. Ours trains the case's lowered config with the same shape and variant
(`reference.step_config`). Every step trains a fixed rollout (`fixed_rollout`: prompts,
responses, scores and reference offsets drawn from a seed, one per step).

Optimizer variants (`corpus/step.yaml`): `sgd` keeps rounding linear in the update, so a wrong
gradient moves the weights by ~lr times its error; `adamw` is the case's AdamW (betas, decoupled
weight decay) with an `eps` large enough that Adam's update stays smooth in the gradient, so it
too is held to float32 rounding. Data: `corpus/step.yaml`. This module imports neither torch
nor verl.
"""

from __future__ import annotations

import dataclasses
import json
import random
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from pytest_verl_compat.pipeline.hydra_internals import override_literal
from pytest_verl_compat.pipeline.manifest import embedded_root
from pytest_verl_compat.pipeline.profile import pattern_regex
from reference_trainer.config import ReferenceTrainerConfig

# Per-token quantities, metrics and parameters compared after each step.
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
RESPONSE_LENGTH = 6
# The seeded offset added to the reference log-probs on both sides: at step 1 the reference
# policy equals the policy, which would make every KL term (and its gradient) exactly zero.
REF_OFFSET_SCALE = 0.3
ACTOR = "actor_rollout_ref.actor"
CRITIC = "critic"


@dataclass(frozen=True)
class StepTolerance:
    atol: float
    rtol: float


@dataclass(frozen=True)
class RoleShape:
    """One role's mini-batches (prompts), micro-batches (trajectories) and epochs."""

    ppo_mini_batch_size: int = 2
    micro_batch_size: int = 2
    ppo_epochs: int = 2


@dataclass(frozen=True)
class Shape:
    """The small batch every side trains. `token_budget` turns on dynamic batch size upstream:
    micro-batches of at most that many tokens per rank (for the log-prob passes too)."""

    prompts: int = 4
    n: int = 2
    actor: RoleShape = RoleShape()
    critic: RoleShape = RoleShape()
    token_budget: int | None = None

    @property
    def trajectories(self) -> int:
        return self.prompts * self.n


@dataclass(frozen=True)
class Variant:
    """An optimizer both sides use in place of the case's learning rate (and, for SGD, AdamW)."""

    name: str
    optimizer: str
    actor_lr: float
    critic_lr: float
    eps: float | None = None


@dataclass(frozen=True)
class StepCase:
    """One case of the step stage: what it trains, at which shape, for how many steps and ranks.

    `active` are claims about upstream's per-mini-batch metrics (`activity`) that make the case
    see what it is there for: a clip that binds, a dual clip that binds, a gradient clip that
    does not. `not_compared` names metrics that differ by design at this geometry, each with
    the upstream code that makes it so.
    """

    id: str
    config: ReferenceTrainerConfig
    resolved: Mapping[str, Any]
    shape: Shape = Shape()
    steps: int = 1
    ranks: int = 1
    variants: tuple[str, ...] = ("sgd", "adamw")
    active: tuple[str, ...] = ()
    not_compared: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class StepCaseSpec:
    """A step-only case of `corpus/step.yaml`: an official case plus Hydra overrides."""

    id: str
    base: str
    overrides: tuple[str, ...]
    why: str
    shape: Shape
    steps: int
    ranks: int
    variants: tuple[str, ...]
    active: tuple[str, ...]
    not_compared: Mapping[str, str]
    # A release whose own behaviour needs another shape (``releases.<version>.shape`` of the
    # case, each with its reason in the plan): the shape that release trains.
    release_shapes: Mapping[str, Shape] = field(default_factory=dict)

    def shape_in(self, version: str) -> Shape:
        return self.release_shapes.get(version, self.shape)


@dataclass(frozen=True)
class StepPlan:
    tolerances: Mapping[str, Mapping[str, StepTolerance]]
    variants: Mapping[str, Variant]
    cases: tuple[StepCaseSpec, ...]
    default_variants: tuple[str, ...]


def default_plan_path() -> Path:
    """`corpus/step.yaml` of the source tree, or of the installed wheel's embedded corpus."""
    return embedded_root() / "corpus" / "step.yaml"


def _shape(raw: Mapping[str, Any] | None, base: Shape = Shape()) -> Shape:
    raw = dict(raw or {})
    roles = {
        role: dataclasses.replace(getattr(base, role), **raw.pop(role, {}))
        for role in ("actor", "critic")
    }
    return dataclasses.replace(base, **raw, **roles)


def load_step_plan(path: Path | None = None) -> StepPlan:
    """Tolerances, variants and step-only cases from `corpus/step.yaml`."""
    source = path or default_plan_path()
    raw = yaml.safe_load(source.read_text(encoding="utf-8"))
    tolerances: dict[str, dict[str, StepTolerance]] = {}
    for variant, table in raw["tolerances"].items():
        missing = [q for q in QUANTITIES if q not in table]
        if missing:
            raise ValueError(f"{source}: tolerances.{variant} lacks {missing}")
        tolerances[variant] = {
            q: StepTolerance(float(v["atol"]), float(v["rtol"])) for q, v in table.items()
        }
    variants = {
        name: Variant(
            name=name,
            optimizer=str(v["optimizer"]),
            actor_lr=float(v["lr"]["actor"]),
            critic_lr=float(v["lr"]["critic"]),
            eps=float(v["eps"]) if v.get("eps") is not None else None,
        )
        for name, v in raw["variants"].items()
    }
    if set(tolerances) != set(variants):
        raise ValueError(
            f"{source}: tolerances name {sorted(tolerances)}, variants {sorted(variants)}"
        )
    default_shape = _shape(raw.get("shape"))
    default_variants = tuple(raw.get("default_variants", sorted(variants)))
    cases = []
    for index, entry in enumerate(raw.get("cases") or ()):
        where = f"{source}: cases[{index}]"
        unknown = [v for v in entry.get("variants", ()) if v not in variants]
        if unknown:
            raise ValueError(f"{where}: unknown variants {unknown}; valid: {sorted(variants)}")
        if not str(entry.get("id", "")).startswith("step/"):
            raise ValueError(f"{where}: a step-only case id starts with 'step/'")
        shape = _shape(entry.get("shape"), default_shape)
        release_shapes = {}
        for version, differs in (entry.get("releases") or {}).items():
            if not str(differs.get("why", "")).strip():
                raise ValueError(f"{where}.releases.{version}: a release's own shape says why")
            release_shapes[str(version)] = _shape(differs.get("shape"), shape)
        cases.append(
            StepCaseSpec(
                id=entry["id"],
                base=entry["base"],
                overrides=tuple(entry.get("overrides", ())),
                why=entry.get("why", ""),
                shape=shape,
                release_shapes=release_shapes,
                steps=int(entry.get("steps", 1)),
                ranks=int(entry.get("ranks", 1)),
                variants=tuple(entry.get("variants", variants)),
                active=tuple(entry.get("active", ())),
                not_compared=dict(entry.get("not_compared") or {}),
            )
        )
    ids = [c.id for c in cases]
    if len(set(ids)) != len(ids):
        raise ValueError(f"{source}: duplicate step case ids")
    return StepPlan(tolerances, variants, tuple(cases), default_variants)


def default_shape(path: Path | None = None) -> Shape:
    source = path or default_plan_path()
    return _shape(yaml.safe_load(source.read_text(encoding="utf-8")).get("shape"))


# ------------------------------------------------------------------ the settings both sides read


@dataclass(frozen=True)
class CoverageRow:
    """One row of `corpus/step_coverage.yaml`: how the step oracle trains the leaves it matches.

    `how`: `case` (the case's own value reaches both sides), `shape` or `variant` (the oracle
    sets it on both sides), `engine` (a kernel, memory or sharding choice upstream runs as
    `oracle` says and ours lowers), `fixed` (one supported value), `outside` (not a setting of
    a training step). `field` is the `ReferenceTrainerConfig` field ours reads it from, and
    `detect` the `variant.quantity` that shows a wrong value of it (`wrong`, else
    `step_mutants.wrong_value`'s) in step case `case` (by default the first case that moves it).
    `when` names a field of the case's lowered config that must be set for the leaf to be
    trained at all (`critic`, `algorithm.use_kl_in_reward`): a KL coefficient moved in a case
    without KL in the reward trains nothing.
    """

    patterns: tuple[str, ...]
    how: str
    why: str
    field: str = ""
    detect: tuple[str, ...] = ()
    oracle: str = ""
    case: str = ""
    when: str = ""
    wrong: Any = None


HOWS = ("case", "shape", "variant", "engine", "fixed", "outside")


def default_coverage_path() -> Path:
    return embedded_root() / "corpus" / "step_coverage.yaml"


def load_coverage(path: Path | None = None) -> tuple[CoverageRow, ...]:
    source = path or default_coverage_path()
    raw = yaml.safe_load(source.read_text(encoding="utf-8"))
    rows = []
    for index, entry in enumerate(raw["settings"]):
        how = entry.get("how")
        if how not in HOWS:
            raise ValueError(f"{source}: settings[{index}]: how {how!r} is not one of {HOWS}")
        patterns = entry["match"] if isinstance(entry["match"], list) else [entry["match"]]
        rows.append(
            CoverageRow(
                patterns=tuple(patterns),
                how=how,
                why=entry.get("why", ""),
                field=entry.get("field", ""),
                detect=tuple(entry.get("detect", ())),
                oracle=entry.get("oracle", ""),
                case=entry.get("case", ""),
                when=entry.get("when", ""),
                wrong=entry.get("wrong"),
            )
        )
    return tuple(rows)


@dataclass(frozen=True)
class RunConformanceCase:
    """A case of a run-conformance module (``corpus/run_conformance/AREA.yaml``): settings that
    act outside one training step (the loop, the data, sampling), set off verl's default, where
    ours and upstream's code must give the same result and the result must change with each."""

    id: str
    area: str
    sets: Mapping[str, Any]
    why: str
    # The upstream lines showing the leaves never reach the result (the case checks that they
    # do not, and that ours ignores them too), or that ours refuses the value: either way the
    # case shows no value that changes the result, so it conforms no leaf.
    no_effect: str = ""
    ours_refuses: bool = False

    @property
    def shows_an_effect(self) -> bool:
        return not self.no_effect and not self.ours_refuses


def default_run_conformance_path() -> Path:
    return embedded_root() / "corpus" / "run_conformance"


# The areas of the SFT trainer's tree (``sft_loop.yaml``): their keys are that tree's, so they
# conform none of the RL tree's leaves of the same name (``trainer.save_freq``).
SFT_AREA_PREFIX = "sft_"


def load_run_conformance(
    folder: Path | None = None, *, sft: bool = False
) -> tuple[RunConformanceCase, ...]:
    """Every run-conformance case of the RL tree's areas (``sft``: of the SFT tree's), area by
    area (one file each), in the files' order."""
    source = folder or default_run_conformance_path()
    cases = []
    paths = sorted(source.glob("*.yaml")) if source.is_dir() else []
    for path in (p for p in paths if p.stem.startswith(SFT_AREA_PREFIX) is sft):
        raw = yaml.safe_load(path.read_text(encoding="utf-8")) or []
        if not isinstance(raw, list):
            raise ValueError(f"{path}: expected a list of cases")
        for index, entry in enumerate(raw):
            if not isinstance(entry, Mapping) or not isinstance(entry.get("sets"), Mapping):
                raise ValueError(f"{path}: [{index}]: expected a case with an id and `sets`")
            cases.append(
                RunConformanceCase(
                    str(entry["id"]),
                    path.stem,
                    dict(entry["sets"]),
                    str(entry.get("why", "")),
                    str(entry.get("no_effect", "")),
                    bool(entry.get("ours_refuses", False)),
                )
            )
    return tuple(cases)


class CoverageTable:
    """Rows in order; the first whose pattern matches a dotted leaf path describes it."""

    def __init__(self, rows: tuple[CoverageRow, ...]) -> None:
        self.rows = rows
        self._regexes = [pattern_regex(r.patterns) for r in rows]

    def row_for(self, dotted: str) -> CoverageRow | None:
        return next(
            (row for row, rx in zip(self.rows, self._regexes, strict=True) if rx.fullmatch(dotted)),
            None,
        )


def case_leaves(resolved: Mapping[str, Any], table: CoverageTable) -> dict[str, Any]:
    """The case's own values of every leaf whose row says `case`: what upstream composes."""
    from pytest_verl_compat.pipeline.compose import iter_leaves  # imports Hydra: only here

    out = {}
    for path, value in iter_leaves(resolved):
        row = table.row_for(path)
        if row is not None and row.how == "case":
            out[path] = value
    return out


def shape_leaves(shape: Shape, ranks: int, use_critic: bool) -> dict[str, Any]:
    """The verl leaves that give upstream the oracle's shape (on `ranks` data-parallel ranks)."""
    a, c = shape.actor, shape.critic
    rollout = "actor_rollout_ref.rollout"
    out: dict[str, Any] = {
        "data.train_batch_size": shape.prompts,
        f"{rollout}.n": shape.n,
        "trainer.n_gpus_per_node": ranks,
        f"{ACTOR}.ppo_mini_batch_size": a.ppo_mini_batch_size,
        f"{ACTOR}.ppo_epochs": a.ppo_epochs,
    }
    budget = shape.token_budget
    out[f"{ACTOR}.use_dynamic_bsz"] = budget is not None
    if budget is not None:
        out[f"{ACTOR}.ppo_max_token_len_per_gpu"] = budget
    else:
        out[f"{ACTOR}.ppo_micro_batch_size_per_gpu"] = a.micro_batch_size
    for role in (rollout, "actor_rollout_ref.ref"):  # the forward-only passes
        out[f"{role}.log_prob_use_dynamic_bsz"] = budget is not None
        if budget is not None:
            out[f"{role}.log_prob_max_token_len_per_gpu"] = budget
        else:
            # One row per forward micro-batch divides any (padded) batch; forward passes do
            # not depend on how rows are grouped.
            out[f"{role}.log_prob_micro_batch_size_per_gpu"] = 1
    if use_critic:
        out[f"{CRITIC}.ppo_mini_batch_size"] = c.ppo_mini_batch_size
        out[f"{CRITIC}.ppo_epochs"] = c.ppo_epochs
        # Checked by FSDPCriticConfig without dynamic batch size (workers/config/critic.py:108-115),
        # though V1's critic engine packs by tokens whatever it says (see below).
        out[f"{CRITIC}.ppo_micro_batch_size_per_gpu"] = c.micro_batch_size
        if budget is not None:
            # V1's critic engine always packs by tokens, at most ppo_infer_max_token_len_per_gpu
            # (trainer_base.py:251-252; a CriticConfig field the tree does not list, so `+`).
            out[f"+{CRITIC}.ppo_infer_max_token_len_per_gpu"] = budget
    return out


def variant_leaves(variant: Variant, use_critic: bool) -> dict[str, Any]:
    out: dict[str, Any] = {
        f"{ACTOR}.optim.optimizer": variant.optimizer,
        f"{ACTOR}.optim.lr": variant.actor_lr,
    }
    if use_critic:
        out[f"{CRITIC}.optim.optimizer"] = variant.optimizer
        out[f"{CRITIC}.optim.lr"] = variant.critic_lr
    if variant.eps is not None:
        # verl's build_optimizer passes override_optimizer_config as optimizer arguments
        # (verl/workers/config/optimizer.py:335-336).
        out[f"{ACTOR}.optim.override_optimizer_config"] = {"eps": variant.eps}
        if use_critic:
            out[f"{CRITIC}.optim.override_optimizer_config"] = {"eps": variant.eps}
    return out


def step_settings(case: StepCase, variant: Variant, table: CoverageTable) -> dict[str, Any]:
    """Everything upstream's side reads of a case and variant, as plain JSON.

    `overrides` are the verl leaves upstream composes: the case's step settings, then the
    shape, then the variant. The LoRA adapter both sides start from is named by its settings.
    """
    cfg = case.config
    use_critic = cfg.critic is not None
    overrides = {
        **case_leaves(case.resolved, table),
        **shape_leaves(case.shape, case.ranks, use_critic),
        **variant_leaves(variant, use_critic),
    }
    lora = None
    if cfg.model.lora_rank > 0:
        targets = cfg.model.target_modules
        excluded = cfg.model.exclude_modules
        lora = {
            "adapter": f"lora-r{cfg.model.lora_rank}-a{cfg.model.lora_alpha}-"
            + _digest([targets, excluded]),
            "rank": cfg.model.lora_rank,
            "alpha": cfg.model.lora_alpha,
            "target_modules": targets if isinstance(targets, str) else list(targets),
            "exclude_modules": excluded if isinstance(excluded, str | None) else list(excluded),
        }
    return {
        "case": case.id,
        "variant": variant.name,
        "steps": case.steps,
        "ranks": case.ranks,
        "overrides": {k: overrides[k] for k in sorted(overrides)},
        "lora": lora,
        "rollouts": [fixed_rollout_spec(case.shape, step) for step in range(case.steps)],
    }


def _digest(value: Any) -> str:
    import hashlib

    return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()[:8]


def fixed_rollout_spec(shape: Shape, step: int) -> dict[str, int]:
    """What draws one step's rollout: its size and seed (the tokens come with the tokenizer)."""
    return {"prompts": shape.prompts, "n": shape.n, "seed": step}


def fixed_rollout(vocab: range, eos: int, spec: Mapping[str, int]) -> dict[str, Any]:
    """Prompts, responses and scores of one step, from `spec` (plain lists).

    Tokens are drawn from `vocab` (the tokenizer's ordinary tokens). The `n` responses of a
    prompt share it; lengths vary (ragged prompts, responses that end in EOS and responses cut
    at `RESPONSE_LENGTH`), and scores are distinct within each group, so group estimators
    see every response's rank and magnitude.
    """
    rng = random.Random(spec["seed"])
    n = spec["n"]
    prompts: list[list[int]] = []
    responses: list[list[int]] = []
    scores: list[float] = []
    offsets: list[list[float]] = []
    for p in range(spec["prompts"]):
        prompt = [rng.choice(vocab) for _ in range(2 + p % 3)]
        group: list[float] = []
        for k in range(n):
            length = rng.randrange(1, RESPONSE_LENGTH + 1)
            response = [rng.choice(vocab) for _ in range(length)]
            if (p + k) % 2 == 0 and length < RESPONSE_LENGTH:
                response.append(eos)
            score = round(rng.uniform(-1.0, 1.0), 4)
            while score in group:
                score = round(rng.uniform(-1.0, 1.0), 4)
            group.append(score)
            prompts.append(prompt)
            responses.append(response)
            scores.append(score)
            offsets.append([round(rng.gauss(0.0, REF_OFFSET_SCALE), 4) for _ in response])
    return {
        "prompts": prompts,
        "responses": responses,
        "scores": scores,
        "ref_offsets": offsets,
        "uids": [f"s{spec['seed']}p{i // n}" for i in range(len(prompts))],
    }


def request_json(model_dir: str, eos: int, vocab: list[int], cases: list[dict[str, Any]]) -> str:
    """What the upstream subprocess reads on stdin: the models, the tokens rollouts draw from
    (`vocab` = [first, stop)), and the settings of each case and variant."""
    request = {"model_dir": model_dir, "eos": eos, "vocab": vocab, "cases": cases}
    return json.dumps(request, sort_keys=True)


def settings_key(settings: Mapping[str, Any]) -> str:
    """The file name (no folders: case ids may hold "/") of one case and variant's result."""
    return f"{settings['case'].replace('/', '__')}.{settings['variant']}"


def upstream_key(settings: Mapping[str, Any]) -> str:
    """Everything upstream's step reads of `settings`: all of it but the case's name.

    Two cases with the same key get the same upstream step (the subprocess sees nothing else),
    so it runs once for both; ours still runs per case, from each case's own lowered config.
    """
    return json.dumps({k: v for k, v in settings.items() if k != "case"}, sort_keys=True)


def hydra_overrides(leaves: Mapping[str, Any]) -> Iterator[str]:
    """`path=value` Hydra overrides for dotted leaves; list items (`x[0]`, `x[1]`) join again."""
    merged: dict[str, Any] = {}
    for path, value in leaves.items():
        if path.endswith("]"):
            head, _, index = path[:-1].rpartition("[")
            items = merged.setdefault(head, [])
            assert isinstance(items, list) and int(index) == len(items), (path, items)
            items.append(value)
        else:
            merged[path] = value
    for path, value in merged.items():
        yield f"{path}={override_literal(value)}"
