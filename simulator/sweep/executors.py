"""Where sweep points run: any :class:`concurrent.futures.Executor`, opened by name.

* ``local`` (default): a :class:`~concurrent.futures.ProcessPoolExecutor` on this machine.
* ``serial``: every point in this process, one after another (debugging, tiny sweeps).
* ``dask-local``: a ``dask.distributed`` LocalCluster of worker processes (one thread each)
  on 127.0.0.1 and its ``Client.get_executor()``. Its dashboard is off and its HTTP servers
  serve no route: Dask binds the scheduler's HTTP port (8787) even with
  ``dashboard_address=None`` and serves its info pages, metrics and JSON there, so the
  scheduler's and workers' ``http.routes`` are emptied while the cluster starts (every path
  answers 404).
* ``dask://HOST:PORT``: a running Dask scheduler (``dask scheduler`` + ``dask worker``
  on many machines); the workers need ``dtsim`` installed and the same data files.
* ``ray`` / ``ray://HOST:PORT``: Ray tasks, through :class:`RayExecutor`.

**Trust.** A remote Dask or Ray cluster runs code inside dtsim's trust domain: the parent
sends it pickled functions to run and unpickles what its workers send back, so a worker can
run any code in the dtsim process. Point dtsim only at a cluster whose workers you trust as
you trust this machine.

:func:`check_executor` validates a name before anything starts (a malformed ``HOST:PORT``, a
missing package: :class:`~simulator.errors.ScenarioError` with the command that installs it);
Dask and Ray are imported only here and only when asked for (``import simulator`` stays
light).

Workers are bounded (:func:`bound_workers`): never more than the CPUs this process may use,
nor than the points there are to run. Pool workers of ``local`` exit when the parent dies
(:func:`_watch_parent`), so a killed ``dtsim`` leaves no process behind.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Executor, Future, ProcessPoolExecutor
from contextlib import contextmanager
from typing import Any

from simulator.errors import ScenarioError

__all__ = ["open_executor", "check_executor", "bound_workers", "InlineExecutor", "RayExecutor", "EXECUTOR_HELP"]

EXECUTOR_HELP = "local | serial | dask-local | dask://HOST:PORT | ray | ray://HOST:PORT"

SCHEDULER_TIMEOUT_S = 10.0  # how long to wait for a remote Dask scheduler before giving up
PARENT_POLL_S = 0.5  # how often a pool worker checks that its parent is alive
_PR_SET_PDEATHSIG = 1  # linux/prctl.h


def default_workers() -> int:
    """Worker processes when none are asked for: the CPUs this process may use."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)


def bound_workers(requested: int | None, tasks: int | None = None) -> tuple[int, str | None]:
    """Worker processes to start and, when a request was cut, the note saying why.

    ``requested`` (None: as many as the CPUs here) is capped at the CPUs this process may use
    (:func:`default_workers`) and at ``tasks``, the points there are to run (at least 1):
    ``bound_workers(64, 5)`` on 16 CPUs gives ``(5, "--workers 64 capped at 5: 5 points to
    run")``. Extra processes would only sit idle and take memory.
    """
    if requested is not None and requested < 1:
        raise ScenarioError(f"--workers {requested}: need at least 1")
    cpus = default_workers()
    n = requested or cpus
    reasons = []
    if n > cpus:
        n = cpus
        reasons.append(f"{cpus} CPU{'s' if cpus != 1 else ''} here")
    if tasks is not None and n > max(1, tasks):
        n = max(1, tasks)
        reasons.append(f"{tasks} point{'s' if tasks != 1 else ''} to run")
    if requested is None or not reasons:
        return n, None
    return n, f"--workers {requested} capped at {n}: {', '.join(reasons)}"


def check_executor(spec: str) -> str:
    """``spec`` if it names an executor this machine can open, else a one-line
    :class:`~simulator.errors.ScenarioError`: an unknown name, a ``dask://`` or ``ray://``
    address that is not ``HOST:PORT`` (PORT 1 to 65535), a package that is not installed.
    Contacts nothing and imports neither Dask nor Ray."""
    if spec in ("local", "serial"):
        return spec
    # scheme: (the local name, the package it imports, the extra that installs it)
    for scheme, (local, package, extra) in {"dask": ("dask-local", "distributed", "dist (dask.distributed)"),
                                            "ray": ("ray", "ray", "ray")}.items():
        if spec == local or spec.startswith(f"{scheme}://"):
            if spec != local:
                _host_port(spec, scheme)
            if importlib.util.find_spec(package) is None:
                raise _missing(spec, extra)
            return spec
    raise ScenarioError(f"--executor {spec!r}: expected {EXECUTOR_HELP}")


def _host_port(spec: str, scheme: str) -> tuple[str, int]:
    """The host and port of ``scheme://HOST:PORT`` (an IPv6 host in brackets)."""
    from urllib.parse import urlsplit

    rest = spec[len(scheme) + 3:]
    bad = ScenarioError(f"--executor {spec!r}: expected {scheme}://HOST:PORT, PORT a number from 1 to 65535")
    if not rest or any(c in rest for c in "/?#@ \t") or not rest.isprintable():
        raise bad
    try:
        parts = urlsplit("//" + rest)
        host, port = parts.hostname, parts.port
    except ValueError:
        raise bad from None
    if not host or port is None or not 1 <= port <= 65535:
        raise bad
    return host, port


