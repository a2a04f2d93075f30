"""GPU types as data (``data/gpus.yaml``): what one device holds, as the framework sees it."""

from __future__ import annotations

import functools
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pytest_verl_compat.files.safe_input import load_yaml_file

GPUS_FILE = Path(__file__).resolve().parents[1] / "data" / "gpus.yaml"
GIB = 1 << 30


class UnknownGpu(ValueError):
    """A GPU type the table does not name (the message lists the known ones)."""


@dataclass(frozen=True)
class Gpu:
    """One device type: its name, the usable bytes torch reports, and where that number is quoted."""

    name: str
    usable_bytes: int
    nominal_gb: int | None = None
    source: str = ""

    @property
    def usable_gib(self) -> float:
        return self.usable_bytes / GIB

    def label(self) -> str:
        return f"{self.name} ({self.usable_gib:.2f} GiB usable)"


# Words a device's name carries as nvidia-smi, rocm-smi and torch.cuda.get_device_name print it
# ("NVIDIA A100-SXM4-80GB", "NVIDIA H100 80GB HBM3", "Tesla V100-SXM2-32GB", "NVIDIA GeForce RTX
# 4090", "AMD Instinct MI300X") that name no other type: the vendor, the product line, the board
# form factor and the memory generation. What is left is the type's name.
_NOT_THE_TYPE = re.compile(
    r"\b(nvidia|amd|instinct|tesla|geforce|quadro|sxm[2-6]?|pcie|hbm[23]e?|nvlink)\b"
)


def _normal(name: str) -> str:
    words = _NOT_THE_TYPE.sub(" ", re.sub(r"[^a-z0-9]+", " ", name.lower()))
    return "".join(ch for ch in words if ch.isalnum())


@functools.cache
def _data() -> Any:
    """data/gpus.yaml, read once."""
    return load_yaml_file(GPUS_FILE, "GPU table")


@functools.cache
def gpu_table() -> dict[str, Gpu]:
    """Every GPU type of the table by its name, in the table's order."""
    data = _data()
    table: dict[str, Gpu] = {}
    for name, entry in data["gpus"].items():
        table[name] = Gpu(
            name,
            round(float(entry["usable_gib"]) * GIB),
            entry.get("nominal_gb"),
            str(entry.get("source", "")),
        )
    return table


@functools.cache
def _aliases() -> dict[str, str]:
    data = _data()
    found: dict[str, str] = {}
    for name, entry in data["gpus"].items():
        for alias in (name, *entry.get("aliases", ())):
            found[_normal(str(alias))] = name
    return found


@functools.cache
def _ambiguous() -> dict[str, tuple[str, ...]]:
    """Names more than one type goes by (the table's ``ambiguous``), each with its sizes' names."""
    return {
        _normal(str(name)): tuple(str(kind) for kind in kinds)
        for name, kinds in (_data().get("ambiguous") or {}).items()
    }


# A count before the type, as reports write their machines ("8xH100", "8 x A100 80GB").
_COUNTED = re.compile(r"^\s*(\d+)\s*[x*\u00d7]\s*(\S.*)$", re.IGNORECASE)


def find_gpu(name: str) -> Gpu:
    """The GPU type named (case, dashes and spaces ignored; aliases such as H800 for H100-80GB)."""
    key = _aliases().get(_normal(name))
    kinds = _ambiguous().get(_normal(name)) if key is None else None
    if kinds:
        table, aliases = gpu_table(), _aliases()
        each = " or ".join(
            f"{kind} ({table[aliases[_normal(kind)]].usable_gib:.2f} GiB usable)" for kind in kinds
        )
        raise UnknownGpu(
            f"GPU type {name.strip()!r} names more than one type: {each}; give the one the run has "
            "(torch.cuda.get_device_name and nvidia-smi print it with its size)"
        )
    counted = _COUNTED.match(name) if key is None else None
    if counted and _normal(counted.group(2)) in _aliases():
        # the count is the launch's, never the option's: a forecast of other GPUs than the
        # launch asks for would be of another run
        kind = counted.group(2).strip()
        raise UnknownGpu(
            f"--gpu names one device type ({kind}), not how many: the launch's "
            "trainer.n_gpus_per_node x trainer.nnodes (torchrun's --nproc_per_node for SFT) is "
            f"the count; give --gpu {kind} and, for other counts, --set "
            f"trainer.n_gpus_per_node={counted.group(1)}"
        )
    if key is None:
        known = ", ".join(gpu_table())
        raise UnknownGpu(
            f"unknown GPU type {name!r} (known: {known}; or give --gpu-memory GIB, the usable GiB)"
        )
    return gpu_table()[key]


def custom_gpu(gib: float) -> Gpu:
    """A device of ``gib`` usable GiB (``--gpu-memory``)."""
    if not (gib > 0 and math.isfinite(gib)):
        raise UnknownGpu(f"--gpu-memory must be a positive number of GiB, got {gib}")
    return Gpu(f"{gib:g} GiB", round(gib * GIB), None, "given with --gpu-memory")


def smallest_and_largest() -> tuple[Gpu, Gpu]:
    """The table's smallest and largest devices (the assumptions of a forecast without a GPU)."""
    gpus = sorted(gpu_table().values(), key=lambda g: (g.usable_bytes, g.name))
    return gpus[0], gpus[-1]
