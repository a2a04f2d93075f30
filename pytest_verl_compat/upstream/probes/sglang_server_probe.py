"""What a release hands SGLang: its own expressions for SGLang's ``max_lora_rank`` and
``lora_target_modules`` (when it serves the actor's LoRA as an adapter), evaluated on each class
of value a configuration may hold, and the attention backend it picks when the configuration
names none, for the SGLang its sglang extra pins on a CUDA GPU.

Run as ``python -I -m pytest_verl_compat.upstream.probes.sglang_server_probe`` in a release's
environment (``verl-compat release derive VERSION --only sglang-server``); prints JSON.

verl's SGLang server module imports SGLang at its top, which a release's environment here does not
install, so the module is read, not imported: the dict entries it builds SGLang's server
arguments with (``"max_lora_rank": …``, ``"lora_target_modules": …``) are found in its source and
their expressions evaluated by Python on a model config holding each sample, with the names they
call taken from the module's own imports (``verl.workers.rollout.sglang_rollout.utils``, which
imports no SGLang). A value the expression passes on is recorded as it comes out; a value it
refuses, as its exception. The attention backend's default is the module's own ``if
attention_backend is None:`` block, run with SGLang's version the pin, ``torch.version.hip``
None (CUDA) and ``packaging.version``.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from pytest_verl_compat.upstream.probes.lora_routers_probe import print_answer, site_path

SERVER_MODULE = "verl.workers.rollout.sglang_rollout.async_sglang_server"
# The JSON keys of the answer (pytest_verl_compat/releases/sglang_server.py reads them).
KEY_RANK = "max_lora_rank"
KEY_TARGETS = "lora_target_modules"
KEY_WHERE = "where"
KEY_STATEMENT = "statement"
KEY_RENDERS = "renders"
KEY_SGLANG = "sglang"  # the SGLang release the verl release's sglang extra pins
KEY_ATTENTION = "attention_backend"  # the backend verl picks when engine_kwargs names none
KEY_DEFAULT = "default"
VALUE = "{value}"  # the configuration's value: handed on as written, or quoted in a refusal
RAISES = "raises: "  # the prefix of a refusal, then the exception's type and message
# One sample per class of value the check tells apart (checks/sglang_lora.py target_class).
TARGET_SAMPLES: dict[str, Any] = {
    "all-linear": "all-linear",
    "pattern": r".*\.(q_proj|v_proj)",
    "list": ["q_proj", "v_proj"],
    "null": None,
}
# The LoRA rank in each spelling alone (the FSDP engine's and the Megatron engine's).
RANK_SAMPLES: dict[str, dict[str, Any]] = {
    "lora_rank": {"lora_rank": 16, "lora": {"rank": 0}},
    "lora.rank": {"lora_rank": 0, "lora": {"rank": 16}},
}


def _entries(tree: ast.Module) -> dict[str, ast.expr]:
    """The server-argument dict entries of interest, by key, with their value expressions."""
    found = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Dict):
            for key, value in zip(node.keys, node.values, strict=True):
                if isinstance(key, ast.Constant) and key.value in (KEY_RANK, KEY_TARGETS):
                    found[str(key.value)] = value
    return found


def _namespace(tree: ast.Module) -> dict[str, Any]:
    """The names the module imports from verl's own SGLang utilities (no SGLang import)."""
    names: dict[str, Any] = {}
    for node in tree.body:
        if (
            isinstance(node, ast.ImportFrom)
            and node.module == "verl.workers.rollout.sglang_rollout.utils"
        ):
            module = importlib.import_module(node.module)
            for alias in node.names:
                names[alias.asname or alias.name] = getattr(module, alias.name)
    return names


