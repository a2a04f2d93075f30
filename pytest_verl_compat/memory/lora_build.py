"""Whether peft builds the LoRA adapter a role asks for, decided on the model's module tree.

verl's FSDP engine hands a model section's ``target_modules``, ``target_parameters`` and
``exclude_modules`` to ``get_peft_model`` as written (verl/workers/engine/fsdp/
transformer_impl.py:340-349; the SFT trainer builds the same engine, sft_trainer.py:141-168), and
peft refuses, before the run's first phase, a configuration that adapts nothing or names a module
LoRA cannot wrap (peft 0.21.2, both releases' environment pin):

- a module a target names that is not an ``nn.Linear``, ``nn.Embedding`` or ``nn.Conv*`` (a
  decoder layer, its ``mlp`` or ``self_attn``, a norm, a MoE router or stacked experts
  transformers 5 no longer builds as linears): ``ValueError: Target module ... is not supported``
  (tuners/lora/model.py:557-561);
- no module (nor parameter) targeted once the excluded are left out: ``NoMatchingPeftModuleError``
  (tuners/tuners_utils.py:1051-1086);
- for a MoE type peft converts to transformers 5's fused experts (states.PEFT_V4_MOE_*), one of
  ``gate_proj`` and ``up_proj`` without the other: ``ValueError: Cannot convert PEFT target(s)``
  (utils/transformers_weight_conversion.py:461-469).

A critic is refused before its targets are read where the release's environment loads it as a
token-classification model, which peft's causal-LM wrapper cannot wrap at all (check's
``model.critic-lora``, ``releases/value_heads.py``).

A target is matched as peft matches it (check_target_module_exists, tuners_utils.py:2337-2412): a
list entry equals a module's name or is its dotted suffix, a string is full-matched. The module
tree is the forecast's own (``Architecture.tensors``, tested equal to transformers' build): every
module holding a parameter and every module above one. Where the tree is not transformers' to the
name (a VL model's language model sits under ``model.language_model``; a tower the forecast does
not count), only a dotless list entry is judged, as its match does not depend on the prefix; a
target ``null`` (peft's defaults per model type), an adapter loaded from ``lora_adapter_path`` and
Megatron-Bridge's LoRA are not judged here.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from pytest_verl_compat.checks.lora import ALL_LINEAR, engine_lora_rank
from pytest_verl_compat.checks.lora_targets import CRITIC_LORA, CRITIC_LORA_FIX, critic_lora_said
from pytest_verl_compat.checks.model_facts import ACTOR_MODEL, CRITIC_MODEL, SFT_MODEL
from pytest_verl_compat.checks.roles import MEGATRON_STRATEGIES
from pytest_verl_compat.files.patterns import fullmatch_decided
from pytest_verl_compat.memory.architecture import Architecture
from pytest_verl_compat.memory.layout import RL, SFT, RunLayout, value_at
from pytest_verl_compat.memory.parts import AdapterRefusal
from pytest_verl_compat.memory.states import (
    PEFT_V4_MOE_MODEL_TYPES,
    PEFT_V4_MOE_NAMES,
)
from pytest_verl_compat.memory.vision import TOWER_PREFIXES
from pytest_verl_compat.releases.value_heads import value_heads

EV_BUILD = "verl/workers/engine/fsdp/transformer_impl.py:340-349"
EV_UNSUPPORTED = "peft/tuners/lora/model.py:557-561@peft-0.21.2"
EV_NOTHING = "peft/tuners/tuners_utils.py:1051-1086@peft-0.21.2"
EV_GROUPS = "peft/tuners/lora/layer.py:1565-1570@peft-0.21.2"
EV_FUSED = "peft/utils/transformers_weight_conversion.py:461-469@peft-0.21.2"
# Parameter kinds (memory/tensor.py) whose module LoRA wraps: nn.Linear (a head's too),
# nn.Embedding, nn.Conv1d/3d (a linear attention's short convolution, a tower's patch embedding).
WRAPPED_KINDS = frozenset({"linear", "lm_head", "embed", "conv", "vision_embed"})
# Seconds to judge a target pattern over the whole tree (each match is bounded by the pattern
# module's own timeout; a pattern slow on every name is not judged rather than held for long).
JUDGE_SECONDS = 0.5
# The fused pair of the converted MoE types' experts: peft refuses one without the other.
FUSED_PAIR = ("gate_proj", "up_proj")


@dataclass(frozen=True)
class ModuleTree:
    """The model's module names, in transformers' order, each with whether LoRA wraps it."""

    wrapped: dict[str, bool]
    parameters: tuple[str, ...]  # every parameter's full name
    # a grouped convolution's groups (a linear attention's depthwise conv1d: one per channel);
    # peft wraps it only at a LoRA rank the groups divide (tuners/lora/layer.py:1565-1570)
    groups: dict[str, int]
    # every module, named as transformers names it (else: a tower the forecast does not count,
    # whose modules are missing; only the last parts of the others' names are reliable)
    exact: bool


def module_tree(arch: Architecture, value_head: bool = False) -> ModuleTree:
    """Every module holding a parameter (wrapped when its weight is a linear, embedding or
    convolution's) and every module above one (a container, never wrapped), with the output
    layer a tied embedding leaves out of the parameters."""
    tensors = list(arch.value_head_tensors() if value_head else arch.tensors())
    vl = arch.vision is not None
    wrapped: dict[str, bool] = {}
    parameters = []
    groups = {}
    for tensor in tensors:
        name = tensor.name
        if vl and name.startswith("model.") and not name.startswith(TOWER_PREFIXES):
            name = "model.language_model." + name[len("model.") :]
        parameters.append(name)
        module, _, leaf = name.rpartition(".")
        parts = module.split(".")
        for depth in range(1, len(parts)):
            wrapped.setdefault(".".join(parts[:depth]), False)
        is_wrapped = leaf == "weight" and tensor.kind in WRAPPED_KINDS
        wrapped[module] = wrapped.get(module, False) or is_wrapped
        if tensor.kind == "conv" and leaf == "weight" and tensor.shape[1] == 1:
            groups[module] = tensor.shape[0]  # depthwise: in channels per group 1
    if arch.tie_word_embeddings and not value_head:
        wrapped["lm_head"] = True  # the module is there; its weight is the embedding's
    return ModuleTree(wrapped, tuple(parameters), groups, exact=not arch.vision_uncounted)


def _names(value: Any) -> tuple[str, ...] | None:
    if isinstance(value, list | tuple):
        return tuple(str(v) for v in value)
    return None


def _listed(entries: Iterable[str], key: str) -> bool:
    return any(key == e or key.endswith(f".{e}") for e in entries)


def _matcher(targets: Any, tree: ModuleTree) -> Any:
    """A function of a module's name: True (targeted), False, or None (undecided), as peft
    matches ``targets``; None itself where this tree cannot judge them."""
    listed = _names(targets)
    if listed is not None:
        if not tree.exact and any("." in e for e in listed):
            return None
        return lambda key: _listed(listed, key)
    if isinstance(targets, str) and tree.exact:
        return lambda key: fullmatch_decided(targets, key)
    return None


def _converts(arch: Architecture) -> bool:
    return arch.model_type in PEFT_V4_MOE_MODEL_TYPES and arch.is_moe


def _resolved_pattern(pattern: str, tree: ModuleTree) -> tuple[str, ...] | None:
    """The last parts of the names a pattern full-matches, as peft resolves a string target
    for a type it converts (_resolve_string_target_modules,
    transformers_weight_conversion.py:355-399@peft-0.21.2): the modules' and parameters' names,
    and transformers 4's expert names probed inside the fused parameters' modules; None when
    not decided in time."""
    found = set()
    deadline = time.monotonic() + JUDGE_SECONDS
    for name in (*tree.wrapped, *tree.parameters):
        hit = fullmatch_decided(pattern, name)
        if hit is None or time.monotonic() > deadline:
            return None
        if hit:
            found.add(name.rsplit(".", 1)[-1])
    holders: dict[str, list[str]] = {}
    for name in tree.parameters:
        module, _, leaf = name.rpartition(".")
        holders.setdefault(leaf, []).append(module)
    for old, new in PEFT_V4_MOE_NAMES.items():
        if old in found:
            continue
        for module in holders.get(new, ()):
            hit = fullmatch_decided(pattern, f"{module}.{old}")
            if hit is None:
                return None
            if hit:
                found.add(old)
                break
    return tuple(sorted(found))


def _converted(
    listed: tuple[str, ...], arch: Architecture
) -> tuple[tuple[str, ...], tuple[str, ...], str]:
    """(module targets left, the parameter targets they became, the one of the fused pair named
    alone) after peft's conversion of transformers 4's MoE names for the types it converts
    (transformers_weight_conversion.py:444-469@peft-0.21.2)."""
    if not _converts(arch):
        return listed, (), ""
    left, moved = [], set()
    for entry in listed:
        old = next((o for o in PEFT_V4_MOE_NAMES if entry == o or entry.endswith(f".{o}")), "")
        if old:
            moved.add(old)
        else:
            left.append(entry)
    alone = [name for name in FUSED_PAIR if name in moved]
    became = tuple(sorted({PEFT_V4_MOE_NAMES[name] for name in moved}))
    return tuple(left), became, alone[0] if len(alone) == 1 else ""


def adapter_refusal(
    arch: Architecture, model: Mapping[str, Any], strategy: str, role: str, where: str
) -> AdapterRefusal | None:
    """What peft raises building the LoRA adapter of ``model`` (the role's model section, at
    ``where``) on ``arch``, if it refuses; None where it builds one or this cannot tell."""
    rank = engine_lora_rank(model, strategy)
    if strategy in MEGATRON_STRATEGIES or rank == 0:
        return None
    if model.get("lora_adapter_path") is not None:
        return None  # a loaded adapter brings its own targets (transformer_impl.py:323-336)
    written = model.get("target_modules")
    if written is None or (isinstance(written, str) and written.lower() == ALL_LINEAR):
        return None
    key = f"{where}.target_modules"
    said = f"{key}={_said(written)}"
    tree = module_tree(arch, value_head=role == "critic")
    parameters = _names(model.get("target_parameters")) or ()
    targets: Any = written
    listed = _names(written)
    if listed is not None:
        targets, moved, alone = _converted(listed, arch)
        if alone:
            other = next(name for name in FUSED_PAIR if name != alone)
            return _refused(
                role,
                key,
                f"{said} names {alone} without {other}: {arch.model_type}'s experts fuse them into "
                "one gate_up_proj, and peft refuses to convert one of them alone (ValueError: "
                "Cannot convert PEFT target(s)",
                f"add {other} to {key}, or leave out {alone}",
                EV_FUSED,
            )
        parameters = (*parameters, *moved)
    elif _converts(arch) and isinstance(written, str):
        if not tree.exact:
            return None
        resolved = _resolved_pattern(written, tree)
        if resolved is None:
            return None  # not decided in time
        # nothing matched: peft leaves the pattern as it was, for its own not-found error
        if resolved:
            targets, moved, _ = _converted(resolved, arch)
            parameters = (*parameters, *moved)
    exclude = model.get("exclude_modules")
    targeted = _matcher(targets, tree)
    excluded = _matcher(exclude, tree) if exclude else _nothing_excluded
    if targeted is None or excluded is None:
        return None
    fix = (
        f"set {key} to the model's own layers ({', '.join(_wrapped_leaves(tree)[:8])}, ...) "
        "or to all-linear"
    )
    matched = named = False  # a module targeted once excluded ones are left out; before
    deadline = time.monotonic() + JUDGE_SECONDS
    for name, wraps in tree.wrapped.items():
        out, hit = excluded(name), targeted(name)
        if out is None or hit is None or time.monotonic() > deadline:
            return None  # a pattern not decided in time: not judged
        named = named or bool(hit)
        if out or not hit:
            continue
        grouped = tree.groups.get(name, 1)
        if wraps and rank % grouped:
            return _refused(
                role,
                key,
                f"{said} names {name}, a convolution of {grouped} groups, at LoRA rank {rank}: "
                "peft wraps a grouped convolution only at a rank its groups divide (ValueError: "
                f"Targeting a Conv1d with groups={grouped}",
                f"leave {name.rsplit('.', 1)[-1]} out of {key}",
                EV_GROUPS,
            )
        if not wraps:
            return _refused(
                role,
                key,
                f"{said} names {name}, which is not a linear, embedding or convolution layer of "
                f"{arch.name}: peft refuses to wrap it (ValueError: Target module ... is not "
                "supported",
                fix,
                EV_UNSUPPORTED,
            )
        matched = True
    # a parameter target names a parameter by its full name or a dotted suffix of it
    # (_inject_parameters, tuners_utils.py:1224-1256@peft-0.21.2)
    if matched or any(_listed(parameters, name) for name in tree.parameters):
        return None
    if not tree.exact:
        return None  # a tower the forecast does not count may hold the modules named
    reason = "leaves no module once exclude_modules is applied" if named else "names no module"
    return _refused(
        role,
        key,
        f"{said} {reason} of {arch.name} that LoRA can wrap: peft adapts nothing and refuses "
        "(NoMatchingPeftModuleError",
        f"{fix}; or narrow {where}.exclude_modules" if named else fix,
        EV_NOTHING,
    )


def _refused(role: str, key: str, why: str, fix: str, evidence: str) -> AdapterRefusal:
    """The refusal said as every one is: ``why`` (its open parenthesis naming what peft raises)
    closed by the peft line that raises it, and when."""
    when = f"when verl's engine builds the adapter ({EV_BUILD}), before the first step"
    return AdapterRefusal(role, key, f"{why}, {evidence}) {when}", fix, evidence)


def _nothing_excluded(name: str) -> bool:
    return False


def _said(value: Any) -> str:
    if isinstance(value, list | tuple):
        return "[" + ",".join(str(v) for v in value) + "]"
    return str(value)


def _wrapped_leaves(tree: ModuleTree) -> list[str]:
    """The last parts of the language model's modules LoRA can wrap, once each, in order: what a
    target list may name."""
    leaves = (
        name.rsplit(".", 1)[-1]
        for name, wraps in tree.wrapped.items()
        if wraps and not name.startswith(TOWER_PREFIXES) and ".layers." in name
    )
    return list(dict.fromkeys(leaves))


# (role, its model section) per kind of run: the roles whose engine builds a LoRA adapter (a
# reference of its own runs only where the actor trains none, roles.ref_in_actor)
MODEL_SECTIONS = {
    RL: (("actor", ACTOR_MODEL), ("critic", CRITIC_MODEL)),
    SFT: (("actor", SFT_MODEL),),
}


def refusals(
    resolved: Mapping[str, Any], layout: RunLayout, version: str
) -> tuple[AdapterRefusal, ...]:
    """peft's refusals of the run's LoRA adapters in ``version``'s environment, one per role
    that trains one."""
    out = []
    by_role = {role.role: role for role in layout.roles}
    for name, where in MODEL_SECTIONS.get(layout.kind, ()):
        role = by_role.get(name)
        model = value_at(resolved, where, None)
        if role is None or not isinstance(model, Mapping):
            continue
        arch, strategy = role.model.architecture, role.spec.strategy
        refused = (
            _critic_refusal(arch, model, strategy, where, version) if name == "critic" else None
        ) or adapter_refusal(arch, model, strategy, name, where)
        if refused is not None:
            out.append(refused)
    return tuple(out)


def _critic_refusal(
    arch: Architecture, model: Mapping[str, Any], strategy: str, where: str, version: str
) -> AdapterRefusal | None:
    """A LoRA critic of a model the release's environment loads as a token-classification
    model, which peft's causal-LM wrapper cannot wrap (check's model.critic-lora)."""
    heads = value_heads(version)
    if (
        heads is None
        or arch.model_type not in heads.model_types
        or strategy in MEGATRON_STRATEGIES
        or engine_lora_rank(model, strategy) == 0
        or model.get("lora_adapter_path") is not None
    ):
        return None
    return AdapterRefusal(
        "critic",
        f"{where}.lora_rank",
        critic_lora_said(heads, version, arch.name, arch.model_type),
        CRITIC_LORA_FIX.format(path=where),
        heads.read.where,
        CRITIC_LORA,
    )
