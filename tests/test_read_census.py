"""The read census (issue 29): docs/census/VERSION/reads.md is the one of now, and each leaf's status
follows from where verl reads it: traced, static on its own section, never read, or undecided.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_verl_compat.releases.index import load_release_index
from pytest_verl_compat.upstream.census import reads as read_census
from pytest_verl_compat.upstream.census import reads_page as read_census_page
from pytest_verl_compat.upstream.census import static_reads

SUPPORTED = load_release_index().supported_versions
PAGES = {
    v: Path(__file__).resolve().parents[1] / "docs" / "census" / v / "reads.md" for v in SUPPORTED
}

CONFIG_CLASS = """
from verl.base_config import BaseConfig

class FooConfig(BaseConfig):
    def __post_init__(self):
        assert self.size > 0
"""
TRAINER = """
def run(config, other):
    if config.mode == "fast":
        n = config.b.size
    return other.weight + len(["unused_but_named"])
"""
TREE = {
    "a": {"_target_": "verl.workers.config.FooConfig", "size": 1, "never": 2},
    "b": {"size": 3, "weight": 4, "unused_but_named": 5},
    "mode": "fast",
}


@pytest.fixture
def verl_parent(tmp_path: Path) -> Path:
    (tmp_path / "verl/workers/config").mkdir(parents=True)
    (tmp_path / "verl/trainer/ppo").mkdir(parents=True)
    (tmp_path / "verl/workers/config/foo.py").write_text(CONFIG_CLASS, encoding="utf-8")
    (tmp_path / "verl/trainer/ppo/run.py").write_text(TRAINER, encoding="utf-8")
    return tmp_path


def _by_leaf(entries: list[read_census.LeafReads]) -> dict[str, read_census.LeafReads]:
    return {entry.leaf: entry for entry in entries}


def test_each_leaf_gets_its_reads_and_status(verl_parent: Path) -> None:
    found = _by_leaf(read_census.census(verl_parent, {"t": TREE}, {}))
    assert sorted(found) == [
        "a.never",
        "a.size",
        "b.size",
        "b.unused_but_named",
        "b.weight",
        "mode",
    ]
    # ``self.size`` in the class the tree builds for ``a``; not ``b.size`` (another section).
    assert [p.where for p in found["a.size"].places] == ["verl/workers/config/foo.py:6"]
    # ``config.b.size`` names its section, under the guard that selects it.
    (place,) = found["b.size"].places
    assert (place.where, place.function, place.holder, place.guard) == (
        "verl/trainer/ppo/run.py:4",
        "run",
        "config.b",
        "config.mode == 'fast'",
    )
    assert found["mode"].status == "static"
    assert found["a.never"].status == "never read"
    # Read on an object the reading cannot place, or only named: undecided, with the places.
    assert found["b.weight"].status == "undecided"
    assert found["b.unused_but_named"].status == "undecided"
    assert found["b.unused_but_named"].unmatched[0].how == "mention"


def test_a_traced_read_comes_first(verl_parent: Path) -> None:
    traced = {"a.never": ["verl/trainer/ppo/run.py:5"]}
    found = _by_leaf(read_census.census(verl_parent, {"t": TREE}, traced))
    assert found["a.never"].status == "traced"
    assert found["a.never"].places[0].function == "run"
    page = read_census_page.render("0.0.0", list(found.values()), 1)
    assert "| 6 | 1 | 3 | 0 | 0 | 0 | 2 | 4 (66.7%) |" in page


# A data set class reached through a factory held in a local, as verl's create_rl_dataset does
# (verl/trainer/ppo/utils.py:126-133): its ``config`` is the section the caller passes.
DATASETS = """
class PromptSet:
    def __init__(self, data_files, config):
        self.key = config.prompt_key


class OptionSet:
    def __init__(self, config):
        self.key = config.answer_key


def pick(data_config):
    if data_config.get("custom", None):
        cls = load_extern_object(data_config.custom)
    else:
        cls = PromptSet
    return cls


def make(data_paths, data_config):
    dataset_cls = pick(data_config)
    return dataset_cls(data_files=data_paths, config=data_config)


