"""Scripts as recipes write them: arrays, IFS, input, getopts, sourced files, traps, logging.

Every construct is checked against real bash: random scripts for the ones with many corner
cases (associative array order, IFS splitting, ``read``, ``getopts``), run by the oracle with
the launcher replaced by an argv printer (``bash_oracle.run_bash``), and written scripts run
with Python and the wrappers stubbed (``reader_checks.same_as_bash``). Hostile variants are
refused with their line and construct and run nothing.
"""

from __future__ import annotations

import hashlib
import os
import random
import shlex
import textwrap
from pathlib import Path

import pytest
from bash_oracle import run_bash
from hostile_canary import make_canary
from reader_checks import HOME, LAUNCH, layout, needs_bash, refused, same_as_bash

from pytest_verl_compat.bash import LaunchExited, LaunchReadError, SourceScope, read_launch
from pytest_verl_compat.bash.arrays import Assoc
from pytest_verl_compat.model import Bindings, Case, InputPin
from pytest_verl_compat.pipeline.init_manifest import init_manifest
from pytest_verl_compat.pipeline.read import PinMismatch, read_case_fields


def bash_and_reader(
    text: str, tmp_path: Path, env: dict[str, str] | None = None, refusable: str = ""
) -> bool:
    """The oracle's argv (launcher replaced by a printer, nothing else changed) is ours; or,
    where ``refusable`` names a construct, the reader refuses it. True when it read."""
    __tracebackhide__ = True
    text = text.replace("LAUNCH", LAUNCH)
    variables = {**HOME, **(env or {})}
    oracle = run_bash(text.encode(), tmp_path, variables, {})
    assert oracle.argv is not None, f"bash exited {oracle.returncode}: {oracle.stderr}\n{text}"
    try:
        read = read_launch(str(tmp_path / "run.sh"), Bindings(variables=variables), text=text)
    except LaunchReadError as exc:
        if exc.construct != refusable or not refusable:
            raise
        return False
    assert read.argv == oracle.argv, text
    return True


def _word(rng: random.Random, alphabet: str, longest: int) -> str:
    return "".join(rng.choice(alphabet) for _ in range(rng.randint(0, longest)))


# --------------------------------------------------------------------------- associative arrays


def _assoc_script(rng: random.Random) -> str:
    keys = list(
        dict.fromkeys(_word(rng, "abcxyz019._-", 8) or "k" for _ in range(rng.randint(1, 30)))
    )
    lines = ["declare -A M=(" + " ".join(f'["{k}"]={i}' for i, k in enumerate(keys)) + ")"]
    for _ in range(rng.randint(0, 6)):
        key = rng.choice([*keys, _word(rng, "pqr", 4) or "p"])
        action = rng.choice(["set", "append", "unset", "list"])
        if action == "set":
            lines.append(f'M["{key}"]=v')
        elif action == "append":
            lines.append(f'M+=(["{key}"]=w)')
        elif action == "unset":
            lines.append(f"unset {shlex.quote(f'M[{key}]')}")
        else:
            lines.append(f"M+=({shlex.quote(key)} pair)")
    lines.append('LAUNCH "${!M[@]}" -- "${M[@]}" -- "${#M[@]}"')
    return "\n".join(lines) + "\n"


@needs_bash
@pytest.mark.parametrize("seed", range(int(os.environ.get("FUZZ_SEEDS", 12))))
def test_associative_arrays_list_their_keys_as_bash_does(seed: int, tmp_path: Path) -> None:
    rng = random.Random(seed)
    for _ in range(4):
        bash_and_reader(_assoc_script(rng), tmp_path)


def test_the_key_order_is_bash_hash_table_order() -> None:
    # FNV-1 of "b" falls in an earlier bucket than "a"'s; the newest key of a bucket comes first.
    table = Assoc({"a": "1", "b": "2"})
    assert table.keys() == ["b", "a"]
    table.items.pop("a")
    table.items["a"] = "3"
    assert table.keys() == ["b", "a"]


