"""Executors under bad input (issue 13, class 7): every input generated here.

* malformed executor names and addresses are one ``error:`` line and exit 2 before anything
  starts (in-process and through the CLI in a subprocess, for ``sweep`` and ``search``);
* pool workers of ``--executor local`` die with their parent (the parent is killed with
  SIGKILL in a subprocess; no worker may survive it);
* the ``dask-local`` cluster serves no dashboard nor any other HTTP route (one cluster).
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from simulator.errors import ScenarioError
from simulator.sweep import check_executor, open_executor

ROOT = Path(__file__).resolve().parents[1]
HAS_RAY = importlib.util.find_spec("ray") is not None
HAS_DASK = importlib.util.find_spec("distributed") is not None

MALFORMED = [
    "dask://HOST:notaport", "dask://", "dask://host", "dask://host:", "dask://:8786", "dask://host:0",
    "dask://host:65536", "dask://host:-1", "dask://host:99999999999999999999", "dask://[::1", "dask://[::1]",
    "dask://a b:1", "dask://user@host:1", "dask://host:1/path", "dask://host:1?x=1", "dask://host:1#f",
    "dask://host:1\n", "dask://\x1b]0;owned\x07:1", "ray://", "ray://host", "ray://host:port", "ray://h:0",
    "", " ", "LOCAL", "dask-locall", "dask", "dask:/host:1", "tcp://host:1", "ray:host:1", "serial ", "local\x00",
]
WELL_FORMED_DASK = ["dask://127.0.0.1:8786", "dask://[::1]:8786", "dask://scheduler.example:1", "dask://h:65535"]


def _dtsim(*args: object, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "simulator.cli", *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT)


@pytest.mark.parametrize("spec", MALFORMED)
def test_malformed_executors_are_bad_input(spec):
    with pytest.raises(ScenarioError) as caught:
        check_executor(spec)
    message = str(caught.value)
    assert message.startswith("--executor ") and "\n" not in message and "\x1b" not in message
    with pytest.raises(ScenarioError):  # refused on opening, before anything starts
        open_executor(spec, workers=1).__enter__()


@pytest.mark.skipif(not HAS_DASK, reason="needs dask.distributed")
@pytest.mark.parametrize("spec", WELL_FORMED_DASK)
def test_well_formed_dask_addresses_pass_the_check(spec):
    assert check_executor(spec) == spec  # contacts nothing


@pytest.mark.skipif(HAS_RAY, reason="checks the message given without ray")
@pytest.mark.parametrize("spec", ["ray", "ray://head:10001"])
def test_ray_without_ray_says_how_to_install_it(spec):
    with pytest.raises(ScenarioError, match=r"needs ray: pip install 'dtsim\[ray\]'"):
        check_executor(spec)


@pytest.mark.parametrize(("command", "spec"), [("sweep", "dask://HOST:notaport"), ("search", "ray://head")])
def test_the_commands_give_one_line_and_exit_2(tmp_path, command, spec):
    target = ROOT / ("scenarios/sweeps/quickstart-nodes.yaml" if command == "sweep" else "scenarios/quickstart.yaml")
    done = _dtsim(command, target, "--executor", spec, "--out", tmp_path / "out")
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: --executor "), done.stderr
    assert "Traceback" not in done.stderr + done.stdout and not (tmp_path / "out").exists()


@pytest.mark.parametrize(("command", "spec"), [("sweep", "dask://"), ("search", "dask://HOST:notaport"),
                                             ("sweep", "dask://h:1/x"), ("search", "local\x1b[2J")])
def test_the_commands_in_process(cli, tmp_path, command, spec):
    target = ROOT / ("scenarios/sweeps/quickstart-nodes.yaml" if command == "sweep" else "scenarios/quickstart.yaml")
    result = cli(command, target, "--executor", spec, "--out", tmp_path / "out")
    assert result.exit_code == 2
    assert result.output.startswith("error: --executor ") and result.output.count("\n") == 1
    assert "\x1b" not in result.output and not (tmp_path / "out").exists()


PARENT = textwrap.dedent("""\
    import json, multiprocessing, sys, time
    from simulator.sweep import open_executor

    with open_executor("local", workers=2, tasks=2) as pool:
        futures = [pool.submit(time.sleep, 300) for _ in range(2)]
        deadline = time.monotonic() + 30
        while not multiprocessing.active_children() and time.monotonic() < deadline:
            time.sleep(0.05)
        print(json.dumps([p.pid for p in multiprocessing.active_children()]), flush=True)
        time.sleep(300)
""")


def _state(pid: int) -> tuple[str, int] | None:
    """(state letter, parent pid) of a live process; None when it is gone or a zombie."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    fields = dict(line.split(":\t", 1) for line in status.splitlines() if ":\t" in line)
    state = fields["State"].strip()[0]
    return None if state in "ZX" else (state, int(fields["PPid"]))


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_pool_workers_exit_when_the_parent_is_killed(tmp_path):
    script = tmp_path / "parent.py"
    script.write_text(PARENT)
    parent = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True, cwd=ROOT,
                              env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        assert parent.stdout is not None
        workers = json.loads(parent.stdout.readline())
        assert workers, "the pool started no worker"
        for pid in workers:  # alive, and children of the parent
            state = _state(pid)
            assert state is not None and state[1] == parent.pid, (pid, state)
        parent.send_signal(signal.SIGKILL)  # no cleanup can run in the parent
        parent.wait(timeout=30)
        deadline = time.monotonic() + 15
        while any(_state(pid) for pid in workers) and time.monotonic() < deadline:
            time.sleep(0.1)
        survivors = [pid for pid in workers if _state(pid)]
        for pid in survivors:  # do not leak them into the rest of the run
            os.kill(pid, signal.SIGKILL)
        assert survivors == []
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()


def _status(port: int, path: str) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


@pytest.mark.skipif(not HAS_DASK, reason="needs dask.distributed")
def test_dask_local_serves_no_dashboard_nor_any_route():
    """With dashboard_address=None alone, Dask still serves /info, /metrics and /json on the
    scheduler's HTTP port (200); dtsim's cluster must answer 404 to every path, on the scheduler
    and on the workers, and listen on 127.0.0.1 only."""
    paths = ["/status", "/info/main/workers.html", "/metrics", "/json/counts.json", "/health", "/"]
    with open_executor("dask-local", workers=1) as executor:
        client = executor._client  # type: ignore[attr-defined]
        assert executor.submit(sum, [1, 2, 3]).result(timeout=60) == 6  # the cluster works
        scheduler = client.cluster.scheduler
        assert scheduler.address.startswith("tcp://127.0.0.1:")
        ports = {sock.getsockname()[1] for sock in scheduler.http_server._sockets.values()}
        hosts = {sock.getsockname()[0] for sock in scheduler.http_server._sockets.values()}
        assert ports and hosts == {"127.0.0.1"}
        worker_ports = client.run(lambda dask_worker: sorted(
            sock.getsockname()[1] for sock in dask_worker.http_server._sockets.values()))
        statuses = {(port, path): _status(port, path) for port in ports for path in paths}
        for ports_of_worker in worker_ports.values():
            statuses.update({(port, path): _status(port, path) for port in ports_of_worker
                             for path in ("/metrics", "/health", "/")})
    assert statuses and set(statuses.values()) == {404}, statuses
