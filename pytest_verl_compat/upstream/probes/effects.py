"""Keys without effect, proven by running upstream's code: never read, or read and overridden.

Two kinds of explicit key train something other than what the script says:

- **never read**: the field of a config dataclass that no code of the installed verl reads outside
  the config dataclasses themselves (``verl/workers/config/``, whose checks the probes run while
  they convert every section of the selected path), and that no probe read either. The finding
  names what is read instead: the field of the same section (or one below) with the closest name
  that the probes saw read (``actor.grad_clip`` → ``actor.optim.clip_grad``, read by
  ``FSDPEngine.optimizer_step``).
- **overridden**: read by one of the effects below, which compute what training does with the
  section (the optimizer's hyperparameters, its learning-rate schedule and one clipped step; the
  actor's and the critic's loss and its gradient on a tiny batch; the advantages, returns and
  rewards of ``_compute_advantage``), yet perturbing the value (a number ×1.5 or ×2, a flag
  flipped) changes nothing any of them computes: another key decides (``clip_ratio`` behind
  ``clip_ratio_low``/``clip_ratio_high``, ``lr_warmup_steps_ratio`` behind ``lr_warmup_steps``,
  ``min_lr_ratio`` under a constant schedule). A perturbation that upstream refuses has effect.

Only explicit keys are examined (a default is upstream's choice), and only numbers and flags: a
string has no generic perturbation.
"""

from __future__ import annotations

import ast
import contextlib
import copy
import difflib
import fnmatch
import functools
import types
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pytest_verl_compat.upstream.probes import statements, tiny_batch
from pytest_verl_compat.upstream.probes.patching import PatchPointMissing
from pytest_verl_compat.upstream.probes.recorder import ConfigReads, recording
from pytest_verl_compat.upstream.probes.types import field_default

KEY_KEY = "key"
KEY_KIND = "kind"  # "never read" or "overridden"
KEY_VALUE = "value"
KEY_TRIED = "tried"  # the perturbed value that changed nothing
KEY_EFFECTS = "effects"  # the effects that read the key
KEY_INSTEAD = "instead"  # what is read instead (never read) or what decides (overridden)
KEY_WHERE = "where"  # the verl lines that read it
NEVER_READ = "never read"
NOT_READ_HERE = "not read with these settings"
OVERRIDDEN = "overridden"

ARR = "actor_rollout_ref"
# The horizons a schedule is compared over when the run's length is its data set's (the rows of
# data.train_files over the batch size, times total_epochs: not known here). A claim holds at every
# step of each, from one step to thousands: warm-up from a ratio rounds ``ratio × horizon`` down
# (fsdp/transformer_impl.py:490-492), and a cosine's floor shows only in its last steps
# (utils/torch_functional.py:748-750).
UNKNOWN_HORIZONS = (1, 2, 3, 5, 8, 13, 21, 40, 100, 250, 1000, 4000)
# A known horizon longer than this is not compared step by step: no claim on the schedule then.
MAX_HORIZON = 20_000
# Optimizer steps taken, on gradients of different directions and sizes: Adam's first step is
# the same for any betas and any gradient scale, its later ones are not.
OPTIMIZER_STEPS = 3


@dataclass(frozen=True)
class Effect:
    """What training does with a part of the configuration, computed by upstream's own code.

    ``owns``: the keys (fnmatch patterns) that no code of the V1 path reads except what this effect
    runs, so that a perturbation it does not see is one training does not see either (a key read
    elsewhere too, like ``use_kl_loss``, which also starts the reference worker, is not owned).
    """

    name: str
    applies: Callable[[Mapping[str, Any]], bool]
    compute: Callable[[Any, Mapping[str, Any]], Any]
    owns: tuple[str, ...]
    # Owned keys whose effect depends on the batch's statistics (a covariance band, a fraction of
    # its tokens), which a tiny batch cannot promise to reach: reported only when not read at all.
    owns_when_unread: tuple[str, ...] = ()
    # The subtrees ``compute`` reads, at their place in the configuration: each run builds its
    # OmegaConf node from these alone (the whole configuration took ~34 ms per run to wrap).
    sections: tuple[str, ...] = ()

    def owned(self, key: str) -> bool:
        return any(fnmatch.fnmatchcase(key, p) for p in (*self.owns, *self.owns_when_unread))

    def perturbable(self, key: str) -> bool:
        return any(fnmatch.fnmatchcase(key, pattern) for pattern in self.owns)