def _watch_parent(parent_pid: int) -> None:
    """Pool-worker initializer: end this worker when the process that started it dies.

    On Linux the kernel sends SIGKILL when the parent exits (``prctl(PR_SET_PDEATHSIG)``,
    through ctypes); everywhere a daemon thread checks ``os.getppid()`` every
    ``PARENT_POLL_S`` seconds and exits once the worker has been handed to another parent.
    A parent that died before this ran is caught by the first check.
    """
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            import ctypes

            ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
    if os.getppid() != parent_pid:
        os._exit(1)
    threading.Thread(target=_poll_parent, args=(parent_pid,), name="dtsim-parent-watch", daemon=True).start()


def _poll_parent(parent_pid: int) -> None:
    while os.getppid() == parent_pid:
        time.sleep(PARENT_POLL_S)
    os._exit(1)


class InlineExecutor(Executor):
    """Runs each submitted call at once in the calling thread; its future is already done."""

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        future: Future[Any] = Future()
        try:
            future.set_result(fn(*args, **kwargs))
        except Exception as exc:  # the caller reads it from the future, as with a pool
            future.set_exception(exc)
        return future


class RayExecutor(Executor):
    """A ``concurrent.futures`` face on Ray tasks: ``submit`` runs ``fn`` as a remote task
    (one CPU) and returns the task's ``ObjectRef.future()``. Ray must be initialised."""

    def __init__(self) -> None:
        import ray

        self._ray = ray
        self._remote: dict[Callable[..., Any], Any] = {}
        self._refs: list[Any] = []

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        remote = self._remote.get(fn)
        if remote is None:
            remote = self._remote[fn] = self._ray.remote(num_cpus=1)(fn)
        ref = remote.remote(*args, **kwargs)
        self._refs.append(ref)
        future: Future[Any] = ref.future()
        return future

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        if cancel_futures:
            for ref in self._refs:
                with contextlib.suppress(Exception):  # already finished or gone
                    self._ray.cancel(ref)
        elif wait and self._refs:
            self._ray.wait(self._refs, num_returns=len(self._refs))
        self._refs = []


def _missing(what: str, extra: str) -> ScenarioError:
    return ScenarioError(f"--executor {what} needs {extra}: pip install 'dtsim[{extra.split()[0]}]'")


@contextmanager
def open_executor(spec: str = "local", workers: int | None = None, *, tasks: int | None = None) -> Iterator[Executor]:
    """Open the executor named by ``spec`` (see the module docstring) and close it on exit.

    ``workers``: processes for ``local`` and ``dask-local``, CPUs for a local ``ray``
    (default: the CPUs available here), bounded by :func:`bound_workers` with ``tasks`` (the
    points to run, when known); ignored for remote schedulers.
    """
    check_executor(spec)
    n, _ = bound_workers(workers, tasks)
    if spec == "local":
        with ProcessPoolExecutor(max_workers=n, initializer=_watch_parent, initargs=(os.getpid(),)) as pool:
            yield pool
    elif spec == "serial":
        yield InlineExecutor()
    elif spec == "dask-local" or spec.startswith("dask://"):
        with _dask(spec, n) as executor:
            yield executor
    elif spec == "ray" or spec.startswith("ray://"):
        with _ray(spec, n) as executor:
            yield executor
    else:
        raise ScenarioError(f"--executor {spec!r}: expected {EXECUTOR_HELP}")


@contextmanager
def _dask(spec: str, workers: int) -> Iterator[Executor]:
    try:
        import dask
        from dask.distributed import Client, LocalCluster
    except ImportError:
        raise _missing(spec, "dist (dask.distributed)") from None
    if spec == "dask-local":
        no_routes: dict[str, list[str]] = {"distributed.scheduler.http.routes": [], "distributed.worker.http.routes": []}
        with dask.config.set(no_routes):  # the workers get the config at their start
            cluster = LocalCluster(n_workers=workers, threads_per_worker=1, processes=True, host="127.0.0.1",
                                   dashboard_address=None, worker_dashboard_address=None)
        client = Client(cluster)
    else:
        address = "tcp://" + spec[len("dask://"):]
        try:
            client = Client(address, timeout=SCHEDULER_TIMEOUT_S)
        except (OSError, ValueError) as exc:
            raise ScenarioError(f"--executor {spec}: cannot reach the Dask scheduler at {address} ({exc})") from None
        cluster = None
    try:
        yield client.get_executor(pure=False)
    finally:
        client.close()
        if cluster is not None:
            cluster.close()


@contextmanager
def _ray(spec: str, workers: int) -> Iterator[Executor]:
    try:
        import ray
    except ImportError:
        raise _missing(spec, "ray") from None
    started = False
    if not ray.is_initialized():
        if spec == "ray":
            ray.init(num_cpus=workers, include_dashboard=False, log_to_driver=False)
        else:
            ray.init(address=spec, log_to_driver=False)
        started = True
    executor = RayExecutor()
    try:
        yield executor
    finally:
        executor.shutdown(wait=False, cancel_futures=True)
        if started:
            ray.shutdown()
