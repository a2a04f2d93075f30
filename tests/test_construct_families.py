"""Every construct family the reader models, against real bash: never a value bash would not give.

Each script runs twice: read by the reader, and run by real bash in the sandbox
(``bash_oracle.run_bash_sandboxed``: the script's own text at the same path, nothing real but
bash and the pure programs the reader models, every other command a silent success, as the
reader assumes). A case expects either the same launch (``SAME``: argv, environment, folder), or
a refusal naming its construct, file and line: a construct whose value the reader does not model
must be a run-time value or a refusal, never a value. ``LAUNCH`` stands for
``python3 -m verl.trainer.main_ppo``.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from reader_checks import LAUNCH, agrees_with_bash, needs_bash

from pytest_verl_compat.bash import LaunchRead, LaunchReadError

SAME = "same"

# family -> [(script, SAME or the construct of the refusal, the variables it is given[, the
# files beside it])]
Case = tuple[str, str, dict[str, str]] | tuple[str, str, dict[str, str], dict[str, str]]
FAMILIES: dict[str, list[Case]] = {
    "quoting and continuations": [
        # A backslash, spaces, then the newline: `\ ` is a word of one space, and the newline
        # ends the command; the next line is a command of its own.
        ("LAUNCH a \\  \n  b=1\n", SAME, {}),
        ('LAUNCH a \\ \nb=2\nLAUNCH "$b"\n', SAME, {}),
        ("LAUNCH a \\\t\n", SAME, {}),
        ("LAUNCH a\\  \n", SAME, {}),
        ("LAUNCH a \\\n  b \\\n  c\n", SAME, {}),
        ("LAUNCH a \\\n\n", SAME, {}),
        ("LAUNCH a \\ \\ \n", SAME, {}),
        # A lone backslash at the very end of the script continues into nothing: it vanishes.
        ("LAUNCH a \\", SAME, {}),
        ("LAUNCH a\\", SAME, {}),
        ("LAUNCH a \\\\", SAME, {}),
        ("LAUNCH 'a\\' \"b\\\\\" $'c\\td' \"$'x'\"\n", SAME, {}),
        ("LAUNCH \"a\\\nb\" 'c\\\nd'\n", SAME, {}),
        ('A=( a \\  \n b )\nLAUNCH "${A[@]}"\n', SAME, {}),
        ('X="a \\  \n b"\nLAUNCH "$X"\n', SAME, {}),
    ],
    "command substitution": [
        ('X=$(echo a b)\nLAUNCH "$X" $X\n', SAME, {}),
        ('X=`echo a`\nLAUNCH "$X"\n', SAME, {}),
        ('X="$(printf \'%s\\n\\n\' a)"\nLAUNCH "[$X]"\n', SAME, {}),
        # `$(< FILE)` prints the file bash reads, never read here: a run-time value.
        ('echo content > f.txt\nX=$(< f.txt)\nLAUNCH "a=$X"\n', "run-time value", {}),
        ('echo content > f.txt\nX=$(0< f.txt)\nLAUNCH "a=$X"\n', "run-time value", {}),
        ('echo c > f.txt\nLAUNCH "a=`< f.txt`"\n', "run-time value", {}),
        # Anything else but one redirection alone prints nothing.
        ('echo c > f.txt\nX=$(echo a; < f.txt)\nLAUNCH "a=$X"\n', SAME, {}),
        ('echo c > f.txt\nX=$(X=1 < f.txt)\nLAUNCH "a=$X"\n', SAME, {}),
        ('echo c > f.txt\nX=$(< f.txt 2>/dev/null)\nLAUNCH "a=$X"\n', SAME, {}),
        ('echo c > f.txt\nX=$(1< f.txt)\nLAUNCH "a=$X"\n', SAME, {}),
        # A program this reader does not model prints what only the run knows.
        ('X=$(date)\nLAUNCH "a=$X"\n', "run-time value", {}),
        ("X=$(date)\nLAUNCH a\n", SAME, {}),
        ('D="$(cd "$(dirname "$0")" && pwd)"\nLAUNCH "d=$D"\n', SAME, {}),
    ],
}


EXTRA_FAMILIES: dict[str, list[Case]] = {
    "parameter expansion": [
        (
            'X=abc.tar.gz\nLAUNCH "${X%.*}" "${X%%.*}" "${X#*.}" "${X##*.}" "${#X}" "${X:1:3}" "${X: -2}"\n',
            SAME,
            {},
        ),
        (
            'X=a/b/c\nLAUNCH "${X/\\//_}" "${X//\\//_}" "${X/#a/z}" "${X/%c/z}" "${X^^}" "${X^}"\n',
            SAME,
            {},
        ),
        (
            'LAUNCH "${U:-d}" "${U-d}" "${E:-d}" "${E-d}" "${S:+alt}" "${U:+alt}" "${E:+alt}"\n',
            SAME,
            {},
        ),
        ('LAUNCH "${U:=set}" "$U"\n', SAME, {}),
        ('A=(x y z)\nLAUNCH "${A[@]:1}" "${#A[@]}" "${A[-1]}" "${!A[@]}" "${A[*]}"\n', SAME, {}),
        ('set -- a b c\nLAUNCH "${@:2}" "${#}" "$*" "${*:1:2}" "$1$2"\n', SAME, {}),
        ('X=hello\nLAUNCH "${X:10}" "${X:2:-1}" "${X: -10}"\n', SAME, {}),
        ('N=X\nX=val\nLAUNCH "${!N}" "${N}"\n', SAME, {}),
        ('X="a b  c"\nLAUNCH $X "$X" ${X// /_}\n', SAME, {}),
        ('X=*\nLAUNCH $X "$X"\n', SAME, {}),
        ('LAUNCH "${X:-a b}" ${X:-a b} ${X:-"a b"}\n', SAME, {}),
        ("LAUNCH ${X:-'a b'} \"${X:-'a b'}\"\n", SAME, {}),
        ('X=path/to/file\nLAUNCH "${X%/*}" "${X##*/}"\n', SAME, {}),
        ('X=AbC\nLAUNCH "${X,,}" "${X,}" "${X~~}"\n', "syntax error", {}),
        ('set -u\nLAUNCH "${UNSET:-ok}"\n', SAME, {}),
        ('set -u\nLAUNCH "$UNSET"\n', "unbound variable", {}),
        ('X=abc\nLAUNCH "${X/b*/Z}" "${X/[ab]/Z}" "${X//?/.}"\n', SAME, {}),
        ('f=file.txt\nLAUNCH "${f%%.txt}.log" "${f/.txt/}"\n', SAME, {}),
        ('LAUNCH "$0x" "${10}" "${1}0"\n', SAME, {}),
        ('X=é\nLAUNCH "${#X}"\n', "parameter expansion", {}),
        ('X=abc\nLAUNCH "${X@Q}"\n', "parameter expansion", {}),
        ('XA=1 XB=2\nLAUNCH "${!X*}"\n', "parameter expansion", {}),
        ('X=abc\nLAUNCH "${X:0:1}${X:1}"\n', SAME, {}),
        ('set -- a b c d e\nshift 2\nLAUNCH "$@" $#\n', SAME, {}),
        ('set -- a\nshift 3\nLAUNCH $? "$@"\n', SAME, {}),
        ('X=ab\nLAUNCH "${X/a/\\&}" "${X//b/[&]}"\n', SAME, {}),
        ("X=a.b.c\nLAUNCH ${X//./ }\n", SAME, {}),
        ('LAUNCH "${HOME%/}" "${HOME##*/}"\n', SAME, {}),
        ('X=\nLAUNCH "${X:-}" "${X:+y}" "${#X}"\n', SAME, {}),
        ('A=(a b)\nLAUNCH "${A[@]:-none}" "${B[@]:-none}" "${A[@]:+set}"\n', SAME, {}),
        ("X=abc\nLAUNCH ${X:1:1}${X: -1:1}\n", SAME, {}),
        ('X="a b"\nset -- $X\nLAUNCH $# "$2"\n', SAME, {}),
    ],
    "arithmetic": [
        (
            "LAUNCH $((1+2*3)) $((7/2)) $((-7/2)) $((-7%3)) $((2**10)) $((1<<3)) $((0x10)) $((010)) $((2#101))\n",
            SAME,
            {},
        ),
        ("N=5\n((N++))\n((N+=2))\nLAUNCH $N $((N>3?1:0)) $((N--, N))\n", SAME, {}),
        ("X=3\nY=X\nLAUNCH $((Y+1)) $(( X * (2 + 1) ))\n", SAME, {}),
        ("LAUNCH $((1/0))\n", "arithmetic", {}),
        ("A=(1 2 3)\nLAUNCH $((A[1]+A[2])) $(( ${#A[@]} * 2 ))\n", SAME, {}),
        ('let "a=5" "b=a*2"\nLAUNCH $a $b\n', "arithmetic", {}),
        ("X=08\nLAUNCH $((X+1))\n", "arithmetic", {}),
        ('X=" 12 "\nLAUNCH $((X+1))\n', SAME, {}),
        ("LAUNCH $(( 9223372036854775807 + 1 ))\n", SAME, {}),
        ("i=0\nfor ((i=0;i<3;i++)); do :; done\nLAUNCH $i\n", SAME, {}),
        ("LAUNCH $[1+1]\n", SAME, {}),
        ("N=$((RANDOM % 2))\nLAUNCH a\n", SAME, {}),
        ("N=$((RANDOM % 2))\nLAUNCH $N\n", "run-time value", {}),
    ],
    "arrays": [
        ('A=(a "b c" d)\nA+=(e)\nLAUNCH "${A[@]}" ${A[@]} "${A[*]}"\n', SAME, {}),
        ('A=()\nLAUNCH "${A[@]}" x\n', SAME, {}),
        ('A=([2]=x [5]=y)\nA[7]=z\nLAUNCH "${!A[@]}" "${A[@]}"\n', SAME, {}),
        (
            'declare -A M=([k1]=v1 [k2]=v2)\nfor k in "${!M[@]}"; do LAUNCH "$k=${M[$k]}"; done\n',
            SAME,
            {},
        ),
        ('A=(a b c)\nunset "A[1]"\nLAUNCH "${A[@]}" "${#A[@]}"\n', SAME, {}),
        ('A=(x y)\nB=("${A[@]/#/p-}")\nLAUNCH "${B[@]}"\n', "parameter expansion", {}),
        ('read -ra A <<< "a b  c"\nLAUNCH "${A[@]}"\n', SAME, {}),
        ('IFS=, read -ra A <<< "a,b,,c"\nLAUNCH "${A[@]}"\n', SAME, {}),
        ('A=(one two)\nLAUNCH "${A}" "$A" "${A[0]}"\n', SAME, {}),
        ('A=(a b)\nA[1]+=x\nLAUNCH "${A[@]}"\n', SAME, {}),
        ('mapfile -t L <<EOF\nl1\nl2\nEOF\nLAUNCH "${L[@]}"\n', SAME, {}),
        ('declare -a A=(1 2)\ndeclare -p A >/dev/null\nLAUNCH "${A[@]}"\n', "declare -p", {}),
    ],
    "here-documents and here-strings": [
        ("cat <<EOF > /dev/null\nignored $X\nEOF\nLAUNCH a\n", SAME, {}),
        ('read X <<< "hello world"\nLAUNCH "$X"\n', SAME, {}),
        ('read -r X Y <<EOF\na b c\nEOF\nLAUNCH "$X" "$Y"\n', SAME, {}),
        ("read -r X <<'EOF'\n$HOME \\x\nEOF\nLAUNCH \"$X\"\n", SAME, {}),
        ('read -r X <<EOF\n$HOME \\$ \\x\nEOF\nLAUNCH "$X"\n', SAME, {}),
        ('while read -r L; do A+=("$L"); done <<EOF\nx 1\ny 2\nEOF\nLAUNCH "${A[@]}"\n', SAME, {}),
        ('X=$(cat <<EOF\nmulti\nline\nEOF\n)\nLAUNCH "$X"\n', SAME, {}),
        ('read -r X <<-EOF\n\tindented\n\tEOF\nLAUNCH "$X"\n', SAME, {}),
        ('X=$(tr a-z A-Z <<< "up")\nLAUNCH "$X"\n', SAME, {}),
        ("LAUNCH a <<EOF\nfed\nEOF\n", "here-document", {}),
    ],
    "conditionals": [
        (
            'X=1\nif [ "$X" = 1 ]; then Y=a; elif [ "$X" = 2 ]; then Y=b; else Y=c; fi\nLAUNCH "$Y"\n',
            SAME,
            {},
        ),
        (
            'X=abc\n[[ $X == a* ]] && Y=glob || Y=no\n[[ $X =~ ^a(b)c$ ]] && Z=${BASH_REMATCH[1]}\nLAUNCH "$Y" "$Z"\n',
            SAME,
            {},
        ),
        (
            'X=5\nif (( X > 3 )); then Y=big; fi\n[ "$X" -lt 10 ] && Z=small\nLAUNCH "$Y" "$Z"\n',
            SAME,
            {},
        ),
        ('case "gpu-8" in cpu*) D=c;; gpu-*) D=g;& x) E=fall;; esac\nLAUNCH "$D" "$E"\n', SAME, {}),
        (
            'X=\nif [ -n "$X" ]; then Y=set; else Y=empty; fi\nif [ -z "${U:-}" ]; then Z=z; fi\nLAUNCH $Y $Z\n',
            SAME,
            {},
        ),
        ('if [ -f /nonexistent ]; then Y=f; else Y=nf; fi\nLAUNCH "$Y"\n', "test -f", {}),
        ("if [ ! -d /x ]; then mkdir -p /x; fi\nLAUNCH a\n", SAME, {}),
        ('[ "a" \\< "b" ] && Y=lt\n[[ "b" > "a" ]] && Z=gt\nLAUNCH $Y $Z\n', SAME, {}),
        ("test 1 -eq 1 -a 2 -gt 1 && Y=and\nLAUNCH $Y\n", SAME, {}),
        ("X=yes\n[[ -n $X && $X != no ]] && Y=ok\nLAUNCH $Y\n", SAME, {}),
        ('V=1.2\nif [[ "$V" < "1.10" ]]; then Y=lex; fi\nLAUNCH "$Y"\n', SAME, {}),
        ('true && false || Y=either\nLAUNCH "$Y"\n', SAME, {}),
    ],
    "loops": [
        ('for x in a b "c d"; do A+=("$x-1"); done\nLAUNCH "${A[@]}"\n', SAME, {}),
        ("i=0\nwhile [ $i -lt 3 ]; do i=$((i+1)); done\nLAUNCH $i\n", SAME, {}),
        ("i=0\nuntil [ $i -ge 2 ]; do i=$((i+1)); done\nLAUNCH $i\n", SAME, {}),
        (
            'for x in 1 2 3 4; do [ $x = 2 ] && continue; [ $x = 4 ] && break; A+=($x); done\nLAUNCH "${A[@]}"\n',
            SAME,
            {},
        ),
        ('for i in {1..3}; do S="$S$i"; done\nLAUNCH "$S" {a,b}{1,2} {01..03}\n', SAME, {}),
        ('for x in $(seq 1 3); do S=$S$x; done\nLAUNCH "$S"\n', SAME, {}),
        ('for f in *.none; do S="$f"; done\nLAUNCH "$S"\n', SAME, {}),
        ("set -- p q\nfor a; do S=$S$a; done\nLAUNCH $S\n", SAME, {}),
        ("for ((i=0,j=10; i<3; i++, j--)); do :; done\nLAUNCH $i $j\n", SAME, {}),
        ("n=0\nwhile true; do n=$((n+1)); [ $n -eq 5 ] && break; done\nLAUNCH $n\n", SAME, {}),
    ],
    "functions": [
        ('f() { local X=in; echo "$X-$1"; }\nX=out\nY=$(f arg)\nLAUNCH "$X" "$Y"\n', SAME, {}),
        ("f() { return 3; }\nf\nLAUNCH $?\n", SAME, {}),
        ('f() { X=global; }\nf\nLAUNCH "$X"\n', SAME, {}),
        ('f() { shift; echo "$@"; }\nLAUNCH "$(f a b c)"\n', SAME, {}),
        ('function g { echo "${FUNCNAME[0]}"; }\nLAUNCH "$(g)"\n', SAME, {}),
        ('f() { LAUNCH "$@"; }\nf x "y z"\n', SAME, {}),
        ('f() { echo $#; }\nLAUNCH "$(f)" "$(f a b)"\n', SAME, {}),
        ('f() { local -a A=(1 2); echo "${A[@]}"; }\nLAUNCH "$(f)"\n', SAME, {}),
        ('X=1\nf() { local X; X=2; g; }\ng() { echo $X; }\nLAUNCH "$(f)" $X\n', SAME, {}),
    ],
    "redirections": [
        ("echo hi > /dev/null\nLAUNCH a > /dev/null 2>&1\n", SAME, {}),
        ('X=$(echo out; echo err >&2)\nLAUNCH "$X"\n', SAME, {}),
        ('X=$(echo out 2>&1)\nLAUNCH "$X"\n', SAME, {}),
        ('X=$( { echo a; echo b; } | tail -1)\nLAUNCH "$X"\n', SAME, {}),
        ("exec 3>&1\nLAUNCH a\n", SAME, {}),
        ("LAUNCH a 2>&1 | tee log.txt\n", SAME, {}),
        ('X=$(echo a >/dev/null; echo b)\nLAUNCH "$X"\n', SAME, {}),
        ("{ LAUNCH a; } > log 2>&1\n", SAME, {}),
        ("exec > >(tee -a log.txt) 2>&1\nLAUNCH a\n", SAME, {}),
    ],
    "traps": [
        ('trap "X=trapped" EXIT\nLAUNCH a\n', SAME, {}),
        ("cleanup() { :; }\ntrap cleanup EXIT INT TERM\nLAUNCH a\n", SAME, {}),
        ("trap 'echo err' ERR\nfalse\nLAUNCH a\n", SAME, {}),
        ('trap "LAUNCH late" EXIT\nLAUNCH early\n', "trap EXIT", {}),
        ('set -e\ntrap "LAUNCH fromtrap" EXIT\nfalse\nLAUNCH never\n', "trap EXIT", {}),
    ],
    "read, mapfile and getopts": [
        (
            'set -- -n 4 -v rest\nwhile getopts "n:v" o; do case $o in n) N=$OPTARG;; v) V=1;; esac; done\nshift $((OPTIND-1))\nLAUNCH "$N" "$V" "$@"\n',
            SAME,
            {},
        ),
        ('set -- -abc\nwhile getopts "abc" o; do S=$S$o; done\nLAUNCH $S $OPTIND\n', SAME, {}),
        ('set -- -x\nwhile getopts ":n:" o; do S="$o:$OPTARG"; done\nLAUNCH "$S"\n', SAME, {}),
        ('IFS=: read -r A B C <<< "x:y:z:w"\nLAUNCH "$A" "$B" "$C"\n', SAME, {}),
        ('read -r X\nLAUNCH "$X"\n', "read", {}),
        ('echo "a b" | read X\nLAUNCH "${X-unset}"\n', SAME, {}),
        ('read -d "" X <<EOF\nl1\nl2\nEOF\nLAUNCH "$X"\n', SAME, {}),
        ('read -n 2 X <<< "abcd"\nLAUNCH "$X"\n', SAME, {}),
    ],
    "printf and echo": [
        ('X=$(printf "%s-%d-%05.2f" a 42 3.14159)\nLAUNCH "$X"\n', SAME, {}),
        ('X=$(printf "%s," a b c)\nLAUNCH "$X"\n', SAME, {}),
        ('printf -v Y "%03d" 7\nLAUNCH "$Y"\n', SAME, {}),
        ('X=$(echo -e "a\\tb")\nY=$(echo -n x; echo y)\nLAUNCH "$X" "$Y"\n', SAME, {}),
        ('X=$(echo -E "a\\tb")\nLAUNCH "$X"\n', SAME, {}),
        ('X=$(printf "%q" "a b")\nLAUNCH "$X"\n', "run-time value", {}),
        ('X=$(printf "%x %o %e" 255 8 1234.5)\nLAUNCH "$X"\n', SAME, {}),
        ('X=$(printf "%b" "a\\nb")\nLAUNCH "$X"\n', SAME, {}),
        ('X=$(echo "$(printf "%s" " spaced ")")\nLAUNCH "[$X]"\n', SAME, {}),
        ('X=$(printf "%s\\n" a b | sort -r | head -1)\nLAUNCH "$X"\n', SAME, {}),
        ('X=$(printf "%d" 0x1f)\nLAUNCH "$X"\n', SAME, {}),
        ('X=$(printf \'%s\' "$(echo a)")\nLAUNCH "$X"\n', SAME, {}),
    ],
    "wrappers": [
        ("nohup LAUNCH a > log 2>&1 &\nwait\n", SAME, {}),
        ("env -u HOME X=1 LAUNCH a\n", SAME, {}),
        ("timeout 10 LAUNCH a\n", SAME, {}),
        ("timeout -s KILL 1h LAUNCH a\n", SAME, {}),
        ("env -C /tmp LAUNCH a\n", SAME, {}),
        ("uv run --all-packages --no-sync LAUNCH a\n", SAME, {}),
        ("ray job submit --address=http://x:8265 --no-wait -- LAUNCH a\n", SAME, {}),
        ("srun -N 1 --ntasks-per-node=1 --export=ALL,X=1 LAUNCH a\n", SAME, {}),
        ("nice -n 5 setsid LAUNCH a\n", SAME, {}),
        ("stdbuf -oL LAUNCH a\n", SAME, {}),
    ],
    "quoting and continuations": [
        ('X=v\nLAUNCH $"hello $X"\n', SAME, {}),
        ("LAUNCH $'a\\x41\\101\\u00e9' $'\\c['\n", "quoting", {}),
        ('Y="q r"\nLAUNCH "${X:-"$Y"}" ${X:-"$Y"} "${X:-$Y}"\n', SAME, {}),
        ('LAUNCH ~ ~/x a=~/y "~" ~root/z x~\n', "tilde expansion", {}),
        ('LAUNCH {a,b}$X {1..5..2} {a..e..2} {z..w} {1..3}{x,y} "{a,b}" \\{a,b\\}\n', SAME, {}),
        ("X=1\nLAUNCH a{$X,2}b ${X}{a,b}\n", SAME, {}),
        ('LAUNCH "$@" "$*" x "${@}" ${@:-none}\n', SAME, {}),
        ('set -- "a b" c\nIFS=,\nLAUNCH "$*" $* "$@"\n', SAME, {}),
        ('IFS=:\nX="a:b::c"\nLAUNCH $X\n', SAME, {}),
        ('IFS=\nX="a b"\nLAUNCH $X\n', SAME, {}),
        ('X="  lead trail  "\nLAUNCH $X "$X"\n', SAME, {}),
        ("LAUNCH \"a\"'b'$'c'\"$HOME\"\n", SAME, {}),
        ("X=$'a\\nb'\nLAUNCH $X \"$X\"\n", SAME, {}),
        ('LAUNCH \\$HOME "\\$HOME" \'$HOME\' "\\"" \\\\\n', SAME, {}),
        ('X="*.sh"\nLAUNCH $X\n', SAME, {}),
        ('X=\'a"b\'\nLAUNCH "$X" ${X}\n', SAME, {}),
    ],
    "builtins and programs": [
        ("sleep 1 &\nPID=$!\nwait $PID\nLAUNCH a\n", SAME, {}),
        ('sleep 1 &\nLAUNCH "$!"\n', "run-time value", {}),
        ("X=$(command -v python3)\nLAUNCH a\n", SAME, {}),
        ("set -e\nfalse || true\nLAUNCH a\n", SAME, {}),
        ("set -e\nX=$(false)\nLAUNCH never\n", "exit", {}),
        ('set -e\nf() { false; echo after; }\nX=$(f)\nLAUNCH "$X"\n', SAME, {}),
        ("set -o pipefail\nfalse | true\nLAUNCH $?\n", SAME, {}),
        ('false | true\nLAUNCH $? "${PIPESTATUS[@]}"\n', SAME, {}),
        ('cd /tmp && cd - >/dev/null\nLAUNCH "$PWD"\n', SAME, {}),
        ('cd /tmp\nLAUNCH "$PWD" "$(pwd)" "$OLDPWD"\n', SAME, {}),
        (
            "X=$(basename /a/b.sh .sh)\nY=$(dirname a/b/c)\nZ=$(realpath -m /a/../b)\nLAUNCH $X $Y $Z\n",
            SAME,
            {},
        ),
        (
            'X=$(echo "a,b,c" | cut -d, -f2)\nY=$(echo abc | tr a-c A-C)\nZ=$(echo "x y z" | awk "{print \\$2}")\nLAUNCH $X $Y $Z\n',
            SAME,
            {},
        ),
        (
            'X=$(echo "a/b" | sed "s/\\//_/g")\nN=$(echo -e "a\\nb\\nc" | wc -l)\nLAUNCH $X $N\n',
            SAME,
            {},
        ),
        ("export A=1\nB=2 LAUNCH x\n", SAME, {}),
        ("export A\nA=set\nLAUNCH x\n", SAME, {}),
        ("declare -x A=1\ndeclare +x A\nLAUNCH x\n", SAME, {}),
        ("set -a\nA=1\nLAUNCH x\n", SAME, {}),
        ("readonly R=1\nLAUNCH $R\n", SAME, {}),
        ('A=1\nunset A\nLAUNCH "${A-unset}"\n', SAME, {}),
        ("X=$(seq -s, 1 4)\nY=$(seq -w 8 10)\nLAUNCH $X $Y\n", SAME, {}),
        (
            'X=$(printf "%5s|%-5s|%.2s|%c|%i|%u" ab cd efg hij 7 8)\nLAUNCH "$X"\n',
            "run-time value",
            {},
        ),
        ('X=$(printf "%.0f %.1f %g %G" 2.5 0.05 100000 1e-5)\nLAUNCH "$X"\n', "run-time value", {}),
        ('X=$(echo -n)\nY=$(echo -e -n "x")\nZ=$(echo -- a)\nLAUNCH "[$X]" "$Y" "$Z"\n', SAME, {}),
        ("X=$(echo $((1 + 1)))\nLAUNCH $X\n", SAME, {}),
        ("CKPT=${CKPT:-$HOME/ckpt}\nmkdir -p $CKPT\nLAUNCH trainer.dir=$CKPT\n", SAME, {}),
        ('PROJECT_DIR="$(pwd)"\nLAUNCH "d=$PROJECT_DIR"\n', SAME, {}),
        ("X=$(hostname)\nLAUNCH a\n", SAME, {}),
        ("X=$(python3 -c 'print(1)')\nLAUNCH a\n", SAME, {}),
        ('eval "X=1"\nLAUNCH $X\n', "eval", {}),
        ("alias p=python3\nLAUNCH a\n", "alias", {}),
        ("shopt -s extglob\nLAUNCH a\n", SAME, {}),
        ("X=$((2**62 * 4))\nLAUNCH $X\n", SAME, {}),
        ("LAUNCH $(( 1 ? 2 : 3 )) $(( 0 && 1/0 )) $(( 1 || 1/0 ))\n", SAME, {}),
        ("i=5\nLAUNCH $((i++ + ++i)) $i\n", SAME, {}),
        (
            "a=3\nLAUNCH $(( a -= 1 )) $(( a *= 4 )) $(( a <<= 1 )) $(( a % 5 )) $(( ~a )) $(( !a ))\n",
            SAME,
            {},
        ),
        ("if command -v nvidia-smi >/dev/null; then echo found; fi\nLAUNCH a\n", SAME, {}),
        ("until command -v ray >/dev/null; do sleep 1; done\nLAUNCH a\n", SAME, {}),
    ],
    "source": [
        (
            'source "$(dirname "$0")/lib.sh"\nLAUNCH "$LIBVAR"\n',
            SAME,
            {},
            {"lib.sh": "LIBVAR=fromlib\n"},
        ),
        (
            '. "$(dirname "$0")/lib.sh" one two\nLAUNCH "$LIBVAR" "$@"\n',
            SAME,
            {},
            {"lib.sh": 'LIBVAR="$1-$#"\n'},
        ),
        (
            'source "$(dirname "$0")/lib.sh"\nLAUNCH "$LIBVAR"\n',
            SAME,
            {},
            {"lib.sh": "LIBVAR=x\nreturn\nLIBVAR=y\n"},
        ),
        (
            'source "$(dirname "$0")/lib.sh"\nf a\n',
            SAME,
            {},
            {"lib.sh": 'f() { LAUNCH "from-$1"; }\n'},
        ),
        ('source ./lib.sh\nLAUNCH "$LIBVAR"\n', "source", {}, {"lib.sh": "LIBVAR=fromlib\n"}),
    ],
}


def _cases() -> list[tuple[str, int, Case]]:
    every: dict[str, list[Case]] = {}
    for source in (FAMILIES, EXTRA_FAMILIES):
        for family, cases in source.items():
            every.setdefault(family, []).extend(cases)
    return [(family, i, case) for family, cases in every.items() for i, case in enumerate(cases)]


@needs_bash
@pytest.mark.parametrize(
    ("family", "number", "case"), _cases(), ids=[f"{f}-{i}" for f, i, _ in _cases()]
)
def test_a_construct_reads_as_bash_runs_it_or_is_refused(
    family: str, number: int, case: Case, tmp_path: Path
) -> None:
    script, expected, env, *files = case
    text = script.replace("LAUNCH", LAUNCH)
    sources = {name: body.replace("LAUNCH", LAUNCH) for name, body in (files or [{}])[0].items()}
    read = agrees_with_bash(text, tmp_path, env, files=sources)
    if expected == SAME:
        assert isinstance(read, LaunchRead), f"{family}: {read}"
    else:
        assert isinstance(read, LaunchReadError), f"{family}: read {read}, expected {expected}"
        assert read.construct == expected, read
        assert read.line is not None


# --------------------------------------------------------------------------- through a function

DATE = "date +%Y%m%d"
# The real `date` prints its output and one newline; the binding holds it without the newline.
DATE_PROGRAM = {"date": 'printf "20260101\\n"'}


@needs_bash
@pytest.mark.parametrize(
    ("script", "expected"),
    [
        ('now() { date +%Y%m%d; }\nTS=$(now)\nLAUNCH "ts=$TS"\n', SAME),
        ('now() { date +%Y%m%d 2>/dev/null; }\nTS=$(now)\nLAUNCH "ts=$TS"\n', SAME),
        ('now() { printf a; date +%Y%m%d; }\nLAUNCH "ts=$(now)"\n', SAME),
        ('now() { echo "$(date +%Y%m%d)"; }\nLAUNCH "ts=$(now)-x"\n', SAME),
        # The newlines `date` ends with are unknown where more output follows them, or where
        # a pipe keeps them.
        ('now() { date +%Y%m%d; echo x; }\nLAUNCH "ts=$(now)"\n', "run-time value"),
        ('now() { date +%Y%m%d | tr -d 0; }\nLAUNCH "ts=$(now)"\n', "run-time value"),
        ('now() { date +%Y%m%d; }\nLAUNCH "ts=$(now 2>&1)"\n', "run-time value"),
        # Another command is not the bound one.
        ('now() { date +%Y; }\nLAUNCH "ts=$(now)"\n', "run-time value"),
    ],
)
def test_a_substitution_through_the_scripts_function_answers_from_the_same_binding(
    script: str, expected: str, tmp_path: Path
) -> None:
    read = agrees_with_bash(
        script.replace("LAUNCH", LAUNCH),
        tmp_path,
        substitutions={DATE: "20260101"},
        programs=DATE_PROGRAM,
    )
    if expected == SAME:
        assert isinstance(read, LaunchRead), read
        assert "20260101" in read.argv[0]
    else:
        assert isinstance(read, LaunchReadError) and read.construct == expected, read


@needs_bash
def test_an_unbound_substitution_through_a_function_stays_a_run_time_value(
    tmp_path: Path,
) -> None:
    read = agrees_with_bash(
        f'now() {{ date +%Y%m%d; }}\nTS=$(now)\n{LAUNCH} "ts=$TS"\n',
        tmp_path,
        programs=DATE_PROGRAM,
    )
    assert isinstance(read, LaunchReadError)
    assert (read.construct, read.line) == ("run-time value", 3)
    assert "$(now) (line 2)" in read.detail
