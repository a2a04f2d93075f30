"""Each stand-in against what it replaces, and a failure a stand-in caused: the sandbox's, never the
user's (oracle process only).

A stand-in keeps upstream's contract where the probes run upstream's code without a cluster, GPUs,
models or data: it takes the calls upstream makes of it and sets what upstream's own code would
set. What the real code sets is read from the release's own source (``ast`` of the replaced
function, and of the functions it calls on ``self`` and on the objects it calls by method
name): ``LLMServerManager._init_global_load_balancer`` sets ``self.global_load_balancer``
(verl/workers/rollout/llm_server.py:600-611), which the separate-async trainer hands on;
``TrainingWorker.reset`` calls ``engine.initialize()`` (engine_workers.py:178), which sets the
engine's module, optimizer and scheduler.

Two uses:

- ``contract_gaps``: for each patch in force, what the real one sets that the stand-in does not,
  and the calls it accepts that the stand-in refuses, less the gaps each stand-in declares with
  a reason (``KNOWN_GAPS``): ``tests/test_stand_ins.py`` fails when upstream's class changes, for
  every supported release;
- ``sandbox_failure``: a failure raised inside a stand-in's own code, or an ``AttributeError``
  on an object of a stand-in class or on an attribute a replaced function would have set, is
  not decided here: a note (an ``info``), never a finding against the configuration.
"""

from __future__ import annotations

import ast
import fnmatch
import functools
import inspect
import textwrap
import traceback
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pytest_verl_compat.upstream.probes.patching import MISSING, in_force, patch_point

_PACKAGE = Path(__file__).resolve().parents[2]  # pytest_verl_compat/
_PROBES = Path(__file__).resolve().parent
# How deep the calls a replaced function makes are followed for what they set.
_DEPTH = 3

# A note's rule: what the sandbox decided, not the configuration.
STAND_IN_RULE = "env.stand-in"


@dataclass(frozen=True)
class Sets:
    """What a function sets on ``self`` (directly or through the ``self`` methods it calls), and
    the method names it calls on other objects (``self.engine.initialize()``)."""

    attributes: frozenset[str]
    calls: frozenset[str]


def _function(value: Any) -> Any:
    """The plain function behind a method, classmethod, staticmethod, property or partial."""
    for attribute in ("__func__", "fget", "func"):
        inner = getattr(value, attribute, None)
        if inner is not None and not isinstance(value, type):
            return _function(inner)
    return inspect.unwrap(value) if callable(value) else value


@functools.lru_cache(maxsize=1024)
def _tree(function: Any) -> ast.AST | None:
    try:
        source = textwrap.dedent(inspect.getsource(function))
        return ast.parse(source)
    except (OSError, TypeError, SyntaxError, IndentationError):
        return None


def _self_name(tree: ast.AST) -> str:
    """The first parameter's name (``self``; a factory's ``cls``, whose instance is then what
    ``instance = cls(…)`` binds, is followed as ``self`` too)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            arguments = [*node.args.posonlyargs, *node.args.args]
            return arguments[0].arg if arguments else ""
    return ""


def _instances(tree: ast.AST, self_name: str) -> set[str]:
    """Names that stand for the instance: ``self``, and in a factory ``x = cls(…)``."""
    names = {self_name} if self_name else set()
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Assign)
            and isinstance(node.value, ast.Call)
            and isinstance(node.value.func, ast.Name)
            and node.value.func.id == self_name
        ):
            names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
    return names


def _super_call(node: ast.Call) -> bool:
    """``super().name(…)``."""
    receiver = node.func.value if isinstance(node.func, ast.Attribute) else None
    return (
        isinstance(receiver, ast.Call)
        and isinstance(receiver.func, ast.Name)
        and receiver.func.id == "super"
    )


def _own_sets(function: Any) -> tuple[set[str], set[str], set[str]]:
    """(attributes set on the instance, its own methods called (``super().m`` as ``super.m``),
    other objects' methods called)."""
    tree = _tree(_function(function))
    if tree is None:
        return set(), set(), set()
    selves = _instances(tree, _self_name(tree))
    attributes: set[str] = set()
    own: set[str] = set()
    other: set[str] = set()
    for node in ast.walk(tree):
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets = list(node.targets)
        elif isinstance(node, ast.AnnAssign | ast.AugAssign):
            targets = [node.target]
        for target in targets:
            for element in target.elts if isinstance(target, ast.Tuple) else [target]:
                if (
                    isinstance(element, ast.Attribute)
                    and isinstance(element.value, ast.Name)
                    and element.value.id in selves
                ):
                    attributes.add(element.attr)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            receiver = node.func.value
            if isinstance(receiver, ast.Name) and receiver.id in selves:
                own.add(node.func.attr)
            elif _super_call(node):
                own.add(f"super.{node.func.attr}")
            else:
                other.add(node.func.attr)
            # ``self.__dict__.update(name=…)`` and ``setattr(self, "name", …)``
            if (
                node.func.attr == "update"
                and isinstance(receiver, ast.Attribute)
                and receiver.attr == "__dict__"
            ):
                attributes.update(k.arg for k in node.keywords if k.arg)
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id == "setattr"
            and len(node.args) >= 2
            and isinstance(node.args[0], ast.Name)
            and node.args[0].id in selves
            and isinstance(node.args[1], ast.Constant)
            and isinstance(node.args[1].value, str)
        ):
            attributes.add(node.args[1].value)
    return attributes, own, other


