"""Run conformance of the SFT tree's data leaves (corpus/run_conformance/sft_data.yaml).

For each case, from the same multi-turn conversations and the same tiny tokenizer (the tiny
character vocabulary under a chat template with a default system prompt and a closing ``<eos>``),
per conversation its token ids, loss mask and position ids, or the error a conversation stops
the run with:

- ours: the reference SFT trainer's data set (``SFTTrainer.__init__`` tokenizes the
  conversations with ``sft_data.tokenize_all`` on the case's lowered config); its positions are
  the ones its step feeds the model, restarting at each conversation (sft_step.py
  ``next_token_log_probs``);
- upstream: verl 0.9.0's ``MultiTurnSFTDataset`` as the SFT trainer builds it, every row read
  with ``__getitem__``, in the oracle's sandbox (``probes/sft_rows.py``).

Each case must agree (or, ``ours_refuses``, be rejected naming its leaf), and each leaf it sets
must change upstream's result when put back at verl's SFT default. A wrong variant of ours fails
some case.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from corpus_facts import PINNED_VERSION, needs_release
from run_conformance import SandboxQuestions, model_files, tiny_chat_model, with_sets
from run_conformance import leaf as value_at

from pytest_verl_compat.upstream.probes import sft_rows
from reference_trainer import sft_data
from reference_trainer.sft import SFTBudget, SFTTrainer

pytestmark = [needs_release()]

CASES_PATH = Path(__file__).resolve().parents[1] / "corpus" / "run_conformance" / "sft_data.yaml"
CASES: list[dict[str, Any]] = yaml.safe_load(CASES_PATH.read_text())
SERVED = ("pytest_verl_compat.upstream.probes.sft_rows",)
# A default system prompt (upstream strips it from every later turn rendered alone,
# multiturn_sft_dataset.py:229-232) and a closing <eos> on every turn (trained on an assistant's).
CHAT_TEMPLATE = (
    "{% if messages[0]['role'] != 'system' %}s be brief.<eos>{% endif %}"
    "{% for m in messages %}{{ m['role'][0] }} {{ m['content'] }}<eos>{% endfor %}"
    "{% if add_generation_prompt %}a {% endif %}"
)


def _turn(role: str, content: str) -> dict[str, str]:
    return {"role": role, "content": content}


# 23, 42, 79 and 40 tokens: a 38-token bound keeps the first whole and cuts the others, two of
# them inside an assistant turn.
CONVERSATIONS = [
    [_turn("user", "2+3="), _turn("assistant", "5")],
    [
        _turn("system", "one number."),
        _turn("user", "7*8="),
        _turn("assistant", "56"),
        _turn("user", "and 7*9="),
        _turn("assistant", "63"),
    ],
    [
        _turn("user", "ann has 4 pens and gets 3 more. how many pens?"),
        _turn("assistant", "she has 7 pens."),
    ],
    [
        _turn("user", "9+9="),
        _turn("assistant", "18"),
        _turn("user", "times 2?"),
        _turn("assistant", "36"),
    ],
]
REFUSED = "refused"


def sft_defaults() -> dict[str, Any]:
    """verl's SFT tree, composed with no override."""
    from pytest_verl_compat.pipeline.sft import compose_sft

    return compose_sft([]).mapping


def outcome(rows: list[dict[str, Any]] | dict[str, Any]) -> Any:
    """A data set's rows, or the class of the first error a row (or the data set) raises: the
    run stops there."""
    if isinstance(rows, dict):
        return {REFUSED: rows[sft_rows.KEY_ERROR].split(":")[0]}
    errors = [row[sft_rows.KEY_ERROR] for row in rows if sft_rows.KEY_ERROR in row]
    return {REFUSED: errors[0].split(":")[0]} if errors else rows


