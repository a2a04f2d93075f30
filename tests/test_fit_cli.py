"""``verl-compat fit`` and ``check --gpu`` as a user runs them: exit statuses, the JSON against
data/fit.schema.json, one-line errors for input it cannot use (never a traceback), the same
bytes across runs and hash seeds (text, JSON, PNG, SVG), SFT launches, and ``check`` without a
GPU exactly as before."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from importlib import resources
from pathlib import Path

import jsonschema
import pytest
from cli_child import run_cli
from cli_in_process import run

GRPO = "examples/grpo_trainer/run_qwen3_8b_fsdp.sh"
SFT = "examples/sft/gsm8k/run_qwen3_8b_fsdp.sh"
PPO = "examples/ppo_trainer/run_qwen3_8b_fsdp.sh"


def _script(name: str) -> str:
    return f"verl-v0.9.0/{name}"


def _one_line_error(status: int, err: str, *words: str) -> None:
    lines = err.strip().splitlines()
    assert status == 2, err
    assert len(lines) == 1 and lines[0].startswith("verl-compat fit"), err
    assert "Traceback" not in err
    for word in words:
        assert word in lines[0], (word, lines[0])


def test_a_run_that_fits_exits_0_and_shows_every_phase(
    here: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    status, out, _ = run(capsys, "fit", _script(GRPO), "--gpu", "H100")
    assert status == 0, out
    for title in ("rollout server start", "rollout generation", "actor update", "checkpoint save"):
        assert title in out
    assert "GPU: H100-80GB (79.11 GiB usable)" in out
    assert "warning[memory." not in out and "error[memory." not in out
    # on 64 GiB the actor update sits above the 90% margin: a warning, still exit 0, located at
    # the key's script line
    status, out, _ = run(capsys, "fit", _script(GRPO), "--gpu-memory", "64")
    assert status == 0, out
    assert "warning[memory.actor-update]" in out
    assert f"{_script(GRPO)}:" in out.split("warning[memory.actor-update]")[0].splitlines()[-1]


def test_a_run_that_does_not_fit_exits_1_with_fixes_forecast_again(
    here: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    status, out, _ = run(capsys, "fit", _script(GRPO), "--gpu", "RTX4090", "--brief")
    assert status == 1
    errors = [line for line in out.splitlines() if "error[memory." in line]
    assert errors, out
    assert any("(e.g. " in line and " GiB" in line.split("(e.g. ")[1] for line in errors)


def test_the_gpu_memory_option_is_any_gpu(here: Path, capsys: pytest.CaptureFixture[str]) -> None:
    status, out, _ = run(capsys, "fit", _script(GRPO), "--gpu-memory", "200", "--brief")
    assert status == 0 and "200" in out


def test_json_follows_its_schema_and_is_the_same_bytes_each_run(
    here: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    schema = json.loads(
        resources.files("pytest_verl_compat").joinpath("data/fit.schema.json").read_text()
    )
    jsonschema.Draft202012Validator.check_schema(schema)
    outputs = []
    for gpu in ("H100", "RTX4090", "H100"):
        status, out, _ = run(capsys, "fit", _script(GRPO), "--gpu", gpu, "--format", "json")
        jsonschema.validate(json.loads(out), schema)
        outputs.append(out)
        assert status == (1 if gpu == "RTX4090" else 0)
    assert outputs[0] == outputs[2]
    status, out, _ = run(capsys, "fit", _script(PPO), "--gpu", "A100-40GB", "--format", "json")
    payload = json.loads(out)
    jsonschema.validate(payload, schema)
    roles = {
        part["key"].split(".")[0]
        for rank in payload["ranks"]
        for phase in rank["phases"]
        for part in phase["parts"]
    }
    assert "critic" in roles


def test_an_sft_launch_takes_torchruns_world(
    here: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    status, out, _ = run(
        capsys, "fit", _script(SFT), "--gpu", "A100-80GB", "--arg", "8", "--arg", "/tmp/save"
    )
    assert status == 0, out
    assert "8 GPUs (torchrun): SFT engine" in out and "SFT update" in out
    status, out4, _ = run(
        capsys, "fit", _script(SFT), "--gpu", "A100-80GB", "--arg", "2", "--arg", "/tmp/save"
    )
    assert "2 GPUs (torchrun)" in out4
    peak = {
        n: float(next(line for line in text.splitlines() if "SFT update" in line).split()[2])
        for n, text in ((8, out), (2, out4))
    }
    assert peak[2] > peak[8]  # fewer ranks, larger shards


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (("--gpu", "B300"), ("unknown GPU type 'B300'", "--gpu-memory")),
        (("--gpu-memory", "lots"), ("expected a positive number of GiB",)),
        (("--gpu-memory", "-3"), ("expected a positive number of GiB",)),
        (("--gpu", "H100", "--lengths", "512"), ("PROMPT,RESPONSE",)),
        (("--gpu", "H100", "--plot", "out.gif"), ("out.gif", ".png or .svg")),
        (("--gpu", "H100", "--model-config", "missing.json"), ("missing.json", "not found")),
        (
            ("--gpu", "H100", "--set", "actor_rollout_ref.model.path=/nowhere/TinyThing-3B"),
            ("TinyThing-3B", "--model-config"),
        ),
        (("--gpu", "H100", "--set", "actor_rollout_ref.rollout.n=two"), ("rollout.n",)),
        (("--gpu-memory", "inf"), ("--gpu-memory", "positive")),
        # a number the tree leaves untyped, given as text or not finite: named, not a traceback
        (
            ("--gpu", "H100", "--set", "actor_rollout_ref.rollout.gpu_memory_utilization=abc"),
            ("rollout.gpu_memory_utilization='abc'", "expected a finite number", GRPO),
        ),
        (
            ("--gpu", "H100", "--set", "actor_rollout_ref.actor.entropy_coeff=inf"),
            ("actor.entropy_coeff=inf", "expected a finite number"),
        ),
        # a parallel size below one, no trainer GPUs, a section where a count goes
        (
            ("--gpu", "H100", "--set", "actor_rollout_ref.rollout.tensor_model_parallel_size=0"),
            ("rollout.tensor_model_parallel_size", "expected a positive integer"),
        ),
        (
            ("--gpu", "H100", "--set", "trainer.n_gpus_per_node=0"),
            ("trainer.n_gpus_per_node", "expected a positive integer"),
        ),
        (
            (
                "--gpu",
                "H100",
                "--set",
                "actor_rollout_ref.actor.ulysses_sequence_parallel_size={a:1}",
            ),
            ("actor.ulysses_sequence_parallel_size", "expected an integer"),
        ),
        (
            # an empty value (a variable the run sets, unset here) says how to bind it
            ("--gpu", "H100", "--set", "trainer.nnodes="),
            ("trainer.nnodes", "expected an integer, got ''", "--env NAME=VALUE"),
        ),
        (
            ("--gpu", "H100", "--set", "actor_rollout_ref.model.target_modules=5"),
            ("model.target_modules=5", "a module name or a list of them"),
        ),
        (
            ("--gpu", "H100", "--set", "actor_rollout_ref.actor.checkpoint.save_contents=-1"),
            ("actor.checkpoint.save_contents=-1", "a content name or a list of them"),
        ),
        (
            ("--gpu", "H100", "--set", "actor_rollout_ref.actor.fsdp_config.model_dtype=bf61"),
            ("actor.fsdp_config.model_dtype='bf61'", "PrecisionType"),
        ),
        (
            ("--gpu", "H100", "--set", "actor_rollout_ref.rollout.dtype=bf16"),
            ("rollout.dtype='bf16'", "auto, bfloat16"),
        ),
    ],
)
def test_input_it_cannot_use_is_one_line(
    here: Path, capsys: pytest.CaptureFixture[str], args: tuple[str, ...], words: tuple[str, ...]
) -> None:
    status, out, err = run(capsys, "fit", _script(GRPO), *args)
    _one_line_error(status, err, *words)
    assert out == ""


def test_a_config_json_that_is_not_json_is_named(
    here: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = here / "config.json"
    bad.write_text('{"hidden_size": 4096,\n "num_hidden_layers": }\n')
    status, _, err = run(capsys, "fit", _script(GRPO), "--gpu", "H100", "--model-config", str(bad))
    _one_line_error(status, err, "config.json:2", "not valid JSON")


def test_a_missing_script_is_one_line(here: Path, capsys: pytest.CaptureFixture[str]) -> None:
    status, _, err = run(capsys, "fit", "nowhere.sh", "--gpu", "H100")
    _one_line_error(status, err, "nowhere.sh")


def test_a_script_that_needs_arguments_says_how_to_give_them(
    here: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """0.9.0's SFT examples stop at their usage check when read with no arguments: the refusal
    names --arg, and with the arguments the usage asks for the script is forecast."""
    sft = _script("examples/sft/gsm8k/run_qwen2_5_0_5b_fsdp.sh")
    status, _, err = run(capsys, "fit", sft, "--gpu", "H100")
    _one_line_error(status, err, "exits with status 1", "with no arguments", "--arg WORD")
    status, out, _ = run(capsys, "fit", sft, "--gpu", "H100", "--arg", "8", "--arg", "/tmp/x")
    assert status == 0 and "SFT update" in out


def _rank_phases(capsys: pytest.CaptureFixture[str], *args: str) -> dict[str, list[str]]:
    status, out, err = run(capsys, "fit", *args, "--gpu", "H200", "--format", "json")
    assert status in (0, 1), err
    return {rank["name"]: [p["phase"] for p in rank["phases"]] for rank in json.loads(out)["ranks"]}


def test_a_separated_trainers_rollout_runs_on_its_own_pool(
    here: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """verl's fully_async_main builds its pools with separation's create_resource_pool_manager:
    the rollout on rollout.nnodes x rollout.n_gpus_per_node GPUs of its own, the trainer's GPUs
    without a server; a key that asks for hybrid replicas puts sleeping ones back on the
    trainer's GPUs; main_ppo with the same keys keeps its colocated server."""
    script = _script("examples/mtp_trainer/run_mimo_7b_mtp_fully_async_megatron_multinode.sh")
    apart = _rank_phases(capsys, script)
    assert apart == {"trainer": ["old-log-prob", "actor-update"], "rollout": ["rollout"]}
    hybrid = "async_training.use_dynamic_resource_scheduling=True"
    together = _rank_phases(capsys, script, "--set", hybrid)
    assert "rollout-start" in together["trainer"] and "weight-sync" in together["trainer"]
    pool = ("--set", "+rollout.nnodes=1", "--set", "+rollout.n_gpus_per_node=4")
    assert "rollout" in _rank_phases(capsys, _script(GRPO), *pool)["trainer"]