def options(flags):
    return OptionSet(config=flags)
"""
DATA_TREE = {"data": {"prompt_key": "p", "answer_key": "a", "custom": None}}


def test_a_parameter_is_the_section_its_callers_pass(tmp_path: Path) -> None:
    (tmp_path / "verl/utils/dataset").mkdir(parents=True)
    (tmp_path / "verl/utils/dataset/sets.py").write_text(DATASETS, encoding="utf-8")
    found = _by_leaf(read_census.census(tmp_path, {"t": DATA_TREE}, {}))
    (place,) = found["data.prompt_key"].places
    assert place.function == "PromptSet.__init__" and place.holder == "config"
    assert place.via == "config = data_config, verl/utils/dataset/sets.py:22"
    assert found["data.prompt_key"].status == "static"
    # The twin: a class whose callers pass a value that is no configuration object stays
    # undecided (its ``config`` could be anything).
    assert found["data.answer_key"].status == "undecided"
    assert not found["data.answer_key"].places


COPY_TREE = {
    "data": {"max_len": 8, "spare": 2},
    "rollout": {"length": "${oc.select:data.max_len,512}", "unused": "${data.spare}"},
}
READER = """
def generate(config):
    if config.rollout.mode == "long":
        return config.rollout.length
"""


def test_a_leaf_is_read_through_the_copy_the_tree_makes_of_it(tmp_path: Path) -> None:
    (tmp_path / "verl/trainer/ppo").mkdir(parents=True)
    (tmp_path / "verl/trainer/ppo/gen.py").write_text(READER, encoding="utf-8")
    copies = {"rollout.length": "data.max_len", "rollout.unused": "data.spare"}
    found = _by_leaf(
        read_census.census(tmp_path, {"t": COPY_TREE}, {}, copies, outside=["trainer_mode"])
    )
    entry = found["data.max_len"]
    assert entry.status == read_census.COPIED
    (place,) = entry.places
    assert (place.where, place.section) == ("verl/trainer/ppo/gen.py:4", "rollout")
    assert place.via == "through its copy rollout.length"
    # The twin: copied into a leaf nothing reads, it stays as it was (never read).
    assert found["data.spare"].status == "never read"
    page = read_census_page.render(
        "0.0.0",
        list(found.values()),
        1,
        explicit={"data.max_len": ["c1", "c2"], "data.spare": ["c1"], "trainer_mode": ["c2"]},
    )
    # Two leaves set, both decided; a key in no tree, whose name nothing uses: never read.
    assert found["trainer_mode"].outside and found["trainer_mode"].status == "never read"
    assert "| 3 | 3 (100.0%) | 0 | 1 (1) |" in page
    # A key in no tree is no leaf of the page's tables.
    assert "| `trainer_mode`" not in page


@pytest.mark.parametrize("version", SUPPORTED)
def test_the_page_shows_the_command_that_checks_it_is_current(version: str) -> None:
    """The page's own staleness check (``census --reads --check``: a changed probe, verl, case or
    variant makes the recorded reads stale, and the page and the off-path index are re-derived
    and compared) runs as written in tests/test_docs_commands.py, from a copy of the
    repository: one run of ~50 s, not two."""
    assert (
        f"verl-compat census --release {version} --upstream verl-v0.9.0 --reads --check "
        f"docs/census/{version}/reads.md"
    ) in PAGES[version].read_text(encoding="utf-8")


# How verl names a section by other means: a local alias of it (verl/experimental/agent_loop/
# agent_loop.py:600), ``pop`` (verl/workers/engine_workers.py:545), a chain of keyed reads
# (verl/experimental/reward_loop/reward_manager/dapo.py:33), and ``**section`` handing on
# every key (verl/workers/engine/megatron/transformer_impl.py:296).
WORKER = """
class Worker:
    def __init__(self, config, other):
        self.config = config
        self.rollout_config = self.config.rollout
        self.other = other

    def generate(self):
        cfg = self.rollout_config
        return cfg.top_p, self.other.top_k

    def setup(self):
        self.config.ref.pop("dyn_bsz", False)
        return self.config.reward.get("reward_kwargs", {}).get("max_len", 0)


