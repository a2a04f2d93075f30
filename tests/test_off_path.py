"""``effect.off-path`` (issue 29, "no-effect findings by path"): an explicit key whose every read
the configuration's own values rule out is a warning; each path class fires on its example and
stays quiet on a near-identical valid twin, and a key the reading cannot follow stays quiet."""

from __future__ import annotations

import dataclasses
import itertools
import json
import re
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from corpus_facts import needs_release

from pytest_verl_compat.checks import off_path as check
from pytest_verl_compat.checks.registry import CHECKS, yield_to_others
from pytest_verl_compat.model import Case, Finding
from pytest_verl_compat.pipeline.audit import AuditSession
from pytest_verl_compat.upstream.verdict.case import check_case

RULE = "effect.off-path"
VERSION = "0.9.0"
FULLY_ASYNC = "examples/mtp_trainer/run_mimo_7b_mtp_fully_async_megatron_multinode.sh"
MEGATRON = "examples/gpg_trainer/run_qwen3_8b_megatron.sh"
_ids = itertools.count()


@pytest.fixture(scope="module")
def session(upstream_session: AuditSession) -> AuditSession:
    return upstream_session


def _case(session: AuditSession, base: str, overrides: Sequence[str]) -> Case:
    """A manifest case or an upstream example script plus ``overrides``, composed."""
    if base.endswith(".sh"):
        assert session.upstream is not None
        case: Case = session.case_for_script(session.upstream.root / base)
    else:
        assert session.manifest is not None
        case = session.manifest.case(base)
    case = dataclasses.replace(case, id=f"{case.id}+off-path{next(_ids)}")
    case = session.with_overrides(case, tuple(overrides))
    assert session.outcome(case).composition.composed, session.outcome(case).composition.reason
    return case


def _findings(session: AuditSession, base: str, overrides: Sequence[str]) -> list[Finding]:
    """Every static finding of the case (upstream's own checks are not asked: the rule is
    static)."""
    return list(check_case(session, _case(session, base, overrides), None).findings)


def _off_path(session: AuditSession, base: str, overrides: Sequence[str]) -> list[Finding]:
    return [f for f in _findings(session, base, overrides) if f.check == RULE]


# Each path class: (base, the overrides that fire, the key, the deciding leaf in the message, the
# upstream line it names, the near-identical valid twin's overrides).
CLASSES = {
    # FSDP1-only: FSDPEngine._build_fsdp_module passes use_orig_params only under
    # `if self.engine_config.strategy == "fsdp"` (verl/workers/engine/fsdp/transformer_impl.py:
    # 404-428), and the engine config's strategy is the actor's (verl/workers/config/actor.py:329).
    "engine: an FSDP1 option under FSDP2": (
        "grpo",
        (
            "actor_rollout_ref.actor.strategy=fsdp2",
            "actor_rollout_ref.actor.fsdp_config.use_orig_params=True",
        ),
        "actor_rollout_ref.actor.fsdp_config.use_orig_params",
        "actor_rollout_ref.actor.strategy='fsdp2'",
        "verl/workers/engine/fsdp/transformer_impl.py:428",
        (
            "actor_rollout_ref.actor.strategy=fsdp",
            "actor_rollout_ref.actor.fsdp_config.use_orig_params=True",
        ),
    ),
    # A size read only when its flag is on: the FSDP engine chunks the entropy with
    # entropy_from_logits_chunk_size only `if self.engine_config.entropy_from_logits_with_chunking`
    # (verl/workers/engine/fsdp/transformer_impl.py:1360-1364); the other engines' places are
    # ruled out by the dispatch.
    "mode: a chunk size whose flag is off": (
        "grpo",
        ("actor_rollout_ref.actor.fsdp_config.entropy_from_logits_chunk_size=1024",),
        "actor_rollout_ref.actor.fsdp_config.entropy_from_logits_chunk_size",
        "actor_rollout_ref.actor.fsdp_config.entropy_from_logits_with_chunking=False",
        "verl/workers/engine/fsdp/transformer_impl.py:1364",
        (
            "actor_rollout_ref.actor.fsdp_config.entropy_from_logits_with_chunking=True",
            "actor_rollout_ref.actor.fsdp_config.entropy_from_logits_chunk_size=1024",
        ),
    ),
    # The trainer reads resume_from_path only under resume_mode == "resume_path"
    # (verl/trainer/ppo/v1/trainer_base.py:793-807).
    "resume mode: a resume path under resume_mode=auto": (
        "grpo",
        ("trainer.resume_mode=auto", "trainer.resume_from_path=ckpt/global_step_10"),
        "trainer.resume_from_path",
        "trainer.resume_mode='auto'",
        "verl/trainer/ppo/v1/trainer_base.py:805-807",
        ("trainer.resume_mode=resume_path", "trainer.resume_from_path=ckpt/global_step_10"),
    ),
    # A loading source: MegatronEngine loads the weights from dist_checkpointing_path only
    # `if self.engine_config.use_dist_checkpointing`, else from the Hugging Face model
    # (verl/workers/engine/megatron/transformer_impl.py:490-492).
    "loading source: a dist-checkpoint path while loading Hugging Face weights": (
        MEGATRON,
        ("actor_rollout_ref.actor.megatron.dist_checkpointing_path=/ckpt/dist",),
        "actor_rollout_ref.actor.megatron.dist_checkpointing_path",
        "actor_rollout_ref.actor.megatron.use_dist_checkpointing=False",
        "verl/workers/engine/megatron/transformer_impl.py:492",
        (
            "actor_rollout_ref.actor.megatron.use_dist_checkpointing=True",
            "actor_rollout_ref.actor.megatron.dist_checkpointing_path=/ckpt/dist",
        ),
    ),
}


