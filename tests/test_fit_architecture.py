"""The forecast's parameter tensors are the ones transformers builds: names, order and shapes of
tiny models of every family, the parameter counts of every model in the shipped table (built on
the meta device, no weights), LoRA's adapters as peft adds them, and the critic's value head.
The table's published sizes (model cards) agree within 2%."""

from __future__ import annotations

import contextlib
import warnings
from typing import Any

import pytest
from tiny_configs import DEEPSEEK_V3_MLA

from pytest_verl_compat.memory.architecture import architecture_from_config
from pytest_verl_compat.memory.models import table_entries
from pytest_verl_compat.memory.states import EngineSpec, model_tensors

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

BASE = {
    "vocab_size": 96,
    "hidden_size": 32,
    "intermediate_size": 48,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
}
TINY: dict[str, dict[str, Any]] = {
    "llama": {},
    "llama-tied-bias": {"model_type": "llama", "tie_word_embeddings": True, "attention_bias": True},
    "llama-mlp-bias": {"model_type": "llama", "mlp_bias": True},
    # Seed-OSS: attention_bias is q/k/v's; o_proj's is attention_out_bias
    "seed_oss": {"head_dim": 16, "attention_bias": True, "attention_out_bias": False},
    # no head_dim in config.json: each config class's own default (Qwen3's and Seed-OSS's 128)
    "qwen3-default-head-dim": {"model_type": "qwen3"},
    "gemma-default-head-dim": {"model_type": "gemma"},
    "seed_oss-out-bias": {
        "model_type": "seed_oss",
        "attention_bias": True,
        "attention_out_bias": True,
        "mlp_bias": True,
    },
    "mistral": {"head_dim": 16},
    "qwen2": {},
    "qwen2-tied": {"model_type": "qwen2", "tie_word_embeddings": True},
    "qwen3": {"head_dim": 16},
    "qwen3_moe": {
        "head_dim": 16,
        "moe_intermediate_size": 24,
        "num_experts": 4,
        "num_experts_per_tok": 2,
    },
    "gemma": {"head_dim": 16},
    "gemma2": {"head_dim": 16},
    "gemma3_text": {"head_dim": 16},
    # gpt-oss: biased attention with a sink per head, routed experts with biases (intermediate_size
    # is their width); GptOssConfig's own defaults where config.json is silent
    "gpt_oss": {"head_dim": 16, "num_local_experts": 4, "num_experts_per_tok": 2},
    "gpt_oss-defaults": {"model_type": "gpt_oss"},
    "deepseek_v3": {**DEEPSEEK_V3_MLA, "moe_intermediate_size": 16},
    "deepseek_v3-no-q-lora": {
        **DEEPSEEK_V3_MLA,
        "model_type": "deepseek_v3",
        "moe_intermediate_size": 16,
        "n_shared_experts": 2,
        "q_lora_rank": None,
    },
    "qwen2_5_vl": {
        "vision_config": {
            "depth": 2,
            "hidden_size": 16,
            "intermediate_size": 24,
            "num_heads": 2,
            "out_hidden_size": 32,
            "patch_size": 14,
            "temporal_patch_size": 2,
            "in_channels": 3,
            "spatial_merge_size": 2,
            "fullatt_block_indexes": [1],
        },
    },
    # Qwen2-VL's vision_config: the tower's width is embed_dim, hidden_size the merger's output
    "qwen2_vl": {
        "vision_config": {
            "depth": 2,
            "embed_dim": 16,
            "hidden_size": 32,
            "mlp_ratio": 4,
            "num_heads": 2,
            "in_chans": 3,
            "patch_size": 14,
            "spatial_merge_size": 2,
            "temporal_patch_size": 2,
        },
    },
    # the language model's numbers under text_config, as Qwen3-VL's config.json keeps them
    "qwen3_vl": {
        "text_config": {**BASE, "head_dim": 16},
        "vision_config": {
            "depth": 3,
            "hidden_size": 16,
            "intermediate_size": 24,
            "num_heads": 2,
            "out_hidden_size": 32,
            "patch_size": 16,
            "temporal_patch_size": 2,
            "in_channels": 3,
            "spatial_merge_size": 2,
            "num_position_embeddings": 64,
            "deepstack_visual_indexes": [0, 2],
        },
    },
}


