"""The rollout engine reproduces the HF model's logits, step by step, or declines the model.

Every model here is a tiny random one built from a config (no hub). The reference for each step
is the HF model run on the whole sequence so far, without a cache, with the same attention mask
and position ids `(mask.cumsum(-1) - 1).clamp_min(0)` as the trainer's `Batch.model_inputs()`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
import torch
from transformers import (
    AutoModelForCausalLM,
    GPT2Config,
    LlamaConfig,
    PreTrainedModel,
    Qwen2Config,
    Qwen3Config,
)

from reference_trainer.rollout import DecoderSnapshot
from reference_trainer.tiny import build_tiny_policy, build_tiny_tokenizer, tiny_config

VOCAB = 49
PAD = 0
PROMPT_LENGTHS = (3, 12, 7, 5, 10, 4, 9)
DECODE_STEPS = 10
# Row -> the decode step after which it stops (fed pad, mask column 0), as `generate()` does.
FINISH_AFTER_STEP = {1: 2, 3: 5, 5: 0, 6: 7}
# Row -> decode steps at which it is fed pad with a 0 mask column and then resumes. generate()
# never does this, but it is what makes the masking of such slots (and the positions that
# skip them) observable: a finished row's own logits are never compared.
PAUSED_AT_STEPS = {2: (3, 4), 4: (1,)}
TOLERANCE = {"rtol": 1e-5, "atol": 1e-5}
LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def perturb_constant_initialisation(model: PreTrainedModel, seed: int) -> PreTrainedModel:
    """HF initialises norm weights to one and biases to zero: random values make them count."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "norm" in name or name.endswith(".bias"):
                parameter.add_(0.1 * torch.randn(parameter.shape, generator=generator))
    return model.eval()


def _seeded(seed: int, build: Callable[[], PreTrainedModel]) -> PreTrainedModel:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = build()
    return perturb_constant_initialisation(model, seed)


def tiny_qwen2() -> PreTrainedModel:
    return perturb_constant_initialisation(build_tiny_policy(build_tiny_tokenizer(), seed=0), 0)


def tiny_qwen3() -> PreTrainedModel:
    # head_dim 32 differs from hidden / heads = 16, as in the real Qwen3 models.
    config = Qwen3Config(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        max_position_embeddings=128,
        pad_token_id=PAD,
    )
    return _seeded(1, lambda: AutoModelForCausalLM.from_config(config, attn_implementation="eager"))


def tiny_llama() -> PreTrainedModel:
    # SmolLM2-like: tied embeddings; plus the optional biases and a scaled rope for coverage.
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        tie_word_embeddings=True,
        attention_bias=True,
        mlp_bias=True,
        rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0},
        pad_token_id=PAD,
    )
    return _seeded(2, lambda: AutoModelForCausalLM.from_config(config, attn_implementation="eager"))


def tiny_lora_qwen2(**lora_options: object) -> torch.nn.Module:
    from peft import LoraConfig, get_peft_model

    config = LoraConfig(
        r=8, lora_alpha=16, target_modules=LORA_TARGETS, lora_dropout=0.0, **lora_options
    )
    model = get_peft_model(tiny_qwen2(), config).eval()
    # peft starts B at zero (a no-op adapter); random B makes every delta count.
    generator = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "lora_B" in name:
                parameter.copy_(0.05 * torch.randn(parameter.shape, generator=generator))
    return model


def left_padded_prompts() -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(4)
    width = max(PROMPT_LENGTHS)
    ids = torch.full((len(PROMPT_LENGTHS), width), PAD)
    mask = torch.zeros(len(PROMPT_LENGTHS), width, dtype=torch.long)
    for row, length in enumerate(PROMPT_LENGTHS):
        ids[row, width - length :] = torch.randint(4, VOCAB, (length,), generator=generator)
        mask[row, width - length :] = 1
    return ids, mask


