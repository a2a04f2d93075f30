"""LoRA against the model: a router peft wraps and the model then reads through; a critic
peft's causal-LM wrapper cannot wrap.

Which model types are affected is a fact of the release's environment (its peft and
transformers), derived there and kept as data (``releases/lora_routers.py`` and
``releases/value_heads.py``, handed to the checks as ``CheckInput.wrapped_routers`` and
``CheckInput.value_heads``); the check matches the role's LoRA targets as peft matches
them. Fires only when the caller could read the model's config.json (``CheckInput.model_facts``).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from pytest_verl_compat.checks.lora import ALL_LINEAR, engine_lora_rank
from pytest_verl_compat.checks.model_facts import (
    ACTOR_MODEL,
    CRITIC_MODEL,
    SFT_MODEL,
    ValueHeads,
    WrappedRouter,
)
from pytest_verl_compat.checks.registry import SFT, CheckInput, Example, Hit, check
from pytest_verl_compat.checks.roles import (
    FSDP_STRATEGIES,
    ROLE_NAMES,
    engine_roles,
    role_strategy,
)
from pytest_verl_compat.checks.sft import engine_strategy
from pytest_verl_compat.files.patterns import fullmatches

# Where a router sits in the module tree, for a regex target (peft full-matches a string target
# against each module's name, tuners_utils.py check_target_module_exists): a causal LM's layers
# and a multimodal model's language model's, at a first, a later and a deep layer.
ROUTER_KEYS = tuple(
    f"{prefix}.layers.{layer}.mlp.{{router}}"
    for prefix in ("model", "model.language_model")
    for layer in (1, 3, 10)
)


def _names_router(model: Mapping[str, Any], router: WrappedRouter) -> str | None:
    """The model section's key whose value makes peft target the router, if any: the target
    modules (all-linear, a regex matching the router's name, a list with the router's name as
    itself or as a suffix: transformers_weight_conversion.py:442-449@peft-0.21.2) or the target
    parameters (the router's weight)."""
    targets = model.get("target_modules")
    if isinstance(targets, str):
        if targets.lower() == ALL_LINEAR:
            return "target_modules"
        if any(fullmatches(targets, key.format(router=router.target)) for key in ROUTER_KEYS):
            return "target_modules"
    elif isinstance(targets, list | tuple):
        if any(str(t) == router.target or str(t).endswith(f".{router.target}") for t in targets):
            return "target_modules"
    parameters = model.get("target_parameters")
    if isinstance(parameters, list | tuple) and any(
        str(p) == router.parameter or str(p).endswith(f".{router.parameter}") for p in parameters
    ):
        return "target_parameters"
    return None


def _trained_models(inp: CheckInput) -> Iterator[tuple[str, str, Mapping[str, Any]]]:
    """(who trains it, its model section's path, the section) per FSDP engine that trains a LoRA
    adapter it builds itself (an adapter loaded from any lora_adapter_path but null brings its
    own targets, verl/workers/engine/fsdp/transformer_impl.py:323-324):
    an RL run's actor and critic, or the SFT trainer's model (the same engine,
    verl/trainer/sft_trainer.py:141-168)."""
    if inp.family == SFT:
        engine = inp.resolved.get("engine")
        strategy = engine_strategy(engine) if isinstance(engine, Mapping) else ""
        trained = [("SFT trainer", SFT_MODEL, strategy)]
    else:
        # a reference worker of its own runs only where the actor trains no adapter
        # (roles.ref_in_actor), so only the actor and the critic build one
        trained = [
            (
                ROLE_NAMES[role],
                CRITIC_MODEL if role == "critic" else ACTOR_MODEL,
                role_strategy(inp.resolved, role),
            )
            for role in engine_roles(inp.resolved)
            if role != "ref"
        ]
    for who, path, strategy in trained:
        model: Any = inp.resolved
        for part in path.split("."):
            model = model.get(part) if isinstance(model, Mapping) else None
        if (
            isinstance(model, Mapping)
            and strategy in FSDP_STRATEGIES
            and engine_lora_rank(model, strategy)
            and model.get("lora_adapter_path") is None
        ):
            yield who, path, model


@check(
    "model.lora-router",
    level="error",
    evidence=(
        "peft/utils/transformers_weight_conversion.py:340@peft-0.21.2 (LoRA's `gate` target, and "
        "all-linear, become the router's parameter target: peft wraps the router) and "
        "transformers/models/glm4_moe/modeling_glm4_moe.py:391@transformers-5.10.4 (the MoE block "
        "reads the router's e_score_correction_bias, which the wrapper lacks), as the release's "
        "environment resolves them (data/releases/VERSION/lora_routers.json); the FSDP engine "
        "hands the model section's targets to peft at verl/workers/engine/fsdp/transformer_impl.py:339-349"
    ),
    summary=(
        "LoRA (FSDP engine) whose targets take in the MoE router of a model whose MoE block "
        "reads an attribute of that router (DeepSeek V3, GLM-4.5, ...): peft wraps the router and "
        "the first forward fails. Needs the model's config.json."
    ),
    fix="list the LoRA targets without the router, e.g. "
    "target_modules=[q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj]",
    example=Example(
        fires=("actor_rollout_ref.model.lora_rank=16",),
        twin=(
            "actor_rollout_ref.model.lora_rank=16",
            "actor_rollout_ref.model.target_modules=[q_proj,k_proj,v_proj,o_proj]",
        ),
        model={"model_type": "glm4_moe"},
    ),
    family=None,
)
def lora_router(inp: CheckInput) -> Iterator[Hit]:
    routers = inp.wrapped_routers
    for who, path, model in _trained_models(inp):
        facts = inp.model_facts.get(path)
        router = routers.get(facts.model_type or "") if facts is not None else None
        if facts is None or router is None:
            continue
        key = _names_router(model, router)
        if key is None:
            continue
        yield Hit(
            f"{path}.{key}",
            f"LoRA's targets take in the MoE router ({router.target}) of {facts.source} "
            f"({router.model_type}): peft wraps it ({router.mapped.where}@peft-"
            f"{router.versions.get('peft', '?')}) and the model reads its {router.attribute} "
            f"through the wrapper ({router.read.where}@transformers-"
            f"{router.versions.get('transformers', '?')}: `{router.read.statement}`); the "
            f"{who}'s first forward fails with an AttributeError in verl "
            f"{inp.version}'s environment ({router.environment})",
            fix=f"set {path}.target_modules to a list without {router.target!r} "
            "(e.g. [q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj])",
        )


CRITIC_LORA = "model.critic-lora"


@check(
    CRITIC_LORA,
    level="error",
    evidence=(
        "verl/workers/engine/fsdp/transformer_impl.py:271-285 (the critic's model is "
        "load_valuehead_model's: AutoModelForTokenClassification, verl/utils/model.py:640-648) "
        "and transformer_impl.py:339-349 (LoRA wraps it with task_type CAUSAL_LM); "
        "peft/peft_model.py:2083@peft-0.21.2 (PeftModelForCausalLM reads the model's "
        "prepare_inputs_for_generation, which a token-classification model lacks), as the "
        "release's environment resolves them (data/releases/VERSION/value_heads.json)"
    ),
    summary=(
        "A LoRA critic on the FSDP engine (critic.model.lora_rank > 0): verl loads the critic as "
        "a token-classification model and asks peft for a causal-LM adapter, whose wrapper reads "
        "a generation method the model does not have; the critic's engine fails when it starts. "
        "Needs the critic model's config.json (the actor's, when the critic reads it)."
    ),
    fix="train the critic in full (critic.model.lora_rank=0); the actor's LoRA is unaffected",
    example=Example(
        fires=(
            "algorithm.adv_estimator=gae",
            "critic.model.path=${actor_rollout_ref.model.path}",
            "critic.model.lora_rank=8",
        ),
        twin=(
            "algorithm.adv_estimator=gae",
            "critic.model.path=${actor_rollout_ref.model.path}",
            "actor_rollout_ref.model.lora_rank=8",
        ),
        model={"model_type": "qwen2"},
    ),
    family=None,
)
def critic_lora(inp: CheckInput) -> Iterator[Hit]:
    heads = inp.value_heads
    if heads is None:
        return
    for _, path, _ in _trained_models(inp):
        facts = inp.model_facts.get(path) if path == CRITIC_MODEL else None
        if facts is None or facts.model_type not in heads.model_types:
            continue
        yield Hit(
            f"{path}.lora_rank",
            critic_lora_said(heads, inp.version, facts.source, facts.model_type or ""),
            fix=CRITIC_LORA_FIX.format(path=path),
        )


CRITIC_LORA_FIX = "set {path}.lora_rank=0 (the critic trains in full)"


def critic_lora_said(heads: ValueHeads, version: str, source: str, model_type: str) -> str:
    """Why a LoRA critic of ``model_type`` (read from ``source``) cannot start in ``version``."""
    loaded = heads.model_types[model_type]
    return (
        f"a LoRA critic: verl {version} loads {source} ({model_type}) as {loaded} "
        "(verl/utils/model.py:640-648) and asks peft for a causal-LM adapter "
        "(verl/workers/engine/fsdp/transformer_impl.py:339-349), whose wrapper reads the model's "
        f"prepare_inputs_for_generation ({heads.read.where}@peft-"
        f"{heads.versions.get('peft', '?')}: `{heads.read.statement}`), which {loaded} does not "
        "have: the critic's engine fails with an AttributeError when it starts, in the release's "
        f"environment ({heads.environment})"
    )
