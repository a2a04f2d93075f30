"""Wrapper tables are built from each wrapper's own documented option list (data/wrappers).

Every option of every stored list is read by the wrapper's table: each spelling is accepted,
with a value where the list says it takes one (attached only, where the value is optional), and
the wrapped command after it is found. The lists come from the tools themselves (their --help,
their option table or their documentation page), each file naming the tool, its version and
where the list came from.
"""

from __future__ import annotations

import pytest

from pytest_verl_compat.bash.wrapper_tables import TABLE_FILES, Option, option_list
from pytest_verl_compat.bash.wrappers import WrapperRefusal, parse

LAUNCH = ["python3", "-m", "verl.trainer.main_ppo", "a=1"]
# A valid value of each kind a wrapper parses.
VALUES = {
    "text": "v",
    "name": "NAME",
    "int": "1",
    "float": "1.5",
    "duration": "10",
    "signal": "TERM",
    "json": "{}",
    "bool": "true",
}


def _known(word: str, purpose: str) -> None:
    """No word of these tests holds a run-time value."""


def _value(option: Option) -> str:
    if option.choices:
        return option.choices[0]
    if option.effect == "assign":
        return "A=1"
    return VALUES[option.value or "text"]


def _command(name: str) -> list[str]:
    """What follows the options: the operands the wrapper reads first, then the launcher."""
    wrapper = option_list(name).wrapper
    operands = [VALUES[kind] for kind in wrapper.operands]
    if wrapper.runs_python:
        return ["-m", "verl.trainer.main_ppo", "a=1"]
    separator = ["--"] if wrapper.parser == "click" else []
    return [*operands, *separator, *LAUNCH]


def _cases() -> list[tuple[str, str, tuple[str, ...]]]:
    cases = []
    for name in TABLE_FILES:
        listed = option_list(name)
        for entry in listed.options:
            # The value a test gives follows the table (the overlay may say it is JSON).
            option = next(o for o in listed.wrapper.options if entry.names[0] in o.names)
            for spelling in entry.names:
                if option.value is None:
                    forms: list[tuple[str, ...]] = [(spelling,)]
                elif option.optional_value:
                    attached = f"{spelling}={_value(option)}" if spelling[:2] == "--" else None
                    short = f"{spelling}{_value(option)}" if spelling[:2] != "--" else None
                    forms = [(spelling,), ((attached or short) or spelling,)]
                else:
                    forms = [(spelling, _value(option))]
                    if spelling.startswith("--"):
                        forms.append((f"{spelling}={_value(option)}",))
                cases.extend((name, spelling, form) for form in forms)
    return cases


@pytest.mark.parametrize(("name", "spelling", "form"), _cases(), ids=str)
def test_every_listed_option_is_read_by_the_wrappers_table(
    name: str, spelling: str, form: tuple[str, ...]
) -> None:
    listed = option_list(name)
    wrapper = listed.wrapper
    table = next(o for o in wrapper.options if spelling in o.names)
    listed_option = next(o for o in listed.options if spelling in o.names)
    assert (table.value is None) == (listed_option.value is None), spelling
    assert table.optional_value == listed_option.optional_value, spelling
    words = [*wrapper.words, *form, *_command(name)]
    if table.effect == "refuse":
        with pytest.raises(WrapperRefusal):
            parse(wrapper, words, _known)
        return
    used = parse(wrapper, words, _known)
    if table.effect == "exits":
        assert used is None
        return
    assert used is not None
    if wrapper.runs_python:
        assert used.command == ["python", "-m", "verl.trainer.main_ppo", "a=1"]
    elif table.effect == "module":
        assert used.command == ["python", "-m", *LAUNCH]  # `uv run -m MODULE`
    else:
        assert used.command == LAUNCH
    assert table.canonical in used.options


@pytest.mark.parametrize("name", TABLE_FILES)
def test_each_list_names_its_tool_version_and_source(name: str) -> None:
    listed = option_list(name)
    wrapper = listed.wrapper
    assert listed.tool == wrapper.name == name.replace("-", " ")
    assert wrapper.version and wrapper.source and wrapper.evidence
    assert len(listed.options) >= 2
    spellings = [n for option in wrapper.options for n in option.names]
    assert len(spellings) == len(set(spellings)), name


def test_uv_run_reads_all_packages_and_hidden_options_but_not_version() -> None:
    uv = option_list("uv-run").wrapper
    used = parse(uv, ["uv", "run", "--all-packages", "--dev", *LAUNCH], _known)
    assert used is not None and used.command == LAUNCH
    with pytest.raises(WrapperRefusal, match="not an option"):
        parse(uv, ["uv", "run", "--version", *LAUNCH], _known)


@pytest.mark.parametrize(
    ("words", "error"),
    [
        (["--nproc", "2", "x.py"], "ambiguous"),
        (["--nnodes", "2", "--", "x.py"], "`--`"),
        (["x.py", "--", "a"], "`--`"),
        (["--master_port", "-x", "x.py"], "option-like"),
        (["--no-python", "x.py"], "torchrun --no-python"),
    ],
)
def test_torchrun_words_argparse_reads_differently_by_release_are_refused(
    words: list[str], error: str
) -> None:
    torchrun = option_list("torchrun").wrapper
    with pytest.raises(WrapperRefusal) as caught:
        parse(torchrun, ["torchrun", *words], _known)
    assert error in f"{caught.value.construct} {caught.value.detail}"


def test_torchrun_options_are_read_as_argparse_reads_them() -> None:
    torchrun = option_list("torchrun").wrapper
    words = ["torchrun", "--nproc-per", "4", "--nnodes=2", "-mr3", "pkg.mod", "--nnodes", "9"]
    used = parse(torchrun, words, _known)
    assert used is not None
    assert used.command == ["python", "-m", "pkg.mod", "--nnodes", "9"]
    assert used.options == {"nproc_per_node": "4", "nnodes": "2", "module": True, "redirects": "3"}