def rollout_steps(
    model: torch.nn.Module,
) -> Iterator[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """(engine logits, HF logits, live rows) for the prefill and each decode step."""
    ids, mask = left_padded_prompts()
    snapshot = DecoderSnapshot.from_model(model)
    assert snapshot is not None
    decoder = snapshot.start(ids, mask, DECODE_STEPS)
    live = torch.ones(len(ids), dtype=torch.bool)
    generator = torch.Generator().manual_seed(5)
    for step in range(DECODE_STEPS + 1):
        with torch.no_grad():
            positions = (mask.cumsum(-1) - 1).clamp_min(0)
            expected = model(input_ids=ids, attention_mask=mask, position_ids=positions).logits
        yield decoder.logits, expected[:, -1], live.clone()
        if step == DECODE_STEPS:
            break
        for row, last_step in FINISH_AFTER_STEP.items():
            if step == last_step + 1:
                live[row] = False
        for row, paused_steps in PAUSED_AT_STEPS.items():
            live[row] = step not in paused_steps
        token = torch.randint(4, VOCAB, (len(ids),), generator=generator)
        token = torch.where(live, token, torch.full_like(token, PAD))
        decoder.advance(token, live)
        ids = torch.cat([ids, token[:, None]], dim=1)
        mask = torch.cat([mask, live[:, None].long()], dim=1)


def assert_matches_hf(model: torch.nn.Module) -> float:
    worst = 0.0
    for got, expected, live in rollout_steps(model):
        assert torch.isfinite(got).all()  # finished rows too: the trainer samples from them
        torch.testing.assert_close(got[live], expected[live], **TOLERANCE)
        worst = max(worst, (got[live] - expected[live]).abs().max().item())
    return worst


@pytest.mark.parametrize("build", [tiny_qwen2, tiny_qwen3, tiny_llama], ids=lambda f: f.__name__)
def test_logits_match_hf_at_every_step(build: Callable[[], PreTrainedModel]) -> None:
    assert_matches_hf(build())


def test_finishing_and_paused_rows_are_exercised() -> None:
    # The schedules above must really stop some rows mid-rollout and keep others running.
    lives = torch.stack([live for _, _, live in rollout_steps(tiny_qwen2())])
    assert lives[0].all() and not lives[-1].all() and lives[-1].any()
    paused = list(PAUSED_AT_STEPS)
    assert not lives[:, paused].all() and lives[-1, paused].all()


def test_lora_uses_the_effective_weights_and_touches_no_parameter() -> None:
    model = tiny_lora_qwen2()
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    assert_matches_hf(model)
    after = dict(model.named_parameters())
    assert all(torch.equal(before[name], after[name]) for name in before)


def test_disabled_lora_adapter_matches_the_base_model() -> None:
    model = tiny_lora_qwen2()
    ids, mask = left_padded_prompts()
    with model.disable_adapter():
        assert_matches_hf(model)
        disabled = DecoderSnapshot.from_model(model).start(ids, mask, 1).logits
    base = DecoderSnapshot.from_model(tiny_qwen2()).start(ids, mask, 1).logits
    enabled = DecoderSnapshot.from_model(model).start(ids, mask, 1).logits
    torch.testing.assert_close(disabled, base, **TOLERANCE)
    assert (enabled - base).abs().max() > 1e-3  # the adapter really changes the logits


def test_repeated_rollouts_are_bit_identical() -> None:
    model = tiny_qwen3()
    ids, mask = left_padded_prompts()
    live = torch.tensor([True, False, True, True, False, True, True])
    tokens = torch.arange(4, 4 + len(ids))

    def run() -> list[torch.Tensor]:
        decoder = DecoderSnapshot.from_model(model).start(ids, mask, 3)
        return [decoder.logits, decoder.advance(tokens, live), decoder.advance(tokens + 1, live)]

    first, second = run(), run()
    assert all(torch.equal(a, b) for a, b in zip(first, second, strict=True))


def test_unpadded_prompts_match_hf() -> None:
    # No padding at all takes the prompt pass's dense path (no real-token packing).
    model = tiny_llama()
    ids = torch.randint(4, VOCAB, (3, 6), generator=torch.Generator().manual_seed(8))
    mask = torch.ones_like(ids)
    decoder = DecoderSnapshot.from_model(model).start(ids, mask, 2)
    with torch.no_grad():
        expected = model(input_ids=ids, attention_mask=mask).logits[:, -1]
    torch.testing.assert_close(decoder.logits, expected, **TOLERANCE)


def test_cache_capacity_and_left_padding_are_enforced() -> None:
    snapshot = DecoderSnapshot.from_model(tiny_qwen2())
    ids, mask = left_padded_prompts()
    decoder = snapshot.start(ids, mask, 1)
    live = torch.ones(len(ids), dtype=torch.bool)
    decoder.advance(torch.full((len(ids),), 5), live)
    with pytest.raises(RuntimeError, match="KV cache full"):
        decoder.advance(torch.full((len(ids),), 5), live)
    with pytest.raises(ValueError, match="left-padded"):
        snapshot.start(ids.flip(-1), mask.flip(-1), 1)


def gpt2() -> PreTrainedModel:
    config = GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=1, n_head=2, n_positions=64)
    return _seeded(6, lambda: AutoModelForCausalLM.from_config(config))


