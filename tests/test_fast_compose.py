"""The fast composition path against Hydra's own ``compose``: same mapping, same key order and
types, or the same exception and message, for every golden case and generated override lists."""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from hydra_references import answer_digest, held_to_hydra, question_key, recorded
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pytest_verl_compat.model import Composition
from pytest_verl_compat.pipeline import compose as compose_module
from pytest_verl_compat.pipeline.compose import Composer
from pytest_verl_compat.pipeline.entry_points import SFT_CONFIG_NAME, SFT_ENTRY_MODULE
from pytest_verl_compat.pipeline.hydra_internals import deterministic_resolvers

REPO = Path(__file__).resolve().parents[1]
UPSTREAM = Path(os.environ.get("VERL_UPSTREAM") or REPO.parent / "shared/upstream/verl-v0.9.0")
CONFIG_DIR = UPSTREAM / "verl/trainer/config"
VARIABLES = {"HOME": "/home/verl"}
GOLDEN = sorted((REPO / "golden/compose").rglob("*.json"))
# Generated lists are composed twice (fast, and by Hydra at ~0.8-3 s); spread over several tests
# so `-n 2` shares them out. At 70 examples the three tests took 470 s of CI's 1394 test seconds;
# 35 (derandomized, so CI sees the same lists) keeps CI under 20 minutes. VERL_FUZZ_EXAMPLES
# scales every generated test for a longer local or nightly run.
EXAMPLES = int(os.environ.get("VERL_FUZZ_EXAMPLES", "35"))

pytestmark = pytest.mark.skipif(
    not CONFIG_DIR.is_dir(), reason=f"no verl v0.9.0 config tree at {CONFIG_DIR} (VERL_UPSTREAM)"
)


def config_name_of(golden: Path) -> str:
    """The config a golden case composes: its launch's entry point's (the SFT trainer's), else
    main_ppo's ``ppo_trainer``."""
    launch = json.loads(golden.read_text()).get("launch") or {}
    return SFT_CONFIG_NAME if launch.get("module") == SFT_ENTRY_MODULE else "ppo_trainer"


