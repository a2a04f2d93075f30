"""Upstream's own verdict: the pinned verl's ``validate_config`` on each composed case, in a subprocess.

Run as ``python -m pytest_verl_compat.upstream.validate`` with a JSON list of resolved mappings on
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
import sys
import types
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from pytest_verl_compat.model import Case, StageFailed
from pytest_verl_compat.upstream.runner import run_module

if TYPE_CHECKING:
    from pytest_verl_compat.pipeline.audit import AuditSession

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
    run = run_module("pytest_verl_compat.upstream.validate", stdin=payload)
    if run.returncode != 0:
        raise RuntimeError("upstream validate_config runner failed:\n" + run.stderr_tail(15))
    verdicts: list[dict[str, str]] = json.loads(run.stdout.strip().splitlines()[-1])
    if cache is not None:
        cache.set(key, verdicts)
    return verdicts


class UpstreamVerdicts:
    """validate_config's verdict for every composed case of a session, from one subprocess."""

    def __init__(self, session: AuditSession) -> None:
        self.session = session
        self._verdicts: dict[str, dict[str, str]] | None = None

    def verdict(self, case: Case, cache: Any = None) -> dict[str, str]:
        if self._verdicts is None:
            session = self.session
            composed = [
                c for c in session.cases if not c.error and session.outcome(c).composition.composed
            ]
            mappings = [session.outcome(c).composition.mapping for c in composed]
            try:
                verdicts = upstream_verdicts(mappings, cache)
            except RuntimeError as exc:
                raise StageFailed(str(exc)) from exc
            self._verdicts = {c.id: v for c, v in zip(composed, verdicts, strict=True)}
        return self._verdicts[case.id]


if __name__ == "__main__":
    results = _validate_all(json.loads(sys.stdin.read()))
    sys.stdout.write("\n" + json.dumps(results) + "\n")
