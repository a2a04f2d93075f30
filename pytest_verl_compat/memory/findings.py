"""The forecast's verdicts as findings (``error[memory.<phase>]``) and the rules' pages.

``verl-compat check --gpu TYPE`` appends these to a script's findings; ``verl-compat rule
memory.<phase>`` prints the page. The pages are registered when this module is imported (by the
CLI and the plugin, the only layers that import ``memory``).
"""

from __future__ import annotations

from pytest_verl_compat.checks.registry import Example, RuleDoc, register_rule, rule_docs
from pytest_verl_compat.memory.parts import LORA_TARGETS, PHASE_TITLES, PHASES, Forecast, gib
from pytest_verl_compat.model import COMPOSE_RULE, Finding

SOURCE = "the memory forecast (verl-compat fit, or check --gpu TYPE)"
# Each phase's page: what decides it, the upstream lines that make it true, the usual fixes.
_WHY = {
    "rollout-start": "vLLM claims gpu_memory_utilization x the GPU and refuses to start when less is free or when the KV cache left cannot hold one max_model_len sequence (vllm/v1/worker/gpu_worker.py Worker.init_device; kv_cache_utils.py check_enough_kv_cache_memory); verl starts it on the actor's GPUs after building the trainer's engines, whose weights stay resident (verl/trainer/ppo/v1/trainer_base.py:311-313, :351-353)",
    "weight-sync": "the server's weights are resumed (unless SGLang's LoRA adapters kept them through sleep), the actor's weights are loaded, gathered tensor by tensor and sent, and the KV cache wakes once the actor's weights are back on the host (verl/workers/engine_workers.py:762-801)",
    "rollout": "the awake server's gpu_memory_utilization share next to what the trainer keeps resident (verl/workers/engine/base.py:312-336)",
    "reward-model": "the reward model's server wakes with its own gpu_memory_utilization (verl/trainer/ppo/v1/trainer_base.py:1408)",
    "old-log-prob": "the actor's forward on log_prob micro-batches, with entropy (verl/trainer/ppo/v1/trainer_base.py:1495-1500; transformer_impl.py:1332-1371)",
    "ref-log-prob": "the reference's forward, its weights streamed from the host (verl/workers/engine/fsdp/transformer_impl.py:389-394)",
    "critic-values": "the critic's forward on ppo_infer_max_token_len_per_gpu tokens (verl/trainer/ppo/v1/trainer_base.py:249-252)",
    "critic-update": "the critic's update: states, activations, and every gradient unsharded between micro-batches while gradient sync waits for a mini-batch's last (verl/workers/engine/fsdp/transformer_impl.py:686-698, :727-730)",
    "actor-update": "the actor's update: weights, gradients, optimizer states, activations and logits of one micro-batch, and every gradient unsharded between micro-batches while gradient sync waits for a mini-batch's last (verl/workers/engine/fsdp/transformer_impl.py:686-698, :727-730, :1332-1371)",
    "sft-update": "the SFT engine's update on data.micro_batch_size_per_gpu or data.max_token_len_per_gpu (verl/trainer/sft_trainer.py; transformer_impl.py:686-698, :727-730)",
    "checkpoint-save": "the engine loads its weights to save them (verl/workers/engine/fsdp/transformer_impl.py:839-865), Megatron's with its gradient buffer (verl/workers/engine/megatron/transformer_impl.py:782-790, load_grad=True)",
}
_FIX = {
    "rollout-start": "lower gpu_memory_utilization, raise the rollout tensor_model_parallel_size or lower max_model_len",
    "weight-sync": "offload the actor's parameters and optimizer, or lower gpu_memory_utilization",
    "rollout": "lower gpu_memory_utilization, or offload the actor's parameters and optimizer",
    "reward-model": "lower the reward model's gpu_memory_utilization",
    "old-log-prob": "lower log_prob_max_token_len_per_gpu (or the log-prob micro-batch), chunk the entropy",
    "ref-log-prob": "lower the reference's log_prob_max_token_len_per_gpu (or its micro-batch)",
    "critic-values": "lower critic.ppo_infer_max_token_len_per_gpu",
    "critic-update": "lower critic.ppo_infer_max_token_len_per_gpu, enable the critic's gradient checkpointing, offload",
    "actor-update": "lower ppo_max_token_len_per_gpu (or ppo_micro_batch_size_per_gpu), enable gradient checkpointing, offload, raise Ulysses parallelism",
    "sft-update": "lower data.max_token_len_per_gpu (or data.micro_batch_size_per_gpu), enable gradient checkpointing, offload",
    "checkpoint-save": "offload the actor's parameters and optimizer",
}
_EXAMPLE_FIRES = {
    "actor-update": (
        ("actor_rollout_ref.actor.ppo_max_token_len_per_gpu=98304",),
        ("actor_rollout_ref.actor.ppo_max_token_len_per_gpu=12288",),
    ),
    "ref-log-prob": (
        ("actor_rollout_ref.ref.log_prob_max_token_len_per_gpu=131072",),
        ("actor_rollout_ref.ref.log_prob_max_token_len_per_gpu=24576",),
    ),
    "rollout-start": (
        ("actor_rollout_ref.rollout.gpu_memory_utilization=0.1",),
        ("actor_rollout_ref.rollout.gpu_memory_utilization=0.5",),
    ),
    "rollout": (
        ("actor_rollout_ref.rollout.gpu_memory_utilization=0.95",),
        ("actor_rollout_ref.rollout.gpu_memory_utilization=0.6",),
    ),
    "old-log-prob": (
        ("actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu=131072",),
        ("actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu=24576",),
    ),
}
EXAMPLE_GPU = "H100-80GB"


