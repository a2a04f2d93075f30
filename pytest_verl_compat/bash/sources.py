"""``source FILE`` and ``. FILE``: the file is read and run in this shell, as bash does.

Only files inside the read's :class:`SourceScope` are read: the script's own folder tree by
default (a manifest case: the folder its inputs are relative to, and each sourced file must be
one of its pinned inputs, by sha256). The file is found as bash finds it (a name without a
slash on PATH first, then in the working directory), resolved through links, and must be a
regular file of at most 1 MiB whose real path stays inside the scope; it is opened without
following a last link and checked again through the open descriptor, so a link swapped in
after the check cannot escape. Nested sourcing is bounded, and so is the text read in all.

In the file, ``$0`` stays the script's, ``BASH_SOURCE[0]`` is the name it was sourced by,
``return`` ends it, and ``source FILE ARGS`` gives it positional parameters, restored after
unless ``set`` changed them at the top level (bash's ``maybe_pop_dollar_vars``).
"""

from __future__ import annotations

import hashlib
import os
import stat

import pytest_verl_compat.bash.paths as paths
from pytest_verl_compat.bash.errors import MAX_SCRIPT_BYTES, ShellReturn
from pytest_verl_compat.bash.parse import parse_script, vet_script
from pytest_verl_compat.bash.traps import Traps

# Files sourced inside sourced files, and text read by `source` in all.
_MAX_SOURCE_DEPTH = 16
_MAX_SOURCED_BYTES = 16 << 20


class Sources(Traps):
    """The ``source`` and ``.`` builtins."""

    def source_builtin(self, words: list[str], line: int) -> int:
        """Read FILE (in the scope) and run it here; ``return`` in it ends it."""
        command = words[0]
        args = words[1:]
        if args[:1] == ["--"]:
            args = args[1:]
        if not args:
            return 2  # bash: filename argument required
        name = args[0]
        self.need(name, line, f"names the file `{command}` reads")
        if self.scope is None:
            self.fail(line, "source", "this read has no folder sourced files may come from")
        depth = sum(1 for called, _ in self.calls if called == "source")
        if depth >= _MAX_SOURCE_DEPTH:
            self.fail(line, "source", f"files sourced more than {_MAX_SOURCE_DEPTH} levels deep")
        label, data = self.sourced_file(name, line)
        tree = parse_script(label, data)
        positional, args_set = self.sh.positional, self.sh.args_set
        if len(args) > 1:
            self.sh.positional, self.sh.args_set = args[1:], False
        self.calls.append(("source", name))
        saved = self.enter_file(label, data, name)
        try:
            status = self.stmts(tree.get("Stmts") or [], exempt=False)
        except ShellReturn as done:
            status = done.status
        finally:
            self.enter_file(*saved)
            self.calls.pop()
            if len(args) > 1 and (self.in_function() or not self.sh.args_set):
                self.sh.positional = positional
            self.sh.args_set = self.sh.args_set or args_set
        return status

    def sourced_file(self, name: str, line: int) -> tuple[str, bytes]:
        """The real path and text of the file ``source NAME`` reads, checked."""
        assert self.scope is not None
        root = os.path.realpath(self.scope.root)
        candidate = self.find_sourced(name, line)
        real = os.path.realpath(candidate)
        if not _inside(real, root):
            self.fail(
                line,
                "source",
                f"{name!r} is {real}, outside the folder sourced files may come from ({root})",
            )
        data = self.read_confined(real, root, line)
        relative = os.path.relpath(real, root)
        digest = hashlib.sha256(data).hexdigest()
        pins = self.scope.pins
        if pins is not None and pins.get(relative) != digest:
            pinned = pins.get(relative)
            self.fail(
                line,
                "source",
                f"{relative} is not a pinned input of this case; pin it (inputs: path "
                f"{relative}, sha256 {digest})"
                if pinned is None
                else f"{relative}: pinned sha256 {pinned}, found {digest}",
            )
        self.sourced_bytes += len(data)
        if self.sourced_bytes > _MAX_SOURCED_BYTES:
            self.fail(line, "source", f"more than {_MAX_SOURCED_BYTES} bytes of sourced files")
        self.sourced[relative] = digest
        vet_script(real, data)
        return real, data

    def find_sourced(self, name: str, line: int) -> str:
        """Where bash finds ``name``: a name without a slash on PATH first (``sourcepath``),
        else relative to the working directory."""
        if "/" not in name:
            for folder in (self.lookup("PATH", None, line) or "").split(":"):
                if not folder or self.lazy_ids(folder):
                    # An unbound PATH is taken to hold no file of this name: recipes source
                    # files beside them, never commands.
                    continue
                found = os.path.join(folder, name)
                if os.path.isfile(found):
                    self.fail(
                        line,
                        "source",
                        f"{name!r} is found on PATH at {found}, which bash reads first",
                    )
        if name.startswith("/"):
            return paths.logical(name)
        folder = self.working_directory(line)
        self.need(folder, line, f"is the folder `source {name}` reads from")
        return paths.joined(folder, name)

    def read_confined(self, real: str, root: str, line: int) -> bytes:
        """The bytes of a regular file at ``real`` whose open descriptor is still inside root."""
        try:
            fd = os.open(
                real, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC | os.O_NOFOLLOW
            )
        except OSError as exc:
            self.fail(line, "source", f"{real}: {exc.strerror or exc}")
        try:
            mode = os.fstat(fd).st_mode
            if not stat.S_ISREG(mode):
                self.fail(line, "source", f"{real} is not a regular file")
            opened = f"/proc/self/fd/{fd}"
            if os.path.exists(opened) and not _inside(os.path.realpath(opened), root):
                self.fail(line, "source", f"{real} left the folder while it was opened")
            chunks: list[bytes] = []
            size = 0
            while size <= MAX_SCRIPT_BYTES:
                chunk = os.read(fd, MAX_SCRIPT_BYTES + 1 - size)
                if not chunk:
                    break
                chunks.append(chunk)
                size += len(chunk)
        finally:
            os.close(fd)
        if size > MAX_SCRIPT_BYTES:
            self.fail(line, "source", f"{real} is larger than {MAX_SCRIPT_BYTES} bytes")
        return b"".join(chunks)


def _inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")