def _plain(value: Any) -> Any:
    """Observables as plain, comparable values (tensors as lists)."""
    import torch

    if isinstance(value, torch.Tensor):
        return value.detach().cpu().double().flatten().tolist()
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in sorted(value.items(), key=lambda kv: str(kv[0]))}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if hasattr(value, "__dict__") and not isinstance(value, type):
        return {"__class__": type(value).__name__, **_plain(vars(value))}
    return value


def _learning_rates(scheduler: Any, steps: int) -> list[float]:
    """The learning rate of each of ``steps`` steps: a ``LambdaLR``'s own functions at each step
    (what ``step()`` sets, without stepping), else the scheduler stepped."""
    lambdas = getattr(scheduler, "lr_lambdas", None)
    if lambdas is not None:
        bases = list(scheduler.base_lrs)
        return [
            base * float(function(step))
            for step in range(steps)
            for base, function in zip(bases, lambdas, strict=True)
        ]
    lrs: list[float] = []
    for _ in range(steps):
        lrs.extend(float(lr) for lr in scheduler.get_last_lr())
        scheduler.step()
    return lrs


def _optimizer(
    section: str, horizon: Callable[[Mapping[str, Any]], int | None]
) -> Callable[[Any, Mapping[str, Any]], Any]:
    def compute(cfg: Any, plain: Mapping[str, Any]) -> Any:
        """build_optimizer, the engine's scheduler over every step of the run's horizon (or of
        each of ``UNKNOWN_HORIZONS``), and a few clipped optimizer steps
        (verl/workers/config/optimizer.py:298, fsdp/transformer_impl.py:484 and :760)."""
        import torch
        from verl.utils.config import omega_conf_to_dataclass
        from verl.workers.config.optimizer import build_optimizer
        from verl.workers.engine.fsdp import transformer_impl

        engine_cls: Any = transformer_impl.FSDPEngine  # its methods, called on stand-in selves

        node = cfg
        for part in filter(None, section.split(".")):  # "" is the root (the SFT trainer's)
            node = node[part]
        optim = omega_conf_to_dataclass(node.optim)
        if str(optim.optimizer_impl) != "torch.optim":
            raise ImportError("optimizer_impl is not imported by the probes")
        known = horizon(plain)
        if known is not None and known > MAX_HORIZON:
            raise ImportError(f"a schedule of {known} steps is not compared step by step")
        schedules = {}
        for steps in (known,) if known is not None else UNKNOWN_HORIZONS:
            # The trainer's write of its horizon (trainer_base.py:722-729, sft_trainer.py:185).
            optim.total_training_steps = steps
            optimizer = build_optimizer(torch.nn.Linear(1, 1).parameters(), optim)
            engine = types.SimpleNamespace(optimizer_config=optim, rank=1)
            scheduler = engine_cls._build_lr_scheduler(engine, optimizer)
            schedules[str(steps)] = _learning_rates(scheduler, steps)
        torch.manual_seed(0)
        module = torch.nn.Linear(3, 2)
        optimizer = build_optimizer(module.parameters(), optim)
        stepper = types.SimpleNamespace(
            module=module, optimizer=optimizer, optimizer_config=optim, _qat_enabled=False
        )
        steps_seen = []
        for step in range(OPTIMIZER_STEPS):
            optimizer.zero_grad()
            inputs = torch.full((4, 3), float(step + 1)) * torch.tensor([1.0, -0.5, 0.25])
            (module(inputs).sum() * 100.0 / (step + 1) ** 2).backward()
            engine_cls.optimizer_step(stepper)
            # The clipped gradients themselves: Adam's step is invariant to their scale, so the
            # parameters alone would not show the clip's effect.
            steps_seen.append(
                {
                    "clipped_grads": [
                        p.grad.detach().clone() for p in module.parameters() if p.grad is not None
                    ],
                    "params": [p.detach().clone() for p in module.parameters()],
                }
            )
        groups = [{k: v for k, v in g.items() if k != "params"} for g in optimizer.param_groups]
        return {"lr": schedules, "groups": groups, "steps": steps_seen}

    return compute