def build(engine_config):
    return make_engine(**engine_config.override)
"""
NAMED_TREE = {
    "rollout": {"top_p": 1.0, "top_k": -1},
    "ref": {"dyn_bsz": False},
    "reward": {"reward_kwargs": {}},
    "engine": {"override": {"a": 1}},
}


def test_a_section_named_by_an_alias_a_pop_a_keyed_chain_or_handed_on_whole(
    tmp_path: Path,
) -> None:
    (tmp_path / "verl/workers").mkdir(parents=True)
    (tmp_path / "verl/workers/worker.py").write_text(WORKER, encoding="utf-8")
    outside = ["reward.reward_kwargs.max_len", "engine.override.b", "ref.unused_knob"]
    found = _by_leaf(read_census.census(tmp_path, {"t": NAMED_TREE}, {}, outside=outside))
    (alias,) = found["rollout.top_p"].places
    assert alias.via == "cfg = self.rollout_config, verl/workers/worker.py:9"
    assert found["ref.dyn_bsz"].status == "static"
    assert found["reward.reward_kwargs.max_len"].status == "static"
    for key in ("engine.override.a", "engine.override.b"):
        assert found[key].status == static_reads.WHOLE, key
        assert found[key].places[0].holder == "**engine_config.override"
    # The twins: a field of an object that is no configuration stays undecided; a key added
    # where no one hands the section on, and whose name nothing uses, is never read.
    assert found["rollout.top_k"].status == "undecided"
    assert found["ref.unused_knob"].status == "never read"


# A field that maps names to a config class (verl/workers/config/distillation.py:265): a user's
# entry beside the tree's own is built and read as that entry is.
TEACHERS = """
from verl.base_config import BaseConfig


class TeacherConfig(BaseConfig):
    key: str = ""


class DistillConfig(BaseConfig):
    teachers: dict[str, TeacherConfig] = None
    limits: dict[str, int] = None


def load(config):
    return config.distill.teachers.default.key, config.distill.limits.default.key
"""


def test_a_users_entry_of_a_dict_of_configs_is_read_as_the_trees_entry(tmp_path: Path) -> None:
    (tmp_path / "verl/workers/config").mkdir(parents=True)
    (tmp_path / "verl/workers/config/distill.py").write_text(TEACHERS, encoding="utf-8")
    tree = {
        "distill": {
            "_target_": "verl.workers.config.DistillConfig",
            "teachers": {"default": {"key": "a"}},
            "limits": {"default": {"key": 1}},
        }
    }
    outside = ["distill.teachers.gsm8k.key", "distill.limits.gsm8k.key"]
    found = _by_leaf(read_census.census(tmp_path, {"t": tree}, {}, outside=outside))
    (place,) = found["distill.teachers.gsm8k.key"].places
    assert place.via == (
        "as distill.teachers.default.key: an entry of teachers (verl/workers/config/distill.py:10)"
    )
    # The twin: a dict of plain values builds no class, so its new entry stays undecided.
    assert found["distill.limits.gsm8k.key"].status == "undecided"


def test_the_path_facts_are_kept_by_the_files_content(
    verl_parent: Path, tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What the census reads from verl's files alone is kept in the user cache by their
    content: a second census reads it back and gives the same entries, and a changed file is
    read anew."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path_factory.mktemp("cache")))
    monkeypatch.delenv("VERL_COMPAT_NO_CACHE", raising=False)
    first = read_census.census(verl_parent, {"t": TREE}, {"mode": ["verl/trainer/ppo/run.py:3"]})

    def unread(_: Path) -> None:
        raise AssertionError("the files were read again")

    monkeypatch.setattr(static_reads, "_sources", unread)
    kept = read_census.census(verl_parent, {"t": TREE}, {"mode": ["verl/trainer/ppo/run.py:3"]})
    assert kept == first
    assert {e.leaf: e.status for e in kept}["a.size"] == "static"
    run = verl_parent / "verl/trainer/ppo/run.py"
    run.write_text(TRAINER + "\n# changed\n", encoding="utf-8")
    with pytest.raises(AssertionError, match="read again"):
        read_census.census(verl_parent, {"t": TREE}, {})
