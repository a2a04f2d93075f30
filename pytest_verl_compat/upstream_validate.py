"""Upstream's own verdict: verl 0.9.0's ``validate_config`` on each composed case, in a subprocess.

Run as ``python -m pytest_verl_compat.upstream_validate`` with a JSON list of resolved mappings on
stdin; prints one verdict per mapping. Two parts of upstream validation need what a laptop does not
have, and are replaced by labelled stand-ins:

- the vLLM LoRA rank check imports vllm; the stand-in applies the same allowed ranks that
  ``get_vllm_max_lora_rank`` falls back to when vllm is absent (1, 8, ..., 512);
- the critic's model config is loaded from the model hub; the stand-in keeps the critic's model
  section a plain mapping, which keeps every batch-size check of ``CriticConfig.validate``.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import subprocess
import sys
import types
from collections.abc import Mapping, Sequence
from typing import Any

STAND_INS = (
    "vllm LoRA rank: allowed ranks 1, 8, 16, 32, 64, 128, 256, 320, 512 (upstream's fallback list)",
    "critic model config: not loaded from the model hub; batch checks run on the critic section",
)
ALLOWED_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


def _stand_in_lora_rank(lora_rank: int) -> int:
    if lora_rank <= 0:
        raise AssertionError(f"lora_rank must be greater than 0, get {lora_rank}")
    if lora_rank > ALLOWED_LORA_RANKS[-1]:
        raise ValueError(
            f"lora_rank must be less than or equal to {ALLOWED_LORA_RANKS[-1]}, but got {lora_rank}"
        )
    return next(rank for rank in ALLOWED_LORA_RANKS if lora_rank <= rank)


def _validate_all(mappings: Sequence[Mapping[str, Any]]) -> list[dict[str, str]]:
    # The real module imports vllm at the top; only its rank helper is used by validate_config.
    fake = types.ModuleType("verl.workers.rollout.vllm_rollout.utils")
    fake.get_vllm_max_lora_rank = _stand_in_lora_rank  # type: ignore[attr-defined]
    sys.modules["verl.workers.rollout.vllm_rollout.utils"] = fake

    from omegaconf import OmegaConf
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils import config as config_utils

    verdicts = []
    for mapping in mappings:
        cfg = OmegaConf.create(dict(mapping))
        # Stand-in for the hub load: without its _target_, the critic's model section stays a
        # plain mapping instead of an HFModelConfig that downloads the model's config.
        if not os.path.isdir(str(cfg.critic.model.path)):
            cfg.critic.model.pop("_target_", None)
        printed = io.StringIO()
        try:
            with contextlib.redirect_stdout(printed):
                config_utils.validate_config(
                    config=cfg,
                    use_reference_policy=need_reference_policy(cfg),
                    use_critic=need_critic(cfg),
                )
            verdicts.append(
                {"verdict": "passes", "message": printed.getvalue().strip().splitlines()[-1]}
            )
        except Exception as exc:
            verdicts.append(
                {"verdict": "fails", "message": f"{type(exc).__name__}: {exc}".splitlines()[0]}
            )
    return verdicts


def upstream_verdicts(
    mappings: Sequence[Mapping[str, Any]], cache: Any = None
) -> list[dict[str, str]]:
    """Verdicts for several mappings from one subprocess (verl imports take ~10 s), cached."""
    payload = json.dumps(list(mappings), sort_keys=True)
    key = "verl_corpus/validate/" + hashlib.sha256(payload.encode()).hexdigest()
    if cache is not None:
        hit = cache.get(key, None)
        if isinstance(hit, list):
            return hit
    proc = subprocess.run(
        [sys.executable, "-m", "pytest_verl_compat.upstream_validate"],
        input=payload,
        capture_output=True,
        text=True,
        env={
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": "/home/verl",
            "PYTHONHASHSEED": "0",
        },
        check=False,
        timeout=600,
    )
    if proc.returncode != 0:
        raise RuntimeError(
            "upstream validate_config runner failed:\n" + "\n".join(proc.stderr.splitlines()[-15:])
        )
    verdicts = json.loads(proc.stdout.strip().splitlines()[-1])
    if cache is not None:
        cache.set(key, verdicts)
    return verdicts


if __name__ == "__main__":
    results = _validate_all(json.loads(sys.stdin.read()))
    sys.stdout.write("\n" + json.dumps(results) + "\n")