def sets(function: Any, owner: type | None = None, depth: int = _DEPTH) -> Sets:
    """What ``function`` (of class ``owner``) sets on its instance, following the methods of
    ``owner`` it calls on ``self`` ``depth`` deep; and the methods it calls on other objects."""
    attributes, own, other = _own_sets(function)
    if owner is not None and depth > 0:
        for name in sorted(own):
            if name.startswith("super."):
                holder = _holder(function, owner)
                method = _after(owner, holder, name.partition(".")[2])
            else:
                method = inspect.getattr_static(owner, name, None)
            if method is None or isinstance(method, type):
                continue
            inner = sets(method, owner, depth - 1)
            attributes |= inner.attributes
            other |= inner.calls
    return Sets(frozenset(attributes), frozenset(other))


def _holder(function: Any, owner: type) -> type:
    """The class of ``owner``'s lineage whose own dict holds ``function``."""
    target = _function(function)
    for cls in owner.__mro__:
        if any(_function(v) is target for v in vars(cls).values()):
            return cls
    return owner


def _after(owner: type, holder: type, name: str) -> Any:
    """``name`` as ``super()`` in ``holder`` finds it on an instance of ``owner``."""
    mro = owner.__mro__
    for cls in mro[mro.index(holder) + 1 :] if holder in mro else ():
        if name in vars(cls):
            return vars(cls)[name]
    return None


def _owner_class(owner: Any) -> type | None:
    if isinstance(owner, type):
        return owner
    if inspect.ismodule(owner):
        return None
    return type(owner)


# --- a failure a stand-in caused ------------------------------------------------------------------


def _ours(filename: str) -> bool:
    try:
        Path(filename).resolve().relative_to(_PACKAGE)
    except ValueError:
        return False
    return True


def _stand_in_class(obj: Any) -> bool:
    """An object of a class the probes define (``StandIn``, ``LocalWorker``, ``FakeMesh``…)."""
    return any(
        _ours(inspect.getsourcefile(cls) or "")
        for cls in type(obj).__mro__  # ``type.mro()`` unbound when ``obj`` is a class
        if cls.__module__.startswith("pytest_verl_compat.")
    )


def _would_set(obj: Any, name: str) -> str:
    """The replaced function whose real code would have set ``obj.name``, or ""."""
    for owner, attribute, real, _ in in_force():
        if not callable(real) or isinstance(real, type):
            continue
        cls = _owner_class(owner)
        found = sets(real, cls)
        if cls is not None and isinstance(obj, cls) and name in found.attributes:
            return f"{cls.__qualname__}.{attribute}"
        for method in sorted(found.calls):
            candidate = inspect.getattr_static(type(obj), method, None)
            if candidate is not None and name in sets(candidate, type(obj)).attributes:
                return f"{_qualified(owner, attribute)} (through {type(obj).__name__}.{method})"
    return ""


def _qualified(owner: Any, attribute: str) -> str:
    cls = _owner_class(owner)
    return f"{cls.__qualname__}.{attribute}" if cls is not None else attribute