@needs_bash
@pytest.mark.parametrize(
    "script",
    [
        'declare -A M=([a-b]=1 [7b]=2 ["x y"]=3 [$K]=4)\nLAUNCH "${!M[@]}" "${M[a-b]}" "${M[$K]}"\n',
        'declare -A M=(k1 v1 k2)\nLAUNCH "${!M[@]}" "${M[k2]-unset}"\n',
        'declare -A M\nM[x]+=a\nM[x]+=b\nLAUNCH "${M[x]}" "${#M[@]}" "${M[0]-none}"\n',
        'declare -A M=([x]=1)\nM=y\nLAUNCH "${!M[@]}"\n',
        'f() { local -A L=([q]=1); LAUNCH "${!L[@]}" "${L[q]}"; }\nf\n',
        'A=(a b c)\nA+=(d)\nunset "A[1]"\nLAUNCH "${!A[@]}" "${#A[@]}" "${A[@]}"\n',
        'declare -a A=(x y)\nLAUNCH "${!A[*]}"\n',
        'for v in TRAIN VAL; do declare "${v}_FILE=$v.parquet"; done\nLAUNCH "$TRAIN_FILE" "$VAL_FILE"\n',
        'X=A\nA=value\nB=(p q)\nY="B[1]"\nLAUNCH "${!X}" "${!Y}" "${!X:-d}"\n',
    ],
)
def test_arrays_read_as_bash(script: str, tmp_path: Path) -> None:
    bash_and_reader(script, tmp_path, {"K": "key"})


def test_an_indexed_array_is_not_made_associative() -> None:
    # bash refuses the conversion and goes on with status 1.
    err = refused("declare -A M=([a.b]=1)\nLAUNCH\n")
    assert err.construct == "syntax error"  # shfmt reads [a.b] as arithmetic; bash does not


# --------------------------------------------------------------------------- IFS and read

_IFS_CHOICES = [None, " \t\n", ",", ", ", ":,", "", "\t"]


def _ifs_line(ifs: str | None) -> str:
    return "" if ifs is None else f"IFS=$'{ifs.encode('unicode_escape').decode()}'\n"


@needs_bash
@pytest.mark.parametrize("seed", range(int(os.environ.get("FUZZ_SEEDS", 10))))
def test_word_splitting_follows_ifs_as_bash(seed: int, tmp_path: Path) -> None:
    """Or refuses an unquoted list with IFS whitespace beside other IFS characters (where
    bash's splitting of ``$*`` is not modelled)."""
    rng = random.Random(seed)
    read = 0
    for _ in range(4):
        ifs = rng.choice(_IFS_CHOICES)
        env = {f"V{i}": _word(rng, "ab ,:\t", 6) for i in range(3)}
        words = " ".join(
            rng.choice(["$V0", '"$V1"', "x$V2", "$V0$V1", '"$*"', "$*", "${V1}y"]) for _ in range(3)
        )
        script = f'set -- "$V0" "$V2"\n{_ifs_line(ifs)}LAUNCH {words}\n'
        read += bash_and_reader(script, tmp_path, env, refusable="IFS")
    assert read >= 2


@needs_bash
@pytest.mark.parametrize("seed", range(int(os.environ.get("FUZZ_SEEDS", 12))))
def test_read_splits_its_line_as_bash(seed: int, tmp_path: Path) -> None:
    rng = random.Random(seed)
    for _ in range(4):
        ifs = rng.choice(_IFS_CHOICES)
        text = "\n".join(_word(rng, "ab ,:\t\\", 10) for _ in range(rng.randint(1, 3)))
        options = rng.choice(["", "-r", "-r -d ''", "-d ''", "-ra A", "-a A", "-n 3", "-rN 4"])
        names = rng.choice(["", "x", "x y", "x y z"]) if "A" not in options else ""
        prefix = "" if ifs is None else f"IFS=$'{ifs.encode('unicode_escape').decode()}' "
        shown = " ".join(f'"{n}=${n}"' for n in names.split()) or '"REPLY=$REPLY"'
        if "A" in options:
            shown = '"${A[@]}" "${#A[@]}"'
        script = (
            f"{prefix}read {options} {names} <<'EOF'\n{text}\nEOF\ns=$?\nLAUNCH \"s=$s\" {shown}\n"
        )
        bash_and_reader(script, tmp_path)