def rule_id(phase: str) -> str:
    return f"memory.{phase}"


def rule_pages() -> tuple[RuleDoc, ...]:
    pages = []
    for phase in PHASES:
        example = None
        if phase in _EXAMPLE_FIRES:
            fires, twin = _EXAMPLE_FIRES[phase]
            example = Example(fires=fires, twin=twin, base="grpo", options=("--gpu", EXAMPLE_GPU))
        pages.append(
            RuleDoc(
                rule_id(phase),
                "error",
                f"The forecast peak of the {PHASE_TITLES[phase]} on some GPU of the run exceeds the "
                "GPU's memory (a warning when it is above 90% of it); the finding names the keys "
                "to change and the forecast after each fix, found by forecasting again, and, "
                "where only a later release's tree key would lower it (gradient sync deferred by "
                "an engine with no key for it), that release with the forecast under its value.",
                _WHY[phase],
                _FIX[phase],
                example,
                SOURCE,
            )
        )
    return tuple(pages)


NOT_FORECAST = "memory.not-forecast"
NOT_FORECAST_PAGE = RuleDoc(
    NOT_FORECAST,
    "info",
    "The memory forecast cannot model this launch (a model it has no numbers for, an engine it does "
    "not count, a value it cannot read): nothing is said about its memory, and the script's other "
    "findings stand.",
    "the forecast counts only what it can cite from upstream's code and the model's own numbers; "
    "where it cannot, it refuses in one line rather than guess",
    "for an unknown model give --model-config PATH (its config.json) or MODEL (the name of a model "
    "the shipped table or the Hugging Face cache knows, a fine-tune's base model); otherwise the "
    "message names what it could not read",
    None,
    SOURCE,
)


def not_forecast(reason: str, key: str) -> Finding:
    """``check --gpu``'s note for a launch the forecast refuses (``NOT_FORECAST_PAGE``)."""
    return Finding(
        "info",
        key or "<memory>",
        f"not forecast: {reason}",
        NOT_FORECAST_PAGE.fix,
        NOT_FORECAST_PAGE.why,
        check=NOT_FORECAST,
    )


LORA_TARGETS_PAGE = RuleDoc(
    LORA_TARGETS,
    "error",
    "A role's LoRA targets (model.target_modules, with exclude_modules and target_parameters) "
    "make peft refuse to build the adapter, so the run stops at its engine's build: they name a "
    "module LoRA cannot wrap (a layer, an mlp or self_attn block, a norm, a MoE router or stacked "
    "experts, a linear attention's depthwise conv1d at a rank its groups do not divide), or no "
    "module of the model at all, or one of a MoE model's fused gate_proj and up_proj without the "
    "other. Decided on the model's module tree as the forecast builds it "
    "(the names transformers gives), matching the targets as peft does.",
    "verl's FSDP engine passes the section's targets to get_peft_model as written "
    "(verl/workers/engine/fsdp/transformer_impl.py:340-349); peft raises ValueError for a module "
    "it cannot wrap (peft/tuners/lora/model.py:557-561@peft-0.21.2), NoMatchingPeftModuleError "
    "when nothing is targeted (tuners_utils.py:1051-1086) and ValueError for half a fused pair "
    "(utils/transformers_weight_conversion.py:461-469)",
    "name the model's own linear layers (q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, "
    "down_proj on most decoders) or all-linear",
    Example(
        fires=(
            "actor_rollout_ref.model.lora_rank=8",
            "actor_rollout_ref.model.target_modules=[query_key_value,dense]",
        ),
        twin=(
            "actor_rollout_ref.model.lora_rank=8",
            "actor_rollout_ref.model.target_modules=[q_proj,v_proj]",
        ),
        base="grpo",
        options=("--gpu", EXAMPLE_GPU),
    ),
    SOURCE,
)


for _page in (*rule_pages(), NOT_FORECAST_PAGE, LORA_TARGETS_PAGE):
    register_rule(_page)


SET_ASIDE_WHY = (
    "Hydra composes the launch on the release's own config tree before anything starts and "
    "rejects an override of a key the tree does not have (hydra/_internal/config_loader_impl.py "
    "ConfigLoaderImpl._apply_overrides_to_config@hydra-core-1.3.2)"
)


def as_findings(forecast: Forecast) -> list[Finding]:
    """The overrides the release rejected (``compose`` errors), then the forecast's verdicts as
    check's findings, one per phase and kind of rank."""
    out = [
        Finding("error", a.key, a.said(), a.fix(), SET_ASIDE_WHY, check=COMPOSE_RULE)
        for a in forecast.set_aside
    ]
    pages = rule_docs() if forecast.refused else {}  # the pages' why, for the refusals alone
    out += [
        Finding("error", r.key, r.message, r.fix, pages[r.rule].why, check=r.rule)
        for r in forecast.refused
    ]
    for v in forecast.verdicts:
        fixes = "; ".join(
            f"{f.text()} -> {gib(f.after):.2f} GiB" + (f", {f.outcome()}" if f.outcome() else "")
            for f in v.suggestions
        )
        fix = f"e.g. {fixes}" if fixes else f"change {', '.join(v.keys)}"
        out.append(
            Finding(
                "error" if v.level == "error" else "warning",
                ", ".join(v.keys),
                v.message,
                fix,
                _WHY.get(v.phase, ""),
                check=rule_id(v.phase),
            )
        )
    return out