# Gemma 3: Gemma 3's language model under text_config, SigLIP's tower without its pooling head
TINY["gemma3"] = {
    "text_config": {**BASE, "head_dim": 16},
    "vision_config": {
        "hidden_size": 16,
        "intermediate_size": 24,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "image_size": 56,
        "patch_size": 14,
        "vision_use_head": False,
    },
    "mm_tokens_per_image": 4,
}


# Qwen3-VL's MoE models: Qwen3-MoE's language model under text_config, Qwen3-VL's tower
TINY["qwen3_vl_moe"] = {
    "text_config": {**TINY["qwen3_vl"]["text_config"], **TINY["qwen3_moe"]},
    "vision_config": TINY["qwen3_vl"]["vision_config"],
}


# Hybrid linear attention: three Gated DeltaNet layers to one gated full-attention layer
GATED_DELTANET = {
    "head_dim": 16,
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 4,
    "linear_key_head_dim": 8,
    "linear_value_head_dim": 8,
    "linear_conv_kernel_dim": 4,
    "num_hidden_layers": 4,
}
QWEN3_NEXT_MOE = {
    "moe_intermediate_size": 24,
    "shared_expert_intermediate_size": 40,
    "num_experts": 4,
    "num_experts_per_tok": 2,
}
# Qwen3.5's tower: Qwen3-VL's without deepstack mergers
QWEN3_5_TOWER = {
    k: v for k, v in TINY["qwen3_vl"]["vision_config"].items() if k != "deepstack_visual_indexes"
}
# Qwen3-Next: layer_types from full_attention_interval (every 4th layer full)
TINY["qwen3_next"] = {**GATED_DELTANET, **QWEN3_NEXT_MOE}
TINY["qwen3_next-interval-2"] = {
    "model_type": "qwen3_next",
    **GATED_DELTANET,
    **QWEN3_NEXT_MOE,
    "full_attention_interval": 2,
}
TINY["qwen3_5"] = {
    "text_config": {
        **BASE,
        **GATED_DELTANET,
        "layer_types": ["linear_attention", "full_attention", "linear_attention", "full_attention"],
    },
    "vision_config": QWEN3_5_TOWER,
}
TINY["qwen3_5_moe"] = {
    "text_config": {**BASE, **GATED_DELTANET, **QWEN3_NEXT_MOE},
    "vision_config": QWEN3_5_TOWER,
}


# GLM-4: a fused gate_up_proj, four norms, o_proj unbiased whatever attention_bias says (Glm4Config
# biases q/k/v by default); its padding id is within a tiny vocabulary
TINY["glm4"] = {"head_dim": 16, "pad_token_id": 0}
TINY["glm4-defaults"] = {"model_type": "glm4", "pad_token_id": 0}
TINY["glm4-unbiased"] = {"model_type": "glm4", "attention_bias": False, "pad_token_id": 0}
# GLM-4.1V: GLM-4's layer with q/k/v always biased under text_config, and its own tower
# (Qwen2.5-VL's tiny numbers, and an image of 4 x 4 patches for its position embedding)
GLM4V_TOWER = {
    **{
        k: v for k, v in TINY["qwen2_5_vl"]["vision_config"].items() if k != "fullatt_block_indexes"
    },
    "image_size": 56,
}
TINY["glm4v"] = {
    "text_config": {**BASE, "partial_rotary_factor": 0.5, "attention_bias": False},
    "vision_config": GLM4V_TOWER,
}
TINY["glm4v-tower-qkv-bias"] = {
    "model_type": "glm4v",
    "text_config": dict(BASE),
    "vision_config": {**GLM4V_TOWER, "attention_bias": True},
}