def qwen2_with(**overrides: object) -> Callable[[], PreTrainedModel]:
    def build() -> PreTrainedModel:
        config = Qwen2Config.from_dict(
            {**tiny_config(build_tiny_tokenizer()).to_dict(), **overrides}
        )
        return _seeded(
            7, lambda: AutoModelForCausalLM.from_config(config, attn_implementation="eager")
        )

    return build


UNSUPPORTED = {
    "gpt2": gpt2,
    "sliding_window": qwen2_with(use_sliding_window=True, sliding_window=4, max_window_layers=0),
    "dynamic_rope": qwen2_with(
        rope_parameters={"rope_type": "dynamic", "factor": 2.0, "rope_theta": 10000.0}
    ),
    "bfloat16": lambda: tiny_qwen2().to(torch.bfloat16),
    "dora": lambda: tiny_lora_qwen2(use_dora=True),
}


@pytest.mark.parametrize("name", sorted(UNSUPPORTED))
def test_unsupported_models_fall_back(name: str) -> None:
    assert DecoderSnapshot.from_model(UNSUPPORTED[name]()) is None


def test_merged_adapter_reads_the_merged_weight_and_declines_when_disabled() -> None:
    model = tiny_lora_qwen2()
    model.merge_adapter()
    assert_matches_hf(model)
    # peft's own forward would unmerge (mutate) the layers here; the engine declines instead.
    with model.disable_adapter():
        assert DecoderSnapshot.from_model(model) is None


@pytest.mark.parametrize("temperature", [1.0, 0.0], ids=["sampled", "greedy"])
def test_generate_with_the_engine_equals_the_hf_loop(sample_rollout, temperature: float) -> None:
    """The trainer's rollouts: same tokens and masks from the engine as from the HF forward."""
    tokenizer = build_tiny_tokenizer()
    policy = build_tiny_policy(tokenizer, seed=3).eval()
    runs = [
        sample_rollout(
            policy,
            tokenizer,
            prompts=8,
            n=4,
            max_new_tokens=24,
            stream=7,
            temperature=temperature,
            fast=fast,
        )
        for fast in (True, False)
    ]
    engine, hf = runs
    assert torch.equal(engine.responses, hf.responses)
    assert torch.equal(engine.response_mask, hf.response_mask)
    lengths = engine.response_mask.sum(-1)
    if temperature:
        assert lengths.min() < lengths.max(), "rows should finish at different steps"


def test_scoring_pass_equals_the_hf_response_logits(sample_rollout) -> None:
    """The engine's no-cache pass over whole rollouts (old and reference log-probs)."""
    from peft import LoraConfig, get_peft_model

    from reference_trainer.generation import response_logits

    tokenizer = build_tiny_tokenizer()
    policy = build_tiny_policy(tokenizer, seed=5).eval()
    batch = sample_rollout(policy, tokenizer, prompts=6, n=3, max_new_tokens=16, stream=9)
    mask = batch.response_mask.bool()
    assert not bool(mask.all()), "some rows should stop early"
    lora = get_peft_model(
        build_tiny_policy(tokenizer, seed=5),
        LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "down_proj"], lora_dropout=0.0),
    ).eval()
    for layer in lora.base_model.model.model.layers:
        for module in (layer.self_attn.q_proj, layer.mlp.down_proj):
            torch.nn.init.normal_(module.lora_B["default"].weight, std=0.05)
    rollout = (batch.prompt_ids, batch.prompt_mask, batch.responses, batch.response_mask)
    for model in (policy, lora):
        snapshot = DecoderSnapshot.from_model(model)
        assert snapshot is not None
        engine = snapshot.response_logits(*rollout)
        with torch.no_grad():
            hf = response_logits(model, batch)
        torch.testing.assert_close(engine[mask], hf[mask], rtol=1e-5, atol=1e-5)
        assert torch.count_nonzero(engine[~mask]) == 0
        again = snapshot.response_logits(*rollout)
        assert torch.equal(engine, again)
