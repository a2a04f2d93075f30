"""Which models' LoRA cannot run in a release's environment: the routers peft wraps and the MoE
block then reads through, found in that environment's own peft and transformers.

Run as ``python -I -m pytest_verl_compat.upstream.probes.lora_routers_probe`` in a release's
environment (``verl-compat release derive VERSION --only lora-routers``); prints JSON.

Since transformers v5 a MoE router is a module holding a ``weight`` parameter, no longer an
``nn.Linear``. peft converts a v4-style LoRA target list for the model types transformers
converts (``_MODEL_TO_CONVERSION_PATTERN``): the router's v4 name (``gate``, matched as itself or
as ``*.gate``, and ``all-linear``, which matched every linear of v4) becomes a *parameter* target
(``gate.weight``), and peft replaces the router with a ``ParamWrapper`` around it. A MoE block
that calls the router still works; one that reads another attribute of it (DeepSeek V3's
``self.gate.e_score_correction_bias``) finds the wrapper, which has none: an ``AttributeError``
at the first forward. The answer lists, per model type, that read (the first of its modeling
file), where it is, and peft's line mapping the target.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import json
import sys
from pathlib import Path
from typing import Any

# The JSON keys of the answer (pytest_verl_compat/releases/lora_routers.py reads them).
KEY_VERSIONS = "versions"
KEY_TARGET = "router_target"
KEY_ROUTERS = "model_types"
PACKAGES = ("transformers", "peft")


def site_path(path: str) -> str:
    """A file of the environment as its path under site-packages."""
    parts = Path(path).parts
    return "/".join(parts[len(parts) - 1 - parts[::-1].index("site-packages") + 1 :])


def _line_after(path: str, needles: tuple[str, ...]) -> tuple[int, str]:
    """The line holding the last of ``needles``, each found after the line of the one before."""
    lines = Path(path).read_text(encoding="utf-8").splitlines()
    number = 0
    for needle in needles:
        number = next(i for i in range(number, len(lines)) if needle in lines[i])
    return number + 1, lines[number].strip()


def _reads_through(
    module_path: str, router: str, provided: set[str]
) -> tuple[int, str, str] | None:
    """The first read of ``self.<router>.<name>`` in a modeling file whose name the wrapper does
    not provide: (line, attribute, the statement)."""
    source = Path(module_path).read_text(encoding="utf-8")
    reads = []
    for node in ast.walk(ast.parse(source)):
        inner = node.value if isinstance(node, ast.Attribute) else None
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.ctx, ast.Load)
            and isinstance(inner, ast.Attribute)
            and inner.attr == router
            and isinstance(inner.value, ast.Name)
            and inner.value.id == "self"
            and node.attr not in provided
        ):
            reads.append((node.lineno, node.attr))
    if not reads:
        return None
    line, name = min(reads)
    return line, name, source.splitlines()[line - 1].strip()


def derive() -> dict[str, Any]:
    from importlib.metadata import version

    from peft.tuners.lora.layer import ParamWrapper
    from peft.utils import transformers_weight_conversion as conversion
    from transformers.models.auto.configuration_auto import model_type_to_module_name

    provided = set(dir(ParamWrapper))
    mappings = conversion._MOE_TARGET_MODULE_MAPPING
    conversion_file = inspect.getsourcefile(conversion) or ""
    routers: dict[str, Any] = {}
    target: dict[str, Any] = {}
    for model_type, pattern in sorted(conversion._MODEL_TO_CONVERSION_PATTERN.items()):
        parameter = mappings.get(pattern, {}).get("gate")
        if parameter is None:
            continue
        module_name = model_type_to_module_name(model_type)
        try:
            module = importlib.import_module(
                f"transformers.models.{module_name}.modeling_{module_name}"
            )
        except ImportError:
            continue  # a type whose modeling file has another name (a sub-config): not a model
        path = inspect.getsourcefile(module) or ""
        found = _reads_through(path, parameter.split(".")[0], provided)
        if found is None:
            continue
        line, name, statement = found
        routers[model_type] = {
            "parameter": parameter,
            "pattern": pattern,
            "attribute": name,
            "where": f"{site_path(path)}:{line}",
            "statement": statement,
        }
        if pattern not in target:
            number, text = _line_after(
                conversion_file,
                ("_MOE_TARGET_MODULE_MAPPING", f'"{pattern}": {{', f'"gate": "{parameter}"'),
            )
            target[pattern] = {
                "where": f"{site_path(conversion_file)}:{number}",
                "statement": text,
            }
    return {
        KEY_VERSIONS: {package: version(package) for package in PACKAGES},
        KEY_TARGET: target,
        KEY_ROUTERS: routers,
    }


def print_answer(answer: dict[str, Any]) -> int:
    """A probe's answer on stdout: sorted, indented JSON (what ``release derive`` keeps)."""
    json.dump(answer, sys.stdout, indent=1, sort_keys=True)
    sys.stdout.write("\n")
    return 0


def main() -> int:
    return print_answer(derive())


if __name__ == "__main__":
    raise SystemExit(main())