# GLM-4.5: DeepSeek V3's MoE block under a Llama attention (q/k/v biased by attention_bias, o_proj
# never), an optional q/k norm, a leading dense layer
GLM4_MOE = {
    "head_dim": 16,
    "moe_intermediate_size": 16,
    "n_routed_experts": 4,
    "n_shared_experts": 1,
    "num_experts_per_tok": 2,
    "first_k_dense_replace": 1,
    "pad_token_id": 0,
}
TINY["glm4_moe"] = {**GLM4_MOE, "attention_bias": True}
TINY["glm4_moe-qk-norm"] = {"model_type": "glm4_moe", **GLM4_MOE, "use_qk_norm": True}
# Hy3: q/k norms always, the router built first, shared experts counted by num_shared_experts,
# the MLP per layer from mlp_layer_types (the first layer dense when it is absent)
HY_V3 = {"head_dim": 16, "moe_intermediate_size": 16, "num_experts": 4, "num_experts_per_tok": 2}
TINY["hy_v3"] = {**HY_V3, "num_hidden_layers": 3, "num_shared_experts": 2, "attention_bias": True}
TINY["hy_v3-layer-types"] = {
    "model_type": "hy_v3",
    **HY_V3,
    "num_hidden_layers": 3,
    "mlp_layer_types": ["dense", "dense", "sparse"],
}


def _config(case: str) -> dict[str, Any]:
    extra = dict(TINY[case])
    family = extra.pop("model_type", case)
    return {"model_type": family, **({} if "text_config" in extra else BASE), **extra}


# Families transformers does not build, and the class whose decoder their remote code builds:
# XiaomiMiMo's MiMoForCausalLM is Qwen2ForCausalLM's with MTP layers beside (counted apart).
BUILT_AS = {"mimo": "qwen2"}


def _build(config: dict[str, Any], auto: Any = None, *, weights: bool = False) -> Any:
    """The model transformers builds from ``config``: on the meta device, or with its weights
    (what peft wraps)."""
    settings = {k: v for k, v in config.items() if k != "model_type"}
    family = BUILT_AS.get(config["model_type"], config["model_type"])
    hf = transformers.AutoConfig.for_model(family, **settings)
    if auto is None:
        vl = "vision_config" in config
        auto = transformers.AutoModelForImageTextToText if vl else transformers.AutoModelForCausalLM
    with contextlib.nullcontext() if weights else torch.device("meta"):
        return auto.from_config(hf)


def _text_name(name: str) -> str:
    """A VL model's language-model tensors, named as the text model's (model.layers...)."""
    return name.replace("model.language_model.", "model.", 1)


@pytest.mark.parametrize("case", sorted(TINY))
def test_tensors_are_the_ones_transformers_builds(case: str) -> None:
    config = _config(case)
    arch = architecture_from_config(config, case, "tiny")
    built = [(_text_name(name), tuple(p.shape)) for name, p in _build(config).named_parameters()]
    assert [(t.name, t.shape) for t in arch.tensors()] == built


@pytest.mark.parametrize(
    ("case", "key"),
    [
        *[("llama", "num_key_value_heads"), ("qwen2", "num_key_value_heads")],
        *[("qwen3", "num_key_value_heads"), ("llama", "head_dim"), ("mistral", "head_dim")],
    ],
)
def test_a_null_count_takes_the_default_transformers_gives_it(case: str, key: str) -> None:
    """A config.json writing null where a count has a default (a key-value head count, a head
    size): transformers reads it as absent, and so does the forecast. (Where transformers 5
    refuses the null, Mistral's head count and Qwen's head size, the model does not load.)"""
    config = {**_config(case), key: None}
    arch = architecture_from_config(config, case, "tiny")
    built = [(_text_name(name), tuple(p.shape)) for name, p in _build(config).named_parameters()]
    assert [(t.name, t.shape) for t in arch.tensors()] == built


@pytest.mark.parametrize("case", ["llama", "qwen2", "qwen3", "gemma2", "glm4"])
def test_the_critic_is_the_body_and_a_score_head(case: str) -> None:
    config = _config(case)
    arch = architecture_from_config(config, case, "tiny")
    model = _build({**config, "num_labels": 1}, transformers.AutoModelForTokenClassification)
    built = sorted((name, tuple(p.shape)) for name, p in model.named_parameters())
    assert sorted((t.name, t.shape) for t in arch.value_head_tensors()) == built


def _peft_trainable(config: dict[str, Any], targets: str | list[str]) -> int:
    """Trainable elements of the tiny model peft wraps with LoRA rank 4 on ``targets``."""
    peft = pytest.importorskip("peft")
    model = _build(config, weights=True)
    with warnings.catch_warnings():
        # peft's rank and alpha patterns for a converted MoE name gate_up_proj, which a module
        # target list no longer holds once it is a parameter target: peft says so and goes on
        warnings.filterwarnings("ignore", "The following (rank|alpha)_pattern keys", RuntimeWarning)
        wrapped = peft.get_peft_model(model, peft.LoraConfig(r=4, target_modules=targets))
    return sum(p.numel() for p in wrapped.parameters() if p.requires_grad)


