"""Shell functions the script defines: the body runs at each call, as bash runs it.

A call gets its own positional parameters, ``local`` (and ``declare`` without ``-g``) variables
restored when it returns, ``return``, ``FUNCNAME``; prefix assignments (``X=1 f``) last for the
call. The body meets the same refusals as the script anywhere else. A function named like the
launcher, a wrapper, a shell, a builtin or a program this reader models is refused where it is
defined: every call of that name would silently mean something else.
"""

from __future__ import annotations

from pytest_verl_compat.bash.builtins import (
    ARGUMENT_BUILTINS,
    BASH_BUILTINS,
    RUNNERS,
    SHELLS,
    Builtins,
)
from pytest_verl_compat.bash.errors import ShellReturn
from pytest_verl_compat.bash.parse import Node
from pytest_verl_compat.bash.programs import COREUTILS
from pytest_verl_compat.bash.state import ShellFunction, Value, is_python
from pytest_verl_compat.bash.words import legal_integer
from pytest_verl_compat.bash.wrappers import WRAPPER_PROGRAMS

# bash itself recurses until it runs out of stack; a launch script that calls a function this
# deep is not one to read.
_MAX_CALL_DEPTH = 40
_RESERVED = (
    BASH_BUILTINS
    | ARGUMENT_BUILTINS
    | RUNNERS
    | SHELLS
    | WRAPPER_PROGRAMS
    | COREUTILS.keys()
    | {"builtin", "command"}
)


class Functions(Builtins):
    """Defining and calling shell functions."""

    def define_function(self, cmd: Node, line: int) -> int:
        """``name() { ...; }`` and ``function name { ...; }``: remembered until called."""
        name = (cmd.get("Name") or {}).get("Value", "")
        if is_python(name):
            self.fail(line, "function definition", f"`{name}` would replace Python, the launcher")
        if name in _RESERVED:
            self.fail(
                line,
                "function definition",
                f"`{name}` would replace a command this reader reads by its meaning",
            )
        self.sh.functions[name] = ShellFunction(cmd["Body"], self.path, self.data, self.source_name)
        return 0

    def call_function(
        self, argv: list[str], temporary: dict[str, str], exempt: bool, line: int
    ) -> int:
        """Run a function's body with ``argv[1:]`` as its positional parameters."""
        name = argv[0]
        if len(self.calls) >= _MAX_CALL_DEPTH:
            self.fail(
                line,
                "function recursion",
                f"`{name}` is called more than {_MAX_CALL_DEPTH} levels deep",
            )
        function = self.sh.functions[name]
        shell = self.sh
        saved_positional, saved_depth = shell.positional, self.loop_depth
        frame: dict[str, tuple[Value | None, bool, bool]] = {}
        self.calls.append((name, function.source))
        self.frames.append(frame)
        saved_file = self.enter_file(function.path, function.data, function.source)
        try:
            for variable, value in temporary.items():
                # bash exports a prefix assignment to the commands the function runs.
                self.make_local(variable, line)
                self.set_scalar(variable, value, line)
                shell.exported.add(variable)
            shell.positional = argv[1:]
            self.loop_depth = 0
            try:
                return self.stmt(function.body, exempt)
            except ShellReturn as done:
                return done.status
        finally:
            self.enter_file(*saved_file)
            self.calls.pop()
            self.frames.pop()
            shell.positional, self.loop_depth = saved_positional, saved_depth
            for variable, (saved, exported, readonly) in reversed(frame.items()):
                if saved is None:
                    shell.vars.pop(variable, None)
                else:
                    shell.vars[variable] = saved
                (shell.exported.add if exported else shell.exported.discard)(variable)
                (shell.readonly.add if readonly else shell.readonly.discard)(variable)

    def make_local(self, name: str, line: int) -> None:
        """Make ``name`` local to the running function: its value comes back at the return."""
        if not self.frames:
            self.fail(line, "local", "`local` outside a function")
        frame = self.frames[-1]
        if name in frame:
            return
        self.check_assignable(name, line)
        value = self.sh.vars.get(name)
        frame[name] = (
            value if isinstance(value, str) or value is None else value.copy(),
            name in self.sh.exported,
            name in self.sh.readonly,
        )
        self.sh.vars.pop(name, None)

    def return_builtin(self, words: list[str], line: int) -> int:
        """``return [N]`` from the running function or sourced file."""
        if not self.calls:
            self.fail(line, "return", "`return` outside a function or sourced file")
        if len(words) > 2:
            self.fail(line, "return", "too many arguments")
        if len(words) == 1:
            raise ShellReturn(self.sh.status)
        value = legal_integer(words[1])
        if value is None:
            self.fail(line, "return", f"numeric argument required, got {words[1]!r}")
        raise ShellReturn(value & 255)