def rl_horizon(plain: Mapping[str, Any]) -> int | None:
    """The optimizer's horizon main_ppo's trainer sets: ``trainer.total_training_steps`` (else
    the data set's length, not known here: None) times the mode's ``parameter_sync_step``
    (trainer_base.py:713-729, :131)."""
    trainer = plain["trainer"]
    steps = trainer.get("total_training_steps")
    if steps is None:
        return None
    v1 = trainer.get("v1") or {}
    mode = v1.get("trainer_mode", "sync")
    sync = (v1.get(mode) or {}).get("parameter_sync_step", 1) if isinstance(mode, str) else 1
    return int(steps) * int(sync or 1)


# Response tokens per row of the effects' batch: enough for every threshold a loss compares a
# per-token quantity with (DPPO's ``prob - old_prob`` against ``clip_ratio_low``, core_algos.py:
# 1431) to fall between two tokens, so a perturbed threshold moves some token across it.
EFFECT_TOKENS = 64


def _actor_loss(cfg: Any, plain: Mapping[str, Any]) -> Any:
    """The actor's ppo_loss and its gradients on a tiny batch (verl/workers/utils/losses.py:57)."""
    import torch
    from verl.utils.config import omega_conf_to_dataclass
    from verl.workers.utils.losses import ppo_loss

    config = omega_conf_to_dataclass(cfg.actor_rollout_ref.actor)
    batch = tiny_batch.shape(plain[ARR]["rollout"]["n"], tokens=EFFECT_TOKENS)
    log_leaf, log_probs = tiny_batch.model_output(batch, -1.0)
    entropy_leaf, entropy = tiny_batch.model_output(batch, 0.7)
    data = tiny_batch.micro_batch(
        batch,
        1,
        {"old_log_probs": (-1.0, 3.0), "advantages": (0.0, 1.0), "ref_log_prob": (-1.1, 0.9)},
    )
    loss, metrics = ppo_loss(config, {"log_probs": log_probs, "entropy": entropy}, data)
    grads = torch.autograd.grad(loss, [log_leaf, entropy_leaf], allow_unused=True)
    return {"loss": loss, "grads": [g for g in grads if g is not None], "metrics": metrics}


def _critic_loss(cfg: Any, plain: Mapping[str, Any]) -> Any:
    """The critic's value_loss and its gradient on a tiny batch (losses.py:147)."""
    import torch
    from verl.utils.config import omega_conf_to_dataclass
    from verl.workers.utils.losses import value_loss

    critic = cfg.critic.copy()
    critic.model.pop("_target_", None)  # the model's files are not read; the loss never uses it
    config = omega_conf_to_dataclass(critic)
    batch = tiny_batch.shape(plain[ARR]["rollout"]["n"], tokens=EFFECT_TOKENS)
    leaf, values = tiny_batch.model_output(batch, 0.25)
    data = tiny_batch.micro_batch(batch, 1, {"values": (0.2, 0.3), "returns": (0.4, 0.8)})
    loss, metrics = value_loss(config, {"values": values}, data)
    (grad,) = torch.autograd.grad(loss, [leaf])
    return {"loss": loss, "grad": grad, "metrics": metrics}


# Consecutive steps of ``_compute_advantage`` on one trainer: an adaptive KL controller updates its
# coefficient after each (``apply_kl_penalty``, ray_trainer.py:112), so its target and horizon
# change the rewards only from the second step on.
ADVANTAGE_STEPS = 3


def _advantage_step(compute: Any, trainer: Any, metrics: dict[str, Any], meta: Any) -> Any:
    return compute(trainer, meta, metrics)


