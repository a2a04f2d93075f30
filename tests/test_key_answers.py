"""Every explicit key answered (issue 46): it acts here, it has no effect here, or it is undecided.

One new example per class of miss, each beside a near-identical valid twin that must stay clean:

1. dispatch decides the path: a key read in a method of a class the probes built acts there
   (``FSDPEngine._build_fsdp_module``, transformer_impl.py:401); a class no registry builds on
   the configuration (``EngineRegistry`` for the critic's strategy) puts its reads off the path;
2. values forced in code: the trainer's setup overwrites ``data.gen_batch_size`` with 1 when the
   sampler refills failed groups (verl/trainer/ppo/v1/trainer_base.py:677-684);
3. keys of another entry point: a PPO key added with ``+`` to an SFT run;
8. types from the reading code: the SFT trainer replaces the string ``"after_each_epoch"`` of its
   frequencies before any arithmetic (verl/trainer/sft_trainer.py:190-196), whatever the tree's
   int default says.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from cli_in_process import run
from corpus_facts import PINNED_VERSION, needs_release, release_root
from no_effect_reads import ROLE_READS, role_copies_out, role_reads_outside

from pytest_verl_compat.checks import off_path
from pytest_verl_compat.model import Finding, Level
from pytest_verl_compat.releases.index import load_release_index
from pytest_verl_compat.upstream.probes import statements
from pytest_verl_compat.upstream.probes.records import KEY_BUILT, KEY_READ_AT
from pytest_verl_compat.upstream.verdict import keys, sentinels

GRPO = "examples/grpo_trainer/run_qwen3_8b_fsdp.sh"
MEGATRON_GRPO = "examples/grpo_trainer/run_qwen3_30b_a3b_megatron.sh"
SFT = "examples/sft/gsm8k/run_qwen2_5_0_5b_fsdp.sh"
# The SFT script's documented arguments: <nproc_per_node> <save_path>.
SFT_ARGS = ("--arg", "8", "--arg", "/tmp/sft-ckpt")

# Every supported release (the tests read each one's files, never its environment).
SUPPORTED = load_release_index().supported_versions
RESHARD = "actor_rollout_ref.actor.fsdp_config.reshard_after_forward"
FSDP_ENGINE = "verl.workers.engine.fsdp.transformer_impl.FSDPEngine"
MEGATRON_ENGINE = "verl.workers.engine.megatron.transformer_impl.MegatronEngine"
RESHARD_READ = "verl/workers/engine/fsdp/transformer_impl.py:401"


def _script(tmp_path: Path, upstream: Path, example: str, after: str, lines: list[str]) -> Path:
    """The example script with ``lines`` (overrides) added on their own lines after ``after``."""
    text = (upstream / example).read_text(encoding="utf-8")
    assert after in text, f"{after!r} not in {example}"
    # A line of a command goes on with a backslash; a line of an array (``DATA=(``) does not.
    tail = " \\" if after.endswith("\\") else ""
    added = "".join(f"    {line}{tail}\n" for line in lines)
    tmp_path.mkdir(parents=True, exist_ok=True)
    path = tmp_path / Path(example).name
    path.write_text(text.replace(after, after + "\n" + added, 1), encoding="utf-8")
    return path


def _line_of(path: Path, text: str) -> int:
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if text in line:
            return number
    raise AssertionError(f"{text!r} not in {path}")


def _check_json(capsys: pytest.CaptureFixture[str], *args: str) -> dict[str, Any]:
    status, out, err = run(capsys, "-q", "check", "--format", "json", *args)
    assert status in (0, 1), err[-3000:]
    report = json.loads(out)
    result: dict[str, Any] = report["files"][0] if "files" in report else report
    return result


def _answer(result: dict[str, Any], key: str) -> dict[str, Any]:
    found = [a for a in result["keys"] if a["key"] == key]
    assert len(found) == 1, f"answers for {key}={found}, but should be one [{result['file']}]"
    return found[0]


def _rules(result: dict[str, Any], key: str) -> list[str]:
    return [f["rule"] for f in result["findings"] if key in f["path"].split(", ")]


# --- 1. dispatch decides the path ---------------------------------------------------------------


def _actor(strategy: str) -> dict[str, Any]:
    return {"actor_rollout_ref": {"actor": {"strategy": strategy, "fsdp_config": {}}}}


def test_a_read_in_a_method_of_a_built_class_acts_and_in_an_unbuilt_one_does_not() -> None:
    """The probes built ``FSDPEngine`` for the actor's engine section: its read at
    transformer_impl.py:401 is on this path. With the Megatron engine built instead, the same
    read is no evidence that the key acts."""
    field = f"{RESHARD}=False"

    def answer(built: str) -> keys.KeyAnswer:
        path = {KEY_READ_AT: {}, KEY_BUILT: {RESHARD.rpartition(".")[0]: [built]}}
        return keys.answer_keys([field], _actor("fsdp"), [], PINNED_VERSION, path=path)[0]

    acts = answer(FSDP_ENGINE)
    assert (acts.answer, acts.where) == (keys.ACTS, (RESHARD_READ,)), acts
    assert "read by FSDPEngine" in acts.why
    twin = answer(MEGATRON_ENGINE)
    assert twin.answer != keys.ACTS and not twin.where, twin


def test_a_class_no_registry_builds_puts_its_reads_off_the_path() -> None:
    """``critic.megatron.grad_offload`` is read only in ``MegatronEngine``
    (megatron/transformer_impl.py:198), which ``EngineRegistry.new(backend=strategy)`` builds only
    for a Megatron strategy (verl/workers/engine_workers.py:135-137): with every strategy FSDP it
    is not built; with the critic's strategy Megatron it may be."""
    key = "critic.megatron.grad_offload"
    leaves = {
        "actor_rollout_ref.actor.strategy": "fsdp",
        "actor_rollout_ref.ref.strategy": "fsdp",
        "critic.strategy": "fsdp",
        key: True,
    }
    found = off_path.static_effect(key, leaves, PINNED_VERSION)
    assert found is not None and found.kind == off_path.NOT_BUILT, found
    assert found.not_built == (MEGATRON_ENGINE,)
    assert [p.where for p in found.places] == [
        "verl/workers/engine/megatron/transformer_impl.py:198"
    ]
    assert found.deciding["critic.strategy"] == "fsdp"
    twin = off_path.static_effect(key, {**leaves, "critic.strategy": "megatron"}, PINNED_VERSION)
    assert twin is None, twin