@pytest.mark.parametrize(
    "case",
    [
        "llama",
        "qwen2",
        "qwen3",
        "gemma2",
        "mistral",
        "qwen2_vl",
        "qwen2_5_vl",
        "gemma3",
        "qwen3_vl",
        "qwen3_vl_moe",
        "qwen3_next",
        "qwen3_5",
        "qwen3_5_moe",
        "gpt_oss",
        "glm4",
        "glm4v",
        "hy_v3",
    ],
)
def test_lora_adapters_are_the_ones_peft_adds(case: str) -> None:
    """peft's all-linear adapts every nn.Linear but the output layer: a VL model's vision
    tower's too."""
    config = _config(case)
    arch = architecture_from_config(config, case, "tiny")
    trainable = _peft_trainable(config, "all-linear")
    frozen, adapters = model_tensors(arch, EngineSpec("fsdp2", 1, lora_rank=4))
    assert sum(t.numel for t in adapters) == trainable
    assert sum(t.numel for t in frozen) == arch.num_parameters


MOE_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


@pytest.mark.parametrize(
    ("case", "targets"),
    [
        ("qwen3_moe", "all-linear"),
        ("qwen3_moe", MOE_TARGETS),
        ("qwen3_next", MOE_TARGETS),
        ("deepseek_v3", "all-linear"),
        ("deepseek_v3", ["q_b_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]),
        ("qwen3_vl_moe", MOE_TARGETS),  # transformers converts no checkpoint for it: modules only
        ("gpt_oss", MOE_TARGETS),  # its own experts: peft adapts the attention's modules alone
        ("glm4_moe", "all-linear"),
        ("glm4_moe", MOE_TARGETS),
        ("hy_v3", MOE_TARGETS),  # not a type transformers converts: its linears alone
    ],
)
def test_moe_lora_targets_keep_transformers_4s_meaning_as_peft_does(
    case: str, targets: str | list[str]
) -> None:
    """peft (the releases' 0.21.2) adapts the router and each routed expert of the MoE model
    types transformers 5 converts from Qwen2-MoE's layout, and no longer a dense or shared
    expert's nn.Linear of the experts' v4 names: the forecast's adapters are peft's, element for
    element."""
    config = _config(case)
    arch = architecture_from_config(config, case, "tiny")
    trainable = _peft_trainable(config, targets)
    listed = (targets,) if isinstance(targets, str) else tuple(targets)
    _, adapters = model_tensors(arch, EngineSpec("fsdp2", 1, lora_rank=4, lora_targets=listed))
    assert sum(t.numel for t in adapters) == trainable


def test_a_module_list_adapts_the_modules_the_model_has() -> None:
    """Llama's module names on GLM-4, whose MLP fuses gate and up into gate_up_proj: peft adapts
    q/k/v/o and down_proj, and so does the forecast."""
    config = _config("glm4")
    arch = architecture_from_config(config, "glm4", "tiny")
    trainable = _peft_trainable(config, MOE_TARGETS)
    spec = EngineSpec("fsdp2", 1, lora_rank=4, lora_targets=tuple(MOE_TARGETS))
    _, adapters = model_tensors(arch, spec)
    assert sum(t.numel for t in adapters) == trainable


ENTRIES = {entry.repo: entry for entry in table_entries()}


@pytest.mark.parametrize("repo", list(ENTRIES))
def test_every_shipped_model_builds_to_its_parameter_count(repo: str) -> None:
    entry = ENTRIES[repo]
    model = _build(dict(entry.config))
    assert sum(p.numel() for p in model.parameters()) == entry.architecture.num_parameters, repo
    if entry.published_params:
        assert entry.architecture.num_parameters == pytest.approx(entry.published_params, rel=0.02)


def test_every_entry_says_how_it_was_verified() -> None:
    assert len(ENTRIES) >= 30
    for repo, entry in ENTRIES.items():
        assert entry.verified == "False" or entry.verified.startswith("search:"), repo
        assert entry.architecture.source.startswith("https://huggingface.co/"), repo


def test_a_context_variant_changes_the_context_alone() -> None:
    """An entry's `contexts` are models with its tensors and another max_position_embeddings, each
    verified and read from its own config.json's address."""
    import yaml

    from pytest_verl_compat.memory.models import TABLE_FILE, from_table

    data = yaml.safe_load(TABLE_FILE.read_text(encoding="utf-8"))
    variants = [(e, v) for e in data["models"] for v in e.get("contexts", ())]
    assert variants
    for entry, variant in variants:
        assert set(variant) == {"repo", "max_position_embeddings", "verified"}, variant
        assert str(variant["verified"]).startswith("search:"), variant["repo"]
        found = from_table(variant["repo"])
        assert found is not None and variant["repo"] in found.where
        primary = ENTRIES[entry["repo"]].architecture
        assert found.architecture.max_position_embeddings == variant["max_position_embeddings"]
        assert list(found.architecture.tensors()) == list(primary.tensors())


@pytest.mark.parametrize(
    ("repo", "context"),
    [
        ("Qwen/Qwen2.5-7B-Instruct", 32768),
        ("Qwen/Qwen2.5-Math-7B", 4096),
        ("/models/Qwen2.5-Math-1.5B-Instruct", 4096),
        ("Qwen/Qwen3-30B-A3B", 40960),
        ("Qwen/Qwen3-Coder-30B-A3B-Instruct", 262144),
        ("Qwen/Qwen2.5-7B", 131072),
        ("/data/DeepSeek-R1-Distill-Qwen-14B", 131072),
        ("Qwen/Qwen3-30B-A3B-Instruct-2507", 262144),
        ("meta-llama/Meta-Llama-3-8B-Instruct", 8192),
        # the 1.5B base model reads 131072, its Instruct model 32768 (search:14205754419,
        # search:52839071726)
        ("Qwen/Qwen2.5-1.5B", 131072),
        ("/models/Qwen2.5-1.5B-Instruct", 32768),
        ("Qwen/Qwen2.5-72B", 131072),
        ("Qwen/Qwen2-7B", 131072),
        ("Qwen/Qwen3-4B", 40960),
        ("Qwen/Qwen3-4B-Instruct-2507", 262144),
        ("/data/Qwen3-4B-Base", 32768),
        ("meta-llama/Llama-2-7b-chat-hf", 4096),
    ],
)
def test_a_model_is_listed_with_its_own_context(repo: str, context: int) -> None:
    """A variant with the numbers of another model but its own max_position_embeddings (vLLM's
    max_model_len when the rollout sets none) is an entry of its own, not that model's alias."""
    from pytest_verl_compat.memory.models import from_table

    found = from_table(repo)
    assert found is not None
    assert found.architecture.max_position_embeddings == context


@pytest.mark.parametrize(
    ("path", "repo"),
    [
        (
            "/root/.cache/huggingface/hub/models--Qwen--Qwen2.5-7B-Instruct/snapshots/"
            "a09a35458c702b33eeacc393d103063234e8bc28",
            "Qwen/Qwen2.5-7B-Instruct",
        ),
        ("/root/.cache/modelscope/hub/Qwen/Qwen2___5-0___5B-Instruct", "Qwen/Qwen2.5-0.5B"),
        ("/mnt/models/qwen/Qwen2___5-Math-7B", "Qwen/Qwen2.5-Math-7B"),
        ("models--meta-llama--Meta-Llama-3-8B-Instruct", "meta-llama/Meta-Llama-3-8B-Instruct"),
    ],
)
def test_a_model_in_a_download_cache_is_found_by_its_repository(path: str, repo: str) -> None:
    """Hugging Face's cache folder (models--org--name/snapshots/rev) and ModelScope's (a name's
    dots written ___) name the repository the table lists."""
    from pytest_verl_compat.memory.models import from_table

    found = from_table(path)
    assert found is not None and repo in found.where


@pytest.mark.parametrize("path", ["/data/models--local/checkpoint-100", "/ckpt/Qwen2___5-99B"])
def test_a_cache_like_path_of_no_listed_model_is_not_found(path: str) -> None:
    from pytest_verl_compat.memory.models import from_table

    assert from_table(path) is None


@pytest.mark.parametrize(
    ("path", "repo", "context"),
    [
        ("/data/qwen2_5_7b_instruct", "Qwen/Qwen2.5-7B-Instruct", 32768),
        ("/models/Qwen2.5-7B_Instruct", "Qwen/Qwen2.5-7B-Instruct", 32768),
        ("/models/qwen2_5_1_5b", "Qwen/Qwen2.5-1.5B", 131072),
        ("/ckpt/llama_3_1_8b_instruct", "meta-llama/Llama-3.1-8B-Instruct", 131072),
        ("/m/deepseek_r1_distill_qwen_7b", "deepseek-ai/DeepSeek-R1-Distill-Qwen-7B", 131072),
    ],
)
def test_a_folder_spelling_a_listed_model_with_other_separators_is_that_model(
    path: str, repo: str, context: int
) -> None:
    """Case, dots, dashes and underscores aside, a folder named as one listed model is that model
    (its own context included); a spelling two models with other numbers share would match none."""
    from pytest_verl_compat.memory.models import from_table

    found = from_table(path)
    assert found is not None and repo in found.where
    assert found.architecture.max_position_embeddings == context


def test_no_two_listed_models_with_other_numbers_share_a_spelling() -> None:
    import yaml

    from pytest_verl_compat.memory.models import TABLE_FILE, _variants, spelled

    data = yaml.safe_load(TABLE_FILE.read_text(encoding="utf-8"))
    seen: dict[str, Any] = {}
    for entry in data["models"]:
        for repo, (_, config, _) in _variants(entry):
            spelling = spelled(repo.rsplit("/", 1)[-1])
            assert seen.setdefault(spelling, config) == config, repo


@pytest.mark.parametrize(
    ("path", "nearest"),
    [
        ("/ckpt/Qwen2.5-7B-Instruct-GRPO-step200", "Qwen/Qwen2.5-7B-Instruct"),
        ("/ckpt/qwen3-8b-sft-v2", "Qwen/Qwen3-8B"),
        ("/ckpt/my-policy", None),
    ],
)
def test_an_unknown_model_names_the_tables_nearest_and_never_takes_it(
    path: str, nearest: str | None
) -> None:
    """A fine-tune's folder is not a listed model: the one-line refusal suggests the listed models
    its name starts with (or nearly spells), for --model-config, and no forecast takes one."""
    from pytest_verl_compat.memory.models import UnknownModel, choose_model, from_table

    assert from_table(path) is None
    with pytest.raises(UnknownModel) as caught:
        choose_model(path)
    message = str(caught.value)
    assert "\n" not in message and "--model-config" in message
    if nearest is None:
        assert "nearest" not in message, message
    else:
        assert f"the table's nearest: {nearest}" in message, message


SLIDING_CASES: dict[str, dict[str, Any]] = {
    "gemma2": {"model_type": "gemma2", "sliding_window": 64},
    "gemma3_text": {"model_type": "gemma3_text", "sliding_window": 64},
    "gemma3_text-pattern-4": {
        "model_type": "gemma3_text",
        "sliding_window": 64,
        "sliding_window_pattern": 4,
    },
    "qwen2-off": {"model_type": "qwen2", "sliding_window": 64, "use_sliding_window": False},
    "qwen2-on": {
        "model_type": "qwen2",
        "sliding_window": 64,
        "use_sliding_window": True,
        "max_window_layers": 3,
    },
    "qwen3-off": {"model_type": "qwen3", "sliding_window": 64},
    "llama": {"model_type": "llama"},
    "gemma2-given": {
        "model_type": "gemma2",
        "sliding_window": 64,
        "layer_types": ["full_attention"] * 7 + ["sliding_attention"],
    },
}


@pytest.mark.parametrize("case", sorted(SLIDING_CASES))
def test_the_sliding_layers_are_the_ones_transformers_lays_out(case: str) -> None:
    """The layers with a sliding window are those transformers' config class marks
    sliding_attention (the layer_types vLLM reads)."""
    config = {**BASE, "num_hidden_layers": 8, "head_dim": 16, **SLIDING_CASES[case]}
    arch = architecture_from_config(config, case, "tiny")
    settings = {k: v for k, v in config.items() if k != "model_type"}
    hf = transformers.AutoConfig.for_model(config["model_type"], **settings)
    kinds = getattr(hf, "layer_types", None) or ["full_attention"] * 8
    assert arch.sliding_layers == tuple(
        i for i, kind in enumerate(kinds) if kind == "sliding_attention"
    )


def test_a_mistral_window_slides_every_layer() -> None:
    """Mistral's config class has no layer_types: vLLM gives every layer the model's window
    (cache_config.sliding_window); without one, none."""
    config = {**BASE, "model_type": "mistral", "head_dim": 16}
    assert architecture_from_config({**config, "sliding_window": 64}, "m", "t").sliding_layers == (
        0,
        1,
    )
    assert (
        architecture_from_config({**config, "sliding_window": None}, "m", "t").sliding_layers == ()
    )


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("num_hidden_layers", 10**12),  # would lay out 10**12 layers
        ("num_hidden_layers", 0),
        ("num_attention_heads", 0),  # hidden // heads
        ("head_dim", "128"),
        ("num_experts", 2.5),
        ("max_position_embeddings", "long"),
        ("sliding_window", [4096]),
        ("vocab_size", 1 << 40),
    ],
)
def test_an_implausible_config_number_is_one_line(key: str, value: Any) -> None:
    """config.json may be hostile or mistyped: a number out of any model's range is refused
    naming its key, before the forecast lays out layers or divides by it."""
    from pytest_verl_compat.memory.architecture import UnsupportedModel

    config = {**BASE, "model_type": "mistral", key: value}
    with pytest.raises(UnsupportedModel, match=key):
        architecture_from_config(config, "m", "config.json")


