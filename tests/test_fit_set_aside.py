"""``fit`` (and ``check --gpu``) on a launch written for another verl: the overrides whose keys the
release's tree does not have are each an error at their line, and the forecast is of the launch
without them (a ``+key=value`` whose key the tree has: applied as ``key=value``), the same bytes
as the launch a user would write without them; a key in a section the tree lacks (another
engine's), or a rejection of another kind, is still refused in one line."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
from test_fit_cli import WAYS_LAUNCH, _one_line_error, _schema, run

from pytest_verl_compat.model import COMPOSED, COMPOSITION_REJECTION, Composition
from pytest_verl_compat.pipeline.set_aside import _closest, _first_absent, compose_setting_aside

# verl's GRPO launch as test_fit_cli's ways script writes it, its variables bound in the script
LAUNCH = WAYS_LAUNCH.format(condition="MBS=4\nNAME=stale").replace(
    "ppo_mini_batch_size=64 \\\n", "ppo_mini_batch_size=64 \\\n{extra}"
)
FIRST_EXTRA_LINE = 12
# Keys verl 0.9.0's tree does not have, each a leaf of a section it has: an FSDP flag removed in
# early 2025, a loss flag loss_agg_mode replaced, a reward-model micro-batch that became
# micro_batch_size_per_gpu
STALE = (
    "actor_rollout_ref.actor.fsdp_config.grad_offload=False",
    "actor_rollout_ref.actor.use_token_level_loss=True",
    "reward_model.micro_batch_size=16",
)


def _launch(folder: Path, name: str, *extra: str) -> str:
    script = folder / name
    script.write_text(LAUNCH.replace("{extra}", "".join(f"  {line} \\\n" for line in extra)))
    return str(script)


def _tables(out: str) -> str:
    """The forecast's tables: the text between the header's assumptions and the findings."""
    body = out.split("\n\n", 1)[1]
    return body.split("\n\n/")[0].rstrip("\n")


def test_stale_keys_are_errors_at_their_lines_and_the_rest_is_forecast(
    here: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    clean = _launch(here, "clean.sh")
    stale = _launch(here, "stale.sh", *STALE)
    status, plain, _ = run(capsys, "fit", clean, "--gpu", "H100")
    assert status == 0 and "error[compose]" not in plain and "rejects" not in plain
    status, out, err = run(capsys, "fit", stale, "--gpu", "H100")
    assert status == 1, err  # the launch as written does not start
    errors = [line for line in out.splitlines() if "error[compose]" in line]
    assert len(errors) == len(STALE), out
    for line_no, (error, written) in enumerate(
        zip(errors, STALE, strict=True), start=FIRST_EXTRA_LINE
    ):
        key = written.split("=", 1)[0]
        assert error.startswith(f"{stale}:{line_no}:3: error[compose] {key}: `{written}`"), error
        assert "the forecast is of the launch without it" in error
    assert "assumes: the launch without the 3 override(s) verl 0.9.0's tree rejects" in out
    # what is forecast is the launch without them, to the byte
    assert _tables(out) == _tables(plain)


def test_an_added_key_the_tree_has_is_applied_as_hydra_would_take_it(
    here: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``+key=value`` where the tree has the key: Hydra refuses the launch, the forecast applies
    the value the user asked for (a memory key here: the micro-batch moves the update)."""
    added = _launch(here, "added.sh", "+actor_rollout_ref.actor.ppo_max_token_len_per_gpu=4096")
    Path(added).write_text(
        Path(added).read_text().replace("ppo_micro_batch_size_per_gpu=$MBS", "use_dynamic_bsz=True")
    )
    meant = _launch(here, "meant.sh", "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=4096")
    Path(meant).write_text(
        Path(meant).read_text().replace("ppo_micro_batch_size_per_gpu=$MBS", "use_dynamic_bsz=True")
    )
    status, out, err = run(capsys, "fit", added, "--gpu", "H100")
    assert status == 1, err
    (error,) = [line for line in out.splitlines() if "error[compose]" in line]
    assert "error[compose] actor_rollout_ref.actor.ppo_max_token_len_per_gpu:" in error
    assert "already has the key" in error
    assert "write `actor_rollout_ref.actor.ppo_max_token_len_per_gpu=4096`" in error
    status, meant_out, _ = run(capsys, "fit", meant, "--gpu", "H100")
    assert status == 0
    assert _tables(out) == _tables(meant_out)
    # and the value acts: left out, the default budget forecasts another update
    default = _launch(here, "default.sh")
    Path(default).write_text(
        Path(default)
        .read_text()
        .replace("ppo_micro_batch_size_per_gpu=$MBS", "use_dynamic_bsz=True")
    )
    _, default_out, _ = run(capsys, "fit", default, "--gpu", "H100")
    assert _tables(out) != _tables(default_out)