@needs_release()
def test_explain_says_reshard_after_forward_acts_on_the_grpo_example(
    upstream_checkout: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """verl's GRPO example builds the FSDP engine: the key acts at FSDPEngine._build_fsdp_module
    (was: undecided, "guard not evaluated"). Its twin, the critic's copy of the same key, is read
    by the same class, but GRPO builds no critic: no effect (effect.no-critic-worker)."""
    upstream = ("--upstream", str(upstream_checkout))
    status, out, err = run(capsys, "-q", *upstream, "explain", RESHARD, "grpo")
    assert status == 0, err[-3000:]
    assert f"grpo: {RESHARD} = True: acts" in out
    assert f"read by FSDPEngine, which the probes built for {RESHARD.rpartition('.')[0]}" in out
    assert f"read here: {RESHARD_READ}" in out
    critic = "critic.fsdp.reshard_after_forward"
    status, out, err = run(capsys, "-q", *upstream, "explain", critic, "grpo")
    assert status == 1, err[-3000:]
    assert f"grpo: {critic} = True: no effect" in out
    assert "builds no critic worker" in out
    assert "read here:" not in out


@needs_release()
def test_a_model_flag_only_the_engines_not_built_read_has_no_effect_and_its_twin_acts(
    upstream_checkout: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """verl's Megatron GRPO example sets ``model.enable_gradient_checkpointing``, which only the
    FSDP and VeOmni engines read (fsdp/transformer_impl.py:316,459); with every strategy
    Megatron no registry builds them. The FSDP example sets the same key, and there it acts."""
    key = "actor_rollout_ref.model.enable_gradient_checkpointing"
    upstream = ("--upstream", str(upstream_checkout))
    megatron = upstream_checkout / MEGATRON_GRPO
    off = _check_json(capsys, *upstream, str(megatron))
    found = [f for f in off["findings"] if f["rule"] == "effect.off-path" and f["path"] == key]
    assert len(found) == 1, off["findings"]
    assert found[0]["location"]["line"] == _line_of(megatron, f"{key}=True")
    message = found[0]["message"]
    assert "only at verl/workers/engine/fsdp/transformer_impl.py:316,459" in message
    assert "actor_rollout_ref.actor.strategy='megatron'" in message
    assert "no registry builds FSDPEngine, VeOmniEngine" in message
    assert "=None" not in message
    answer = _answer(off, key)
    assert (answer["answer"], answer["rule"]) == (keys.NO_EFFECT, "effect.off-path"), answer
    on = _check_json(capsys, *upstream, str(upstream_checkout / GRPO))
    assert "effect.off-path" not in _rules(on, key), on["findings"]
    answer = _answer(on, key)
    assert answer["answer"] == keys.ACTS, answer
    assert "read by FSDPEngine" in answer["why"]


def test_a_finding_that_says_no_effect_answers_the_key_whatever_its_level() -> None:
    """A legacy reward key main_ppo silently ignores is an error (fields.legacy-reward-key) and
    its key has no effect (was: undecided, the answer contradicting the finding); a note (info)
    of the same rule claims nothing."""
    key = "reward_model.reward_manager"
    field = f"{key}=dapo"
    resolved = {"reward_model": {"reward_manager": "dapo"}}

    def answer(level: Level) -> keys.KeyAnswer:
        said = Finding(level, key, f"`{field}` ...", "", check="fields.legacy-reward-key")
        return keys.answer_keys([field], resolved, [said], PINNED_VERSION)[0]

    error = answer("error")
    assert (error.answer, error.rule) == (keys.NO_EFFECT, "fields.legacy-reward-key"), error
    assert answer("info").answer != keys.NO_EFFECT


# --- 2. values forced in code -------------------------------------------------------------------


@needs_release()
def test_a_value_the_trainer_overwrites_has_no_effect_and_its_twin_acts(
    upstream_checkout: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    after = "    data.train_batch_size=${train_batch_size}"
    forced = _script(
        tmp_path / "forced",
        upstream_checkout,
        GRPO,
        after,
        ["data.gen_batch_size=4", "trainer.v1.sampler.sync_refill_failed_groups=True"],
    )
    twin = _script(tmp_path / "twin", upstream_checkout, GRPO, after, ["data.gen_batch_size=4"])
    upstream = ("--upstream", str(upstream_checkout))
    status, out, err = run(capsys, "-q", *upstream, "check", str(forced))
    assert status == 0, err[-3000:]
    line = _line_of(forced, "data.gen_batch_size=4")
    warned = [x for x in out.splitlines() if "warning[effect.forced]" in x]
    assert len(warned) == 1, out
    assert warned[0].startswith(f"{forced}:{line}:5: warning[effect.forced] data.gen_batch_size:")
    assert "`data.gen_batch_size=4` has no effect here" in warned[0]
    assert "sets data.gen_batch_size = 1 at verl/trainer/ppo/v1/trainer_base.py:684" in warned[0]
    result = _check_json(capsys, *upstream, str(forced))
    answer = _answer(result, "data.gen_batch_size")
    assert (answer["answer"], answer["rule"]) == (keys.NO_EFFECT, "effect.forced"), answer
    assert _answer(result, "trainer.v1.sampler.sync_refill_failed_groups")["answer"] == keys.ACTS
    clean = _check_json(capsys, *upstream, str(twin))
    assert "effect.forced" not in _rules(clean, "data.gen_batch_size"), clean["findings"]
    assert _answer(clean, "data.gen_batch_size")["answer"] == keys.ACTS


MEGATRON_8B = "examples/grpo_trainer/run_qwen3_8b_megatron.sh"
SEQUENCE_PARALLEL = "actor_rollout_ref.actor.megatron.sequence_parallel"


@needs_release()
@pytest.mark.parametrize(
    ("tp", "sp", "forced"), [("1", "True", True), ("2", "True", False), ("1", "False", False)]
)
def test_a_value_a_config_class_forces_has_no_effect_and_its_twins_are_clean(
    upstream_checkout: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    tp: str,
    sp: str,
    forced: bool,
) -> None:
    """``McoreEngineConfig.__post_init__`` sets ``sequence_parallel = False`` when the tensor
    parallel size is 1 (verl/workers/config/engine.py:237-239 in 0.9.0), a line the probes do not
    see run as a write. Every read of the field is on that dataclass (the engine, Megatron's
    TransformerConfig built from it), so the script's True never acts. Twins: with TP 2 nothing
    is forced; writing the value upstream forces says nothing wrong."""
    after = "    actor_rollout_ref.actor.megatron.tensor_model_parallel_size=${actor_tp}"
    script = _script(tmp_path, upstream_checkout, MEGATRON_8B, after, [f"{SEQUENCE_PARALLEL}={sp}"])
    # The script's own knob for the tensor parallel size (``actor_tp=${ACTOR_TP:-2}``).
    upstream = ("--upstream", str(upstream_checkout))
    result = _check_json(capsys, *upstream, "--env", f"ACTOR_TP={tp}", str(script))
    assert ("effect.forced" in _rules(result, SEQUENCE_PARALLEL)) is forced, result["findings"]
    answer = _answer(result, SEQUENCE_PARALLEL)
    if forced:
        assert (answer["answer"], answer["rule"]) == (keys.NO_EFFECT, "effect.forced"), answer
        found = next(f for f in result["findings"] if f["rule"] == "effect.forced")
        assert found["location"]["line"] == _line_of(script, f"{SEQUENCE_PARALLEL}={sp}")
        assert "verl/workers/config/engine.py:239" in found["message"]
    else:
        assert answer["answer"] != keys.NO_EFFECT, answer


# --- 3. keys of another entry point -------------------------------------------------------------


@needs_release()
def test_a_ppo_key_added_to_an_sft_run_has_no_effect_and_its_twin_is_clean(
    upstream_checkout: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before: the RL checks read the SFT tree that ``+algorithm…`` made look like one, and check
    stopped on an internal error (KeyError: 'algorithm')."""
    after = "    -m verl.trainer.sft_trainer \\"
    other = _script(
        tmp_path / "other", upstream_checkout, SFT, after, ["+algorithm.adv_estimator=grpo"]
    )
    twin = _script(
        tmp_path / "twin",
        upstream_checkout,
        SFT,
        after,
        ["+model.override_config.attn_implementation=eager"],
    )
    upstream = ("--upstream", str(upstream_checkout))
    status, out, err = run(capsys, "-q", *upstream, "check", str(other), *SFT_ARGS)
    assert status == 0, err[-3000:]
    line = _line_of(other, "+algorithm.adv_estimator=grpo")
    warned = [x for x in out.splitlines() if "warning[sft.other-entry-key]" in x]
    assert len(warned) == 1, out
    assert warned[0].startswith(
        f"{other}:{line}:6: warning[sft.other-entry-key] algorithm.adv_estimator: "
        "`+algorithm.adv_estimator=grpo` has no effect here"
    )
    result = _check_json(capsys, *upstream, str(other), *SFT_ARGS)
    answer = _answer(result, "algorithm.adv_estimator")
    assert (answer["answer"], answer["rule"]) == (keys.NO_EFFECT, "sft.other-entry-key"), answer
    clean = _check_json(capsys, *upstream, str(twin), *SFT_ARGS)
    assert not [f for f in clean["findings"] if f["rule"] == "sft.other-entry-key"]
    assert _answer(clean, "model.override_config.attn_implementation")["answer"] != keys.NO_EFFECT


@needs_release()
@pytest.mark.parametrize(
    ("example", "written", "fires"),
    [
        (GRPO, "actor_rollout_ref.model.lora.rank=16", True),
        (GRPO, "actor_rollout_ref.model.lora_rank=16", False),
        (MEGATRON_8B, "actor_rollout_ref.model.lora_rank=16", True),
        (MEGATRON_8B, "actor_rollout_ref.model.lora.rank=16", False),
    ],
)
def test_a_lora_rank_in_the_other_engines_spelling_is_named_and_its_twin_is_clean(
    upstream_checkout: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    example: str,
    written: str,
    fires: bool,
) -> None:
    """FSDP trains LoRA from model.lora_rank, Megatron from model.lora (transformer_impl.py:143,
    :340-349; megatron/transformer_impl.py:422-424): the other spelling's rank only makes the
    trainer drop the reference worker (trainer_base.py:317-320)."""
    text = (upstream_checkout / example).read_text(encoding="utf-8")
    after = next(
        line
        for line in text.splitlines()
        if line.strip().startswith("actor_rollout_ref.model.path=")
    )
    script = _script(tmp_path, upstream_checkout, example, after, [written])
    result = _check_json(capsys, "--upstream", str(upstream_checkout), str(script))
    key = written.partition("=")[0]
    found = [f for f in result["findings"] if f["rule"] == "fields.lora-other-engine-spelling"]
    assert bool(found) is fires, result["findings"]
    if fires:
        assert found[0]["path"] == key
        assert found[0]["location"]["line"] == _line_of(script, written)


@pytest.mark.parametrize("version", SUPPORTED)
def test_the_sft_trainer_and_what_it_imports_never_read_the_ray_world_keys(version: str) -> None:
    """The evidence of sft.world-from-torchrun on each release's files: no code the SFT trainer
    reaches by import reads n_gpus_per_node or nnodes (a read in a module it imports counts
    unless it sits in a function or class the trainer does not import, like main_ppo's
    validate_config beside omega_conf_to_dataclass in verl/utils/config.py); the Ray SFT entry
    point does read them (sft_trainer_ray.py), so the scan sees reads at all."""
    import ast

    root = release_root(version)

    def reads(relative: str, names: set[str] | None) -> list[str]:
        """Reads in ``relative``: in every top-level definition named in ``names`` and at module
        level (``names`` None: the whole file)."""
        tree = ast.parse((root / relative).read_text(encoding="utf-8"))
        found = []
        for top in tree.body:
            named = getattr(top, "name", None)
            if names is not None and named is not None and named not in names:
                continue
            found += [
                f"{relative}:{n.lineno}"
                for n in ast.walk(top)
                if isinstance(n, ast.Attribute) and n.attr in ("n_gpus_per_node", "nnodes")
            ]
        return found

    trainer = "verl/trainer/sft_trainer.py"
    imported: dict[str, set[str]] = {}
    for node in ast.walk(ast.parse((root / trainer).read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("verl."):
            base = root / node.module.replace(".", "/")
            for candidate in (base.with_suffix(".py"), base / "__init__.py"):
                if candidate.is_file():
                    names = imported.setdefault(candidate.relative_to(root).as_posix(), set())
                    names |= {alias.name for alias in node.names}
    assert len(imported) > 5, imported
    found = reads(trainer, None) + [r for f, n in sorted(imported.items()) for r in reads(f, n)]
    assert found == []
    assert reads("verl/trainer/sft_trainer_ray.py", None)


@needs_release()
@pytest.mark.parametrize(
    ("key", "fires"), [("trainer.nnodes=1", True), ("trainer.total_epochs=2", False)]
)
def test_a_ray_world_key_under_torchrun_has_no_effect_and_its_twin_is_clean(
    upstream_checkout: Path, capsys: pytest.CaptureFixture[str], key: str, fires: bool
) -> None:
    script = upstream_checkout / SFT
    result = _check_json(
        capsys, "--upstream", str(upstream_checkout), str(script), *SFT_ARGS, "--set", key
    )
    named = [f["path"] for f in result["findings"] if f["rule"] == "sft.world-from-torchrun"]
    assert named == ([key.partition("=")[0]] if fires else []), result["findings"]


# --- a role the run never starts ------------------------------------------------------------------


@pytest.mark.parametrize("role", sorted(ROLE_READS))
@pytest.mark.parametrize("version", SUPPORTED)
def test_every_read_of_a_role_section_waits_for_the_role(version: str, role: str) -> None:
    """The evidence of effect.no-critic-worker and effect.no-reference-worker, checked on each
    release's own files: every read of the role's section waits for the role, and no leaf
    outside the section copies one of its leaves by interpolation."""
    seen, outside = role_reads_outside(release_root(version), role)
    assert seen > 5, f"the scan saw {seen} reads of the {role} section: it reads nothing"
    assert outside == [], outside
    assert role_copies_out(release_root(version), role) == []


@needs_release()
@pytest.mark.parametrize(
    ("overrides", "fires"),
    [
        (["critic.optim.lr=2e-5", "critic.ppo_micro_batch_size_per_gpu=4"], True),
        (
            ["critic.enable=True", "critic.optim.lr=2e-5", "critic.ppo_micro_batch_size_per_gpu=4"],
            False,
        ),
        (["algorithm.adv_estimator=gae", "critic.optim.lr=2e-5"], False),
        (["critic.enable=False"], False),
        (
            [
                "actor_rollout_ref.actor.use_kl_loss=False",
                "actor_rollout_ref.ref.fsdp_config.param_offload=True",
            ],
            True,
        ),
        (["actor_rollout_ref.ref.fsdp_config.param_offload=True"], False),
        (
            [
                "actor_rollout_ref.actor.use_kl_loss=False",
                "algorithm.use_kl_in_reward=True",
                "actor_rollout_ref.ref.fsdp_config.param_offload=True",
            ],
            False,
        ),
    ],
)
def test_a_key_of_a_role_the_run_never_starts_has_no_effect_and_its_twins_are_clean(
    upstream_checkout: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    overrides: list[str],
    fires: bool,
) -> None:
    # ``--set`` wins over the script's own keys (its actor sets use_kl_loss=True).
    sets = [arg for override in overrides for arg in ("--set", override)]
    script = upstream_checkout / GRPO
    result = _check_json(capsys, "--upstream", str(upstream_checkout), str(script), *sets)
    rules = ("effect.no-critic-worker", "effect.no-reference-worker")
    named = sorted(f["path"] for f in result["findings"] if f["rule"] in rules)
    role_keys = sorted(
        o.partition("=")[0]
        for o in overrides
        if o.startswith(("critic.", "actor_rollout_ref.ref."))
        and o != "critic.enable=False"
        and not o.startswith("critic.enable")
    )
    # The script's own reference keys are named too when no reference runs.
    assert set(role_keys) <= set(named) if fires else named == [], result["findings"]
    for key in role_keys if fires else []:
        answer = _answer(result, key)
        assert answer["answer"] == keys.NO_EFFECT and answer["rule"] in rules, answer


# --- 8. types from the reading code -------------------------------------------------------------


@pytest.mark.parametrize("version", SUPPORTED)
def test_the_sft_trainer_replaces_its_frequency_sentinel(version: str) -> None:
    """The read ``self.save_freq = self.config.trainer.save_freq`` is followed by an ``if`` that
    compares it to "after_each_epoch" and assigns it again (sft_trainer.py:190-192 in 0.9.0),
    in every supported release's own files."""
    root = release_root(version)
    relative = "verl/trainer/sft_trainer.py"
    source = statements.parse(str(root / relative), relative)
    assert source is not None
    text = (root / relative).read_text(encoding="utf-8").splitlines()
    reads = {
        name: next(i for i, x in enumerate(text, 1) if f"self.config.trainer.{name}" in x)
        for name in ("save_freq", "test_freq", "total_epochs")
    }
    assert sentinels.replaced_strings(source, reads["save_freq"]) == {"after_each_epoch"}
    assert sentinels.replaced_strings(source, reads["test_freq"]) == {"after_each_epoch"}
    assert sentinels.replaced_strings(source, reads["total_epochs"]) == set()
    read_at = {"trainer.save_freq": [f"{relative}:{reads['save_freq']}"]}
    where = sentinels.accepted("trainer.save_freq", "after_each_epoch", read_at, root)
    assert where == f"{relative}:{reads['save_freq']}"
    assert sentinels.accepted("trainer.save_freq", "sometimes", read_at, root) is None
    assert sentinels.accepted("trainer.save_freq", 5, read_at, root) is None


@pytest.mark.parametrize("version", SUPPORTED)
def test_the_derived_string_sentinels_are_each_releases_own(version: str) -> None:
    """data/string_sentinels.yaml equals what each entry module's own code replaces, read again
    from the release's files; main_ppo's own module replaces none, so it lists none."""
    from pytest_verl_compat.checks.types import _string_sentinels
    from pytest_verl_compat.cli.release_steps import _string_sentinel_modules

    root = release_root(version)
    derived = {}
    for module in _string_sentinel_modules():
        relative = module.replace(".", "/") + ".py"
        source = statements.parse(str(root / relative), relative)
        found = sentinels.module_sentinels(source) if source is not None else {}
        if found:
            derived[module] = found
    assert _string_sentinels()[version] == derived, "stale: release derive --only string-sentinels"
    assert set(derived["verl.trainer.sft_trainer"]) == {"trainer.save_freq", "trainer.test_freq"}
    assert "verl.trainer.main_ppo" not in derived


def test_a_key_read_as_it_is_anywhere_in_the_module_has_no_sentinel() -> None:
    """One read that uses the value as it is, beside one that replaces the string, and the
    string reaches the arithmetic: the key is not listed."""
    import ast

    text = (
        "class T:\n"
        "    def a(self):\n"
        "        self.f = self.config.trainer.save_freq\n"
        "        if self.f == 'after_each_epoch':\n"
        "            self.f = 3\n"
        "    def b(self):\n"
        "        return 10 % self.config.trainer.save_freq\n"
    )
    replaced_only = text.split("    def b")[0]
    for body, listed in ((text, False), (replaced_only, True)):
        source = statements.Source("verl/t.py", ast.parse(body), body.splitlines())
        found = sentinels.module_sentinels(source)
        assert ("trainer.save_freq" in found) is listed, found
        if listed:
            assert found["trainer.save_freq"] == {"after_each_epoch": "verl/t.py:3"}


@needs_release()
def test_without_upstream_checks_the_sentinel_is_accepted_and_its_twin_is_not(
    upstream_checkout: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The static answer (no probes): the release's derived sentinels accept the SFT trainer's
    "after_each_epoch"; any other string, and the same string for main_ppo, stay wrong types."""
    after = "    -m verl.trainer.sft_trainer \\"
    static = ("--upstream", str(upstream_checkout), "--no-upstream-checks")
    results = {}
    for value in ("after_each_epoch", "sometimes"):
        script = _script(
            tmp_path / value, upstream_checkout, SFT, after, [f"trainer.save_freq={value}"]
        )
        results[value] = _check_json(capsys, *static, str(script), *SFT_ARGS)
    assert "types.wrong-type" not in _rules(results["after_each_epoch"], "trainer.save_freq")
    assert _rules(results["sometimes"], "trainer.save_freq") == ["types.wrong-type"]
    ppo = _check_json(
        capsys,
        *static,
        str(upstream_checkout / GRPO),
        "--set",
        "trainer.save_freq=after_each_epoch",
    )
    assert _rules(ppo, "trainer.save_freq") == ["types.wrong-type"], ppo["findings"]


@needs_release()
def test_a_string_sentinel_the_reader_accepts_is_no_wrong_type_and_its_twin_is(
    upstream_checkout: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    after = "    -m verl.trainer.sft_trainer \\"
    upstream = ("--upstream", str(upstream_checkout))
    results = {}
    for value in ("after_each_epoch", "sometimes"):
        script = _script(
            tmp_path / value, upstream_checkout, SFT, after, [f"trainer.save_freq={value}"]
        )
        results[value] = _check_json(capsys, *upstream, str(script), *SFT_ARGS)
    accepted = results["after_each_epoch"]
    assert "types.wrong-type" not in _rules(accepted, "trainer.save_freq"), accepted["findings"]
    assert accepted["valid"] is True
    answer = _answer(accepted, "trainer.save_freq")
    assert answer["answer"] == keys.ACTS
    assert any(re.fullmatch(r"verl/trainer/sft_trainer\.py:\d+", w) for w in answer["where"])
    wrong = results["sometimes"]
    assert _rules(wrong, "trainer.save_freq") == ["types.wrong-type"], wrong["findings"]
    assert wrong["valid"] is False