def _render(expression: ast.expr, names: dict[str, Any], model: dict[str, Any], sample: Any) -> Any:
    """verl's expression on a model config holding ``model``: what it gives (``VALUE`` where that
    is the sample itself, handed on as written), or its refusal (its exception, the sample's
    quoted value replaced by ``VALUE``). A rank sample is None: its renders are the ranks."""
    code = compile(ast.Expression(expression), "<verl>", "eval")
    scope = {"self": SimpleNamespace(model_config=SimpleNamespace(**model))}
    try:
        # verl's own expression, run as the other probes run upstream code (sandboxed)
        given = eval(code, {"__builtins__": __builtins__, **names}, scope)
    except Exception as exc:
        refusal = f"{RAISES}{type(exc).__name__}: {exc}"
        return refusal.replace(repr(sample), VALUE) if isinstance(sample, str) else refusal
    # the configuration's own value, handed on as it is
    return VALUE if sample is not None and given == sample else given


def _sglang_pin() -> str:
    """The SGLang version the release's sglang extra asks for exactly ("" when none)."""
    from importlib.metadata import requires

    for requirement in requires("verl") or ():
        name, _, rest = requirement.partition("==")
        if name.split("[")[0].strip() == "sglang" and 'extra == "sglang"' in rest:
            return rest.split(";")[0].strip()
    return ""


def _picks_when_unset(node: ast.AST) -> bool:
    """``if attention_backend is None:``"""
    test = getattr(node, "test", None)
    return (
        isinstance(node, ast.If)
        and isinstance(test, ast.Compare)
        and isinstance(test.left, ast.Name)
        and test.left.id == KEY_ATTENTION
        and isinstance(test.ops[0], ast.Is)
        and isinstance(test.comparators[0], ast.Constant)
        and test.comparators[0].value is None
    )


def _default_attention(tree: ast.Module, lines: list[str], origin: str, pin: str) -> dict[str, Any]:
    """The backend the module's own default block picks for SGLang ``pin`` on a CUDA GPU."""
    from packaging import version

    node = next(n for n in ast.walk(tree) if isinstance(n, ast.If) and _picks_when_unset(n))
    code = compile(ast.Module(body=[node], type_ignores=[]), "<verl>", "exec")
    scope: dict[str, Any] = {
        KEY_ATTENTION: None,
        "torch": SimpleNamespace(version=SimpleNamespace(hip=None)),
        "sglang": SimpleNamespace(__version__=pin),
        "version": version,
    }
    exec(code, {"__builtins__": __builtins__}, scope)  # verl's own block (sandboxed, as above)
    return {
        KEY_WHERE: f"{site_path(origin)}:{node.lineno}",
        KEY_STATEMENT: lines[node.lineno - 1].strip(),
        KEY_DEFAULT: scope[KEY_ATTENTION],
    }


def derive() -> dict[str, Any]:
    spec = importlib.util.find_spec(SERVER_MODULE)
    assert spec is not None and spec.origin is not None, SERVER_MODULE
    source = Path(spec.origin).read_text(encoding="utf-8")
    tree = ast.parse(source)
    lines = source.splitlines()
    names = _namespace(tree)
    entries = _entries(tree)
    base = {"lora_rank": 16, "lora": {"rank": 0}, "target_modules": "all-linear"}
    answer: dict[str, Any] = {KEY_SGLANG: _sglang_pin()}
    answer[KEY_ATTENTION] = _default_attention(tree, lines, spec.origin, answer[KEY_SGLANG])
    samples: dict[str, dict[str, tuple[dict[str, Any], Any]]] = {
        KEY_TARGETS: {n: ({**base, "target_modules": v}, v) for n, v in TARGET_SAMPLES.items()},
        KEY_RANK: {n: ({**base, **v}, None) for n, v in RANK_SAMPLES.items()},
    }
    for key, cases in samples.items():
        expression = entries[key]
        answer[key] = {
            KEY_WHERE: f"{site_path(spec.origin)}:{expression.lineno}",
            KEY_STATEMENT: lines[expression.lineno - 1].strip(),
            KEY_RENDERS: {
                name: _render(expression, names, model, sample)
                for name, (model, sample) in cases.items()
            },
        }
    return answer


def main() -> int:
    return print_answer(derive())


if __name__ == "__main__":
    raise SystemExit(main())