@pytest.fixture(scope="module")
def model_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny policy and its tokenizer, with the chat template, as a local model folder."""
    return tiny_chat_model(tmp_path_factory.mktemp("sft-data-model") / "tiny-chat", CHAT_TEMPLATE)


@pytest.fixture(scope="module")
def conversations_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("sft-data-rows") / "conversations.jsonl"
    path.write_text("".join(json.dumps({"messages": m}) + "\n" for m in CONVERSATIONS))
    return path


def variants(case: dict[str, Any]) -> list[dict[str, Any]]:
    """The case's sets, then each leaf back at verl's SFT default, then (a case setting
    truncation) the same with truncation=right."""
    defaults = sft_defaults()
    out = [dict(case["sets"])]
    out += [{**case["sets"], leaf: value_at(defaults, leaf)} for leaf in case["sets"]]
    if "data.truncation" in case["sets"]:
        out.append({**case["sets"], "data.truncation": "right"})
    return out


@pytest.fixture(scope="module")
def upstream(model_folder: Path) -> Iterator[dict[str, list[Any]]]:
    """Upstream's outcome of every case's variants, asked in one question."""
    files = model_files(model_folder)
    asked = {case["id"]: variants(case) for case in CASES}
    request = {
        "kind": sft_rows.KIND,
        "tokenizer": files,
        sft_rows.KEY_CONVERSATIONS: CONVERSATIONS,
        sft_rows.KEY_DATA: [
            with_sets(sft_defaults(), sets)["data"]
            for case_sets in asked.values()
            for sets in case_sets
        ],
    }
    oracle = SandboxQuestions(SERVED, PINNED_VERSION)
    try:
        answered = iter(oracle.ask(request)[sft_rows.KEY_RESULTS])
    finally:
        oracle.close()
    yield {case_id: [outcome(next(answered)) for _ in sets] for case_id, sets in asked.items()}


def ours(sets: dict[str, Any], model_folder: Path, conversations: Path, out: Path) -> Any:
    """The reference SFT trainer's data set on the case: each conversation's rows, or the error
    building it stops at; a case the compiler rejects is its reason."""
    from pytest_verl_compat.pipeline.sft import compile_sft, sft_config

    mapping = with_sets(sft_defaults(), sets)
    report = compile_sft(mapping, case_id="sft-data")
    if not report.accepted:
        return {REFUSED: report.reason}
    cfg = sft_config(mapping, report)
    # A bound above every case's: the local run keeps the case's max_length and truncation.
    budget = SFTBudget(
        steps=1,
        train_batch_size=1,
        max_length=cfg.data.max_length,
        model=str(model_folder),
        conversations=str(conversations),
    )
    try:
        trainer = SFTTrainer(cfg, budget, out, progress=False)
    except ValueError as exc:
        return {REFUSED: type(exc).__name__}
    kept = ("max_length", "truncation", "pad_mode")
    assert [getattr(trainer.cfg.data, k) for k in kept] == [getattr(cfg.data, k) for k in kept]
    return [
        {
            sft_rows.INPUT_IDS: row.input_ids.tolist(),
            sft_rows.LOSS_MASK: row.loss_mask.tolist(),
            # The step's positions restart at every conversation (sft_step.py:87).
            sft_rows.POSITION_IDS: list(range(len(row.input_ids))),
        }
        for row in trainer.train_set
    ]


@pytest.mark.parametrize("case", CASES, ids=[case["id"] for case in CASES])
def test_case_matches_upstream_and_each_leaf_changes_it(
    case: dict[str, Any],
    upstream: dict[str, list[Any]],
    model_folder: Path,
    conversations_file: Path,
    tmp_path: Path,
) -> None:
    theirs, *at_defaults = upstream[case["id"]][: 1 + len(case["sets"])]
    assert isinstance(theirs, list) or case["sets"].get("data.truncation", "error") == "error", (
        f"upstream refused the case: {theirs} [{case['id']}]"
    )
    mine = ours(case["sets"], model_folder, conversations_file, tmp_path)
    if case.get("ours_refuses"):
        assert REFUSED in mine, f"ours={mine}, but should be refused [{case['id']}]"
        assert any(leaf in mine[REFUSED] for leaf in case["sets"]), (
            f"refusal={mine[REFUSED]!r}, but should name a leaf of {list(case['sets'])} "
            f"[{case['id']}]"
        )
    else:
        assert mine == theirs, f"ours={mine}, but should be upstream's {theirs} [{case['id']}]"
    defaults = sft_defaults()
    for leaf, at_default in zip(case["sets"], at_defaults, strict=True):
        assert at_default != theirs, (
            f"{leaf} back at verl's default {value_at(defaults, leaf)!r} gives upstream the same "
            f"rows: the case does not show the leaf [{case['id']}]"
        )


def test_over_long_conversations_are_refused_and_cut_on_both_sides(
    upstream: dict[str, list[Any]],
) -> None:
    """The cases show both branches: upstream refuses at the default truncation, and cuts some
    conversations while keeping another whole under right."""
    refusing = [c for c in CASES if "data.truncation" not in c["sets"]]
    assert refusing and all(upstream[c["id"]][0] == {REFUSED: "ValueError"} for c in refusing)
    cutting = [c for c in CASES if c["sets"].get("data.truncation") == "right"]
    assert cutting
    for case in cutting:
        rows, whole = upstream[case["id"]][0], upstream[case["id"]][1]  # max_length at default
        lengths = [len(row[sft_rows.INPUT_IDS]) for row in rows]
        full = [len(row[sft_rows.INPUT_IDS]) for row in whole]
        bound = case["sets"]["data.max_length"]
        assert lengths == [min(n, bound) for n in full]
        assert any(n > bound for n in full) and any(n < bound for n in full), full


def test_left_cuts_the_right_end_as_right_does(upstream: dict[str, list[Any]]) -> None:
    """The profile refuses truncation=left because upstream's no-padding branch keeps the first
    max_length tokens whatever the value (multiturn_sft_dataset.py:404-412): left's rows are
    right's."""
    lefts = [c for c in CASES if c["sets"].get("data.truncation") == "left"]
    assert lefts
    for case in lefts:
        rows, *_, as_right = upstream[case["id"]]
        assert isinstance(rows, list) and rows == as_right