def sandbox_failure(exc: BaseException) -> str:
    """Why a failure is the sandbox's rather than the configuration's ("" when it is not): it was
    raised in a stand-in's own code, or it is an ``AttributeError`` on a stand-in's object or on
    an attribute a replaced function would have set."""
    frames = list(traceback.walk_tb(exc.__traceback__))
    if frames and _ours(frames[-1][0].f_code.co_filename):
        frame = frames[-1][0]
        return f"raised inside the stand-in {frame.f_code.co_name} ({type(exc).__name__}: {exc})"
    if isinstance(exc, AttributeError):
        name = getattr(exc, "name", None)
        obj = getattr(exc, "obj", None)
        if name is None or obj is None:
            return ""
        if _stand_in_class(obj):
            return f"the stand-in {type(obj).__name__} has no {name!r}"
        replaced = _would_set(obj, name)
        if replaced:
            return (
                f"{type(obj).__name__}.{name} is set by {replaced}, which the probes stand in for"
            )
    return ""


def note(step: str, where: str, reason: str, keys: list[str]) -> dict[str, Any]:
    """The note of a failure the sandbox caused (``optional``'s note keys, with its fix)."""
    return {
        "rule": STAND_IN_RULE,
        "message": f"not decided here: {step} stopped on the sandbox, not on the configuration "
        f"({reason})",
        "where": where,
        "keys": keys,
        "fix": "nothing: what the step would check is not evaluated on this machine",
    }


# --- each stand-in against what it replaces ------------------------------------------------------

# What a stand-in does not set or accept of what it replaces, by patch point, each with why that is
# safe; an entry that matches no patch of a run is stale (``unmatched_known_gaps``).
_NEVER_SPAWNED = (
    "the trainer only spawns the group (trainer_base.py:307-311, the asynchronous trainers' "
    "separation/ray_trainer.py:227-234); what it reads afterwards is each spawned worker's, which "
    "LocalWorker takes from the real worker"
)
_NOT_TRAINED = (
    "the training loop, not run: the probes end where it starts, after its resume "
    "(separation/ray_trainer.py:293-295), so nothing reads what the loop sets"
)
_USER_ROWS = "rows of the user's data files: the probes read no row (no __getitem__)"
_MEGATRON_STEP = (
    "the stand-in step stops at the micro-batch split; optimizer_step, which reads it "
    "(megatron/transformer_impl.py:689, 976-980), is not run on a Megatron engine"
)
# Keys are patch points, or fnmatch patterns of them (one engine class's methods for each head).
KNOWN_GAPS: dict[str, dict[str, str]] = {
    "verl.utils.dataset.multiturn_sft_dataset.MultiTurnSFTDataset._read_files_and_process": dict.fromkeys(
        ("dataframe", "enable_thinking", "generation_prompt", "system_prompt", "tools"),
        _USER_ROWS,
    ),
    "verl.workers.engine.megatron.transformer_impl.MegatronEngineWith*Head.*_batch": dict.fromkeys(
        ("_distillation_use_topk_active", "mini_layer_topk_idx_list"), _MEGATRON_STEP
    ),
    # main_ppo's trainer's (trainer_base) and the asynchronous runners' (separation/utils.py:74)
    "verl.*.RayWorkerGroup": dict.fromkeys(
        (
            "_checker_thread",
            "_collect_info",
            "_dispatch_info",
            "_is_init_with_detached_workers",
            "_master_addr",
            "_master_port",
            "_process_dispatch_config",
            "_ray_master_port_range",
            "_ray_wait_register_center_timeout",
            "_worker_names",
            "_workers",
            "_world_size",
            "customized_worker_env",
            "device_name",
            "fused_worker_used",
            "method_names",
            "name_prefix",
            "profile_steps",
            "ray_cls_with_init",
            "resource_pool",
            "sub_cls_name",
            "use_gpu",
            "wg_dict",
            "worker_nsight_options",
        ),
        _NEVER_SPAWNED,
    ),
    "verl.experimental.one_step_off_policy.ray_trainer.OneStepOffRayTrainer.fit": dict.fromkeys(
        (
            "_dump_futures",
            "curr_step_profile",
            "future_reward",
            "global_steps",
            "is_last_step",
            "last_val_metrics",
            "logger",
            "max_steps_duration",
            "metrics",
            "next_step_profile",
            "prev_step_profile",
            "progress_bar",
            "reward_extra_infos_dict",
            "reward_tensor",
            "timing_raw",
        ),
        _NOT_TRAINED,
    ),
}