def test_an_implausible_tower_depth_is_one_line() -> None:
    from pytest_verl_compat.memory.architecture import UnsupportedModel

    config = _config("qwen2_vl")
    config["vision_config"] = {**config["vision_config"], "depth": 10**9}
    with pytest.raises(UnsupportedModel, match=r"vision_config\.depth"):
        architecture_from_config(config, "m", "config.json")


@pytest.mark.parametrize(
    ("case", "key"),
    [
        ("glm4v", "image_size"),
        ("glm4v", "temporal_patch_size"),
        ("glm4v", "spatial_merge_size"),
        ("qwen2_5_vl", "in_channels"),
    ],
)
@pytest.mark.parametrize("value", ["abc", -1, 0, 3.5, [1, 2]])
def test_a_tower_number_given_wrong_is_refused_not_defaulted(
    case: str, key: str, value: Any
) -> None:
    """A vision_config key the config class defaults, given as no count: one line naming it
    (its default would forecast a tower the checkpoint is not); left out, the default."""
    from pytest_verl_compat.memory.architecture import UnsupportedModel

    config = _config(case)
    config["vision_config"] = {**config["vision_config"], key: value}
    with pytest.raises(UnsupportedModel, match=rf"vision_config\.{key} must be an integer"):
        architecture_from_config(config, "m", "config.json")
    config["vision_config"] = {k: v for k, v in config["vision_config"].items() if k != key}
    assert architecture_from_config(config, "m", "config.json").vision is not None