_tokenize = sft_data.tokenize_conversation


def _keeps_the_last_tokens(
    tokenizer: Any, messages: Any, *, max_length: int, truncation: str
) -> Any:
    # Cutting the left end, as the name "left" (and right padding's left branch, :380-384) would.
    whole = _tokenize(tokenizer, messages, max_length=1 << 30, truncation=truncation)
    if len(whole.input_ids) > max_length and truncation == "error":
        raise ValueError("over long")
    return sft_data.TokenizedConversation(
        whole.input_ids[-max_length:], whole.loss_mask[-max_length:]
    )


def _never_refuses(tokenizer: Any, messages: Any, *, max_length: int, truncation: str) -> Any:
    return _tokenize(tokenizer, messages, max_length=max_length, truncation="right")


def _cuts_one_short(tokenizer: Any, messages: Any, *, max_length: int, truncation: str) -> Any:
    # A bound counted with a closing token reserved.
    whole = _tokenize(tokenizer, messages, max_length=1 << 30, truncation="right")
    if len(whole.input_ids) <= max_length:
        return whole
    return _tokenize(tokenizer, messages, max_length=max_length - 1, truncation=truncation)


MUTANTS: dict[str, Callable[..., Any]] = {
    "an over-long conversation keeps its last tokens": _keeps_the_last_tokens,
    "truncation=error cuts instead": _never_refuses,
    "the cut keeps one token less": _cuts_one_short,
}


@pytest.mark.parametrize("mutant", sorted(MUTANTS))
def test_a_wrong_sft_data_set_disagrees_with_upstream(
    mutant: str,
    upstream: dict[str, list[Any]],
    model_folder: Path,
    conversations_file: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(sft_data, "tokenize_conversation", MUTANTS[mutant])
    compared = [case for case in CASES if not case.get("ours_refuses")]
    differing = [
        case["id"]
        for case in compared
        if ours(case["sets"], model_folder, conversations_file, tmp_path / case["id"])
        != upstream[case["id"]][0]
    ]
    assert differing, f"the mutant {mutant!r} agrees with upstream on every case"