def _advantage(cfg: Any, plain: Mapping[str, Any]) -> Any:
    """The trainer's own _compute_advantage (trainer_base.py:1588) on a tiny batch, at each of
    ``ADVANTAGE_STEPS`` consecutive steps: what it hands back to TransferQueue and its metrics."""
    from verl.trainer.ppo import core_algos
    from verl.trainer.ppo.v1.trainer_base import PPOTrainer

    trainer = types.SimpleNamespace(config=cfg)
    if cfg.algorithm.use_kl_in_reward:
        get_kl_controller: Any = core_algos.get_kl_controller
        trainer.kl_ctrl_in_reward = get_kl_controller(cfg.algorithm.kl_ctrl)
    rollout = plain[ARR]["rollout"]
    steps = []
    compute: Any = PPOTrainer._compute_advantage  # called on a stand-in self
    for _ in range(ADVANTAGE_STEPS):
        metrics: dict[str, Any] = {}
        put = tiny_batch.through_transfer_queue(
            functools.partial(_advantage_step, compute, trainer, metrics),
            rollout["n"],
            bool(rollout.get("calculate_log_probs")),
            tokens=EFFECT_TOKENS,
        )
        fields = {name: value.values() if value.is_nested else value for name, value in put.items()}
        steps.append({"fields": fields, "metrics": metrics})
    return steps


def optimizer_effect(
    section: str, horizon: Callable[[Mapping[str, Any]], int | None]
) -> Callable[[Any, Mapping[str, Any]], Any]:
    """The optimizer of the config section at ``section`` (its ``optim``; "" for the root) over
    the horizon ``horizon`` gives (None: the run's length is its data set's), as ``_optimizer``
    computes it: for another entry point's effects."""
    return _optimizer(section, horizon)


def _needs_critic(plain: Mapping[str, Any]) -> bool:
    from pytest_verl_compat.checks.roles import need_critic

    return need_critic(plain)


def _no_distillation(plain: Mapping[str, Any]) -> bool:
    distillation = plain.get("distillation") or {}
    return not distillation.get("enabled")


_ACTOR = f"{ARR}.actor"
EFFECTS = (
    # optim.* is read by build_optimizer, the engine's scheduler and optimizer_step only
    # (verl/workers/config/optimizer.py:298-351, fsdp/transformer_impl.py:477-517 and :760-800).
    Effect(
        "the actor's optimizer and schedule",
        lambda plain: True,
        _optimizer(_ACTOR, rl_horizon),
        (f"{_ACTOR}.optim.*",),
        sections=(f"{_ACTOR}.optim",),
    ),
    Effect(
        "the critic's optimizer and schedule",
        _needs_critic,
        _optimizer("critic", rl_horizon),
        ("critic.optim.*",),
        sections=("critic.optim",),
    ),
    # The policy loss's knobs: read by ppo_loss and the policy-loss functions it looks up
    # (verl/workers/utils/losses.py:57-145, verl/trainer/ppo/core_algos.py compute_policy_loss_*).
    Effect(
        "the actor's loss",
        _no_distillation,
        _actor_loss,
        tuple(
            f"{_ACTOR}.{name}"
            for name in (
                "clip_ratio",
                "clip_ratio_low",
                "clip_ratio_high",
                "clip_ratio_c",
                "kl_loss_coef",
                "kl_loss_type",
                "loss_scale_factor",
            )
        ),
        (f"{_ACTOR}.policy_loss.*",),
        sections=(_ACTOR,),
    ),
    # value_loss alone reads the critic's clip range and aggregation (losses.py:147-200).
    Effect(
        "the critic's loss",
        _needs_critic,
        _critic_loss,
        ("critic.cliprange_value", "critic.loss_agg_mode", "critic.loss_scale_factor"),
        sections=("critic",),
    ),
    # _compute_advantage alone reads these (trainer_base.py:1588-1647; the KL controller is built
    # from kl_ctrl only when use_kl_in_reward, trainer_base.py:129-130).
    Effect(
        "the advantages",
        lambda plain: True,
        _advantage,
        (
            "algorithm.gamma",
            "algorithm.lam",
            "algorithm.norm_adv_by_std_in_grpo",
            "algorithm.kl_penalty",
            "algorithm.kl_ctrl.*",
        ),
        sections=("algorithm", f"{ARR}.rollout", "trainer"),
    ),
)