@pytest.mark.parametrize("path_class", sorted(CLASSES))
def test_each_path_class_fires_and_its_twin_does_not(
    session: AuditSession, path_class: str
) -> None:
    base, fires, key, deciding, where, twin = CLASSES[path_class]
    found = _off_path(session, base, fires)
    assert [f.path for f in found] == [key], f"[{path_class}] {found}"
    message = found[0].message
    assert f"`{fires[-1]}`" in message  # the key as the user wrote it
    assert deciding in message and where in message, message
    assert found[0].level == "warning"
    assert _off_path(session, base, twin) == [], f"[{path_class}] fires on its valid twin"


@pytest.mark.parametrize(
    "overrides",
    [
        # Read under `strategy == "fsdp2"` and also as a dict key ("offload_policy",
        # fsdp/transformer_impl.py:449) the reading cannot attribute: never claimed.
        ("actor_rollout_ref.actor.fsdp_config.offload_policy=True",),
        # A key the tree lacks, read by Megatron through a whole dict: not in the index.
        ("+actor_rollout_ref.actor.fsdp_config.wrap_policy.extra=1",),
        # A key deleted, not set.
        (
            "actor_rollout_ref.actor.strategy=fsdp2",
            "~actor_rollout_ref.actor.fsdp_config.use_orig_params",
        ),
        # A key read on the path (the KL loss is on in grpo).
        ("actor_rollout_ref.actor.kl_loss_coef=0.01",),
    ],
)
def test_keys_the_reading_cannot_rule_out_stay_quiet(
    session: AuditSession, overrides: tuple[str, ...]
) -> None:
    findings = _findings(session, "grpo", overrides)
    assert not any(f.check == RULE for f in findings), findings


@pytest.mark.parametrize("base", ["grpo", FULLY_ASYNC])
def test_a_key_another_rule_speaks_of_is_said_once(session: AuditSession, base: str) -> None:
    """A legacy reward loop's module path is read only with a reward_loop_source
    (verl/experimental/reward_loop/reward_loop.py:53-55), yet the profile's no-effect warning
    already speaks of it: the off-path warning yields, as it yields to upstream's effect
    findings."""
    key = "reward_model.reward_loop_module_path"
    fields = (f"{key}=my_reward.py",)
    found = _findings(session, base, fields)
    rules = [f.check for f in found if f.path == key]
    assert rules and RULE not in rules, rules
    resolved = session.outcome(_case(session, base, fields)).composition.mapping
    assert [k for _, k, _, _ in check.off_path_keys(resolved, fields, VERSION)] == [key]