@needs_bash
@pytest.mark.parametrize(
    "script",
    [
        'while IFS= read -r line; do A+=("[$line]"); done <<EOF\n a b \n\nc\\\\d\nEOF\nLAUNCH "${A[@]}"\n',
        "while read -r k v; do declare \"$k=$v\"; done <<'EOF'\nLR 1e-6\nBSZ 32\nEOF\nLAUNCH lr=$LR b=$BSZ\n",
        'mapfile -t L <<EOF\na\n\nb c\nEOF\nLAUNCH "${#L[@]}" "${L[@]}"\n',
        'mapfile L <<< "x"\nreadarray -s 1 -n 1 -t M <<< $\'a\\nb\\nc\'\nLAUNCH "${L[0]}" "${M[@]}"\n',
        'mapfile -d , -t P <<< "a,b,c"\nLAUNCH "${P[@]}"\n',
        'printf \'%s\\n\' one two | { read -r a; read -r b; LAUNCH "$a" "$b"; }\n',
        'cat <<EOF | while read -r x; do echo "$x"; done > /dev/null\nq\nEOF\nLAUNCH done\n',
        'X=$(cat <<-EOF\n\tindented $HOME \\$HOME \\\\ "q"\n\t\tkeep\n\tEOF\n)\nLAUNCH "$X"\n',
        "X=$(cat <<'EOF'\nliteral $HOME \\$ \\\nEOF\n)\nLAUNCH \"$X\"\n",
        'X=$(tee <<< "one\ntwo")\nLAUNCH "$X"\n',
        'read -r a b <<< "$(printf "%s %s" p q)"\nLAUNCH "$a" "$b"\n',
        'IFS=: read -r -a P <<< "/a:/b::/c:"\nLAUNCH "${P[@]}" "${#P[@]}"\n',
    ],
)
def test_input_is_read_as_bash_reads_it(script: str, tmp_path: Path) -> None:
    same_as_bash(script, tmp_path)


# --------------------------------------------------------------------------- getopts


@needs_bash
@pytest.mark.parametrize("seed", range(int(os.environ.get("FUZZ_SEEDS", 12))))
def test_getopts_parses_as_bash(seed: int, tmp_path: Path) -> None:
    rng = random.Random(seed)
    for _ in range(4):
        spec = rng.choice(["", ":"]) + rng.choice(["ab:c", "x:y:", "hvn:", "a"])
        pool = [
            "-a",
            "-b",
            "val",
            "-ab",
            "-bval",
            "-c",
            "-x",
            "-xy1",
            "-z",
            "--",
            "plain",
            "-",
            "-hvn3",
            "-n",
        ]
        args = [rng.choice(pool) for _ in range(rng.randint(0, 5))]
        script = (
            f"set -- {' '.join(shlex.quote(a) for a in args)}\nR=()\n"
            f'while getopts {shlex.quote(spec)} opt; do R+=("$opt:${{OPTARG-unset}}:$OPTIND"); done\n'
            'R+=("end:$opt:$OPTIND")\nshift $((OPTIND - 1))\nLAUNCH "${R[@]}" -- "$@"\n'
        )
        bash_and_reader(script, tmp_path)


# --------------------------------------------------------------------------- sourced files

COMMON = """\
    HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
    export SHARED=1
    where() { echo "${FUNCNAME[*]}|${#BASH_SOURCE[@]}"; }
    ARGS_IN=$#
    [ "$#" -gt 0 ] && FIRST=$1
    return 3
    NOT_REACHED=1
"""


@needs_bash
@pytest.mark.parametrize(
    "script",
    [
        'source "$(dirname "$0")/lib/common.sh" a b\nS=$?\nLAUNCH "$HERE" "$S" "$ARGS_IN" "$FIRST" "$(where)" "$#" "${NOT_REACHED-no}"\n',
        'cd "$(dirname "$0")"\n. lib/common.sh\nLAUNCH "$HERE" "$ARGS_IN" "$(where)"\n',
        'f() { source "$(dirname "$0")/lib/common.sh" x; LAUNCH "$(where)" "$1" "$FIRST"; }\nf y\n',
        'set -- keep\n. "$(dirname "$0")/lib/setter.sh" a\nLAUNCH "$@"\n',
        'set -- keep\n. "$(dirname "$0")/lib/shifter.sh" a b\nLAUNCH "$@"\n',
        'X=1 source "$(dirname "$0")/lib/show.sh"\nLAUNCH "$SEEN" "${X-unset}"\n',
        'set -a\nsource "$(dirname "$0")/lib/plain.env"\nset +a\nLAUNCH "$A"\n',
    ],
)
def test_a_sourced_file_runs_as_bash_runs_it(script: str, tmp_path: Path) -> None:
    files = {
        "lib/common.sh": COMMON,
        "lib/setter.sh": "set -- from-file\n",
        "lib/shifter.sh": "shift\n",
        "lib/show.sh": 'SEEN="x=$X"\n',
        "lib/plain.env": "A=exported\n",
    }
    read, _ = same_as_bash(script, tmp_path, bind_pwd=False, files=files)
    assert [path for path, _ in read.sources] == sorted(
        {"lib/common.sh", "lib/setter.sh", "lib/shifter.sh", "lib/show.sh", "lib/plain.env"}
        & {path for path, _ in read.sources}
    )