@dataclass(frozen=True)
class Gap:
    """One way a stand-in falls short of what it replaces."""

    point: str  # the patched name (a registry's: with the stand-in class's method)
    kind: str  # "attribute" or "call"
    name: str

    def line(self) -> str:
        what = "sets no" if self.kind == "attribute" else "refuses the argument"
        return f"{self.point}: the stand-in {what} {self.name!r}, which upstream's own does"


def _accepts(real: Any, stand_in: Any) -> list[str]:
    """The parameters of ``real`` that a call of ``stand_in`` refuses (by name or position)."""
    try:
        # A method patched on an instance is called bound: its ``self`` is not the caller's.
        wanted = inspect.signature(real if inspect.ismethod(real) else _function(real))
        given = inspect.signature(stand_in)
    except (TypeError, ValueError):
        return []
    parameters = list(given.parameters.values())
    takes_args = any(p.kind == p.VAR_POSITIONAL for p in parameters)
    takes_kwargs = any(p.kind == p.VAR_KEYWORD for p in parameters)
    positional = [p for p in parameters if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    named = {p.name for p in parameters if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    refused = []
    for index, parameter in enumerate(wanted.parameters.values()):
        if parameter.kind == parameter.VAR_POSITIONAL:
            if not takes_args:
                refused.append(f"*{parameter.name}")
            continue
        if parameter.kind == parameter.VAR_KEYWORD:
            if not takes_kwargs:
                refused.append(f"**{parameter.name}")
            continue
        by_position = parameter.kind != parameter.KEYWORD_ONLY and (
            index < len(positional) or takes_args
        )
        by_name = parameter.kind != parameter.POSITIONAL_ONLY and (
            parameter.name in named or takes_kwargs
        )
        if not (by_position and by_name) and not (
            (by_position and parameter.kind == parameter.POSITIONAL_ONLY)
            or (by_name and parameter.kind == parameter.KEYWORD_ONLY)
        ):
            refused.append(parameter.name)
    return refused


def _answers_everything(cls: Any) -> bool:
    """A class of ours whose instances answer any attribute (``StandIn``)."""
    return (
        isinstance(cls, type)
        and _is_ours(cls)
        and inspect.getattr_static(cls, "__getattr__", None) is not None
    )


def _returned_class(function: Any) -> Any:
    """The class a stand-in factory says it returns (its return annotation), or None."""
    annotation = inspect.signature(function).return_annotation
    if isinstance(annotation, str):
        annotation = getattr(function, "__globals__", {}).get(annotation)
    return annotation if isinstance(annotation, type) else None


def _provides(stand_in: Any, attribute: str) -> bool:
    """Whether the stand-in gives ``attribute``: a class (its own attributes, what its
    ``__init__`` sets, or any, for ``StandIn``), a factory of such a class, or a function that
    sets it on its ``self``."""
    if not isinstance(stand_in, type):
        made = _returned_class(stand_in)
        if made is None:
            return attribute in sets(stand_in).attributes
        stand_in = made
    if _answers_everything(stand_in):
        return True
    if inspect.getattr_static(stand_in, attribute, None) is not None:
        return True
    init = inspect.getattr_static(stand_in, "__init__", None)
    return init is not None and attribute in sets(init, stand_in).attributes


def _real_sets(owner: Any, real: Any) -> frozenset[str]:
    if isinstance(real, type):
        init = inspect.getattr_static(real, "__init__", None)
        return sets(init, real).attributes if init is not None else frozenset()
    return sets(real, _owner_class(owner)).attributes


def _is_ours(value: Any) -> bool:
    try:
        filename = inspect.getsourcefile(_function(value))
    except TypeError:
        return False
    return bool(filename) and _ours(str(filename))


def _code_pairs(
    point: str, real: Any, stand_in: Any
) -> Iterator[tuple[str, type | None, Any, Any, type | None]]:
    """(point, upstream's class or None, upstream's code, the stand-in, the stand-in's class or
    None) of each piece of code a patch stands in for: the patched callable itself; for a
    registry, each stand-in class it hands out that subclasses one of upstream's, method by
    method (``StandInReplica.init_hybrid`` for ``RolloutReplica.init_hybrid``)."""
    if isinstance(stand_in, dict):
        made = {_made_class(value) for value in stand_in.values()}
        for cls in sorted((c for c in made if c is not None), key=lambda c: c.__qualname__):
            yield from _subclass_pairs(point, cls)
        return
    if real is MISSING or _is_ours(real) or not _is_ours(stand_in) or _is_hook(stand_in):
        return
    if callable(_function(real)) and callable(stand_in):
        yield point, None, real, stand_in, None


def _is_hook(value: Any) -> bool:
    """The recorder's hooks wrap upstream's own functions and call them: no stand-in."""
    try:
        filename = inspect.getsourcefile(_function(value)) or ""
    except TypeError:
        return False
    return Path(filename).resolve() == _PROBES / "recorder.py"


def _made_class(value: Any) -> type | None:
    """The class a registry entry of ours hands out (the class, or a loader returning it)."""
    if isinstance(value, type):
        return value if _is_ours(value) else None
    if callable(value) and _is_ours(value):
        try:
            if not inspect.signature(value).parameters:
                made = value()
                return made if isinstance(made, type) and _is_ours(made) else None
        except (TypeError, ValueError):
            return None
    return None


def _subclass_pairs(
    point: str, cls: type
) -> Iterator[tuple[str, type | None, Any, Any, type | None]]:
    parent = next((base for base in cls.__mro__[1:] if not _is_ours(base)), None)
    if parent is None or parent is object:
        return
    for name, value in sorted(vars(cls).items()):
        real = inspect.getattr_static(parent, name, None)
        if (name.startswith("__") and name != "__init__") or real is None or not callable(value):
            continue
        yield f"{point}[{cls.__name__}.{name}]", parent, real, value, cls


def _given(replacement: Any, holder: type | None) -> frozenset[str]:
    """What a stand-in method sets, with what its class's ``__init__`` set before."""
    given = sets(replacement, holder).attributes
    init = inspect.getattr_static(holder, "__init__", None) if holder is not None else None
    return given | (sets(init, holder).attributes if init is not None else frozenset())


def _known(point: str) -> dict[str, str]:
    return {
        name: why
        for pattern, gaps in KNOWN_GAPS.items()
        if fnmatch.fnmatchcase(point, pattern)
        for name, why in gaps.items()
    }


def _only_raises(stand_in: Any) -> bool:
    """A stand-in whose body only raises (``not evaluated here``): what it replaces is not run,
    so there is nothing it should have set."""
    tree = _tree(_function(stand_in))
    function = (
        next(
            (n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)),
            None,
        )
        if tree is not None
        else None
    )
    if function is None:
        return False
    body = [
        statement
        for statement in function.body
        if not (isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Constant))
    ]
    return len(body) == 1 and isinstance(body[0], ast.Raise)