def test_yielding_is_by_rule_and_key() -> None:
    overridden = Finding("warning", "a.b", "x", check="effect.overridden")
    mine = Finding("warning", "a.b", "y", check=RULE)
    other_key = Finding("warning", "a.c", "z", check=RULE)
    assert yield_to_others([mine, overridden, other_key]) == [overridden, other_key]
    assert "effect.overridden" in CHECKS[RULE].yields_to


def _place(*guard: str) -> check.Place:
    return check.Place("verl/x.py:3", tuple(guard))


@pytest.mark.parametrize(
    ("guard", "ruled_out"),
    [
        (("L['a.flag']",), {"a.flag": False}),
        (("L['a.mode'] == 'fast'",), None),
        (("L['a.mode'] == 'fast'", "L['a.flag']"), {"a.flag": False}),
        (("L['a.mode'] in ['slow', 'medium']",), {"a.mode": "fast"}),
        (("not L['a.flag'] and L['a.size'] > 1",), None),
        (("UNKNOWN",), None),
        (("UNKNOWN and L['a.flag']",), {"a.flag": False}),
        (("UNKNOWN or L['a.flag']",), None),
        (("L['a.absent']",), None),
        (("L['a']",), None),  # a section, not a value
        (("L['a.missing'] == 'fsdp'",), None),  # a mandatory value not given
        # Nothing but the normal form is evaluated, and nothing is executed.
        (("__import__('os').system('false')",), None),
        (("L['a.size'] + 1 == 0",), None),
        (("L['a.size'] < 'x'",), None),
    ],
)
def test_a_guard_is_ruled_out_only_when_decidedly_false(
    guard: tuple[str, ...], ruled_out: dict[str, object] | None
) -> None:
    leaves = {"a": {"flag": False}, "a.flag": False, "a.mode": "fast", "a.size": 2}
    leaves["a.missing"] = "???"
    assert check.ruled_out(_place(*guard), leaves) == ruled_out


def test_a_release_without_data_has_no_finding() -> None:
    assert check.off_path_reads("0.0.0") == {}
    assert list(check.off_path_keys({"a": 1}, ("a=1",), "0.0.0")) == []


def test_the_shipped_index_reads_each_leaf_only_under_guards() -> None:
    """``data/off_path_reads.json`` (what the check reads without verl), per release: every leaf
    the census saw read, each place at a line of a verl module with its guard in normal form
    (conjuncts on ``L[...]`` leaves), ``complete`` only where the census saw every read; each
    class a registry builds with the condition on its selecting leaves (``D[...]``). That the
    file is what each release gives is checked by ``release derive --only reads --check``."""
    from pytest_verl_compat.upstream.census import off_path

    data = off_path.DATA_FILE
    index = json.loads(data.read_text(encoding="utf-8"))
    assert index and all(index.values())
    for release in index.values():
        assert sorted(release) == ["classes", "leaves"]
        assert any(item.get("complete") for item in release["leaves"].values())
        for item in release["leaves"].values():
            for place in item["places"]:
                assert re.fullmatch(r"verl/\S+\.py:\d+", place["where"]), place
                assert all(c.count("L[") or c.count("UNKNOWN") for c in place["guard"]), place
        assert release["classes"] and all("D[" in c for c in release["classes"].values())