def _update_parts(capsys: pytest.CaptureFixture[str], *args: str) -> dict[str, int]:
    status, out, err = run(capsys, "fit", *args, "--gpu", "H100", "--format", "json")
    assert status in (0, 1), err
    (trainer,) = [rank for rank in json.loads(out)["ranks"] if rank["name"] == "trainer"]
    (update,) = [phase for phase in trainer["phases"] if phase["phase"] == "actor-update"]
    return {part["key"]: part["bytes"] for part in update["parts"]}


def test_an_optimizer_step_that_outgrows_the_backward_is_the_updates_peak(
    here: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Seed-OSS-36B's FSDP example keeps small activations beside 67 GiB of states: AdamW's
    foreach step (one more copy of the gradient shards) is its update's peak, what it adds beyond
    the backward's transients; fused, or a run whose backward holds more, shows no step."""
    seed = _script("examples/grpo_trainer/run_seed_oss_36b_fsdp.sh")
    parts = _update_parts(capsys, seed)
    backward = sum(
        size
        for key, size in parts.items()
        if key.rsplit(".", 1)[-1] in ("gathered", "activations", "reduce", "logits", "head_grad")
    )
    assert parts["actor.step"] == parts["actor.grads"] - backward > 0
    fused = "+actor_rollout_ref.actor.optim.override_optimizer_config.fused=True"
    assert "actor.step" not in _update_parts(capsys, seed, "--set", fused)
    assert "actor.step" not in _update_parts(capsys, _script(GRPO))


def _start_messages(capsys: pytest.CaptureFixture[str], *sets: str) -> list[str]:
    args = [arg for key in sets for arg in ("--set", key)]
    status, out, err = run(capsys, "fit", _script(GRPO), "--gpu", "H100", "--format", "json", *args)
    assert status in (0, 1), err
    return [
        f["message"] for f in json.loads(out)["findings"] if f["rule"] == "memory.rollout-start"
    ]


def test_an_fp8_rollout_loads_one_byte_linear_weights_and_can_start_where_bf16_cannot(
    here: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """rollout.quantization=fp8 (verl asks vLLM for block-wise fp8): Qwen2.5-32B on one H100 at
    0.85 cannot start in bf16 (its KV cache cannot hold one 131,072-token sequence) and can in
    fp8; a quantization the forecast does not count is said as an assumption."""
    big = (
        "actor_rollout_ref.model.path=Qwen/Qwen2.5-32B",
        "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
        "actor_rollout_ref.rollout.gpu_memory_utilization=0.85",
    )
    assert any("cannot start" in m for m in _start_messages(capsys, *big))
    fp8 = "actor_rollout_ref.rollout.quantization=fp8"
    assert not any("cannot start" in m for m in _start_messages(capsys, *big, fp8))
    other = "actor_rollout_ref.rollout.quantization=torchao"
    _, out, _ = run(capsys, "fit", _script(GRPO), "--gpu", "H100", "--set", other)
    assert "quantization 'torchao': the server's weights are counted in the rollout dtype" in out


@pytest.mark.parametrize("suffix", [".png", ".svg"])
def test_pictures_and_reports_are_the_same_bytes_across_hash_seeds(here: Path, suffix: str) -> None:
    outputs = []
    for seed in ("0", "12345"):
        picture = here / f"fit-{seed}{suffix}"
        env = {**os.environ, "PYTHONHASHSEED": seed}
        done = run_cli(
            ["fit", _script(GRPO), "--gpu", "H100", "--plot", str(picture)],
            here,
            timeout=300,
            environment=env,
        )
        assert done.returncode == 0, done.stderr
        outputs.append((done.stdout, picture.read_bytes()))
    assert outputs[0][0] == outputs[1][0]
    assert outputs[0][1] == outputs[1][1]
    if suffix == ".png":
        assert outputs[0][1].startswith(b"\x89PNG")
    else:
        assert b"<svg" in outputs[0][1] and b"<dc:date>" not in outputs[0][1]


def test_check_with_a_gpu_adds_the_memory_findings_and_without_one_is_unchanged(
    here: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    plain = run(capsys, "check", _script(GRPO), "--no-upstream-checks", "--format", "sarif")
    assert plain[0] == 0 and "memory." not in plain[1]
    status, out, _ = run(capsys, "check", _script(GRPO), "--no-upstream-checks", "--gpu", "RTX4090")
    assert status == 1 and "error[memory." in out
    status, out, _ = run(
        capsys,
        "check",
        _script(GRPO),
        "--no-upstream-checks",
        "--gpu",
        "RTX4090",
        "--format",
        "sarif",
    )
    assert '"memory.actor-update"' in out
    # again without a GPU: the same bytes as the first time
    assert run(capsys, "check", _script(GRPO), "--no-upstream-checks", "--format", "sarif") == plain


@pytest.mark.parametrize("given", ["file", "name"])
def test_check_with_a_gpu_forecasts_with_the_model_config_it_was_given(
    here: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], given: str
) -> None:
    """check --gpu --model-config forecasts a fine-tune's run with the model given (a config.json
    or a listed model's name) as fit does, where without it the run is not forecast; before, the
    note asked for the --model-config it had been given."""
    tuned = ("--set", "actor_rollout_ref.model.path=/ckpt/my-policy-step100")
    base = ("check", _script(GRPO), "--no-upstream-checks", "--gpu", "RTX4090", *tuned)
    _, out, _ = run(capsys, *base)
    assert "info[memory.not-forecast]" in out and "error[memory." not in out, out
    if given == "file":
        config = tmp_path / "config.json"
        facts = {
            "model_type": "qwen3", "hidden_size": 4096, "num_hidden_layers": 36,
            "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
            "intermediate_size": 12288, "vocab_size": 151936, "tie_word_embeddings": False,
            "max_position_embeddings": 40960,
        }  # fmt: skip
        config.write_text(json.dumps(facts))
        model = str(config)
    else:
        model = "Qwen/Qwen3-8B"
    status, out, err = run(capsys, *base, "--model-config", model)
    assert status == 1, err
    assert "not-forecast" not in out and "error[memory.actor-update]" in out, out


def test_check_with_a_gpu_notes_a_script_it_cannot_forecast_and_checks_the_others(
    here: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A folder checked with a GPU (the pyproject setting makes that every CI run) holds a script
    whose model the forecast has no numbers for: that script gets one info naming the key that
    names the model, the others their memory findings; before, the whole check stopped (exit 2)."""
    unknown = _script("examples/grpo_trainer/run_minicpm_o_2_6_fsdp.sh")
    status, out, err = run(
        capsys, "check", unknown, _script(GRPO), "--no-upstream-checks", "--gpu", "RTX4090"
    )
    assert status == 1, err  # GRPO's memory errors on an RTX 4090, not a usage error
    noted = [line for line in out.splitlines() if "info[memory.not-forecast]" in line]
    assert len(noted) == 1 and noted[0].startswith(unknown), out
    assert "actor_rollout_ref.model.path: not forecast: model 'openbmb/MiniCPM-o-2_6" in noted[0]
    assert any(
        line.startswith(_script(GRPO)) and "error[memory." in line for line in out.splitlines()
    ), out


def test_check_without_a_gpu_does_not_load_the_memory_layer(here: Path) -> None:
    probe = (
        "import sys; from pytest_verl_compat import cli; "
        f"status = cli.main(['check', {_script(GRPO)!r}, '--no-upstream-checks', '-q']); "
        "print(sorted(m for m in sys.modules if m.startswith('pytest_verl_compat.memory')))"
    )
    child = subprocess.run(
        [sys.executable, "-c", probe], cwd=here, capture_output=True, text=True, check=False
    )
    assert child.stdout.strip().splitlines()[-1] == "[]", child.stdout + child.stderr


def test_the_gpu_setting_of_pyproject_applies_to_check(
    here: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (here / "pyproject.toml").write_text('[tool.verl-compat]\ngpu = "RTX4090"\n')
    status, out, _ = run(capsys, "check", _script(GRPO), "--no-upstream-checks")
    assert status == 1 and "error[memory." in out
    status, out, _ = run(capsys, "check", _script(GRPO), "--no-upstream-checks", "--isolated")
    assert status == 0 and "memory." not in out
    status, _, err = run(capsys, "fit", _script(GRPO), "--brief")  # fit reads it too
    assert status == 1, err
    (here / "pyproject.toml").write_text("[tool.verl-compat]\ngpu = 80\n")
    status, _, err = run(capsys, "check", _script(GRPO), "--no-upstream-checks")
    assert status == 2 and "gpu must be a GPU type name" in err
    # a name sold in two sizes is refused as the setting it came from
    (here / "pyproject.toml").write_text('[tool.verl-compat]\ngpu = "A100"\n')
    status, _, err = run(capsys, "fit", _script(GRPO), "--brief")
    _one_line_error(status, err, "[tool.verl-compat] gpu: GPU type 'A100'", "A100-40GB")


def test_json_is_the_same_bytes_across_hash_seeds(here: Path) -> None:
    outputs = set()
    for seed in ("0", "4242"):
        done = run_cli(
            ["fit", _script(PPO), "--gpu", "A100-40GB", "--format", "json"],
            here,
            timeout=300,
            environment={**os.environ, "PYTHONHASHSEED": seed},
        )
        assert done.returncode in (0, 1), done.stderr
        outputs.add(done.stdout)
    assert len(outputs) == 1


def test_an_entry_point_that_never_trains_is_its_rollout_servers_alone(
    here: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """main_generation_server composes the PPO tree but starts standalone rollout servers only
    (its entry point reaches no trainer's fit): no actor, critic or update is forecast, and the
    JSON says the run serves."""
    schema = json.loads(
        resources.files("pytest_verl_compat").joinpath("data/fit.schema.json").read_text()
    )
    script = _script("examples/generation/run_deepseek_llm_7b.sh")
    status, out, _ = run(capsys, "fit", script, "--gpu", "H100", "--format", "json")
    payload = json.loads(out)
    jsonschema.validate(payload, schema)
    assert status == 0 and payload["kind"] == "serve"
    assert [rank["name"] for rank in payload["ranks"]] == ["rollout"]
    keys = {part["key"] for rank in payload["ranks"] for p in rank["phases"] for part in p["parts"]}
    assert not any(key.startswith(("actor.", "critic.", "ref.")) for key in keys), keys
    # the same tree under a trainer's entry point trains: the PPO tree's critic is forecast
    status, out, _ = run(capsys, "fit", _script(PPO), "--gpu", "H100", "--format", "json")
    assert json.loads(out)["kind"] == "rl"


def test_a_vision_language_model_counts_its_vision_tower(
    here: Path, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """verl's Qwen2.5-VL GRPO example: the shipped table's Qwen2.5-VL-7B-Instruct is the language
    model and its vision tower (8,292,166,656 parameters, the model card's count), and the
    forecast says the tower's activations are not forecast; a tower the forecast does not lay
    out (SigLIP with its pooling head, which vision_use_head unset builds) says it is not
    counted."""
    script = _script("examples/grpo_trainer/run_qwen2_5_vl_7b_fsdp.sh")
    status, out, err = run(capsys, "fit", script, "--gpu", "H100", "--format", "json")
    assert status in (0, 1), err
    payload = json.loads(out)
    weights = _part(payload, "old-log-prob", "actor.params")
    assert "8,292,166,656 params" in weights["formula"]
    assert any("vision tower's weights" in a for a in payload["assumptions"])
    config = {
        "model_type": "gemma3",
        "text_config": {
            "hidden_size": 2560,
            "num_hidden_layers": 34,
            "num_attention_heads": 8,
            "num_key_value_heads": 4,
            "head_dim": 256,
            "intermediate_size": 10240,
            "vocab_size": 262208,
        },
        "vision_config": {"model_type": "siglip_vision_model", "hidden_size": 1152},
    }
    (tmp_path / "config.json").write_text(json.dumps(config))
    args = ("fit", script, "--gpu", "H100", "--format", "json", "--model-config", str(tmp_path))
    status, out, err = run(capsys, *args)
    assert status in (0, 1), err
    assumptions = json.loads(out)["assumptions"]
    assert any("gemma3: the language model alone" in a for a in assumptions), assumptions


def test_a_model_whose_mtp_layers_are_not_counted_says_so(
    here: Path, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """MiMo's model class builds num_nextn_predict_layers MTP layers beside its decoder: the
    forecast does not count them and says how many parameters it leaves out; a Qwen2 config
    with the same key builds none and says nothing."""
    config = {
        "model_type": "mimo",
        "hidden_size": 4096,
        "num_hidden_layers": 36,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "intermediate_size": 11008,
        "vocab_size": 151680,
        "num_nextn_predict_layers": 1,
    }
    script = _script(GRPO)
    for model_type, said in (("mimo", True), ("qwen2", False)):
        (tmp_path / "config.json").write_text(json.dumps({**config, "model_type": model_type}))
        args = ("fit", script, "--gpu", "H100", "--format", "json", "--model-config", str(tmp_path))
        status, out, err = run(capsys, *args)
        assert status in (0, 1), err
        notes = [a for a in json.loads(out)["assumptions"] if "multi-token-prediction" in a]
        assert bool(notes) is said, notes
        if said:
            assert "about 211M parameters" in notes[0]


def test_a_qwen3_vl_moe_example_counts_its_tower_on_megatron(
    here: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """verl's Qwen3-VL-30B-A3B Megatron example: the table's entry is Qwen3-MoE's language model
    and Qwen3-VL's tower, 31,070,754,032 parameters (the count of the model's own safetensors)."""
    script = _script("examples/grpo_trainer/run_qwen3_vl_30b_a3b_megatron.sh")
    status, out, err = run(capsys, "fit", script, "--gpu", "H100", "--format", "json")
    assert status in (0, 1), err
    payload = json.loads(out)
    assert "31,070,754,032 params" in _part(payload, "old-log-prob", "actor.params")["formula"]
    assert any("vision tower's weights" in a for a in payload["assumptions"])


def test_an_sft_megatron_engine_is_forecast_as_megatron(
    here: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """engine=megatron composes megatron.yaml, which has no strategy key: the engine is
    McoreEngineConfig's default, megatron (verl/workers/config/engine.py:214), with the script's
    parallel sizes and its CPU optimizer (all states on the host, precision-aware)."""
    script = _script("examples/sft/gsm8k/run_qwen3_5_397b_a17b_megatron.sh")
    status, out, err = run(capsys, "fit", script, "--gpu", "H100", "--format", "json")
    assert status in (0, 1), err
    payload = json.loads(out)
    assert "Megatron tp 2 pp 4 ep 32" in _part(payload, "sft-update", "actor.params")["formula"]
    optimizer = _part(payload, "sft-update", "actor.optimizer")["formula"]
    assert "the master and states of 100% of the params on the host" in optimizer


def _phase(payload: dict[str, object], phase: str) -> dict[str, object]:
    for rank in payload["ranks"]:  # type: ignore[attr-defined]
        for entry in rank["phases"]:
            if entry["phase"] == phase:
                return dict(entry)
    raise AssertionError(f"no {phase}")


def _part(payload: dict[str, object], phase: str, key: str) -> dict[str, str]:
    for part in _phase(payload, phase)["parts"]:  # type: ignore[attr-defined]
        if part["key"] == key:
            return dict(part)
    raise AssertionError(f"no {key} in {phase}")


@pytest.mark.parametrize("offload", ["False", "True"])
def test_an_sglang_rollout_shares_what_the_trainer_leaves_free_at_its_start(
    here: Path, capsys: pytest.CaptureFixture[str], offload: str
) -> None:
    """verl's Qwen3-8B GRPO example with SGLang: its share is mem_fraction_static (the rollout's
    gpu_memory_utilization) of the memory free when it starts, after the actor's resident
    weights and the processes' contexts; offloading the actor frees more of it. The same run
    on vLLM claims gpu_memory_utilization of the device either way."""
    base = ("fit", _script(GRPO), "--gpu", "H100", "--format", "json")
    offloaded = ("--set", f"actor_rollout_ref.actor.fsdp_config.param_offload={offload}")
    sglang = ("--set", "actor_rollout_ref.rollout.name=sglang")
    status, out, err = run(capsys, *base, *offloaded, *sglang)
    assert status in (0, 1), err
    payload = json.loads(out)
    capacity = payload["gpu"]["capacity_bytes"]
    start = _phase(payload, "rollout-start")
    held = sum(p["bytes"] for p in start["parts"] if p["key"] != "rollout.server")  # type: ignore[attr-defined]
    assert (held > 2 << 30) == (offload == "False"), held  # the actor's weights or not
    share = payload["rollout_kv_cache"]["share"]
    assert share == int(0.6 * (capacity - held)), (share, capacity, held)
    status, out, err = run(capsys, *base, *offloaded)
    assert status in (0, 1), err
    assert json.loads(out)["rollout_kv_cache"]["share"] == int(0.6 * capacity)


@pytest.mark.parametrize("server", ["vllm", "sglang"])
def test_only_vllm_refuses_to_start_short_of_one_max_model_len_sequence(
    here: Path, capsys: pytest.CaptureFixture[str], server: str
) -> None:
    """At gpu_memory_utilization 0.13 the Qwen3-8B GRPO example's KV cache cannot hold one
    40,960-token sequence: vLLM refuses to start (check_enough_kv_cache_memory); SGLang starts
    with what its pool holds (it refuses only a pool of no token, and a longer request per
    request), so the same run on SGLang has no start error."""
    args = ("--set", "actor_rollout_ref.rollout.gpu_memory_utilization=0.13")
    args += ("--set", f"actor_rollout_ref.rollout.name={server}")
    status, out, err = run(capsys, "fit", _script(GRPO), "--gpu", "H100", "--brief", *args)
    assert status in (0, 1), err
    kv = json.loads(
        run(capsys, "fit", _script(GRPO), "--gpu", "H100", "--format", "json", *args)[1]
    )
    cache = kv["rollout_kv_cache"]
    assert 0 < cache["kv_bytes"] < cache["one_sequence_bytes"], cache
    assert ("error[memory.rollout-start]" in out) == (server == "vllm"), out


def test_a_fine_tunes_folder_is_forecast_as_the_listed_model_it_names(
    here: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A fine-tune's folder that is not here is refused, naming the table's nearest model;
    --model-config with that model's name forecasts the run as the launch of the model itself."""
    tuned = "--set", "actor_rollout_ref.model.path=/ckpt/Qwen2.5-7B-Instruct-GRPO-step200"
    status, _, err = run(capsys, "fit", _script(GRPO), "--gpu", "H100", *tuned)
    assert status == 2 and "the table's nearest: Qwen/Qwen2.5-7B-Instruct" in err, err
    named = ("--model-config", "Qwen/Qwen2.5-7B-Instruct")
    status, out, err = run(
        capsys, "fit", _script(GRPO), "--gpu", "H100", "--format", "json", *tuned, *named
    )
    assert status in (0, 1), err
    listed = "--set", "actor_rollout_ref.model.path=Qwen/Qwen2.5-7B-Instruct"
    _, same, _ = run(capsys, "fit", _script(GRPO), "--gpu", "H100", "--format", "json", *listed)
    assert json.loads(out)["ranks"] == json.loads(same)["ranks"]
    status, _, err = run(
        capsys, "fit", _script(GRPO), "--gpu", "H100", *tuned, "--model-config", "Qwen/NoSuch-7B"
    )
    assert status == 2 and "not found" in err, err


@pytest.mark.parametrize(
    ("model", "max_model_len", "starts"),
    [
        ("Qwen/Qwen2.5-1.5B", None, False),
        ("Qwen/Qwen2.5-1.5B-Instruct", None, True),
        ("Qwen/Qwen2.5-1.5B", 32768, True),
    ],
)
def test_a_base_models_longer_context_is_the_sequence_vllm_must_hold(
    here: Path,
    capsys: pytest.CaptureFixture[str],
    model: str,
    max_model_len: int | None,
    starts: bool,
) -> None:
    """Without rollout.max_model_len verl gives vLLM the model's max_position_embeddings
    (vllm_async_server.py:953-955): Qwen2.5-1.5B's 131,072 (its base config.json) on an RTX 4090
    at gpu_memory_utilization 0.25 does not fit the KV cache left, the Instruct model's 32,768
    does, and so does the base model with a max_model_len set."""
    args = [
        "--set", f"actor_rollout_ref.model.path={model}",
        "--set", "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
        "--set", "actor_rollout_ref.rollout.gpu_memory_utilization=0.25",
    ]  # fmt: skip
    if max_model_len is not None:
        args += ["--set", f"actor_rollout_ref.rollout.max_model_len={max_model_len}"]
    status, out, err = run(
        capsys, "fit", _script(GRPO), "--gpu", "RTX4090", "--format", "json", *args
    )
    assert status in (0, 1), err
    payload = json.loads(out)
    cache = payload["rollout_kv_cache"]
    assert (cache["kv_bytes"] >= cache["one_sequence_bytes"]) == starts, cache
    refused = [
        f["message"]
        for f in payload["findings"]
        if f["rule"] == "memory.rollout-start" and "cannot start" in f["message"]
    ]
    assert bool(refused) != starts, refused
    if refused:
        assert "131,072 tokens" in refused[0], refused


@pytest.mark.parametrize("pp", ["2", "1"])
def test_a_megatron_pipeline_update_peaks_on_its_first_stage_without_the_logits(
    here: Path, capsys: pytest.CaptureFixture[str], pp: str
) -> None:
    """verl's GPG Qwen3-8B Megatron example (tp 2, pp 2, no recompute): the first stage keeps two
    micro-batches of its 18 layers in flight under 1F1B and holds no logits, so its update is the
    peak and counts no logits part; without a pipeline the one stage holds all 36 layers of one
    micro-batch and the logits."""
    script = _script("examples/gpg_trainer/run_qwen3_8b_megatron.sh")
    args = ("--set", f"actor_rollout_ref.actor.megatron.pipeline_model_parallel_size={pp}")
    status, out, err = run(capsys, "fit", script, "--gpu", "H100", "--format", "json", *args)
    assert status in (0, 1), err
    payload = json.loads(out)
    formula = _part(payload, "actor-update", "actor.activations")["formula"]
    keys = [part["key"] for part in _phase(payload, "actor-update")["parts"]]  # type: ignore[attr-defined]
    if pp == "2":
        assert "first of 2 pipeline stages (layers 0-17, 2 micro-batches in flight" in formula
        assert "actor.logits" not in keys
    else:
        assert "pipeline" not in formula and "actor.logits" in keys


@pytest.mark.parametrize("release", ["0.9.0", "0.9.1"])
def test_every_example_script_is_forecast_or_refused_in_one_line(
    release: str, upstream_checkout: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Each of verl 0.9.0's example launch scripts (every engine, trainer and parallel layout
    they use), forecast for each supported release, fits (0), does not (1) or is refused with
    one line naming why (2: an unknown model, a script that exits before its launcher, a
    configuration its release rejects), never an internal error (Megatron with LoRA over
    pipeline stages once ended in one)."""
    scripts = sorted((upstream_checkout / "examples").rglob("*.sh"))
    assert len(scripts) >= 100
    statuses: dict[int, int] = {}
    for script in scripts:
        status, _, err = run(capsys, "fit", str(script), "--gpu", "H100", "--release", release)
        statuses[status] = statuses.get(status, 0) + 1
        assert status in (0, 1, 2), f"{script.name}: {err[-500:]}"
        assert "Traceback" not in err and "internal error" not in err, f"{script.name}: {err}"
        if status == 2:
            refusals = [line for line in err.splitlines() if "forecast for verl" not in line]
            assert len(refusals) == 1, f"{script.name}: {err}"
    assert statuses.get(0, 0) + statuses.get(1, 0) >= 30, statuses


WAYS_LAUNCH = """#!/usr/bin/env bash
{condition}
python3 -m verl.trainer.main_ppo \\
  algorithm.adv_estimator=grpo \\
  data.train_batch_size=64 \\
  data.max_prompt_length=1024 \\
  data.max_response_length=2048 \\
  actor_rollout_ref.model.path=Qwen/Qwen2.5-7B-Instruct \\
  actor_rollout_ref.model.enable_gradient_checkpointing=True \\
  actor_rollout_ref.actor.ppo_mini_batch_size=64 \\
  actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=$MBS \\
  actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4 \\
  actor_rollout_ref.rollout.name=vllm \\
  actor_rollout_ref.rollout.n=4 \\
  trainer.experiment_name=$NAME \\
  trainer.n_gpus_per_node=8
"""


def _ways_script(folder: Path, condition: str) -> str:
    script = folder / "ways.sh"
    script.write_text(WAYS_LAUNCH.format(condition=condition))
    return str(script)


def _schema() -> dict[str, object]:
    loaded: dict[str, object] = json.loads(
        resources.files("pytest_verl_compat").joinpath("data/fit.schema.json").read_text()
    )
    return loaded


def test_a_script_whose_ways_forecast_differently_gives_each_way(
    here: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A test only the run decides (a command's output) that sets a micro-batch: each way is forecast on
    its own under the test it takes, the exit is 1 if any way does not fit, the JSON gives each
    way under `ways`, and a picture (one forecast) is refused in one line, nothing written."""
    script = _ways_script(
        here, 'if [ "$(hostname)" = big-node ]; then MBS=32; NAME=big; else MBS=1; NAME=small; fi'
    )
    status, out, _ = run(capsys, "fit", script, "--gpu", "H100", "--brief")
    assert status == 1, out
    blocks = out.split('\nwhen [ "$(hostname)" = big-node ] (line 2) is false:\n')
    assert len(blocks) == 2 and blocks[0].startswith(
        'when [ "$(hostname)" = big-node ] (line 2) is true:'
    )
    assert "error[memory.actor-update]" in blocks[0] and "error[memory." not in blocks[1], out
    status, out, _ = run(capsys, "fit", script, "--gpu", "H100", "--format", "json")
    payload = json.loads(out)
    jsonschema.validate(payload, _schema())
    assert [way["when"] for way in payload["ways"]] == [
        'when [ "$(hostname)" = big-node ] (line 2) is true',
        'when [ "$(hostname)" = big-node ] (line 2) is false',
    ]
    picture = here / "ways.png"
    status, _, err = run(capsys, "fit", script, "--gpu", "H100", "--plot", str(picture))
    _one_line_error(status, err, "ways forecast differently", "without --plot")
    assert not picture.exists()
    # bound, the test is decided: one forecast
    status, out, _ = run(
        capsys, "fit", script, "--gpu", "H100", "--subst", "hostname", "small-node"
    )
    assert "when [" not in out and status == 0, out


def test_a_script_whose_ways_forecast_alike_gives_one_forecast(
    here: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Near-identical, the test sets only the experiment's name: one forecast, a note on stderr
    that every way gives it, the JSON a plain forecast."""
    script = _ways_script(
        here, 'MBS=2; if [ "$(hostname)" = big-node ]; then NAME=big; else NAME=small; fi'
    )
    status, out, err = run(capsys, "fit", script, "--gpu", "H100", "--brief")
    assert status == 0 and "when [" not in out, out
    assert "goes 2 ways" in err and "each way forecasts this" in err
    status, out, _ = run(capsys, "fit", script, "--gpu", "H100", "--format", "json")
    payload = json.loads(out)
    jsonschema.validate(payload, _schema())
    assert "ways" not in payload and payload["ranks"]


def test_a_way_that_cannot_be_read_is_said_beside_the_one_forecast(
    here: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`[ -f .env ] && source .env` with no .env here: that way says why it has no forecast, the
    other is forecast (it had been an internal error)."""
    script = _ways_script(here, "MBS=2; NAME=x\n[ -f .env ] && source .env")
    status, out, err = run(capsys, "fit", script, "--gpu", "H100", "--brief")
    assert "Traceback" not in err and "internal error" not in err
    assert status == 0, out
    assert "when [ -f .env ] (line 3) is true: not forecast: " in out and ".env" in out
    assert "when [ -f .env ] (line 3) is false:\n" in out


@pytest.mark.parametrize(
    ("name", "said"),
    [("trtllm", "rollout.name is 'trtllm'"), ("'???'", "unset ('???'"), ("vllm", "")],
)
def test_a_rollout_engine_the_forecast_does_not_model_is_an_assumption(
    here: Path, capsys: pytest.CaptureFixture[str], name: str, said: str
) -> None:
    script = _ways_script(here, "MBS=2; NAME=x")
    text = Path(script).read_text().replace("rollout.name=vllm", f"rollout.name={name}")
    Path(script).write_text(text)
    _, out, _ = run(capsys, "fit", script, "--gpu", "H100", "--brief")
    assumed = [line for line in out.splitlines() if "share arithmetic" in line]
    if said:
        assert assumed and said in assumed[0] and assumed[0].startswith("assumes: "), out
    else:
        assert not assumed, out


def test_check_with_a_gpu_forecasts_each_way_of_a_script(
    here: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """check --gpu on a script that goes two ways: the way that does not fit gives its
    memory.* error, said with the test it takes (its ways had been checked without the GPU)."""
    script = _ways_script(
        here, 'if [ "$(hostname)" = big-node ]; then MBS=32; NAME=big; else MBS=1; NAME=small; fi'
    )
    status, out, _ = run(capsys, "check", script, "--gpu", "H100", "--no-upstream-checks")
    errors = [line for line in out.splitlines() if "error[memory.actor-update]" in line]
    assert status == 1 and len(errors) == 1, out
    assert errors[0].endswith('[when [ "$(hostname)" = big-node ] (line 2) is true]'), errors[0]


@pytest.mark.parametrize(("strategy", "on_host"), [("fsdp2", True), ("fsdp", False)])
def test_the_new_trainers_offload_policy_holds_only_on_fsdp2(
    here: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    strategy: str,
    on_host: bool,
) -> None:
    """verl 0.9.0's engine builds FSDP2's CPUOffloadPolicy for engine.offload_policy
    (transformer_impl.py:440-443) and gives FSDP1's training engine none (:404-415): the shards,
    gradients and optimizer states leave the GPU on FSDP2 only."""
    keys = (
        "model.path=Qwen/Qwen2.5-7B-Instruct data.use_dynamic_bsz=False "
        f"engine.strategy={strategy} engine.offload_policy=True"
    )
    script = tmp_path / "sft.sh"
    script.write_text(
        "torchrun --nproc_per_node=8 -m verl.trainer.sft_trainer " + keys + "\n", encoding="utf-8"
    )
    status, out, err = run(capsys, "fit", str(script), "--gpu", "H100", "--format", "json")
    assert status == 0, err
    keys_held = {part["key"] for part in _phase(json.loads(out), "sft-update")["parts"]}  # type: ignore[union-attr]
    for name in ("actor.params", "actor.optimizer"):
        assert (name not in keys_held) is on_host, (strategy, name)


GPT_OSS = "examples/grpo_trainer/run_gpt_oss_20b_fsdp.sh"
MEGATRON = "examples/grpo_trainer/run_qwen3_8b_megatron.sh"


def _refused_under_megatron(capsys: pytest.CaptureFixture[str], repo: str, family: str) -> None:
    """verl's Megatron example with ``repo``: one line at the strategy's key naming the family
    and the engines that count it."""
    path = f"actor_rollout_ref.model.path={repo}"
    status, _, err = run(capsys, "fit", _script(MEGATRON), "--gpu", "H100", "--set", path)
    _one_line_error(
        status, err, "actor_rollout_ref.actor.megatron.strategy=megatron", family, "FSDP"
    )


def test_gpt_oss_is_forecast_on_fsdp_and_refused_in_one_line_on_megatron(
    here: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """verl 0.9.0's gpt-oss example trains the bf16 copy it makes of openai/gpt-oss-20b: the
    table knows it by its folder's name, and its every-other-layer window is vLLM's. Under
    Megatron verl builds megatron-core's own gpt-oss layer, which the forecast does not count:
    one line at the strategy's key, as for the SFT engine; the MXFP4 checkpoint itself is not
    in the table, and its refusal names the bf16 copy."""
    status, out, err = run(
        capsys,
        "fit",
        _script(GPT_OSS),
        "--gpu",
        "H100",
        "--set",
        "actor_rollout_ref.rollout.name=vllm",
    )
    assert status == 1, err
    assert "lmsys/gpt-oss-20b-bf16 (shipped table" in out
    assert "20,914,757,184 params" in out
    _refused_under_megatron(capsys, "lmsys/gpt-oss-20b-bf16", "gpt-oss")
    status, _, err = run(
        capsys,
        "fit",
        _script(SFT),
        "--arg",
        "8",
        "--arg",
        "/tmp/save",
        "--gpu",
        "H100",
        "--set",
        "model.path=lmsys/gpt-oss-20b-bf16",
        "--set",
        "engine=megatron",
    )
    _one_line_error(status, err, "engine.strategy=megatron", "gpt-oss")
    path = "actor_rollout_ref.model.path=openai/gpt-oss-20b"
    status, _, err = run(capsys, "fit", _script(GRPO), "--gpu", "H100", "--set", path)
    _one_line_error(status, err, "openai/gpt-oss-20b", "lmsys/gpt-oss-20b-bf16")


GLM4V = "examples/grpo_trainer/run_glm4_1v_9b_fsdp.sh"


def test_glm_4_1v_is_forecast_with_its_tower_and_its_dense_layer_refused_on_megatron(
    here: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """verl 0.9.0's GLM-4.1V example: the table's GLM-4.1V-9B-Thinking, language model and tower
    (10.29B parameters, about the 10.3B its checkpoint holds), each phase forecast. verl's Megatron
    registry has no GLM-4 dense layer and the forecast counts none: one line at the strategy's
    key. GLM-4.5's MoE model is in the registry, and forecast under Megatron."""
    status, out, err = run(capsys, "fit", _script(GLM4V), "--gpu", "H100")
    assert status == 0, err
    assert "zai-org/GLM-4.1V-9B-Thinking (shipped table" in out
    assert "10,292,777,472 params" in out
    assert "vision tower's weights, gradients and optimizer states are counted" in out
    _refused_under_megatron(capsys, "zai-org/GLM-4.1V-9B-Thinking", "GLM-4")
    # GLM-4.5's MoE model is in verl's Megatron registry (Glm4MoeForCausalLM) and forecast there
    path = "actor_rollout_ref.model.path=zai-org/GLM-4.5-Air"
    status, out, err = run(capsys, "fit", _script(MEGATRON), "--gpu", "H100", "--set", path)
    assert status in (0, 1), err
    assert "106,852,245,504 params" in out and "Megatron tp 2 pp 2 ep 1" in out


def test_an_mxfp4_checkpoint_is_refused_and_its_bf16_copy_forecast(
    here: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """openai's gpt-oss config.json declares its MXFP4 quantization: counted at two bytes its
    experts would be four times what vLLM loads, so it is one line naming the key; the same
    numbers without it (the dequantized copy verl's example makes) are forecast."""
    from pytest_verl_compat.memory.models import config_by_name

    found = config_by_name("lmsys/gpt-oss-20b-bf16")
    assert found is not None
    numbers = dict(found[1])
    folder = here / "gpt-oss-20b"
    folder.mkdir()
    quantized = {**numbers, "quantization_config": {"quant_method": "mxfp4"}}
    (folder / "config.json").write_text(json.dumps(quantized))
    args = ["fit", _script(GPT_OSS), "--gpu", "H100", "--model-config", str(folder)]
    status, _, err = run(capsys, *args)
    _one_line_error(status, err, "quantization_config.quant_method=mxfp4", "-120b-bf16")
    (folder / "config.json").write_text(json.dumps(numbers))
    status, out, err = run(capsys, *args)
    assert status in (0, 1), err
    assert "20,914,757,184 params" in out


LORA = "examples/tuning/lora/run_qwen3_8b_fsdp.sh"
ACTOR_TARGETS = "actor_rollout_ref.model.target_modules"
CRITIC = "critic.model.lora_rank"


@pytest.mark.parametrize(
    ("script", "sets", "key"),
    [
        (LORA, (f"{ACTOR_TARGETS}=[query_key_value,dense]",), ACTOR_TARGETS),
        (LORA, (f"{ACTOR_TARGETS}=[self_attn,q_proj]",), ACTOR_TARGETS),
        (
            SFT,
            ("model.lora_rank=8", "model.target_modules=[mlp]"),
            "model.target_modules",
        ),
        # a LoRA critic: its token-classification model is no causal LM for peft's adapter
        (PPO, ("critic.model.lora_rank=8", "critic.model.target_modules=[q_proj,v_proj]"), CRITIC),
    ],
)
def test_lora_targets_peft_refuses_are_an_error_naming_the_key(
    here: Path, capsys: pytest.CaptureFixture[str], script: str, sets: tuple[str, ...], key: str
) -> None:
    """A role's LoRA adapter peft refuses to build (another architecture's names, a block, a
    critic): fit exits 1 with the key, in text and in JSON that follows the schema, and check
    --gpu says the same error once; the twin with the model's own layer names (the critic: none)
    or with the adapter loaded from a path is no finding."""
    schema = json.loads(
        resources.files("pytest_verl_compat").joinpath("data/fit.schema.json").read_text()
    )
    args = ["--gpu", "H100", *(["--arg", "8", "--arg", "/tmp/save"] if script == SFT else [])]
    options = [word for s in sets for word in ("--set", s)]
    status, out, _ = run(capsys, "fit", _script(script), *args, *options, "--format", "json")
    payload = json.loads(out)
    jsonschema.validate(payload, schema)
    assert status == 1
    rule = "model.critic-lora" if key == CRITIC else "model.lora-targets"
    assert [(r["rule"], r["key"]) for r in payload["adapter_refused"]] == [(rule, key)]
    assert "peft" in payload["adapter_refused"][0]["message"]
    status, out, _ = run(capsys, "check", _script(script), "--no-upstream-checks", *args, *options)
    assert status == 1 and out.count(f"error[{rule}] {key}:") == 1, out
    section = key.rsplit(".", 1)[0]
    twins = [f"{section}.lora_adapter_path=/adapters/one"]
    twins.append("critic.model.lora_rank=0" if key == CRITIC else f"{key}=[q_proj,v_proj]")
    for twin in twins:
        status, out, _ = run(
            capsys, "fit", _script(script), *args, *options, "--set", twin, "--format", "json"
        )
        assert "adapter_refused" not in json.loads(out), twin


@pytest.mark.parametrize(
    ("sets", "server"),
    [
        ((), "vllm"),  # the example's rank, 64
        (("actor_rollout_ref.model.lora_rank=48",), "vllm"),  # vLLM's next rank, 64
        (("actor_rollout_ref.model.lora.merge=True",), ""),  # merged: no adapter served
        (("actor_rollout_ref.rollout.name=sglang",), "sglang"),  # SGLang's pool of 8 slots
        (
            (
                "actor_rollout_ref.rollout.name=sglang",
                "actor_rollout_ref.model.target_modules=[q_proj,v_proj]",
                "+actor_rollout_ref.rollout.engine_kwargs.sglang.max_loras_per_batch=2",
            ),
            "sglang-listed",
        ),
    ],
)
def test_the_servers_lora_slots_are_in_its_weights(
    here: Path, capsys: pytest.CaptureFixture[str], sets: tuple[str, ...], server: str
) -> None:
    """The LoRA example's rollout server loads LoRA slots with its weights, vLLM's of the rank
    verl asks for, SGLang's pool of its slots over the targets verl hands it: the JSON (valid
    under the schema) names their bytes and the text says them; the merged twin has none."""
    from pytest_verl_compat.memory.models import from_table
    from pytest_verl_compat.memory.server_lora import sglang_pool_bytes, slot_bytes

    choice = from_table("Qwen/Qwen3-8B")
    assert choice is not None
    arch, tp = choice.architecture, 2  # the example's rollout tensor-parallel size
    expected = {
        "vllm": slot_bytes(arch, 64, tp, 0, 2),
        "": 0,
        "sglang": sglang_pool_bytes(arch, 64, tp, 0, 2, ("all",), 8),
        "sglang-listed": sglang_pool_bytes(arch, 64, tp, 0, 2, ("q_proj", "v_proj"), 2),
    }[server]
    options = [word for s in sets for word in ("--set", s)]
    status, out, _ = run(
        capsys, "fit", _script(LORA), "--gpu", "H100", *options, "--format", "json"
    )
    payload = json.loads(out)
    jsonschema.validate(
        payload,
        json.loads(
            resources.files("pytest_verl_compat").joinpath("data/fit.schema.json").read_text()
        ),
    )
    assert payload["rollout_kv_cache"].get("lora_slots", 0) == expected
    status, text, _ = run(capsys, "fit", _script(LORA), "--gpu", "H100", *options)
    assert status == 0, text  # it fits an H100 either way
    assert ("of them its LoRA slots" in text) == bool(expected), text