def test_an_error_in_a_sourced_file_names_that_file_and_line(tmp_path: Path) -> None:
    scripts, _ = layout(tmp_path)
    (scripts / "lib").mkdir()
    (scripts / "lib" / "bad.sh").write_text('X=1\neval "$X"\n')
    (scripts / "run.sh").write_text(f'source "$(dirname "$0")/lib/bad.sh"\n{LAUNCH}\n')
    with pytest.raises(LaunchReadError) as caught:
        read_launch(scripts / "run.sh", Bindings(variables=HOME))
    assert (caught.value.path, caught.value.line, caught.value.construct) == (
        str(scripts / "lib" / "bad.sh"),
        2,
        "eval",
    )


def _fifo(path: Path) -> None:
    os.mkfifo(path)


def _escape(path: Path) -> None:
    path.symlink_to("/etc/hostname")


def _folder_link(path: Path) -> None:
    path.symlink_to(path.parent.parent, target_is_directory=True)


def _huge(path: Path) -> None:
    path.write_text("#" * (1 << 20) + "\n")


@pytest.mark.parametrize(
    ("make", "name", "detail"),
    [
        (_fifo, "lib.sh", "not a regular file"),
        (_escape, "lib.sh", "outside the folder"),
        (_folder_link, "up/project/x.sh", "outside the folder"),
        (_huge, "lib.sh", "larger than"),
        (None, "/etc/profile", "outside the folder"),
        (None, "missing.sh", "No such file"),
        (None, "$0", "levels deep"),
    ],
    ids=["fifo", "symlink-out", "folder-symlink-out", "too-large", "absolute", "missing", "loop"],
)
def test_a_sourced_file_outside_the_scripts_folder_or_not_a_file_is_refused(
    make: object, name: str, detail: str, tmp_path: Path
) -> None:
    canary = make_canary(tmp_path)
    scripts, _ = layout(tmp_path)
    if callable(make):
        target = scripts / name.split("/")[0]
        make(target)
    (tmp_path / "project" / "x.sh").write_text(f"{canary.payload}\n")
    path = name if name.startswith(("/", "$")) else f'$(dirname "$0")/{name}'
    (scripts / "run.sh").write_text(f'X=1\nsource "{path}"\n{LAUNCH}\n')
    with pytest.raises(LaunchReadError) as caught:
        read_launch(scripts / "run.sh", Bindings(variables=HOME))
    assert (caught.value.line, caught.value.construct) == (2, "source")
    assert detail in caught.value.detail
    assert not canary.fired()


def test_a_manifest_case_sources_only_its_pinned_inputs(tmp_path: Path) -> None:
    (tmp_path / "recipe").mkdir()
    (tmp_path / "recipe" / "env.sh").write_text("MODEL=m\n")
    script = tmp_path / "recipe" / "run.sh"
    script.write_text(f'. "$(dirname "$0")/env.sh"\n{LAUNCH} model=$MODEL\n')
    digests = {
        path: hashlib.sha256((tmp_path / path).read_bytes()).hexdigest()
        for path in ("recipe/run.sh", "recipe/env.sh")
    }
    pins = (InputPin("recipe/run.sh", digests["recipe/run.sh"]),)
    case = Case(id="c", kind="user", line=1, launch="recipe/run.sh", inputs=pins)
    with pytest.raises(LaunchReadError) as caught:
        read_case_fields(case, tmp_path)
    assert caught.value.construct == "source"
    assert "recipe/env.sh is not a pinned input" in caught.value.detail
    assert digests["recipe/env.sh"] in caught.value.detail
    pinned = Case(
        id="c",
        kind="user",
        line=1,
        launch="recipe/run.sh",
        inputs=(*pins, InputPin("recipe/env.sh", digests["recipe/env.sh"])),
    )
    assert read_case_fields(pinned, tmp_path).fields == ("model=m",)
    (tmp_path / "recipe" / "env.sh").write_text("MODEL=changed\n")
    with pytest.raises(PinMismatch, match=r"recipe/env\.sh: pinned sha256"):
        read_case_fields(pinned, tmp_path)
    # The reader checks the bytes it reads itself, whatever checked the pins before.
    scope = SourceScope(str(tmp_path), {pin.path: pin.sha256 for pin in pinned.inputs})
    with pytest.raises(LaunchReadError) as caught:
        read_launch(script, Bindings(), scope=scope)
    assert "recipe/env.sh: pinned sha256" in caught.value.detail