def test_a_block_a_library_reads_is_never_claimed_without_effect() -> None:
    """verl hands the LoRA block to Megatron-Bridge (``create_peft(lora_cfg)``,
    verl/workers/config/megatron_peft.py:30) and the transfer queue's to TransferQueue
    (``tq.init(config.transfer_queue)``, verl/trainer/main_ppo.py:150): keys no verl line names,
    read by the library (verl's own example run_qwen3_30b_a3b_megatron.sh sets
    lora_A_init_method), stay out of the index on every release; a key no code names at all
    (``actor_rollout_ref.nccl_timeout``, read by no class of 0.9.0) stays in."""
    from pytest_verl_compat.upstream.census import off_path

    index = json.loads(off_path.DATA_FILE.read_text(encoding="utf-8"))
    for version, release in index.items():
        leaves = release["leaves"]
        for leaf in (
            "actor_rollout_ref.model.lora.lora_A_init_method",
            "critic.model.lora.freeze_vision_model",
            "transfer_queue.backend.storage_backend",
        ):
            assert leaf in leaves and not leaves[leaf].get("complete"), (version, leaf)
    assert index["0.9.0"]["leaves"]["actor_rollout_ref.nccl_timeout"].get("complete")


@needs_release()
def test_explain_says_what_check_says(upstream_checkout: Path) -> None:
    """``explain`` judges a key of the index as ``check`` does: the engine's strategy is the
    actor's (verl/workers/config/actor.py:329), not fsdp_config's own tree value."""
    key = "actor_rollout_ref.actor.fsdp_config.use_orig_params"
    cli = (
        sys.executable,
        "-m",
        "pytest_verl_compat.cli",
        "-q",
        "--upstream",
        str(upstream_checkout),
    )
    sets = ("--set", "actor_rollout_ref.actor.strategy=fsdp2", "--set", f"{key}=True")
    done = subprocess.run(
        [*cli, "explain", key, "grpo", *sets],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 1, done.stderr[-3000:]
    assert f"grpo: {key} = True: no effect" in done.stdout
    assert (
        "off this path: verl/workers/engine/fsdp/transformer_impl.py:428  "
        "[actor_rollout_ref.actor.strategy='fsdp2']" in done.stdout
    )


# A package shaped like verl's, each leaf of it one class of what keeps a key out of the index.
_PACKAGE = {
    "verl/trainer/ppo/trainer.py": """
class Trainer:
    def fit(self):
        if self.config.trainer.mode == "a":
            print(self.config.trainer.path_a)
        if self.config.trainer.mode == "b":
            print(self.config.other.spread_key)
        if self.config.trainer.flag:
            print(self.config.trainer.used_elsewhere)
        if self.config.trainer.mode == "c":
            print(self.config.trainer.copied_key)
        print(self.config.trainer.unguarded)
        if self.config.trainer.reassigned == 1:
            print(self.config.trainer.behind_reassigned)
""",
    "verl/utils/helpers.py": """
def helper(obj):
    return obj.used_elsewhere
""",
    "verl/utils/sft_helpers.py": """
def sft_only(obj):
    return obj.path_a
""",
    "verl/trainer/sft.py": """
import hydra


@hydra.main(config_path="config", config_name="sft")
def main(config):
    sft_only(config)
""",
    "verl/trainer/config/sft.yaml": "trainer: {}\n",
    "verl/trainer/config/ppo_trainer.yaml": "foo: ${oc.select:trainer.copied_key,null}\n",
    "verl/workers/spread.py": """
def log(self):
    for key in self.config.other.items():
        print(key)
""",
    "verl/workers/reassign.py": """
def setup(config):
    config.trainer.reassigned = 2
""",
    # A section handed to a library (verl/workers/config/megatron_peft.py:22-30 hands the LoRA
    # block to Megatron-Bridge's create_peft): whatever names it reads there, its leaves may act.
    "verl/workers/peft.py": """
def get_peft(model_config):
    from bridge.peft import create_peft

    lora_cfg = model_config.lora
    return create_peft(lora_cfg)
""",
    # OmegaConf's helpers are modelled (open_dict reads nothing): the twin that keeps it in.
    "verl/workers/writable.py": """
from omegaconf import open_dict


def widen(config):
    with open_dict(config.plain):
        pass
""",
    "verl/workers/engine/base.py": "class EngineRegistry:\n    pass\n",
    "verl/workers/engine/alpha.py": """
class AlphaEngine:
    def __init__(self):
        print(self.engine_config.alpha_only)


@EngineRegistry.register(model_type="language_model", backend=["alpha"])
class AlphaEngineWithLMHead(AlphaEngine):
    pass
""",
    "verl/workers/config/actor.py": """
class ActorConfig(BaseConfig):
    def __post_init__(self):
        self.engine = self.fsdp
        object.__setattr__(self.engine, "strategy", self.strategy)
""",
}
_TREE = {
    "trainer": {
        "mode": "a",
        "path_a": None,
        "flag": False,
        "used_elsewhere": 1,
        "copied_key": 1,
        "unguarded": 1,
        "reassigned": 1,
        "behind_reassigned": 1,
    },
    "other": {"spread_key": 1},
    # Named nowhere: never read, but for the library the block is handed to.
    "model": {"lora": {"init_method": "xavier"}},
    "plain": {"never_named": 1},
    "actor": {
        "_target_": "verl.workers.config.actor.ActorConfig",
        "strategy": "beta",
        "fsdp": {
            "_target_": "verl.workers.config.engine.FSDPEngineConfig",
            "strategy": "alpha",
            "alpha_only": 1,
        },
    },
}


def _index(root: Path, leave_out: str = "") -> dict[str, Any]:
    from pytest_verl_compat.upstream.census import off_path

    for relative, text in _PACKAGE.items():
        if relative != leave_out:
            path = root / relative
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text.lstrip("\n"), encoding="utf-8")
    return off_path.build(root, {"ppo_trainer": _TREE}, {})