# --- running the effects ------------------------------------------------------------------


def _perturbations(value: Any) -> list[Any]:
    """Other values to try: a flag flipped; a number raised and lowered, and a small fraction
    also raised a hundredfold (``clip_cov_ratio=0.0002`` picks a count of tokens, none of a tiny
    batch's until it is large enough). No effect is claimed unless every one changes nothing."""
    if isinstance(value, bool):
        return [not value]
    # A value at or below zero is often a sentinel (``lr_warmup_steps=-1``: "use the ratio",
    # verl/workers/engine/fsdp/transformer_impl.py:490): positive values are tried too, or the
    # sentinel's own regime would look like no effect.
    if isinstance(value, int):
        return [value * 2, value + 1] if value > 0 else [value - 1, 1, 2]
    if isinstance(value, float):
        tried = [value * 1.5, value * 0.5] if value > 0 else [value - 1.0, 0.1, 1.0]
        if 0 < abs(value) < 0.01:
            tried.append(value * 100)
        # Six significant digits: the finding says 0.45, not 0.44999999999999996.
        return [float(f"{t:.6g}") for t in tried]
    return []


def _same_kind(a: Any, b: Any) -> bool:
    """Both flags, or both numbers (an int default stands for a float key: ``entropy_coeff``)."""
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool)
    return isinstance(a, int | float) and isinstance(b, int | float)


def _subset(
    plain: Mapping[str, Any], sections: tuple[str, ...], change: tuple[str, Any] | None
) -> dict[str, Any]:
    """A copy of ``plain``'s ``sections`` (all of it without any), at their places, with
    ``change`` (key, value) applied where the key lies inside them."""
    if not sections:
        out = copy.deepcopy(dict(plain))
    else:
        out = {}
        for section in sections:
            *parents, leaf = section.split(".")
            source: Any = plain
            target = out
            for part in parents:
                source = source[part]
                target = target.setdefault(part, {})
            target[leaf] = copy.deepcopy(source[leaf])
    if change is not None:
        *parents, leaf = change[0].split(".")
        node: Any = out
        for part in parents:
            node = node.get(part) if isinstance(node, dict) else None
        if isinstance(node, dict) and leaf in node:
            node[leaf] = change[1]
    return out


def _observe(
    effect: Effect,
    plain: Mapping[str, Any],
    reads: ConfigReads | None,
    change: tuple[str, Any] | None = None,
) -> Any:
    """The effect's observables on ``plain`` with ``change`` (key, value) (recording its reads
    into ``reads``), or the exception it raised."""
    import torch
    from omegaconf import OmegaConf

    cfg = OmegaConf.create(_subset(plain, effect.sections, change))
    torch.manual_seed(0)  # a loss that samples tokens (clip_cov) draws the same ones every time
    try:
        with recording(reads) if reads is not None else contextlib.nullcontext():
            return _plain(effect.compute(cfg, plain))
    except PatchPointMissing:
        raise
    except Exception as exc:  # upstream refused it: a different outcome, never equal
        return _Failed(f"{type(exc).__name__}: {exc}")


@dataclass(frozen=True)
class _Failed:
    why: str


