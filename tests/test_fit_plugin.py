"""``pytest --verl-corpus --verl-corpus-gpu TYPE``: the memory forecast joins the verdict stage only
when the option is given; an unknown GPU type is a usage error at parse time."""

from __future__ import annotations

import pytest
from corpus_facts import needs_release


def run(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    """The audit in a subprocess, fast: no trusted stage, no cache."""
    return pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "-p", "no:randomly", "--verl-corpus-trusted=off", *args
    )


def test_an_unknown_gpu_type_is_a_usage_error(pytester: pytest.Pytester) -> None:
    result = run(pytester, "--verl-corpus", "--verl-corpus-gpu", "B300")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert "--verl-corpus-gpu: unknown GPU type 'B300'" in result.stderr.str()


@pytest.mark.slow
@needs_release()
@pytest.mark.parametrize("workers", [(), ("-n", "2")], ids=["serial", "xdist"])
def test_the_verdict_fails_a_case_that_does_not_fit_only_when_asked(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, workers: tuple[str, ...]
) -> None:
    monkeypatch.delenv("VERL_UPSTREAM", raising=False)  # the installed verl's tree
    selection = ("--verl-corpus", "verl-corpus::test_verdict[grpo]", *workers)
    plain = run(pytester, *selection)
    plain.assert_outcomes(passed=1)
    small = run(pytester, *selection, "--verl-corpus-gpu", "RTX4090")
    small.assert_outcomes(failed=1)
    assert "does not fit the RTX4090: " in small.stdout.str()
    assert "actor update on the trainer GPUs peaks at" in small.stdout.str()
    large = run(pytester, *selection, "--verl-corpus-gpu", "H200")
    large.assert_outcomes(passed=1)


def test_the_docs_gpu_table_is_the_data() -> None:
    """docs/fit.md lists every GPU type of data/gpus.yaml with its usable GiB, and no other."""
    from pathlib import Path

    from pytest_verl_compat.memory.gpus import gpu_table

    text = (Path(__file__).resolve().parents[1] / "docs" / "fit.md").read_text(encoding="utf-8")
    rows = {}
    for line in text.split("## GPUs", 1)[1].splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if line.startswith("| ") and len(cells) == 3 and cells[1].replace(".", "").isdigit():
            rows[cells[0]] = float(cells[1])
    assert rows == {name: round(gpu.usable_gib, 2) for name, gpu in gpu_table().items()}


@pytest.mark.parametrize(
    ("printed", "gpu"),
    [
        ("NVIDIA A100-SXM4-80GB", "A100-80GB"),
        ("NVIDIA A100-SXM4-40GB", "A100-40GB"),
        ("NVIDIA H100 80GB HBM3", "H100-80GB"),
        ("NVIDIA H100 NVL", "H100-NVL"),
        ("NVIDIA A800-SXM4-80GB", "A100-80GB"),
        ("Tesla V100-SXM2-32GB", "V100-32GB"),
        ("Tesla V100-SXM2-16GB", "V100-16GB"),
        ("NVIDIA GeForce RTX 4090", "RTX4090"),
        ("NVIDIA RTX A6000", "A6000"),
        ("NVIDIA RTX 6000 Ada Generation", "RTX6000-Ada"),
        ("NVIDIA GH200 480GB", "GH200"),
        ("AMD Instinct MI300X", "MI300X"),
        ("Tesla T4", "T4"),
    ],
)
def test_a_gpu_is_found_by_the_name_its_tools_print(printed: str, gpu: str) -> None:
    """--gpu takes a device's name as nvidia-smi, rocm-smi and torch.cuda.get_device_name print
    it: the vendor, product line, form factor and memory generation name no other type."""
    from pytest_verl_compat.memory.gpus import find_gpu

    assert find_gpu(printed).name == gpu


def test_no_two_gpu_types_share_a_name() -> None:
    """Every name and alias of the table, compared as --gpu compares them, names one type."""
    from pytest_verl_compat.files.safe_input import load_yaml_file
    from pytest_verl_compat.memory.gpus import GPUS_FILE, _normal

    named: dict[str, str] = {}
    for name, entry in load_yaml_file(GPUS_FILE, "GPU table")["gpus"].items():
        for alias in (name, *entry.get("aliases", ())):
            assert named.setdefault(_normal(str(alias)), name) == name, alias


@pytest.mark.parametrize(
    ("given", "sizes"),
    [
        ("A100", ("A100-80GB (79.25 GiB usable)", "A100-40GB (39.50 GiB usable)")),
        ("a800", ("A800-80GB (79.25 GiB usable)", "A800-40GB (39.50 GiB usable)")),
        ("V100", ("V100-32GB (31.74 GiB usable)", "V100-16GB (15.78 GiB usable)")),
    ],
)
def test_a_name_sold_in_two_sizes_is_refused_naming_both(
    given: str, sizes: tuple[str, ...]
) -> None:
    """A bare A100 is an 80 GB or a 40 GB device: taking it for the larger would forecast "fits"
    for a run on the smaller, so --gpu names both sizes in one line; each size's name, and the
    names the tools print, are found."""
    from pytest_verl_compat.memory.gpus import UnknownGpu, find_gpu

    with pytest.raises(UnknownGpu) as caught:
        find_gpu(given)
    message = str(caught.value)
    assert all(size in message for size in sizes), message
    for size in sizes:
        find_gpu(size.split(" (")[0])
    assert find_gpu("NVIDIA A100-PCIE-40GB").name == "A100-40GB"
    assert find_gpu("NVIDIA A800 80GB PCIe").name == "A100-80GB"


def test_every_ambiguous_name_is_no_types_name_and_lists_two_sizes() -> None:
    """The table's ambiguous names: none is a type's name or alias (it would never be refused),
    and each lists at least two names, each of a different type."""
    from pytest_verl_compat.files.safe_input import load_yaml_file
    from pytest_verl_compat.memory.gpus import GPUS_FILE, _aliases, _normal

    ambiguous = load_yaml_file(GPUS_FILE, "GPU table")["ambiguous"]
    assert ambiguous
    for name, sizes in ambiguous.items():
        assert _normal(name) not in _aliases(), name
        kinds = [_aliases()[_normal(size)] for size in sizes]
        assert len(set(kinds)) == len(kinds) >= 2, name


@pytest.mark.parametrize(
    ("given", "gpu", "count"), [("8xH100", "H100", 8), ("4 * A100 80GB", "A100 80GB", 4)]
)
def test_a_gpu_count_is_refused_as_the_launchs_to_give(given: str, gpu: str, count: int) -> None:
    """Reports write machines as "8xH100": --gpu names the device, the count is the launch's, so a
    counted name is one line saying which type to give and which key sets the count."""
    from pytest_verl_compat.memory.gpus import UnknownGpu, find_gpu

    with pytest.raises(UnknownGpu) as caught:
        find_gpu(given)
    message = str(caught.value)
    assert f"give --gpu {gpu}" in message and f"trainer.n_gpus_per_node={count}" in message
    find_gpu(gpu)  # the type alone is known
