"""SGLang serving the actor's LoRA as an adapter: the arguments verl hands it, which SGLang
refuses at the server's start for some values of the LoRA keys.

What a release hands SGLang is that release's own code (its server module's
``"max_lora_rank": …`` and ``"lora_target_modules": …``), evaluated in the release's
environment on each class of value (``upstream/probes/sglang_server_probe.py``) and kept as data
(``releases/sglang_server.py``, handed to the check as ``CheckInput.sglang_server``). What SGLang then
does with them is SGLang's code, cited:

- a string as ``lora_target_modules`` becomes the set of its characters
  (ServerArgs.check_lora_server_args: server_args.py:5063-5064@sglang-0.5.8, :7511-7512@0.5.12),
  and the LoRA memory pool then sizes a module named by one character: ``NotImplementedError:
  get_hidden_dim not implemented for …`` (lora/utils.py:94-97@sglang-0.5.8, :169-172@0.5.12);
- no target modules, or a ``max_lora_rank`` of 0, without an initial adapter path (verl gives
  none): an ``AssertionError`` (server_args.py:5083-5085@sglang-0.5.8, :7519-7521@0.5.12).

A value the release's own code refuses (0.9.1 refuses a pattern string and ``null``) is that
refusal, at the server's start too. The server starts after the trainer has built its workers.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from pytest_verl_compat.checks.lora import ALL_LINEAR, served_rank_spelling
from pytest_verl_compat.checks.model_facts import ACTOR_MODEL, Citation
from pytest_verl_compat.checks.registry import CheckInput, Example, Hit, check
from pytest_verl_compat.model import dotted_value

MODEL = ACTOR_MODEL
ROLLOUT_NAME = "actor_rollout_ref.rollout.name"
RAISES = "raises: "  # a refusal's prefix in the record (the probe's RAISES)
VALUE = "{value}"  # the configuration's value, handed on or quoted in a refusal (the probe's VALUE)
SGLANG_SETS = "server_args.py:5063-5064@sglang-0.5.8, :7511-7512@sglang-0.5.12"
SGLANG_POOL = "lora/utils.py:94-97@sglang-0.5.8, :169-172@sglang-0.5.12"
SGLANG_ASSERTS = "server_args.py:5083-5085@sglang-0.5.8, :7519-7521@sglang-0.5.12"


def target_class(value: Any) -> str:
    """The class of a target_modules value the record renders (the probe's TARGET_SAMPLES)."""
    if value is None:
        return "null"
    if isinstance(value, str):
        return ALL_LINEAR if value == ALL_LINEAR else "pattern"
    return "list"


def _where(inp: CheckInput, read: Citation) -> str:
    # the record's line is the checked release's own (``@``: not a line of the cited release)
    return f"verl {inp.version} hands SGLang `{read.statement}` ({read.where}@{inp.version})"


@check(
    "rollout.sglang-lora",
    level="error",
    evidence=(
        "what the release hands SGLang as max_lora_rank and lora_target_modules, its own server "
        "code evaluated in its environment (data/releases/VERSION/sglang_server.json); sglang "
        f"{SGLANG_SETS} (a string becomes the set of its characters), {SGLANG_POOL} (the LoRA pool "
        f"sizes no module of that name), {SGLANG_ASSERTS} (rank and targets required)"
    ),
    summary=(
        "SGLang serving the actor's LoRA adapter with arguments it refuses when the server "
        "starts, as the checked release hands them: target_modules as written (a string, "
        "all-linear included, becomes the set of its characters) or lora_rank alone as the rank "
        "(the Megatron spelling lora.rank gives 0); a release that translates all-linear may "
        "refuse a pattern or null itself."
    ),
    fix=(
        "list the module names (actor_rollout_ref.model.target_modules=[q_proj,k_proj,v_proj,"
        "o_proj,gate_proj,up_proj,down_proj]) and set the rank as lora_rank, or serve with vLLM"
    ),
    example=Example(
        fires=(
            "actor_rollout_ref.rollout.name=sglang",
            "actor_rollout_ref.model.lora_rank=8",
            "actor_rollout_ref.model.target_modules=all-linear",
        ),
        twin=(
            "actor_rollout_ref.rollout.name=sglang",
            "actor_rollout_ref.model.lora_rank=8",
            "actor_rollout_ref.model.target_modules=[q_proj,v_proj]",
        ),
    ),
)
def sglang_lora(inp: CheckInput) -> Iterator[Hit]:
    record = inp.sglang_server
    model = dotted_value(inp.resolved, MODEL)
    name = dotted_value(inp.resolved, ROLLOUT_NAME)
    if record is None or name != "sglang" or not isinstance(model, Mapping):
        return
    spelling = served_rank_spelling(model)
    if spelling is None:
        return
    targets = model.get("target_modules")
    given = record.targets.renders.get(target_class(targets), [])
    given = targets if given == VALUE else given  # handed on as written
    sglang = f"SGLang {record.sglang or '?'}"
    if isinstance(given, str) and given.startswith(RAISES):
        refusal = given.removeprefix(RAISES).replace(VALUE, repr(targets))
        yield Hit(
            f"{MODEL}.target_modules",
            f"{_where(inp, record.targets.read)}, which refuses {targets!r}: {refusal}, when the "
            "rollout server starts",
        )
    elif isinstance(given, str) or given is None:
        why = (
            f"SGLang makes the set of its characters ({SGLANG_SETS}) and its LoRA memory pool "
            f"cannot size a module named by one character ({', '.join(map(repr, sorted(set(given))[:3]))}, "
            f"...): NotImplementedError ({SGLANG_POOL})"
            if given
            else "SGLang asserts target modules are given, as no initial adapter path is "
            f"({SGLANG_ASSERTS})"
        )
        yield Hit(
            f"{MODEL}.target_modules",
            f"{_where(inp, record.targets.read)}: {given!r} as lora_target_modules; {why}, when "
            f"the rollout server starts ({sglang})",
        )
    rank = record.rank.renders.get(spelling)
    if rank == 0:
        yield Hit(
            f"{MODEL}.{spelling}",
            f"{_where(inp, record.rank.read)}: the rank set as {spelling} reaches SGLang as "
            f"max_lora_rank 0, and SGLang asserts a rank ({SGLANG_ASSERTS}) when the rollout "
            f"server starts ({sglang})",
            fix=f"set {MODEL}.lora_rank to the rank too",
        )