def overridden(
    plain: Mapping[str, Any],
    explicit: list[str],
    leaves: Mapping[str, Any],
    root: Path,
    effects: tuple[Effect, ...] = EFFECTS,
) -> list[dict[str, Any]]:
    """Explicit numeric or boolean keys an effect reads whose perturbation changes nothing
    (``effects``: those of the entry point's path, by default main_ppo's)."""
    results = []
    baselines: list[tuple[Effect, Any, ConfigReads]] = []
    for effect in effects:
        if not effect.applies(plain):
            continue
        reads = ConfigReads(root, leaves)
        seen = _observe(effect, plain, reads)
        if not isinstance(seen, _Failed):
            baselines.append((effect, seen, reads))
    for key in explicit:
        owners = [(e, seen, r) for e, seen, r in baselines if e.owned(key)]
        if not owners:
            continue
        if not any(key in r.origins(r.read) for _, _, r in owners):
            record = _record(key, NOT_READ_HERE, leaves, [], [e.name for e, _, _ in owners])
            record[KEY_INSTEAD] = _enabling_flag(
                key, [e for e, _, _ in owners], plain, leaves, root
            )
            results.append(record)
            continue
        tries = _perturbations(leaves.get(key))
        # The value the key has without the script's line: a value in a regime where the
        # perturbations cannot bind (``clip_ratio_low=10`` under CISPO's ``1 - clip_ratio_low``)
        # still differs from removing the key, so it acts.
        has_default, default = field_default(plain, key)
        if has_default and _same_kind(default, leaves.get(key)) and default != leaves.get(key):
            tries.append(default)
        tries = [t for i, t in enumerate(tries) if t not in tries[:i]]
        readers = [(e, seen, r) for e, seen, r in owners if e.perturbable(key)]
        if not tries or not readers:
            continue
        changed = any(
            _observe(e, plain, None, (key, tried)) != seen
            for tried in tries
            for e, seen, _ in readers
        )
        if changed:
            continue
        where = sorted(
            {
                f"{f}:{n}"
                for e, _, r in readers
                for (f, n), ks in r.by_line.items()
                if key in ks and f.startswith("verl/")
            }
        )
        # What decides instead: the other keys read on the lines that read this one, when they
        # are few (``clip_ratio_low if clip_ratio_low is not None else clip_ratio``).
        deciding = sorted(
            {k for _, _, r in readers for (f, n), ks in r.by_line.items() if key in ks for k in ks}
            - {key}
        )
        deciding = deciding if len(deciding) <= 2 else []
        record = _record(key, OVERRIDDEN, leaves, where[:3], [e.name for e, _, _ in readers])
        record[KEY_TRIED] = ", ".join(repr(tried) for tried in tries)
        record[KEY_INSTEAD] = [k for k in deciding if k in leaves]
        results.append(record)
    return results


# Flags of a section tried for the one that makes an unread key read (a section has a dozen).
_MAX_FLAGS = 24


def _enabling_flag(
    key: str, owners: list[Effect], plain: Mapping[str, Any], leaves: Mapping[str, Any], root: Path
) -> list[str]:
    """The flag of the key's section or a section above it (nearest first) that, flipped, makes
    one of its effects read the key (``actor.use_kl_loss=True`` for ``actor.kl_loss_coef``,
    ``algorithm.use_kl_in_reward=True`` for ``algorithm.kl_ctrl.kl_coef``), as
    ``["flag=value"]``; [] when none does (the key waits on a string option or a number)."""
    parts = key.split(".")
    flags = [
        k
        for depth in range(len(parts) - 1, 0, -1)
        for k, v in sorted(leaves.items())
        if isinstance(v, bool) and k.rpartition(".")[0] == ".".join(parts[:depth])
    ]
    for flag in flags[:_MAX_FLAGS]:
        for effect in owners:
            reads = ConfigReads(root, leaves)
            seen = _observe(effect, plain, reads, (flag, not leaves[flag]))
            if not isinstance(seen, _Failed) and key in reads.origins(reads.read):
                return [f"{flag}={not leaves[flag]}"]
    return []


def _record(
    key: str, kind: str, leaves: Mapping[str, Any], where: list[str], effects: list[str]
) -> dict[str, Any]:
    return {
        KEY_KEY: key,
        KEY_KIND: kind,
        KEY_VALUE: repr(leaves.get(key)),
        KEY_TRIED: "",
        KEY_EFFECTS: effects,
        KEY_INSTEAD: [],
        KEY_WHERE: where,
    }


# --- never read ----------------------------------------------------------------------------


@functools.cache
def referenced_names(root: Path) -> frozenset[str]:
    """Every attribute name and string key upstream's code reads outside its config dataclasses
    (``x.name``, ``x["name"]``, ``x.get("name", …)``), over the whole installed package."""
    return _scan(root)[0]


