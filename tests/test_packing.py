"""Padding removal: packed passes give the padded passes' log-probs, values and gradients."""

from __future__ import annotations

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel

from reference_trainer.generation import response_logits, response_values
from reference_trainer.packing import pack, packing_supported
from reference_trainer.tiny import build_tiny_policy, build_tiny_tokenizer, build_tiny_value_model


@pytest.fixture(scope="module")
def rollout(sample_rollout):
    torch.set_num_threads(1)
    tokenizer = build_tiny_tokenizer()
    policy = build_tiny_policy(tokenizer, seed=0).eval()
    # The first prompts mix 4-character arithmetic with 49-character word problems.
    batch = sample_rollout(policy, tokenizer, prompts=8, n=4, max_new_tokens=24, stream=1)
    lengths = batch.response_mask.sum(-1)
    assert lengths.min() < lengths.max(), "the batch should mix finished and truncated rows"
    return tokenizer, policy, batch


def test_packed_rows_hold_each_trajectory_once(rollout) -> None:
    tokenizer, _, batch = rollout
    packed = pack(
        batch.prompt_ids,
        batch.prompt_mask,
        batch.responses,
        batch.response_mask,
        tokenizer.pad_token_id,
        max_tokens=64,
    )
    unshared = pack(
        batch.prompt_ids,
        batch.prompt_mask,
        batch.responses,
        batch.response_mask,
        tokenizer.pad_token_id,
        share_prompts=False,
    )
    assert unshared.attention_mask is None, "position ids alone separate unshared trajectories"
    assert sum(unshared.row_tokens) == int(
        batch.prompt_mask.sum() + batch.response_mask.sum()
    ) - len(batch)
    # Real tokens only, each prompt once for its 4 responses; the last response token predicts
    # nothing, so it is not fed.
    prompts_once = int(batch.prompt_mask[::4].sum())
    real = prompts_once + int(batch.response_mask.sum()) - len(batch)
    assert sum(packed.row_tokens) == real
    assert packed.attention_mask is not None
    assert max(packed.row_tokens) == packed.input_ids.shape[1]
    assert packed.input_ids.numel() < 0.75 * (batch.prompt_ids.numel() + batch.responses.numel())
    # The output that predicts response token t sits on the input holding token t - 1.
    rows, cols = packed.source
    targets_row, targets_col = packed.target
    assert len(rows) == int(batch.response_mask.sum())
    later = targets_col > 0
    torch.testing.assert_close(
        packed.input_ids[rows[later], cols[later]],
        batch.responses[targets_row[later], targets_col[later] - 1],
    )
    first = ~later
    prompt_last = batch.prompt_ids[targets_row[first], -1]
    torch.testing.assert_close(packed.input_ids[rows[first], cols[first]], prompt_last)


def test_packed_log_probs_and_gradients_match_padded(rollout) -> None:
    tokenizer, policy, batch = rollout
    mask = batch.response_mask.bool()
    assert packing_supported(policy)
    padded = response_logits(policy, batch)
    packed = response_logits(policy, batch, tokenizer.pad_token_id)
    torch.testing.assert_close(packed[mask], padded[mask], rtol=1e-5, atol=1e-5)
    # Response padding is zero in the packed layout: every loss masks it out.
    assert torch.count_nonzero(packed[~mask]) == 0
    weight = policy.model.layers[0].self_attn.q_proj.weight
    (grad_padded,) = torch.autograd.grad(padded[mask].square().sum(), [weight])
    (grad_packed,) = torch.autograd.grad(packed[mask].square().sum(), [weight])
    torch.testing.assert_close(grad_packed, grad_padded, rtol=1e-4, atol=1e-5)


def test_packed_values_and_lora_match_padded(rollout) -> None:
    from peft import LoraConfig, get_peft_model

    tokenizer, policy, batch = rollout
    mask = batch.response_mask.bool()
    critic = build_tiny_value_model(policy.config, seed=1)
    torch.testing.assert_close(
        response_values(critic, batch, tokenizer.pad_token_id)[mask],
        response_values(critic, batch)[mask],
        rtol=1e-5,
        atol=1e-5,
    )
    lora = get_peft_model(
        build_tiny_policy(tokenizer, seed=0),
        LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], lora_dropout=0.0),
    )
    assert packing_supported(lora)
    torch.testing.assert_close(
        response_logits(lora, batch, tokenizer.pad_token_id)[mask],
        response_logits(lora, batch)[mask],
        rtol=1e-5,
        atol=1e-5,
    )


def test_models_without_block_causal_masks_keep_the_padded_pass(rollout) -> None:
    tokenizer, _, batch = rollout
    gpt2 = GPT2LMHeadModel(
        GPT2Config(vocab_size=len(tokenizer), n_embd=32, n_layer=1, n_head=2, n_positions=128)
    ).eval()
    assert not packing_supported(gpt2)
    # Asked to pack, it runs padded: same result as not asking.
    torch.testing.assert_close(
        response_logits(gpt2, batch, tokenizer.pad_token_id), response_logits(gpt2, batch)
    )