def test_the_index_keeps_only_the_leaves_whose_every_read_it_has_seen(tmp_path: Path) -> None:
    """Out: a section iterated (spread_key) or handed to a library (lora), a use of the name
    elsewhere (used_elsewhere), an
    interpolation copying the key (copied_key), a read with no guard (unguarded), a guard on a
    value verl reassigns (behind_reassigned). In: a guarded read (path_a; its use in a helper
    only another tree's entry point calls does not count), an engine's read (alpha_only) with the
    dispatch on the strategy the config class copies from the section above."""
    built = _index(tmp_path)["leaves"]
    complete = sorted(leaf for leaf, item in built.items() if item.get("complete"))
    for out in ("other.spread_key", "trainer.used_elsewhere", "trainer.copied_key"):
        assert out in built and out not in complete, out
    assert {"actor.fsdp.alpha_only", "trainer.path_a", "plain.never_named"} <= set(complete)
    assert "model.lora.init_method" in built and "model.lora.init_method" not in complete
    assert built["trainer.path_a"]["places"][0]["guard"] == ["L['trainer.mode'] == 'a'"]
    # The engine config's strategy is the actor's (copied in ActorConfig.__post_init__).
    assert built["actor.fsdp.alpha_only"]["places"][0]["guard"] == [
        "L['actor.strategy'] in ['alpha']"
    ]
    # A guard on a value verl reassigns decides nothing: the place stays open (never ruled out).
    assert built["trainer.behind_reassigned"]["places"][0]["open"] == 1


@pytest.mark.parametrize(
    ("leave_out", "leaf", "enters"),
    [
        ("verl/workers/spread.py", "other.spread_key", True),
        ("verl/utils/helpers.py", "trainer.used_elsewhere", True),
        ("verl/trainer/config/ppo_trainer.yaml", "trainer.copied_key", True),
        ("verl/workers/reassign.py", "trainer.reassigned", True),
        ("verl/workers/peft.py", "model.lora.init_method", True),
        # With no caller left, the helper may be anyone's: its use counts again.
        ("verl/trainer/sft.py", "trainer.path_a", False),
    ],
)
def test_each_cause_alone_keeps_its_leaf_out(
    tmp_path: Path, leave_out: str, leaf: str, enters: bool
) -> None:
    def complete(index: dict[str, Any]) -> bool:
        return bool(index["leaves"].get(leaf, {}).get("complete"))

    assert not complete(_index(tmp_path / "all")) or not enters
    assert complete(_index(tmp_path / "without", leave_out)) is enters