@functools.cache
def reflected_classes(root: Path) -> frozenset[str]:
    """Config classes whose every field upstream's code reads by reflection: a function whose
    parameter is annotated with the class and that walks it with ``fields``, ``asdict``,
    ``astuple`` or ``vars`` (``_build_ops_implementation_config(engine_config:
    VeOmniEngineConfig)`` forwards each ``*_implementation`` field to VeOmni,
    verl/workers/engine/veomni/transformer_impl.py:64-76); no field name appears in that code."""
    return _scan(root)[1]


_REFLECTING = frozenset({"fields", "asdict", "astuple", "vars"})


def _annotation_name(node: ast.expr | None) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value.rpartition(".")[2]
    return ""


def _reflected_in(function: ast.FunctionDef | ast.AsyncFunctionDef) -> set[str]:
    arguments = function.args
    annotated = {
        arg.arg: _annotation_name(arg.annotation)
        for arg in [*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs]
    }
    found = set()
    for node in ast.walk(function):
        if not (isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Name)):
            continue
        if _annotation_name(node.func) in _REFLECTING and annotated.get(node.args[0].id):
            found.add(annotated[node.args[0].id])
    return found


@functools.cache
def _scan(root: Path) -> tuple[frozenset[str], frozenset[str]]:
    names: set[str] = set()
    reflected: set[str] = set()
    config = root / "workers" / "config"
    for path in sorted(root.rglob("*.py")):
        if config in path.parents:
            continue
        source = statements.parse(str(path), path.relative_to(root.parent).as_posix())
        if source is None:
            continue
        for node in source.nodes:
            if isinstance(node, ast.Attribute):
                names.add(node.attr)
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                names.add(node.value)
            elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                reflected |= _reflected_in(node)
    return frozenset(names), frozenset(reflected)


def _likeness(a: str, b: str) -> float:
    """How alike two field names are: by characters, or by their words in any order
    (``grad_clip`` and ``clip_grad`` are the same words)."""
    words_a, words_b = set(a.split("_")), set(b.split("_"))
    shared = len(words_a & words_b) / len(words_a | words_b)
    return max(difflib.SequenceMatcher(None, a, b).ratio(), shared)


def _closest_read(key: str, read: set[str], settable: Mapping[str, Any]) -> str:
    """The read key most like ``key`` in its section that the user can set (a key of the tree:
    a dataclass field the tree lacks, such as the deprecated ``optim.grad_clip``, is no advice)."""
    section, _, name = key.rpartition(".")
    nearby = sorted(k for k in read if k.startswith(section + ".") and k != key and k in settable)
    scored = sorted(((_likeness(name, k.rpartition(".")[2]), k) for k in nearby), reverse=True)
    return scored[0][1] if scored and scored[0][0] >= 0.6 else ""


def never_read(
    reads: ConfigReads,
    tagged: Iterator[tuple[Any, str]],
    explicit: list[str],
    root: Path,
    leaves: Mapping[str, Any],
    referenced: frozenset[str] | None = None,
) -> list[dict[str, Any]]:
    """Explicit fields of a converted config dataclass that nothing reads (see the docstring);
    ``referenced``: the names the entry point's code reads, by default the whole package's."""
    import dataclasses as dc

    fields_at: dict[str, set[str]] = {}
    reflected = reflected_classes(root)
    for obj, path in tagged:
        lineage = {cls.__name__ for cls in type(obj).mro()}
        if dc.is_dataclass(obj) and not lineage & reflected:
            fields_at.setdefault(path, set()).update(f.name for f in dc.fields(obj))
    referenced = referenced_names(root) if referenced is None else referenced
    read = reads.origins(reads.read)
    results = []
    for key in explicit:
        section, _, name = key.rpartition(".")
        if name not in fields_at.get(section, set()) or key in read or name in referenced:
            continue
        results.append(
            {
                KEY_KEY: key,
                KEY_KIND: NEVER_READ,
                KEY_VALUE: "",
                KEY_TRIED: "",
                KEY_EFFECTS: [],
                KEY_INSTEAD: [k for k in [_closest_read(key, read, leaves)] if k],
                KEY_WHERE: [],
            }
        )
    return results