def test_a_section_the_tree_does_not_have_is_refused_in_one_line(
    here: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Megatron's keys on the FSDP tree (a launch that selects its engine with a key 0.9.0 does not
    have): forecast without them it would be an FSDP run the user never asked for."""
    other = _launch(
        here,
        "other.sh",
        "actor_rollout_ref.actor.model_engine=megatron",
        "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=8",
    )
    status, out, err = run(capsys, "fit", other, "--gpu", "H100")
    _one_line_error(
        status,
        err,
        "Could not override 'actor_rollout_ref.actor.megatron.tensor_model_parallel_size'",
        "has no engine section actor_rollout_ref.actor.megatron",
    )
    assert out == ""
    # an engine section of another tree without a shipped move (the critic's Megatron section on
    # the FSDP tree) is refused alike, naming the ones the tree has there
    critic = _launch(here, "critic.sh", "critic.megatron.tensor_model_parallel_size=2")
    status, _, err = run(capsys, "fit", critic, "--gpu", "H100")
    _one_line_error(
        status,
        err,
        "has no engine section critic.megatron",
        "the engine sections it has there: critic.fsdp",
    )
    # Megatron's keys where the launch's own `+` keys make the section (router replay's override
    # of the transformer config) are refused alike; on the Megatron tree they are set aside
    own = (
        "+actor_rollout_ref.actor.megatron.override_transformer_config.recompute_method=uniform",
        "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=8",
    )
    status, out, err = run(capsys, "fit", _launch(here, "own.sh", *own), "--gpu", "H100")
    _one_line_error(status, err, "has no engine section actor_rollout_ref.actor.megatron")
    stale = "actor_rollout_ref.actor.megatron.grad_offload_before=True"
    on_megatron = _launch(here, "megatron.sh", "model_engine=megatron", own[0], stale)
    status, out, _ = run(capsys, "fit", on_megatron, "--gpu", "H100")
    assert status == 1 and out.count("error[compose]") == 1 and "Megatron tp" in out
    # a block the tree lacks that is no engine's (DAPO's overlong buffer of early 2025): set aside
    block = _launch(here, "block.sh", "custom_reward_function.overlong_buffer.enable=True")
    status, out, _ = run(capsys, "fit", block, "--gpu", "H100")
    assert status == 1 and out.count("error[compose]") == 1
    # a rejection of another kind is refused as before (a group option the tree lacks)
    bad = _launch(here, "bad.sh", "actor@actor_rollout_ref.actor=nowhere_actor")
    status, _, err = run(capsys, "fit", bad, "--gpu", "H100")
    _one_line_error(status, err, "composition rejected")


def test_a_section_an_earlier_release_mounted_elsewhere_is_forecast_at_its_new_place(
    here: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """verl 0.7's critic/dp_critic.yaml mounted the FSDP engine at ``critic.model.fsdp_config``;
    0.8 on mount it at ``critic.fsdp`` (the shipped moved_mounts.json): the launch's critic
    offloads are forecast there, to the byte as the launch written for 0.9.0, each still an
    error; a key the new section lacks too is left out and said once, at its line."""
    offloads = ("param_offload=True", "optimizer_offload=True")
    older = _launch(here, "older.sh", *(f"critic.model.fsdp_config.{o}" for o in offloads))
    current = _launch(here, "current.sh", *(f"critic.fsdp.{o}" for o in offloads))
    status, out, err = run(capsys, "fit", older, "--gpu", "H100")
    errors = [line for line in out.splitlines() if "error[compose]" in line]
    assert len(errors) == 2, err
    for error in errors:
        assert "its section moved (`critic/dp_critic` mounts `engine/fsdp`" in error
        assert "critic/dp_critic.yaml:14@0.7.1" in error and "dp_critic.yaml:14@0.9.0" in error
    assert "the forecast applies `critic.fsdp.param_offload=True`" in errors[0]
    _, plain, _ = run(capsys, "fit", current, "--gpu", "H100")
    assert _tables(out) == _tables(plain)
    status, payload_text, _ = run(capsys, "fit", older, "--gpu", "H100", "--format", "json")
    payload = json.loads(payload_text)
    jsonschema.validate(payload, _schema())
    assert [(a["applied"], bool(a["moved"])) for a in payload["set_aside"]] == [
        (f"critic.fsdp.{o}", True) for o in offloads
    ]
    stale = _launch(here, "stale_moved.sh", "critic.model.fsdp_config.grad_offload=True")
    status, out, _ = run(capsys, "fit", stale, "--gpu", "H100")
    assert status == 1
    (error,) = [line for line in out.splitlines() if "error[compose]" in line]
    assert error.startswith(f"{stale}:{FIRST_EXTRA_LINE}:3:"), error
    assert "the key is not in the new section either" in error


def test_a_legacy_reward_model_is_said_not_forecast(
    here: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """reward_model.enable and reward_model.model.path compose on 0.9.0's tree (its legacy block)
    but main_ppo never reads them (check's fields.legacy-reward-key): no reward model runs, and
    the forecast says why it has none; the same keys under reward.reward_model forecast one."""
    model = "Qwen/Qwen2.5-0.5B"
    legacy = _launch(
        here,
        "legacy_rm.sh",
        "reward_model.enable=True",
        f"reward_model.model.path={model}",
        # an engine section 0.9.0's legacy block lacks, which no reader of main_ppo's would read:
        # set aside, not refused as another engine's
        "reward_model.model.fsdp_config.param_offload=True",
    )
    current = _launch(
        here,
        "current_rm.sh",
        "reward.reward_model.enable=True",
        f"reward.reward_model.model_path={model}",
        "reward.reward_model.rollout.name=vllm",
    )
    _, out, _ = run(capsys, "fit", legacy, "--gpu", "H100")
    (said,) = [line for line in out.splitlines() if "legacy reward keys" in line]
    assert said.startswith("assumes: reward_model.enable, reward_model.model.path:"), said
    assert "reward_model.enable is reward.reward_model.enable" in said
    assert "reward model" not in _tables(out)
    (error,) = [line for line in out.splitlines() if "error[compose]" in line]
    assert "reward_model.model.fsdp_config.param_offload" in error
    _, out, _ = run(capsys, "fit", current, "--gpu", "H100")
    assert "legacy reward keys" not in out and "reward model" in _tables(out)


def test_json_lists_what_was_set_aside_and_follows_the_schema(
    here: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    stale = _launch(here, "stale.sh", *STALE)
    status, out, _ = run(capsys, "fit", stale, "--gpu", "H100", "--format", "json")
    payload = json.loads(out)
    jsonschema.validate(payload, _schema())
    assert status == 1
    assert [(a["written"], a["applied"]) for a in payload["set_aside"]] == [(w, "") for w in STALE]
    clean = _launch(here, "clean.sh")
    _, out, _ = run(capsys, "fit", clean, "--gpu", "H100", "--format", "json")
    assert "set_aside" not in json.loads(out)


def test_check_with_a_gpu_says_each_stale_key_at_its_line(
    here: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    stale = _launch(here, "stale.sh", *STALE)
    status, out, _ = run(capsys, "check", stale, "--no-upstream-checks")
    assert status == 1
    assert out.count("error[compose]") == 1  # without a GPU: Hydra's first rejection, as before
    status, out, _ = run(capsys, "check", stale, "--no-upstream-checks", "--gpu", "RTX4090")
    assert status == 1
    assert out.count("error[compose]") == len(STALE), out
    assert "error[memory." in out  # the launch without them does not fit a 24 GB card
    # set aside, but a model the forecast has no numbers for: check's own compose error stays
    unknown = Path(stale).with_name("unknown.sh")
    unknown.write_text(Path(stale).read_text().replace("Qwen/Qwen2.5-7B-Instruct", "acme/unknown"))
    status, out, _ = run(capsys, "check", str(unknown), "--no-upstream-checks", "--gpu", "H100")
    assert status == 1 and out.count("error[compose]") == 1, out
    assert "info[memory.not-forecast]" in out
    # a rejection that is not a key the tree lacks: check's own error, alone, with or without a GPU
    bad = _launch(here, "bad.sh", "actor@actor_rollout_ref.actor=nowhere_actor")
    plain = run(capsys, "check", bad, "--no-upstream-checks")
    assert plain[0] == 1 and plain[1].count("error[compose]") == 1
    assert run(capsys, "check", bad, "--no-upstream-checks", "--gpu", "RTX4090") == plain


def _fake(tree: set[str]) -> object:
    """A composer over a tree of the dotted ``tree`` keys: rejects as Hydra words it, else
    composes the tree (the values are not what these tests look at)."""

    def compose(fields: tuple[str, ...]) -> Composition:
        known = set(tree)
        for field in fields:
            key = field.split("=", 1)[0]
            if key.startswith("+") and key[1:] in known:
                return Composition(
                    COMPOSITION_REJECTION,
                    reason=f"ConfigCompositionException: Could not append to config. An item is already at '{key[1:]}'.",
                )
            if not key.startswith("+") and key not in known:
                return Composition(
                    COMPOSITION_REJECTION,
                    reason=f"ConfigCompositionException: Could not override '{key}'.",
                )
            known.add(key.lstrip("+"))  # as Hydra adds a `+` key, sections and all
        resolved: dict[str, object] = {}
        for dotted in sorted(known):
            *sections, leaf = dotted.split(".")
            node = resolved
            for part in sections:
                node = node.setdefault(part, {})  # type: ignore[assignment]
            node[leaf] = None
        return Composition(COMPOSED, resolved=resolved)

    return compose


def test_setting_aside_stops_at_its_bound_and_keeps_the_order_hydra_named() -> None:
    compose = _fake({"a.x", "a.y"})
    fields = ("a.x=1", "a.old=2", "+a.y=3", "a.gone=4")
    composition, kept, aside = compose_setting_aside(compose, fields, "0.9.0")  # type: ignore[arg-type]
    assert composition.composed
    assert kept == ("a.x=1", "a.y=3")
    assert [(a.key, a.applied) for a in aside] == [("a.old", ""), ("a.y", "a.y=3"), ("a.gone", "")]
    many = tuple(f"a.k{i}=1" for i in range(40))
    composition, _, aside = compose_setting_aside(compose, many, "0.9.0")  # type: ignore[arg-type]
    assert not composition.composed and len(aside) == 32


def test_only_an_absent_engine_section_is_refused() -> None:
    tree = {"a": {"fsdp_config": {"param_offload": False}}}
    assert _first_absent(tree, "a.fsdp_config") == ""
    assert _first_absent(tree, "a.megatron") == "a.megatron"
    assert _first_absent(tree, "a.fsdp_config.new_block") == "a.fsdp_config.new_block"
    compose = _fake({"a.fsdp_config.param_offload"})
    fields = ("a.fsdp_config.param_offload=True", "a.fsdp_config.new_block.x=1")
    composition, _, aside = compose_setting_aside(compose, fields)  # type: ignore[arg-type]
    assert [a.key for a in aside] == ["a.fsdp_config.new_block.x"]  # a block inside the engine's
    composition, _, aside = compose_setting_aside(compose, ("a.megatron.tp=2",))  # type: ignore[arg-type]
    assert not composition.composed and not aside
    assert "has no engine section a.megatron" in composition.reason
    assert "the engine sections it has there: a.fsdp_config" in composition.reason


def test_an_absent_engine_section_is_placed_only_where_each_key_has_a_new_place() -> None:
    """With a relocation for ``a.model.fsdp_config`` (an engine section of an older tree), its
    keys are applied at ``a.fsdp`` and the launch composed there; a key the relocation does not
    cover (another engine's section) keeps the refusal, for all of them, as does no relocation."""
    compose = _fake({"a.fsdp.param_offload", "a.model.path", "a.x"})

    def relocating(key: str) -> tuple[str, str] | None:
        old = "a.model.fsdp_config."
        return ("a.fsdp." + key[len(old) :], "moved") if key.startswith(old) else None

    fields = ("a.model.fsdp_config.param_offload=True", "a.x=1", "a.model.fsdp_config.gone=1")
    composition, kept, aside = compose_setting_aside(compose, fields, "0.9.0", relocating)  # type: ignore[arg-type]
    assert composition.composed
    assert kept == ("a.fsdp.param_offload=True", "a.x=1")
    assert [(a.key, a.applied, a.moved) for a in aside] == [
        ("a.model.fsdp_config.param_offload", "a.fsdp.param_offload=True", "moved"),
        ("a.model.fsdp_config.gone", "", "moved"),
    ]
    assert "its section moved (moved), and the forecast applies" in aside[0].said()
    mixed = ("a.model.fsdp_config.param_offload=True", "a.megatron.tp=2")
    composition, _, aside = compose_setting_aside(compose, mixed, "0.9.0", relocating)  # type: ignore[arg-type]
    assert not composition.composed and not aside
    assert "has no engine section a.megatron" in composition.reason
    composition, _, aside = compose_setting_aside(compose, fields[:1], "0.9.0")  # type: ignore[arg-type]
    assert (
        not composition.composed
        and "has no engine section a.model.fsdp_config" in composition.reason
    )


def test_an_engine_section_of_a_block_the_release_never_reads_is_set_aside() -> None:
    compose = _fake({"r.model.path", "a.x"})
    fields = ("r.model.fsdp_config.param_offload=True", "a.x=1")
    composition, kept, aside = compose_setting_aside(compose, fields, "0.9.0", unread=("r",))  # type: ignore[arg-type]
    assert composition.composed and kept == ("a.x=1",)
    assert [a.key for a in aside] == ["r.model.fsdp_config.param_offload"]
    composition, _, _ = compose_setting_aside(compose, fields, "0.9.0")  # type: ignore[arg-type]
    assert "has no engine section r.model.fsdp_config" in composition.reason


def test_an_engine_section_the_launch_makes_itself_is_not_the_trees() -> None:
    """``+a.megatron.extra=1`` makes a section the tree does not have: a key set aside in it is
    refused as in a section no one made. The same launch on a tree with the section (its engine's
    group selected), and a `+` section that is no engine's, are set aside and forecast."""
    compose = _fake({"a.fsdp_config.param_offload"})
    fields = ("+a.megatron.override.recompute=full", "a.megatron.tp=8")
    composition, _, aside = compose_setting_aside(compose, fields)  # type: ignore[arg-type]
    assert not composition.composed and not aside
    assert "has no engine section a.megatron" in composition.reason
    with_engine = _fake({"a.fsdp_config.param_offload", "a.megatron.override.method"})
    composition, kept, aside = compose_setting_aside(with_engine, fields)  # type: ignore[arg-type]
    assert composition.composed and [a.key for a in aside] == ["a.megatron.tp"]
    assert kept == ("+a.megatron.override.recompute=full",)
    own_block = ("+a.fsdp_config.extra.x=1", "a.fsdp_config.extra.y=2", "a.gone=3")
    composition, _, aside = compose_setting_aside(compose, own_block)  # type: ignore[arg-type]
    assert composition.composed and [a.key for a in aside] == ["a.fsdp_config.extra.y", "a.gone"]


def test_the_closest_key_is_looked_for_in_the_section_then_above_it() -> None:
    tree = {"model_engine": "dp", "actor_rollout_ref": {"actor": {"strategy": "fsdp"}}}
    assert _closest("actor_rollout_ref.actor.model_engine", tree) == "model_engine"
    assert _closest("actor_rollout_ref.actor.strategie", tree) == "actor_rollout_ref.actor.strategy"
    assert _closest("actor_rollout_ref.actor.grad_offload", tree) == ""


def test_a_strategy_without_its_engines_section_is_refused_not_read_as_defaults(
    here: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``strategy=megatron`` on the FSDP tree (no ``actor.megatron`` section): every Megatron size
    and offload would read as a default; the forecast names the key instead. The same launch
    composed with the engine's config group is forecast."""
    clean = _launch(here, "clean.sh")
    status, _, err = run(
        capsys, "fit", clean, "--gpu", "H100", "--set", "actor_rollout_ref.actor.strategy=megatron"
    )
    _one_line_error(
        status,
        err,
        "actor_rollout_ref.actor.strategy=megatron",
        "no actor_rollout_ref.actor.megatron",
    )
    status, out, err = run(capsys, "fit", clean, "--gpu", "H100", "--set", "model_engine=megatron")
    assert status in (0, 1) and "Megatron tp" in out, err
