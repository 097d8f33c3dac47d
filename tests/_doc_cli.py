"""The ``snapshotkit`` command of the doc blocks: each run a fresh fork of one interpreter that imported the CLI once.

Run as written, every ``snapshotkit`` line of a page starts an interpreter that imports torch (2-4 s
on a loaded 2-core CI machine; docs/cli.md alone has over 40 of them). The shell blocks still run
as written, through bash: only the ``snapshotkit`` they find first on ``PATH`` is :data:`SHIM`, a
small script (no torch) that hands its arguments, working directory, environment and standard
streams (the file descriptors themselves) to a server started by :func:`start`. The server has
imported ``snapshotkit.cli`` and nothing else of ours, and never runs a command itself: for each
command it forks a copy of itself that takes over the streams, the directory, the environment and
``sys.argv``, and then does what the installed entry point does, ``sys.exit(main())`` and a normal
interpreter exit; the shim exits with that copy's exit status (128 + N for a signal, as a shell
shows it).

What a command would see differently in a fresh interpreter is what was read while importing: a
command whose environment differs from the server's in anything but :data:`_READ_PER_COMMAND`
runs the real entry point instead, as does every command when no server is reachable.

The module imports only the standard library: the shim imports it too, and stays cheap.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import socket
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

#: The environment variable that names the server's (abstract, Linux) socket for the shim.
SERVER_VARIABLE = "SNAPSHOTKIT_DOC_TEST_CLI_SERVER"

#: Variables read when a command runs, not at import (as snapshotkit reads its ``SNAPSHOTKIT_*``
#: config, per operation; rich reads the terminal's size and colour settings per console), and those
#: bash itself sets in every script: a difference in these (or ``SNAPSHOTKIT_*``) still runs in a fork.
_READ_PER_COMMAND = ("PWD", "OLDPWD", "SHLVL", "_", "COLUMNS", "LINES", "NO_COLOR", "FORCE_COLOR", "TERM")

_LENGTH = struct.Struct("!I")
_STATUS = struct.Struct("!i")
_FALLBACK = b"F"  # the server's answer for a command it would not run faithfully
_RAN = b"R"  # followed by the exit status

# sh, not a ``#!python`` line, which a long path to the interpreter would break; the script's own
# path goes first, as the command's ``sys.argv[0]``.
SHIM = """\
#!/bin/sh
exec {python} -S -c 'import json, sys; sys.path.insert(0, sys.argv[1]); import _doc_cli; \\
_doc_cli.shim(json.loads(sys.argv[2]), sys.argv[3:])' {tests} {real} "$0" "$@"
"""


def write_shim(path: Path, real: list[str]) -> None:
    """Write the ``snapshotkit`` shim to ``path``; ``real`` is the command it stands in for (without arguments)."""
    tests = str(Path(__file__).parent)
    path.write_text(
        SHIM.format(python=shlex.quote(sys.executable), tests=shlex.quote(tests), real=shlex.quote(json.dumps(real)))
    )
    path.chmod(0o755)


def start(env: dict[str, str]) -> tuple[subprocess.Popen[bytes], str]:
    """Start a server with environment ``env`` (and :data:`SERVER_VARIABLE`, which the caller then sets for its
    commands: the environment they are compared with); returns it and that variable's value.

    Nothing is started where abstract Unix sockets do not exist (not Linux): the shim then runs the
    real command every time. The caller terminates the server when its blocks are done.
    """
    if not sys.platform.startswith("linux"):
        raise OSError("abstract Unix sockets are Linux only")
    name = f"snapshotkit-doc-cli-{os.getpid()}-{os.urandom(6).hex()}"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        listener.bind("\0" + name)  # bound before the server starts: a shim may connect at once
        listener.listen(16)
        # Through bash, which exports to the server what it exports to the blocks' commands (not PS1, say).
        server = subprocess.Popen(
            ["bash", "-c", 'exec "$@"', "bash", sys.executable, __file__, str(listener.fileno()), str(os.getpid())],
            pass_fds=(listener.fileno(),),
            env={**env, SERVER_VARIABLE: name},
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,  # not a terminal: its commands buffer stdout as a pipe's reader would see
        )
    finally:
        listener.close()
    return server, name


# ---------------------------------------------------------------- the shim


def shim(real: list[str], argv: list[str]) -> None:
    """Run ``snapshotkit`` with ``argv`` (its path first) in a fork of the server, or ``real`` when there is none."""
    name = os.environ.get(SERVER_VARIABLE)
    if name:
        connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            connection.connect("\0" + name)
        except OSError:
            connection.close()
        else:
            request = json.dumps({"argv": argv, "cwd": os.getcwd(), "env": dict(os.environ)}).encode()
            socket.send_fds(connection, [_LENGTH.pack(len(request))], [0, 1, 2])
            connection.sendall(request)
            answer = _receive_exactly(connection, 1)
            if answer == _RAN:
                (status,) = _STATUS.unpack(_receive_exactly(connection, _STATUS.size))
                sys.exit(status if status >= 0 else 128 - status)
            if answer != _FALLBACK:
                sys.stderr.write(f"{argv[0]}: the doc-test CLI server ended without an exit status\n")
                sys.exit(1)
    os.execv(real[0], [*real, *argv[1:]])


def _receive_exactly(connection: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = connection.recv(size - len(data))
        if not chunk:
            break
        data += chunk
    return data


# ---------------------------------------------------------------- the server


def runs_in_a_fork(env: dict[str, str], startup_env: dict[str, str]) -> bool:
    """Whether a command with environment ``env`` runs in a fork of a server started with ``startup_env``."""
    changed = {name for name in env.keys() | startup_env.keys() if env.get(name) != startup_env.get(name)}
    return all(name in _READ_PER_COMMAND or name.startswith("SNAPSHOTKIT_") for name in changed)


def _serve(listener: socket.socket, parent: int) -> socket.socket:
    """Accept commands until the parent goes; returns only in a forked child, with its connection."""
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the children reap themselves
    listener.settimeout(1.0)
    while True:
        try:
            connection, _ = listener.accept()
        except TimeoutError:
            if os.getppid() != parent:
                sys.exit(0)
            continue
        connection.settimeout(None)
        if os.fork() == 0:
            listener.close()
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            return connection
        connection.close()


def _run_one(connection: socket.socket, startup_env: dict[str, str]) -> None:
    """In the server's child: fork the command, and report its exit status; returns only in the command's process."""
    header, fds, _, _ = socket.recv_fds(connection, _LENGTH.size, 3)
    (length,) = _LENGTH.unpack(header)
    request: dict[str, Any] = json.loads(_receive_exactly(connection, length))
    env: dict[str, str] = request["env"]
    if not runs_in_a_fork(env, startup_env):
        for fd in fds:
            os.close(fd)
        connection.sendall(_FALLBACK)
        os._exit(0)
    pid = os.fork()
    if pid == 0:
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
        for fd in fds:
            if fd > 2:
                os.close(fd)
        connection.close()
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(env)
        sys.argv = list(request["argv"])
        return
    for fd in fds:
        os.close(fd)
    _, status = os.waitpid(pid, 0)
    connection.sendall(_RAN + _STATUS.pack(os.waitstatus_to_exitcode(status)))
    os._exit(0)


if __name__ == "__main__":
    # The import path of the installed console script, whose directory (not this one) comes first.
    sys.path[0] = str(Path(sys.executable).parent)
    _startup_env = dict(os.environ)
    _listener = socket.socket(fileno=int(sys.argv[1]))
    from snapshotkit.cli import main

    _run_one(_serve(_listener, int(sys.argv[2])), _startup_env)
    del _listener, _startup_env
    sys.exit(main())  # as the console script does