def test_init_pins_the_files_a_script_sources(tmp_path: Path) -> None:
    (tmp_path / "exp" / "lib").mkdir(parents=True)
    (tmp_path / "exp" / "lib" / "env.sh").write_text("M=x\n")
    (tmp_path / "exp" / "run.sh").write_text(f'. "$(dirname "$0")/lib/env.sh"\n{LAUNCH} m=$M\n')
    text = init_manifest(tmp_path)
    assert '      - path: "exp/lib/env.sh"  # sourced\n        sha256: ' in text


def test_a_read_of_text_alone_sources_nothing() -> None:
    from pytest_verl_compat.bash import read_launch_text

    with pytest.raises(LaunchReadError) as caught:
        read_launch_text(f". ./env.sh\n{LAUNCH}\n", Bindings(variables={**HOME, "PWD": "/w"}))
    assert caught.value.construct == "source"


def test_the_scope_can_be_a_wider_folder(tmp_path: Path) -> None:
    (tmp_path / "common.sh").write_text("X=shared\n")
    (tmp_path / "exp").mkdir()
    (tmp_path / "exp" / "run.sh").write_text(f'. "$(dirname "$0")/../common.sh"\n{LAUNCH} $X\n')
    with pytest.raises(LaunchReadError):
        read_launch(tmp_path / "exp" / "run.sh", Bindings(variables=HOME))
    read = read_launch(
        tmp_path / "exp" / "run.sh", Bindings(variables=HOME), scope=SourceScope(str(tmp_path))
    )
    assert read.argv == ("shared",)
    assert [path for path, _ in read.sources] == ["common.sh"]


# --------------------------------------------------------------------------- traps


@needs_bash
@pytest.mark.parametrize(
    "script",
    [
        "cleanup() { rm -rf /nonexistent/x; export DONE=1; }\ntrap cleanup EXIT\nLAUNCH a=1\n",
        "trap 'echo bye >&2' EXIT INT TERM\ntrap - INT\nLAUNCH a=1\n",
        "trap 'X=err' ERR\nfalse || true\nfalse\nLAUNCH \"x=$X\"\n",
        "set -E\nf() { false; }\ntrap 'N=$((N+1))' ERR\nf\nLAUNCH \"n=$N\"\n",
        "f() { false; }\ntrap 'N=$((N+1))' ERR\nf\nLAUNCH \"n=$N\"\n",
        "(trap 'echo sub >&2' EXIT; exit 3) || S=$?\nLAUNCH \"s=$S\"\n",
        "trap '' EXIT\nLAUNCH a=1\n",
    ],
)
def test_traps_run_where_bash_runs_them(script: str, tmp_path: Path) -> None:
    same_as_bash(script, tmp_path)


@needs_bash
def test_an_exit_trap_decides_the_status_of_a_script_that_exits(tmp_path: Path) -> None:
    text = "trap 'exit 7' EXIT\nexit 1\nLAUNCH\n".replace("LAUNCH", LAUNCH)
    oracle = run_bash(text.encode(), tmp_path, HOME, {})
    with pytest.raises(LaunchExited) as caught:
        read_launch(str(tmp_path / "run.sh"), Bindings(variables=HOME), text=text)
    assert caught.value.status == oracle.returncode == 7


# --------------------------------------------------------------------------- logging, exec


