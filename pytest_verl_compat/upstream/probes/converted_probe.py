"""The values a configuration's role classes hold after upstream's own conversion, answered in
the oracle process (``--serve``) for the proofs from reads of tests/test_no_effect_adversarial.py.

A ``converted`` question holds a resolved mapping and the sections to convert; the answer holds
each converted section's values by the dotted path of the tree key they come from. A
``__post_init__`` may rewrite a field the tree sets (FSDPActorConfig syncs its engine's strategy
to its own, verl/workers/config/actor.py:326-329): the code that reads the class sees these
values, not the tree's.
"""

from __future__ import annotations

import contextlib
import io
import warnings
from collections.abc import Callable, Mapping
from typing import Any

KIND = "converted"
KEY_LEAVES = "leaves"
KEY_REFUSED = "refused"
# Upstream's own deciders of the roles a run starts (verl/trainer/ppo/utils.py), by name.
KEY_ROLES = "roles"


def converted(request: Mapping[str, Any]) -> dict[str, Any]:
    """The values each role's config class holds after upstream's own conversion
    (``omega_conf_to_dataclass``, its ``__post_init__`` included: FSDPActorConfig syncs its
    engine's strategy to its own, verl/workers/config/actor.py:326-329), by the dotted path of the
    tree key they come from: for each section of ``request["sections"]``. A nested model section
    is left unconverted, and a model section is not converted at all (its class reads the
    model's files). A section upstream refuses is named with its error."""
    import dataclasses

    from omegaconf import OmegaConf
    from verl.utils.config import omega_conf_to_dataclass

    cfg = OmegaConf.create(dict(request["mapping"]))
    leaves: dict[str, Any] = {}
    refused: dict[str, str] = {}

    def walk(value: Any, path: str) -> None:
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            for field in dataclasses.fields(value):
                if field.name != "_target_":  # the class's own name, not a tree value
                    walk(getattr(value, field.name), f"{path}.{field.name}")
        elif isinstance(value, Mapping):
            for name, item in value.items():
                walk(item, f"{path}.{name}")
        elif value is None or isinstance(value, bool | int | float | str):
            leaves[path] = value

    for section in request["sections"]:
        node = OmegaConf.select(cfg, section)
        if node is None or section.rpartition(".")[2] == "model":
            continue
        node = node.copy()
        for name in list(node.keys()):
            if name == "model" and OmegaConf.is_dict(node[name]):
                node[name].pop("_target_", None)
        try:
            with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
                warnings.simplefilter("ignore")
                walk(omega_conf_to_dataclass(node), section)
        except Exception as exc:
            refused[section] = (
                f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
            )
    return {KEY_LEAVES: leaves, KEY_REFUSED: refused, KEY_ROLES: _roles(cfg)}


def _roles(cfg: Any) -> dict[str, bool | str]:
    """need_critic and need_reference_policy on the configuration, as the trainers call them
    (verl/trainer/main_ppo.py:180-181); an error is named instead of a verdict."""
    from verl.trainer.ppo import utils

    out: dict[str, bool | str] = {}
    for name in ("need_critic", "need_reference_policy"):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                out[name] = bool(getattr(utils, name)(cfg))
        except Exception as exc:
            out[name] = f"{type(exc).__name__}: {exc}"
    return out


ORACLE_HANDLERS: dict[str, Callable[[Mapping[str, Any]], dict[str, Any]]] = {KIND: converted}