@pytest.mark.parametrize(
    "layer_types",
    [
        ["dense", "sparse", "dense"],  # transformers builds it; the forecast counts a dense prefix
        ["dense", "sparse"],  # not one entry per layer
        ["dense", {"kind": "sparse"}, "sparse"],
        "dense",
    ],
)
def test_mlp_layer_types_the_forecast_cannot_lay_out_are_one_line(layer_types: Any) -> None:
    from pytest_verl_compat.memory.architecture import UnsupportedModel

    config = {**_config("hy_v3"), "mlp_layer_types": layer_types}
    with pytest.raises(UnsupportedModel, match="mlp_layer_types"):
        architecture_from_config(config, "m", "config.json")


# --- LoRA targets peft refuses (memory/lora_build.py) -----------------------------------------

REFUSAL_TARGETS: tuple[dict[str, Any], ...] = (
    {"target_modules": ["q_proj", "v_proj"]},
    {"target_modules": MOE_TARGETS},
    {"target_modules": ["query_key_value", "dense"]},  # another architecture's names
    {"target_modules": ["mlp"]},  # a block, not a layer
    {"target_modules": ["self_attn", "q_proj"]},
    {"target_modules": ["input_layernorm"]},
    {"target_modules": ["gate"]},  # a MoE router, or a dense model's nothing
    {"target_modules": ["experts"]},
    {"target_modules": ["router"]},
    {"target_modules": ["q_proj", "gate_proj", "down_proj"]},  # half of a fused pair
    {"target_modules": ["lm_head"]},
    {"target_modules": ["embed_tokens"]},
    {"target_modules": ["conv1d"]},
    {"target_modules": []},
    {"target_modules": r".*\.(q|v)_proj"},
    {"target_modules": ".*attention.*"},
    {"target_modules": ".*attn"},
    {"target_modules": ["q_proj"], "exclude_modules": ["q_proj"]},
    {"target_modules": ["q_proj", "v_proj"], "exclude_modules": r".*layers\.0\..*"},
    {"target_modules": ["foo"], "target_parameters": ["mlp.experts.down_proj"]},
)