@needs_bash
@pytest.mark.parametrize(
    "script",
    [
        'exec > >(tee -a "$HOME/x.log") 2>&1\nLAUNCH a=1\n',
        'exec &> /dev/null\nLAUNCH a=1\necho "done"\n',
        'LAUNCH a=1 2>&1 | tee /dev/null\necho "${PIPESTATUS[0]} ${PIPESTATUS[1]}" >&2\n',
        "set -o pipefail\nLAUNCH a=1 |& tee -a /dev/null\n",
        'exec LAUNCH a="$((1 + 1))"\nLAUNCH never\n',
        'CMD=(LAUNCH b=2)\nexec "${CMD[@]}" c=3\n',
        "LAUNCH a=1 &\nP=$!\nwait $P\nkill -0 $P 2>/dev/null || true\n",
        'printf -v TAG "r%02d-%s" 7 x\nLAUNCH "$TAG" "$(seq -s, 1 4)"\n',
        'f() { :; }\nif declare -F f >/dev/null; then X=yes; fi\nLAUNCH "$X" "$(declare -F f g)"\n',
        'export "K=v w" J\nLAUNCH "$K"\n',
        "P=()\n"
        'if false; then :; fi; P+=("${PIPESTATUS[*]}")\n{ false | true; }; P+=("${PIPESTATUS[*]}")\n'
        'x=$(exit 3); P+=("${PIPESTATUS[*]}")\nf() { return 4; }; f; P+=("${PIPESTATUS[*]}")\n'
        '! false | false; P+=("${PIPESTATUS[*]}")\ntrue && false; P+=("${PIPESTATUS[*]}")\n'
        '[[ 1 == 2 ]]; P+=("${PIPESTATUS[*]}")\n(( 0 )); P+=("${PIPESTATUS[*]}")\n'
        '(exit 5); P+=("${PIPESTATUS[*]}")\nfalse; case a in a) true;; esac; P+=("${PIPESTATUS[*]}")\n'
        'LAUNCH "${P[@]}"\n',
    ],
)
def test_logging_and_exec_read_as_bash(script: str, tmp_path: Path) -> None:
    (tmp_path / "home").mkdir()
    same_as_bash(script, tmp_path, {"HOME": str(tmp_path / "home")})


def test_what_only_running_would_tell_stays_refused() -> None:
    assert refused('read -r X < "$HOME/name"\nLAUNCH "$X"\n').construct == "read"
    assert refused('mapfile -t L < <(ls /)\nLAUNCH "${L[@]}"\n').construct == "mapfile"
    err = refused('S=$(seq 1 "$(nproc)")\nLAUNCH "$S"\n')
    assert err.construct == "run-time value"
    assert refused("exec -a name LAUNCH\n").construct == "exec -a"


def test_a_here_document_never_feeds_the_launcher() -> None:
    err = refused(
        textwrap.dedent(
            """\
            while read -r o; do
              LAUNCH "$o"
            done <<EOF
            a=1
            EOF
            """
        )
    )
    assert (err.construct, err.line) == ("here-document", 2)


# --------------------------------------------------------------------------- text filters

FILTER_CASES = [
    ("cat", []),
    ("cat", ["-"]),
    ("tee", ["-a", "/dev/null"]),
    ("tr", [",", "\\n"]),
    ("tr", ["a-z", "A-Z"]),
    ("tr", ["[:upper:]", "[:lower:]"]),
    ("tr", ["-d", " \\t"]),
    ("tr", ["-s", " "]),
    ("tr", ["/.", "__"]),
    ("tr", ["abc", "x"]),
    ("cut", ["-d,", "-f1"]),
    ("cut", ["-d", "/", "-f", "2-"]),
    ("cut", ["-d:", "-f1,3", "-s"]),
    ("cut", ["-c", "1-3"]),
    ("head", ["-n", "1"]),
    ("head", ["-2"]),
    ("head", []),
    ("tail", ["-n1"]),
    ("tail", ["-n", "2"]),
    ("wc", ["-l"]),
    ("wc", ["-w"]),
    ("wc", ["-c"]),
    ("sort", []),
    ("sort", ["-u"]),
    ("sort", ["-r"]),
    ("sort", ["-n"]),
    ("uniq", []),
    ("awk", ["{print $1}"]),
    ("awk", ["-F/", "{print $NF}"]),
    ("awk", ["-F", ",", "{ print $2, $1 }"]),
    ("awk", ["{print $0}"]),
    ("awk", ["-F,", "{print NF}"]),
    ("awk", ["-F/", "{print $(NF-1), NF}"]),
    ("sed", ["s/\\//_/g"]),
    ("sed", ["s/-/_/"]),
    ("sed", ["-e", "s|a|b|g"]),
]


