"""SGLang's attention backend for the model it serves: the backend verl hands it, which SGLang
refuses for some model architectures when the rollout server starts.

verl hands SGLang ``rollout.engine_kwargs.sglang.attention_backend`` when set, else its own pick
for the SGLang it runs (``fa3`` below SGLang 0.5.12, ``flashinfer`` from it, on a CUDA GPU): the
release's own code, run in its environment for its pinned SGLang (``releases/sglang_server.py``,
``CheckInput.sglang_server``). SGLang's ``ServerArgs._handle_model_specific_adjustments`` then
asserts, per architecture (the config's ``architectures[0]``), the backends it accepts
(``ACCEPTED``, cited per SGLang release). Needs the actor model's config.json, or its model_type
where the facts give no architecture (a model named to ``--model-config`` that the shipped table
knows: ``CLASS_OF_MODEL_TYPE``).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from pytest_verl_compat.checks.model_facts import ACTOR_MODEL
from pytest_verl_compat.checks.registry import CheckInput, Example, Hit, check
from pytest_verl_compat.checks.sglang_lora import ROLLOUT_NAME
from pytest_verl_compat.model import dotted_value

BACKEND_KEY = "actor_rollout_ref.rollout.engine_kwargs.sglang.attention_backend"


@dataclass(frozen=True)
class Accepted:
    """The attention backends an SGLang release accepts for some architectures: ``allowed`` (the
    rest refused), or every one but ``refused``; only with a sliding_window_pattern where
    ``sliding_only``."""

    architectures: tuple[str, ...]
    where: str
    allowed: frozenset[str] = frozenset()
    refused: frozenset[str] = frozenset()
    sliding_only: bool = False

    def refuses(self, backend: str) -> bool:
        return backend in self.refused if self.refused else backend not in self.allowed


GPT_OSS_0_5_12 = frozenset({"triton", "trtllm_mha", "fa3", "fa4", "ascend", "intel_xpu", "aiter"})
LLAMA4 = ("Llama4ForConditionalGeneration", "Llama4ForCausalLM")
# The class a checkpoint of these model_types names first in its architectures, for facts that
# carry the model_type alone (the shipped table's numbers): transformers' auto mappings give each
# one class of ACCEPTED (llama4 also its text-only Llama4ForCausalLM, refused alike), and verl's
# actor is that class. SGLang's ExaoneMoEForCausalLM is no class transformers names, so an
# exaone_moe config is judged by its own architectures only.
CLASS_OF_MODEL_TYPE = {
    "gpt_oss": "GptOssForCausalLM",
    "llama4": "Llama4ForConditionalGeneration",
    "llama4_text": "Llama4ForCausalLM",
    "exaone4": "Exaone4ForCausalLM",
    "olmo2": "Olmo2ForCausalLM",
    "lfm2": "Lfm2ForCausalLM",
    "nemotron_h": "NemotronHForCausalLM",
}
# By the SGLang release a verl release's sglang extra pins (its record's ``sglang``).
ACCEPTED: dict[str, tuple[Accepted, ...]] = {
    "0.5.12": (
        Accepted(("GptOssForCausalLM",), "server_args.py:2007-2049", GPT_OSS_0_5_12),
        Accepted(
            LLAMA4,
            "server_args.py:2181-2204",
            frozenset({"fa3", "aiter", "triton", "ascend", "trtllm_mha", "intel_xpu"}),
        ),
        Accepted(
            ("Exaone4ForCausalLM", "ExaoneMoEForCausalLM"),
            "server_args.py:2239-2249",
            frozenset({"fa3", "triton", "trtllm_mha"}),
            sliding_only=True,
        ),
        Accepted(
            ("Olmo2ForCausalLM",), "server_args.py:2250-2270", refused=frozenset({"flashinfer"})
        ),
        Accepted(("Lfm2ForCausalLM",), "server_args.py:2406-2416", refused=frozenset({"triton"})),
    ),
    "0.5.8": (
        Accepted(
            ("GptOssForCausalLM",),
            "server_args.py:1257-1276",
            frozenset({"triton", "trtllm_mha", "fa3", "fa4", "ascend"}),
        ),
        Accepted(
            LLAMA4,
            "server_args.py:1344-1366",
            frozenset({"fa3", "aiter", "triton", "trtllm_mha", "intel_xpu"}),
        ),
        Accepted(
            ("Olmo2ForCausalLM",), "server_args.py:1386-1406", refused=frozenset({"flashinfer"})
        ),
        Accepted(
            ("NemotronHForCausalLM",), "server_args.py:1462-1465", refused=frozenset({"triton"})
        ),
    ),
}


@check(
    "rollout.sglang-attention",
    level="error",
    evidence=(
        "the attention backend the release hands SGLang when engine_kwargs names none, its own "
        "code run in its environment for its pinned SGLang (data/releases/VERSION/"
        "sglang_server.json); sglang/srt/server_args.py _handle_model_specific_adjustments, the "
        "backends each architecture accepts (checks/sglang_attention.py ACCEPTED, "
        "@sglang-0.5.8 and @sglang-0.5.12)"
    ),
    summary=(
        "SGLang serving a model whose architecture does not accept the attention backend verl "
        "hands it: with none named, verl picks flashinfer for SGLang 0.5.12 and later, which "
        "gpt-oss, Llama 4, Olmo 2 and sliding-window Exaone 4 refuse; the rollout server stops "
        "at start. Needs the actor model's config.json, or --model-config naming a model the "
        "shipped table knows."
    ),
    fix=f"name an accepted backend in {BACKEND_KEY} (fa3 on Hopper, triton elsewhere)",
    example=Example(
        fires=("actor_rollout_ref.rollout.name=sglang", f"+{BACKEND_KEY}=flashinfer"),
        twin=("actor_rollout_ref.rollout.name=sglang", f"+{BACKEND_KEY}=fa3"),
        model={"model_type": "gpt_oss", "architecture": "GptOssForCausalLM"},
    ),
)
def sglang_attention(inp: CheckInput) -> Iterator[Hit]:
    record = inp.sglang_server
    facts = inp.model_facts.get(ACTOR_MODEL)
    if record is None or facts is None:
        return
    architecture, read = facts.architecture, f"read from {facts.source}"
    if architecture is None:
        architecture = CLASS_OF_MODEL_TYPE.get(str(facts.model_type))
        read = f"the class of its model_type {facts.model_type!r}, read from {facts.source}"
    if architecture is None:
        return
    if dotted_value(inp.resolved, ROLLOUT_NAME) != "sglang":
        return
    named = dotted_value(inp.resolved, BACKEND_KEY)
    if named is not None and not isinstance(named, str):
        return  # not a backend's name: verl hands it on, SGLang's own type check says what
    # verl picks one only when the key is unset (its engine_kwargs.pop(..., None) is None)
    backend = record.default_attention if named is None else named
    for rule in ACCEPTED.get(record.sglang, ()):
        if architecture not in rule.architectures or not rule.refuses(backend):
            continue
        if rule.sliding_only and not facts.sliding_window_pattern:
            continue
        chosen = (
            f"{BACKEND_KEY} is {backend!r}"
            if named is not None
            else f"verl {inp.version} picks {backend!r} for SGLang {record.sglang} when "
            f"{BACKEND_KEY} is unset ({record.attention.where}@{inp.version})"
        )
        accepts = (
            f"accepts only {', '.join(sorted(rule.allowed))}"
            if rule.allowed
            else f"refuses {', '.join(sorted(rule.refused))}"
        )
        yield Hit(
            BACKEND_KEY if named is not None else ROLLOUT_NAME,
            f"{chosen}; SGLang {record.sglang} {accepts} for {architecture} "
            f"({rule.where}@sglang-{record.sglang}, {read}): the rollout "
            "server stops at start",
        )