def hydra_reference(
    fields: Sequence[str], variables: dict[str, str], config_name: str = "ppo_trainer"
) -> Composition:
    """Plain ``hydra.compose`` and ``OmegaConf.to_container``, nothing of ours but the resolvers."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from omegaconf import OmegaConf

    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base=None):
            cfg = compose(config_name=config_name, overrides=list(fields))
        with deterministic_resolvers(variables):
            resolved = OmegaConf.to_container(cfg, resolve=True, throw_on_missing=False)
    except Exception as exc:  # the Composer turns every compose error into a rejection
        reason = f"{type(exc).__name__}: {exc}".replace(str(CONFIG_DIR), "<config_dir>").strip()
        return Composition("composition_rejection", reason=reason)
    assert isinstance(resolved, dict)
    return Composition(
        "composed", resolved=resolved, missing=tuple(compose_module._missing_paths(cfg))
    )


def typed(value: Any) -> Any:
    """A comparable form that keeps key order and types (``1 == 1.0 == True`` otherwise)."""
    if isinstance(value, dict):
        return ("dict", tuple((type(k).__name__, k, typed(v)) for k, v in value.items()))
    if isinstance(value, list):
        return ("list", tuple(typed(v) for v in value))
    if isinstance(value, float) and math.isnan(value):
        return ("float", "nan")
    return (type(value).__name__, value)


def assert_same(fields: Sequence[str], fast: Composition, reference: Composition) -> None:
    __tracebackhide__ = True
    assert (fast.outcome, fast.reason) == (reference.outcome, reference.reason), fields
    assert typed(fast.resolved) == typed(reference.resolved), fields
    assert fast.missing == reference.missing, fields


def comparable(result: Composition) -> tuple[Any, ...]:
    """What ``assert_same`` compares, as one value."""
    return (result.outcome, result.reason, typed(result.resolved), result.missing)


def assert_hydras(
    fields: Sequence[str], fast: Composition, config_name: str = "ppo_trainer"
) -> None:
    """The fast path's answer is Hydra's: its recorded answer (``hydra_references``), else
    Hydra asked live and compared."""
    __tracebackhide__ = True

    def live() -> str:
        reference = hydra_reference(fields, VARIABLES, config_name)
        assert_same(fields, fast, reference)
        return answer_digest(comparable(reference))

    held_to_hydra(CONFIG_DIR, config_name, fields, VARIABLES, answer_digest(comparable(fast)), live)


def assert_base_untouched(composer: Composer) -> None:
    """The shared override-free composition must come back from every call unchanged."""
    __tracebackhide__ = True
    from omegaconf import OmegaConf

    base = composer._base()
    assert typed(OmegaConf.to_container(base.cfg, resolve=False)) == typed(base.plain)


@pytest.fixture(autouse=True)
def _draws_without_local_constants(monkeypatch: pytest.MonkeyPatch) -> None:
    """Hypothesis mixes the constants of every local module in ``sys.modules`` into what it
    draws (``providers._get_local_constants``, cached in ``CONSTANTS_CACHE`` when first used), so
    a derandomized test drew other lists depending on which of our modules the worker had
    imported before: importing ``upstream.releases.trees`` first changed 32 of the 35 lists of
    ``test_new_values_of_existing_keys``, even with a fixed ``@seed``, and each list that
    ``hydra_references`` does not hold is composed by Hydra live (~1 s). Without local constants
    the draws depend on the test alone, as ``derandomize`` means them to. Private names of
    hypothesis: ``monkeypatch`` fails loudly when they go."""
    from hypothesis.internal.conjecture import providers

    monkeypatch.setattr(providers, "_get_local_constants", providers.Constants)
    monkeypatch.setattr(providers, "CONSTANTS_CACHE", {})


@pytest.fixture(scope="module")
def composer() -> Composer:
    return Composer(CONFIG_DIR, "ppo_trainer")


@pytest.fixture(scope="module")
def reference_base() -> dict[str, Any]:
    result = hydra_reference([], VARIABLES)
    assert result.resolved is not None
    return result.resolved


@pytest.mark.parametrize(
    "golden", GOLDEN, ids=[str(p.relative_to(REPO / "golden/compose"))[:-5] for p in GOLDEN]
)
def test_golden_cases_compose_as_hydra_does(composer: Composer, golden: Path) -> None:
    fields = json.loads(golden.read_text())["explicit_fields"]
    name = config_name_of(golden)
    composer = composer if name == composer.config_name else Composer(CONFIG_DIR, name)
    fast = composer.compose(fields, VARIABLES)
    assert_hydras(fields, fast, name)
    assert_base_untouched(composer)


def test_recorded_answers_are_hydras_answers_now() -> None:
    """A sample of Hydra's recorded answers for this tree, asked of Hydra live again."""
    current = [
        entry
        for key, entry in sorted(recorded().items())
        if key == question_key(CONFIG_DIR, entry["config"], entry["fields"], entry["variables"])
    ]
    if not current:
        pytest.skip("no answer is recorded for this tree and these versions: all are asked live")
    for entry in current[:: max(1, len(current) // 6)]:
        live = hydra_reference(entry["fields"], entry["variables"], entry["config"])
        assert answer_digest(comparable(live)) == entry["answer"], entry["fields"]


def test_an_answer_unlike_the_recorded_one_is_compared_live() -> None:
    """Only an equal recorded answer spares Hydra; any other digest asks it."""
    fields = ["trainer.total_epochs=2"]
    fast = Composer(CONFIG_DIR, "ppo_trainer")._compose_values(fields, VARIABLES)
    right = answer_digest(comparable(fast))
    asked: list[str] = []

    def ask() -> str:
        asked.append("live")
        return right

    key = question_key(CONFIG_DIR, "ppo_trainer", fields, VARIABLES)
    recorded()[key] = {"config": "ppo_trainer", "fields": fields, "variables": {}, "answer": right}
    try:
        assert held_to_hydra(CONFIG_DIR, "ppo_trainer", fields, VARIABLES, right, ask)
        assert not asked
        assert not held_to_hydra(CONFIG_DIR, "ppo_trainer", fields, VARIABLES, "0" * 64, ask)
        assert asked == ["live"]
    finally:
        del recorded()[key]


def test_golden_cases_take_the_fast_path(composer: Composer) -> None:
    """Every official case avoids Hydra (rejections fall back on purpose)."""
    for golden in GOLDEN:
        payload = json.loads(golden.read_text())
        if payload["outcome"] != "composed":
            continue
        name = config_name_of(golden)
        case_composer = composer if name == composer.config_name else Composer(CONFIG_DIR, name)
        case_composer._fast_compose(payload["explicit_fields"], VARIABLES)


@pytest.mark.slow
@pytest.mark.parametrize("version", ["0.7.0", "0.9.1"])
def test_rejections_on_other_releases_are_hydras(version: str, release_cache: Path) -> None:
    """The fast path takes Hydra's own override rejection as it is (no second compose): on an
    older and a newer release's tree, which reject several golden cases, every rejection is the
    one Hydra's full compose gives, byte for byte."""
    from pytest_verl_compat.releases.wheels import release_tree

    tree = release_tree(version, fetch=False)
    fast = Composer(tree.config_dir, "ppo_trainer")
    slow = Composer(tree.config_dir, "ppo_trainer", fast=False)
    rejected = 0
    for golden in GOLDEN:
        fields = json.loads(golden.read_text())["explicit_fields"]
        result = fast.compose(fields, VARIABLES)
        if result.composed:
            continue
        rejected += 1
        reference = slow.compose(fields, VARIABLES)
        assert (result.outcome, result.reason) == (reference.outcome, reference.reason), fields
    assert rejected >= 2


def test_override_free_config_is_hydras(composer: Composer) -> None:
    from omegaconf import OmegaConf

    fast = OmegaConf.to_container(composer.compose_config([]), resolve=False)
    reference = Composer(CONFIG_DIR, "ppo_trainer", fast=False).compose_config([])
    assert typed(fast) == typed(OmegaConf.to_container(reference, resolve=False))


def test_hydra_reads_the_config_files_with_libyaml_and_the_same_documents() -> None:
    """Every YAML file of the pinned tree loads to the same document through OmegaConf's own
    loader and through the one ``libyaml_config_loading`` gives Hydra, and that one is libyaml's
    when PyYAML has it (``yaml.CParser`` was never exported, so the speed-up was once dead)."""
    import yaml
    from omegaconf import OmegaConf

    from pytest_verl_compat.pipeline.hydra_internals import libyaml_config_loading

    files = sorted(CONFIG_DIR.rglob("*.yaml"))
    assert len(files) > 50
    pure = [OmegaConf.to_container(OmegaConf.load(f), resolve=False) for f in files]
    with libyaml_config_loading():
        from omegaconf import _utils

        loader = _utils.get_yaml_loader()
        fast = [OmegaConf.to_container(OmegaConf.load(f), resolve=False) for f in files]
    assert issubclass(loader, yaml.cyaml.CParser) == yaml.__with_libyaml__
    assert [typed(d) for d in fast] == [typed(d) for d in pure]


def _nodes(node: Any, path: str = "") -> Iterator[tuple[str, str, dict[str, Any]]]:
    """Every node of a config: its path, class and metadata (but the resolver cache, which
    Hydra's compose fills with the clock's ``now`` for its own ``hydra`` node)."""
    from omegaconf import DictConfig, ListConfig

    metadata = {k: v for k, v in vars(node._metadata).items() if k != "resolver_cache"}
    yield path, type(node).__name__, metadata
    if node._is_none() or node._is_missing() or node._is_interpolation():
        return
    if isinstance(node, DictConfig):
        for key in node.__dict__["_content"]:
            yield from _nodes(node._get_node(key), f"{path}.{key}")
    elif isinstance(node, ListConfig):
        for index in range(len(node.__dict__["_content"])):
            yield from _nodes(node._get_node(index), f"{path}[{index}]")


KEPT_BASE_FIELDS = (
    [],
    ["data.train_batch_size=64", "+trainer.extra=1", "actor_rollout_ref.rollout.n=8"],
    ["model_engine=megatron", "trainer.total_epochs=2"],
    ["actor_rollout_ref.actor.ppo_mini_batch_size=abc"],
    ["data.nope=1"],
)


def test_a_base_kept_in_the_user_cache_is_hydras(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The override-free compositions the fast path starts from are kept in the user cache as
    JSON; a new process rebuilds each with the same nodes, classes and flags as Hydra's, and
    composes every list as it would from Hydra's."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.delenv("VERL_COMPAT_NO_CACHE", raising=False)
    monkeypatch.setattr(compose_module, "_BASES", {})
    composer = Composer(CONFIG_DIR, "ppo_trainer")
    from_hydra = [composer.compose(fields, VARIABLES) for fields in KEPT_BASE_FIELDS]
    hydra_bases = dict(compose_module._BASES)
    assert len(hydra_bases) == 2  # the default engine's and megatron's
    assert len(list((tmp_path / "pytest-verl-compat/results/base").iterdir())) == 2

    monkeypatch.setattr(compose_module, "_BASES", {})

    def no_hydra(*_: object) -> None:
        raise AssertionError("composed by Hydra, not read from the user cache")

    monkeypatch.setattr(Composer, "_hydra_base", no_hydra)
    kept = Composer(CONFIG_DIR, "ppo_trainer")
    assert [kept.compose(fields, VARIABLES) for fields in KEPT_BASE_FIELDS] == from_hydra
    for key, hydra_base in hydra_bases.items():
        kept_base = compose_module._BASES[key]
        assert kept_base.groups == hydra_base.groups and "hydra/env" in kept_base.groups
        assert list(_nodes(kept_base.cfg)) == list(_nodes(hydra_base.cfg))
        assert typed(kept_base.plain) == typed(hydra_base.plain)


def test_a_kept_base_or_defaults_list_not_of_this_codes_shape_is_composed_anew() -> None:
    """The user cache is the user's, and may hold anything: only what this code writes is read."""
    assert compose_module._kept_base({"plain": {"a": 1}, "groups": "actor"}) is None
    assert compose_module._kept_base({"plain": [], "groups": []}) is None
    assert compose_module._kept_base(None) is None
    kept = compose_module._kept_base({"plain": {"a": {"b": 1}}, "groups": ["actor"]})
    assert kept is not None and kept.group_exists("actor") and not kept.group_exists("a")
    from omegaconf import OmegaConf

    assert OmegaConf.is_struct(kept.cfg)
    assert compose_module._pairs_of_strings([["ppo_trainer", ""], ["actor/dp_actor", "actor"]])
    assert not compose_module._pairs_of_strings([["ppo_trainer"]])
    assert not compose_module._pairs_of_strings({"ppo_trainer": ""})


# --- generated override lists --------------------------------------------------------------------


def _paths(value: Any, prefix: str = "") -> list[tuple[str, Any]]:
    out = []
    if isinstance(value, dict):
        for key, item in value.items():
            path = f"{prefix}.{key}" if prefix else str(key)
            out.append((path, item))
            out.extend(_paths(item, path))
    return out


def _base_paths() -> list[tuple[str, Any]]:
    if not CONFIG_DIR.is_dir():
        return [("trainer.nnodes", 1)]
    return _paths(Composer(CONFIG_DIR, "ppo_trainer")._base().plain)


BASE_PATHS = _base_paths()
KEYS = [path for path, _ in BASE_PATHS]
LEAF_KEYS = [path for path, value in BASE_PATHS if not isinstance(value, dict | list)]
DICT_KEYS = [path for path, value in BASE_PATHS if isinstance(value, dict)]
LIST_KEYS = [path for path, value in BASE_PATHS if isinstance(value, list)]
NAME = st.from_regex(r"[a-z_][a-z0-9_]{0,8}", fullmatch=True)

primitive = st.one_of(
    st.integers(-(10**12), 10**12).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.sampled_from(["true", "False", "TRUE", "null", "NULL", "1e-6", "0.6", "1_000", "+5", "-0"]),
    st.sampled_from(["low_var_kl", "Qwen/Qwen3-8B", "vllm", "a-b", "x:y", "inf", "nan", "-inf"]),
    NAME,
)
quoted = st.text(
    alphabet=st.characters(codec="ascii", exclude_characters="'\\\r\n\x0b\x0c\x1c\x1d\x1e\x1f\x85"),
    max_size=12,
).map(lambda s: f"'{s}'")
interpolation = st.one_of(
    st.sampled_from(KEYS).map(lambda k: f"${{{k}}}"),
    st.sampled_from(
        [
            "${does.not.exist}",
            "${oc.env:HOME}",
            "${oc.env:NOT_BOUND}",
            "${oc.env:NOT_BOUND,fallback}",
            "${now:%Y}",
            "${..nnodes}",
            "pre_${trainer.nnodes}_post",
            "\\${escaped}",
            "${oc.select:trainer.nnodes,3}",
            "${oc.decode:'[1, 2]'}",
        ]
    ),
)
scalar = st.one_of(primitive, quoted, interpolation)
value = st.recursive(
    scalar,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3).map(lambda xs: "[" + ",".join(xs) + "]"),
        st.dictionaries(NAME, inner, max_size=3).map(
            lambda d: "{" + ",".join(f"{k}:{v}" for k, v in d.items()) + "}"
        ),
    ),
    max_leaves=5,
)

existing_assignment = st.builds(
    lambda key, v: f"{key}={v}",
    st.sampled_from(LEAF_KEYS + LIST_KEYS + DICT_KEYS),
    value,
)
addition = st.builds(
    lambda prefix, key, name, v: f"{prefix}{key}.{name}={v}" if key else f"{prefix}{name}={v}",
    st.sampled_from(["+", "++", ""]),
    st.sampled_from(["", *DICT_KEYS]),
    NAME,
    value,
)
re_add = st.builds(
    lambda prefix, key, v: f"{prefix}{key}={v}",
    st.sampled_from(["+", "++"]),
    st.sampled_from(KEYS),
    value,
)
hydra_only = st.sampled_from(
    [
        "model_engine=megatron",
        "model_engine=dp",
        "data=legacy_data",
        "actor@actor_rollout_ref.actor=dp_actor",
        "+actor@extra=dp_actor",
        "~trainer.nnodes",
        "~trainer.nnodes=1",
        "~trainer.nnodes=2",
        "~does.not.exist",
        "trainer.nnodes=1,2",
        "trainer.nnodes=range(1,3)",
        "trainer.nnodes=choice(1,2)",
        "trainer.logger=glob(*)",
        "hydra.job.name=x",
        "+hydra.foo=1",
        "trainer..nnodes=1",
        "=1",
        "trainer.nnodes",
        "trainer.nnodes=[1,",
        "critic={enable: false}",
        "algorithm.rollout_correction=rollout_correction",
        "trainer.nnodes=${trainer.n_gpus_per_node}",
        "trainer.does_not_exist=1",
        "does_not_exist.x=1",
        "trainer.nnodes.x=1",
        "+trainer.nnodes.x=1",
        "trainer=[]",
        "model_engine=[0]",  # Hydra raises a bare TypeError for this one
    ]
)
OFFICIAL = json.loads((REPO / "golden/compose/grpo.json").read_text())["explicit_fields"]
with_official = st.booleans()


def _check(composer: Composer, fields: list[str]) -> None:
    # The fast path against Hydra itself: before the _target_ guard, which Hydra does not have.
    fast = composer._compose_values(fields, VARIABLES)
    assert_hydras(fields, fast)
    assert_base_untouched(composer)


SETTINGS = settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


@SETTINGS
@given(fields=st.lists(existing_assignment, min_size=1, max_size=4), official=with_official)
def test_new_values_of_existing_keys(composer: Composer, fields: list[str], official: bool) -> None:
    _check(composer, (OFFICIAL if official else []) + fields)


@SETTINGS
@given(fields=st.lists(st.one_of(addition, re_add), min_size=1, max_size=4), official=with_official)
def test_additions(composer: Composer, fields: list[str], official: bool) -> None:
    _check(composer, (OFFICIAL if official else []) + fields)


@SETTINGS
@given(
    fields=st.lists(
        st.one_of(existing_assignment, addition, hydra_only, hydra_only), min_size=1, max_size=4
    )
)
def test_mixed_with_hydra_only_overrides(composer: Composer, fields: list[str]) -> None:
    _check(composer, fields)