def _peft_refuses(config: dict[str, Any], section: dict[str, Any]) -> str:
    """What peft raises wrapping the tiny model as verl's FSDP engine asks it to
    (transformer_impl.py:340-349), or "" where it builds the adapter."""
    peft = pytest.importorskip("peft")
    model = _build(config, weights=True)
    lora = peft.LoraConfig(
        task_type=peft.TaskType.CAUSAL_LM,
        r=4,
        lora_alpha=8,
        target_modules=section.get("target_modules"),
        target_parameters=section.get("target_parameters"),
        exclude_modules=section.get("exclude_modules"),
        bias="none",
    )
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            peft.get_peft_model(model, lora)
    except (ValueError, AttributeError, TypeError) as exc:
        return f"{type(exc).__name__}: {str(exc)[:120]}"
    return ""


@pytest.mark.parametrize(
    "case",
    [
        "llama",
        "qwen2-tied",
        "qwen3_moe",
        "deepseek_v3",
        "glm4",
        "glm4_moe",
        "gpt_oss",
        "hy_v3",
        "qwen3_next",
        "qwen3_5_moe",
        "qwen2_5_vl",
        "gemma3",
    ],
)
def test_lora_targets_peft_refuses_are_the_ones_the_forecast_refuses(case: str) -> None:
    """Twenty target settings on a tiny model of each family, wrapped by peft (the releases'
    0.21.2) as verl's engine wraps it: the forecast says peft refuses exactly where it raises
    (a module LoRA cannot wrap, nothing targeted, half a fused pair, a grouped convolution at a
    rank its groups do not divide), and where peft builds it says nothing."""
    from pytest_verl_compat.memory.lora_build import adapter_refusal

    config = _config(case)
    arch = architecture_from_config(config, case, "tiny")
    wrong, refused = [], 0
    for section in REFUSAL_TARGETS:
        raised = _peft_refuses(config, section)
        said = adapter_refusal(
            arch, {"lora_rank": 4, **section}, "fsdp2", "actor", "actor_rollout_ref.model"
        )
        if said is not None and not raised:
            wrong.append(f"{section}: the forecast refuses, peft builds it")
        elif raised and said is None:
            wrong.append(f"{section}: peft raises {raised}, the forecast says nothing")
        refused += bool(raised)
    assert not wrong, "\n".join(wrong)
    # each family meets both outcomes: the settings are not all one way on it
    assert 0 < refused < len(REFUSAL_TARGETS)


def test_a_tower_the_forecast_does_not_count_leaves_unknown_names_unjudged() -> None:
    """A VL model whose tower the forecast does not count lacks that tower's module names: a
    target naming none of the names it knows may be the tower's, so it is not judged; one naming
    a block it knows is still peft's refusal."""
    import dataclasses

    from pytest_verl_compat.memory.lora_build import adapter_refusal

    arch = architecture_from_config(_config("llama"), "llama", "tiny")
    uncounted = dataclasses.replace(arch, vision_uncounted="some_vl")
    for model, refused in (
        ({"target_modules": ["qkv"]}, False),
        ({"target_modules": ".*visual.*qkv"}, False),
        ({"target_modules": ["mlp"]}, True),
    ):
        said = adapter_refusal(uncounted, {"lora_rank": 4, **model}, "fsdp2", "actor", "m")
        assert (said is not None) == refused, model
    assert adapter_refusal(arch, {"lora_rank": 4, "target_modules": ["qkv"]}, "fsdp2", "a", "m")
