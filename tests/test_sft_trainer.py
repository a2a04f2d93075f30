"""The reference trainer's SFT loop: data, micro-batches, checkpoints and resume, the CLI."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from pytest_verl_compat.cli import main as verl_compat
from pytest_verl_compat.pipeline.sft import lower_sft, sft_case_overrides
from reference_trainer.config import SFTConfig
from reference_trainer.sft import SFTBudget, SFTTrainer
from reference_trainer.sft_data import SFTSampler, tokenize_conversation
from reference_trainer.sft_step import build_sft_optimizer, micro_batches, sft_update
from reference_trainer.tiny import build_tiny_policy, build_tiny_tokenizer

BUDGET = SFTBudget(steps=4, train_batch_size=4, save_freq=2, test_freq=-1, max_length=64)
RESUME_IN_PROCESS = """
import sys
from reference_trainer.config import SFTConfig
from reference_trainer.sft import SFTBudget, SFTTrainer
import json
cfg = SFTConfig.from_dict(json.loads(sys.argv[2]))
budget = SFTBudget(**json.loads(sys.argv[3]))
SFTTrainer(cfg, budget, sys.argv[1], progress=False).run(resume=True)
"""


def _config(case: str = "sft/full", *extra: str) -> SFTConfig:
    return lower_sft([*sft_case_overrides()[case], *extra], case_id=case)[1]


def _rows(out: Path) -> list[dict[str, float]]:
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in row.items() if not k.startswith("timing_s/")} for row in rows]


def test_only_assistant_turns_and_their_eos_are_trained() -> None:
    tokenizer = build_tiny_tokenizer()
    messages = [
        {"role": "user", "content": "1+2="},
        {"role": "assistant", "content": "3"},
        {"role": "user", "content": "2+2="},
        {"role": "assistant", "content": "4"},
    ]
    seq = tokenize_conversation(tokenizer, messages, max_length=64, truncation="error")
    trained = tokenizer.convert_ids_to_tokens(seq.input_ids[seq.loss_mask.bool()].tolist())
    assert trained == ["3", "<eos>", "4", "<eos>"]
    assert seq.loss_mask[0] == 0  # BOS: the first token is never trained
    with pytest.raises(ValueError, match=r"data\.max_length=5"):
        tokenize_conversation(tokenizer, messages, max_length=5, truncation="error")
    cut = tokenize_conversation(tokenizer, messages, max_length=5, truncation="right")
    assert cut.input_ids.tolist() == seq.input_ids[:5].tolist()


def test_the_sampler_is_verls_distributed_sampler() -> None:
    from torch.utils.data import DistributedSampler

    data = list(range(10))
    sampler = SFTSampler(len(data), 3)
    theirs = DistributedSampler(data, num_replicas=1, rank=0, shuffle=True, drop_last=True)
    for epoch in range(3):
        theirs.set_epoch(epoch)
        order = list(theirs)
        assert [sampler.next_batch() for _ in range(3)] == [order[i : i + 3] for i in (0, 3, 6)]


def test_micro_batches_do_not_change_the_update() -> None:
    tokenizer = build_tiny_tokenizer()
    from reference_trainer.sft_data import conversations_from_prompts, tokenize_all

    batch = tokenize_all(
        tokenizer, conversations_from_prompts()[:6], max_length=64, truncation="error"
    )
    cfg = _config()
    results = []
    for micro, budget, packed in ((None, None, True), (1, None, False), (None, 60, True)):
        model = build_tiny_policy(tokenizer, 0)
        optimizer, scheduler = build_sft_optimizer(model, "SGD", cfg.optim, 3)
        sft_update(
            model,
            optimizer,
            scheduler,
            batch,
            pad_id=tokenizer.pad_token_id,
            grad_clip=1e9,
            micro_batch_size=micro,
            max_token_len=budget,
            packed=packed,
        )
        results.append(torch.cat([p.detach().flatten() for p in model.parameters()]))
    assert len(micro_batches([len(s.input_ids) for s in batch], None, 60)) > 2
    for other in results[1:]:
        assert float((other - results[0]).abs().max()) < 1e-6


def test_resume_in_a_new_process_is_bit_identical(tmp_path: Path) -> None:
    cfg = _config()
    SFTTrainer(cfg, BUDGET, tmp_path / "a", progress=False).run()
    SFTTrainer(cfg, BUDGET, tmp_path / "b", progress=False).run(stop_after=3)
    # Resume from step 2 while step 3's metrics are on disk: they are dropped and redone.
    import shutil

    shutil.rmtree(tmp_path / "b" / "checkpoints" / "global_step_3")
    budget = json.dumps(BUDGET.__dict__)
    subprocess.run(
        [
            sys.executable,
            "-c",
            RESUME_IN_PROCESS,
            str(tmp_path / "b"),
            json.dumps(cfg.to_dict()),
            budget,
        ],
        check=True,
        capture_output=True,
    )
    final = Path("checkpoints") / "global_step_4" / "policy.safetensors"
    a, b = load_file(tmp_path / "a" / final), load_file(tmp_path / "b" / final)
    assert all(torch.equal(a[k], b[k]) for k in a), "weights differ after a resume [sft/full]"
    assert _rows(tmp_path / "a") == _rows(tmp_path / "b")


def test_lora_trains_only_the_adapter_and_exports_it_merged(tmp_path: Path) -> None:
    trainer = SFTTrainer(_config("sft/lora"), BUDGET, tmp_path, progress=False)
    base = {k: v.clone() for k, v in trainer.policy.named_parameters() if "lora_" not in k}
    trainer.run()
    assert all(torch.equal(v, base[k]) for k, v in trainer.policy.named_parameters() if k in base)
    saved = load_file(tmp_path / "checkpoints" / "global_step_4" / "policy.safetensors")
    assert saved and all("lora_" in k for k in saved)
    assert (tmp_path / "final" / "adapter" / "adapter_config.json").is_file()
    assert (tmp_path / "final" / "hf" / "config.json").is_file()


def test_cli_trains_an_sft_case_and_refuses_what_the_profile_rejects(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "run"
    argv = ["train", "sft/token-budget", "--steps", "2", "--out", str(out), "--no-progress"]
    assert verl_compat(argv) == 0
    assert "sft/token-budget: 2 steps, loss" in capsys.readouterr().out
    ledger = json.loads((out / "adaptations.json").read_text())
    assert {"field": "data.train_batch_size", "upstream": 6, "local": 8} in ledger["adaptations"]
    assert verl_compat(["train", "sft", "--override", "data.pad_mode=right"]) == 2
    assert "data.pad_mode='right' is not supported" in capsys.readouterr().err
    assert verl_compat(["train", "sft/nope"]) == 2
    assert "unknown SFT case 'sft/nope'" in capsys.readouterr().err


def test_the_sft_loss_has_verls_one_aggregation() -> None:
    """verl's sft_loss is a global token mean whatever the config (losses.py:49 and :52)."""
    from reference_trainer.math.registry import UnknownNameError
    from reference_trainer.math.sft import sft_loss

    log_prob, mask = torch.tensor([[-1.0, -2.0, -3.0]]), torch.tensor([[0, 1, 1]])
    assert float(sft_loss(log_prob, mask, dp_size=2, batch_num_tokens=4)) == 2.5
    with pytest.raises(UnknownNameError, match="valid names: token-mean"):
        sft_loss(log_prob, mask, loss_agg_mode="seq-mean-token-mean")