@pytest.mark.parametrize(("program", "args"), FILTER_CASES, ids=lambda v: str(v))
def test_a_text_filter_prints_what_the_program_prints(program: str, args: list[str]) -> None:
    import shutil
    import subprocess

    from pytest_verl_compat.bash.filters import FILTERS

    if shutil.which(program) is None:
        pytest.skip(f"{program} is not installed")
    rng = random.Random(program + "".join(args))
    inputs = [
        "a/b/c,d e\n",
        "Qwen/Qwen2.5-7B\n",
        "0,1,2,3",
        "x\n\ny z\n",
        "3\n10\n2\n2\n",
        "",
        *(
            "".join(rng.choice("ab ,:/-\n\t3") for _ in range(rng.randint(0, 30)))
            for _ in range(20)
        ),
    ]
    modelled = 0
    for text in inputs:
        ours = FILTERS[program](list(args), text)
        if ours is None:
            continue
        modelled += 1
        theirs = subprocess.run(
            [program, *args],
            input=text,
            capture_output=True,
            text=True,
            check=False,
            env={"LC_ALL": "C", "PATH": os.environ.get("PATH", "")},
        )
        assert (ours, 0) == (theirs.stdout, theirs.returncode), (program, args, text)
    assert modelled >= 3


@needs_bash
@pytest.mark.parametrize(
    "script",
    [
        "export CUDA_VISIBLE_DEVICES=0,1,2,3\nN=$(echo \"$CUDA_VISIBLE_DEVICES\" | tr ',' '\\n' | wc -l)\nLAUNCH \"n=$N\"\n",
        'M=Qwen/Qwen2.5-7B-Instruct\nLAUNCH "$(echo $M | cut -d/ -f2)" "$(echo $M | awk -F/ \'{print $NF}\')"\n',
        "M=Qwen/Qwen2.5-7B\nLAUNCH \"$(echo \"$M\" | sed 's/\\//_/g' | tr '[:upper:]' '[:lower:]')\"\n",
        "LAUNCH \"$(printf '%s\\n' b a b | sort -u | head -n1)\" \"$(seq 5 | tail -n 2 | tr '\\n' ,)\"\n",
    ],
)
def test_values_piped_through_filters_read_as_bash(script: str, tmp_path: Path) -> None:
    same_as_bash(script, tmp_path)


# --------------------------------------------------------------------------- [[ =~ ]]


def _regex(rng: random.Random, depth: int = 0) -> str:
    atoms = ["a", "b", ".", "[ab]", "[^a]", "[[:digit:]]", "x", "\\.", "1"]
    if depth < 2:
        atoms += [
            f"({_regex(rng, depth + 1)})",
            f"({_regex(rng, depth + 1)}|{_regex(rng, depth + 1)})",
        ]
    parts = []
    for _ in range(rng.randint(1, 3)):
        parts.append(rng.choice(atoms) + rng.choice(["", "", "*", "+", "?", "{1,2}"]))
    return "".join(parts)


@needs_bash
@pytest.mark.parametrize("seed", range(int(os.environ.get("FUZZ_SEEDS", 12))))
def test_regex_matching_is_bashs(seed: int, tmp_path: Path) -> None:
    """The match, and BASH_REMATCH where it is modelled, equal bash's (glibc's POSIX regex)."""
    rng = random.Random(seed)
    lines = []
    for case in range(8):
        pattern = rng.choice(["", "^"]) + _regex(rng) + rng.choice(["", "$"])
        subject = _word(rng, "abx1.-", 8)
        lines.append(f"p{case}={shlex.quote(pattern)}\ns{case}={shlex.quote(subject)}")
        lines.append(
            f'if [[ $s{case} =~ $p{case} ]]; then R+=("{case}:yes:${{#BASH_REMATCH[@]}}:'
            f'${{BASH_REMATCH[0]}}"); else R+=("{case}:no"); fi'
        )
    script = "\n".join(lines) + '\nLAUNCH "${R[@]}"\n'
    bash_and_reader(script, tmp_path)
    # Every capture, where the reader knows it; a capture it does not know is refused.
    known = 0
    for _ in range(8):
        pattern, subject = _regex(rng), _word(rng, "abx1.-", 8)
        known += bash_and_reader(
            f"p={shlex.quote(pattern)}\ns={shlex.quote(subject)}\n[[ $s =~ $p ]]\n"
            'LAUNCH "${BASH_REMATCH[@]}"\n',
            tmp_path,
            refusable="run-time value",
        )
    assert known >= 2