def _decides_what_it_makes(stand_in: Any) -> bool:
    """A stand-in class with its own ``__new__`` (``UnshardedFSDP`` gives the module itself,
    unwrapped): its instances are not instances of what it replaces."""
    return isinstance(stand_in, type) and "__new__" in vars(stand_in)


def contract_gaps(patches: Iterable[tuple[Any, str, Any, Any]]) -> list[Gap]:
    """Each stand-in of ``patches`` (``patching.watching``'s entries) that falls short of the code
    it replaces: a call upstream makes that it refuses, an attribute upstream's code sets that it
    does not; less ``KNOWN_GAPS``."""
    gaps: set[Gap] = set()
    for owner, name, real, stand_in in patches:
        for point, parent, code, replacement, holder in _code_pairs(
            patch_point(owner, name), real, stand_in
        ):
            known = _known(point)
            gaps.update(
                Gap(point, "call", parameter)
                for parameter in _accepts(code, replacement)
                if parameter not in known
            )
            if _only_raises(replacement) or _decides_what_it_makes(replacement):
                continue
            if holder is not None:
                missing = sets(code, parent).attributes - _given(replacement, holder)
            else:
                missing = frozenset(
                    a for a in _real_sets(owner, code) if not _provides(replacement, a)
                )
            gaps.update(Gap(point, "attribute", a) for a in missing if a not in known)
    return sorted(gaps, key=lambda gap: (gap.point, gap.kind, gap.name))


def unmatched_known_gaps(points: Iterable[str]) -> list[str]:
    """The points of ``KNOWN_GAPS`` that no patch of ``points`` met: stale entries."""
    met = set(points)
    return sorted(
        pattern
        for pattern in KNOWN_GAPS
        if not any(fnmatch.fnmatchcase(point, pattern) for point in met)
    )
