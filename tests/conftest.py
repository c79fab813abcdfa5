"""Fixtures several test modules share."""

from __future__ import annotations

import importlib
import importlib.util
import pkgutil
import time
from collections.abc import Iterator

import pytest
from repo_paths import CPU_LEDGER

from specledger import plugin
from specledger.ledger import load_ledger
from specledger.measure.http import endpoints, servers


class ServerURLs(dict[str, str]):
    """Arm name -> server root; `.started` holds the servers themselves (a test may kill one)."""

    started: dict[str, servers.VLLMServer]


@pytest.fixture(scope="module")
def cpu_servers(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
                ) -> Iterator[ServerURLs]:
    """The CPU ledger's arms as two live servers for the requesting module; gone before other engine tests
    measure (module scope: idle servers would take CPU from them)."""
    if importlib.util.find_spec("vllm") is None:
        pytest.skip("vLLM is not installed")
    from specledger.models import resolve_model

    def say(line: str) -> None:
        plugin.say(request.config, f"[servers {time.strftime('%H:%M:%S')}] {line}")

    ledger = load_ledger(CPU_LEDGER)
    logs = tmp_path_factory.mktemp("servers")
    t0 = time.monotonic()
    started = endpoints.start_servers(ledger.data, resolve_model(ledger.data["target"]["model"]), log_dir=logs,
                                      progress=say)
    say(f"servers up in {time.monotonic() - t0:.0f} s (logs in {logs})")
    try:
        urls = ServerURLs({name: server.base_url for name, server in started.items()})
        urls.started = started
        yield urls
    finally:
        for server in started.values():
            server.stop()
        left = [name for name, server in started.items() if servers.group_alive(server.process.pid)]
        assert not left, f"server process groups left running: {left}"


@pytest.fixture
def inner_pytest(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> pytest.Pytester:
    """`pytester` for inner pytest runs in this process, with every module such a run imports loaded first, run
    as a session of its own also inside a pytest-xdist worker (pytest-benchmark and specledger.gpu_assignment read
    PYTEST_XDIST_WORKER from the environment: under `-n`, benchmarks were disabled and a benchmark test failed).

    Why: after an inner run, pytester drops from `sys.modules` every module that run imported first. The next
    import makes a second copy: NumPy warns that it was reloaded, and a class of a specledger module imported
    again is no longer the class that other modules hold (`isinstance` and `pytest.raises` then miss)."""
    import specledger

    for module in pkgutil.walk_packages(specledger.__path__, "specledger."):
        importlib.import_module(module.name)
    for name in ("numpy", "pandas", "scipy.stats", "matplotlib", "jsonschema", "hypothesis"):
        importlib.import_module(name)
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    monkeypatch.delenv("PYTEST_XDIST_WORKER_COUNT", raising=False)
    return pytester