@needs_bash
@pytest.mark.parametrize(
    "script",
    [
        'M=Qwen2.5-7B\nif [[ $M =~ ^Qwen([0-9.]+)-([0-9]+)B$ ]]; then LAUNCH "${BASH_REMATCH[@]}"; fi\n',
        'M=llama-3.1-70b\n[[ $M =~ ([0-9]+)b$ ]] && S=${BASH_REMATCH[1]}\nLAUNCH "s=$S"\n',
        'M=abc\n[[ $M =~ "a.c" ]] || X=literal\n[[ a.c =~ "a.c" ]] && Y=yes\nLAUNCH "$X" "$Y"\n',
        "R='^[a-z]+_[0-9]{2}$'\n[[ run_07 =~ $R ]] && LAUNCH ok \"${#BASH_REMATCH[@]}\"\n",
    ],
)
def test_regex_conditions_read_as_bash(script: str, tmp_path: Path) -> None:
    bash_and_reader(script, tmp_path)


def test_a_capture_bash_chooses_by_rules_not_modelled_is_a_run_time_value() -> None:
    err = refused('[[ aab =~ (a)+b ]]\nLAUNCH "${BASH_REMATCH[1]}"\n')
    assert err.construct == "run-time value" and "BASH_REMATCH[1]" in err.detail
    # A back-reference or a word anchor, from a variable (quoted by a backslash in the word
    # itself, the character would only be literal).
    assert refused("r='(a)\\1'\n[[ aa =~ $r ]]\nLAUNCH\n").construct == "[[ =~ ]]"
    assert refused("r='\\<a'\n[[ a =~ $r ]]\nLAUNCH\n").construct == "[[ =~ ]]"
    assert refused("r='(a'\n[[ a =~ $r ]]\nLAUNCH\n").construct == "[[ =~ ]]"


# --------------------------------------------------------------------------- printf numbers


@needs_bash
@pytest.mark.parametrize("seed", range(int(os.environ.get("FUZZ_SEEDS", 12))))
def test_printf_formats_numbers_as_bash(seed: int) -> None:
    """Where the reader formats a number (C's printf rules), bash prints the same."""
    import subprocess

    from pytest_verl_compat.bash.printing import printf_output

    rng = random.Random(seed)
    arguments = ["0", "1", "-7", "42", "3.14159", "-0.5", "1e3", "0x1f", "010", " 12", "", "2.5e-7"]
    for _ in range(40):
        letter = rng.choice("diuxXofeEgG")
        flags = "".join(rng.sample("-+ #0", rng.randint(0, 2)))
        precision = rng.choice(["", ".", ".0", ".2", ".6"])
        form = f"%{flags}{rng.choice(['', '5', '08'])}{precision}{letter}|"
        argument = rng.choice(arguments)
        ours = printf_output(form, [argument])
        if ours is None:
            continue
        bash = subprocess.run(
            ["bash", "-c", 'printf "$1" "$2"', "x", form, argument], capture_output=True, text=True
        )
        assert (bash.stdout, bash.returncode) == (ours, 0), (form, argument)


def test_an_undecidable_test_whose_ways_set_different_traps_or_read_differently_is_refused() -> (
    None
):
    err = refused("[ -f /nonexistent ] && trap 'rm -f x' EXIT\nLAUNCH a=1\n")
    assert (err.construct, err.line) == ("test -f", 1)
    err = refused(
        '{ [ -f /nonexistent ] && read -r x; read -r y; } <<EOF\n1\n2\nEOF\nLAUNCH "$y"\n'
    )
    assert (err.construct, err.line) == ("test -f", 1)
    assert refused("f() { :; }\nexport -f f\nLAUNCH\n").construct == "export -f"
