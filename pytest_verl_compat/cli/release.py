"""``verl-compat release``: the releases the checker knows, their environments, and adding one.

``release list`` says which releases are known and supported, which environments are built, and
which verl is installed here; ``release env VERSION`` builds a release's environment (``--clean``
removes it); ``release lock VERSION`` pins its environment's wheels for this platform;
``release derive VERSION`` derives what can be derived from a release's own files (its
``docs/releases.md`` checklist, step by step) and lists what needs a person. ``--check`` derives
without writing and exits 1 when a derived file is stale.
"""

from __future__ import annotations

import argparse
import shutil
from collections.abc import Callable
from typing import Any

from pytest_verl_compat.cli.common import EXIT_FINDINGS, EXIT_OK, EXIT_USAGE, say
from pytest_verl_compat.cli.output import note
from pytest_verl_compat.pipeline.snapshot import write_atomic
from pytest_verl_compat.releases.index import TRYING, Release, ReleaseError, load_release_index


def cmd_list(args: argparse.Namespace) -> int:
    from pytest_verl_compat.releases.choice import installed_version
    from pytest_verl_compat.releases.environment import built, load_lock

    index = load_release_index()
    installed = installed_version()
    print(f"installed verl: {installed or 'none'}")
    for release in index.releases:
        state = "supported" if release.supported else "known (composition only)"
        environment = ""
        if release.supported:
            try:
                found = built(load_lock(release))
                environment = f"; environment {'built' if found else 'not built'}"
            except ReleaseError as exc:
                environment = f"; {exc}"
        print(f"{release.version}: {state}{environment}")
    return EXIT_OK


def cmd_env(args: argparse.Namespace) -> int:
    from pytest_verl_compat.releases.environment import (
        built,
        environment_folder,
        load_lock,
        release_environment,
    )
    from pytest_verl_compat.upstream.oracle.runner import say_progress

    release = _release(args.version)
    lock = load_lock(release)
    if args.clean:
        folder = environment_folder(lock)
        if built(lock) is None and not folder.exists():
            say("release", f"verl {release.version}'s environment is not built")
            return EXIT_OK
        shutil.rmtree(folder)
        say("release", f"removed {folder}")
        return EXIT_OK
    environment = release_environment(release, say_progress)
    print(environment.python)
    return EXIT_OK


def cmd_lock(args: argparse.Namespace) -> int:
    from pytest_verl_compat.releases.lock import derive_lock, lock_destination

    index = load_release_index()
    release = index.release(args.version)
    text = derive_lock(release, index)
    target = lock_destination(release, package=args.package)
    write_atomic(target, text)
    pinned = sum(not line.startswith("#") for line in text.splitlines())
    note("release", f"wrote {target} ({pinned} pinned wheels)")
    return EXIT_OK


def _release(version: str) -> Release:
    index = load_release_index()
    return index.supported_release(version)


# --- derive ------------------------------------------------------------------------------------


def cmd_derive(args: argparse.Namespace) -> int:
    import os

    from pytest_verl_compat.cli.release_steps import STEPS, Derivation, DeriveContext

    unknown = sorted(set(args.only or ()) - STEPS.keys())
    if unknown:
        raise ReleaseError(f"no derive step {', '.join(unknown)}; the steps: {', '.join(STEPS)}")
    index = load_release_index()
    release = index.release(args.version)
    os.environ[TRYING] = release.version
    derivation = Derivation(release.version, write=not args.check)
    failed: list[str] = []
    context = DeriveContext(release, args.upstream, args.only, args.run_command)
    for name, step in STEPS.items():
        if args.only and name not in args.only:
            continue
        say("release", f"derive {release.version}: {name}")
        try:
            step(derivation, context)
        except (ReleaseError, RuntimeError) as exc:
            # One line (a process that gave no answer: its last words); the other steps still
            # run, each saying what it cannot do without this one.
            last = (str(exc).strip().splitlines() or [repr(exc)])[-1]
            failed.append(f"{name}: {last}")
            say("release", f"derive {release.version}: {name} failed: {last}")
    for path in derivation.written:
        note("release", f"wrote {path}")
    for path in derivation.stale:
        say("release", f"stale: {path}")
    if derivation.person:
        print(f"verl {release.version}: {len(derivation.person)} things need a person:")
        for item in derivation.person:
            print(f"  - {item}")
    elif not release.supported and not failed:
        print(f"verl {release.version}: nothing left to review; mark it supported in releases.yaml")
    if failed:
        print(f"verl {release.version}: {len(failed)} steps failed:")
        for item in failed:
            print(f"  - {item}")
        return EXIT_USAGE
    return EXIT_FINDINGS if derivation.stale else EXIT_OK


def add_release_command(
    sub: Any, common: argparse.ArgumentParser, run_command: Callable[[list[str]], int]
) -> None:
    """``run_command``: the command line's own entry (``cli.main``), which ``derive`` runs for
    its census and audit steps as a user would."""
    release = sub.add_parser(
        "release", help="the releases checked: list, build an environment, pin it, add a release"
    )
    actions = release.add_subparsers(dest="action", required=True)
    listed = actions.add_parser("list", help="known and supported releases, built environments")
    listed.set_defaults(func=cmd_list)
    env = actions.add_parser("env", help="build a release's environment (once), print its python")
    env.add_argument("version", metavar="VERSION")
    env.add_argument("--clean", action="store_true", help="remove the environment instead")
    env.set_defaults(func=cmd_env)
    lock = actions.add_parser("lock", help="pin a release's environment for this platform")
    lock.add_argument("version", metavar="VERSION")
    lock.add_argument(
        "--package",
        action="store_true",
        help="write it into the package's data (a checkout's), not the user cache",
    )
    lock.set_defaults(func=cmd_lock)
    derive = actions.add_parser(
        "derive",
        parents=[common],
        help="derive a release's facts from its own files; list what needs a person",
    )
    derive.add_argument("version", metavar="VERSION")
    derive.add_argument(
        "--check",
        action="store_true",
        help="write nothing; exit 1 when a derived file differs from what is derived now",
    )
    derive.add_argument(
        "--only",
        action="append",
        metavar="STEP",
        help="run only this step (repeatable)",
    )
    derive.set_defaults(func=cmd_derive, run_command=run_command)
