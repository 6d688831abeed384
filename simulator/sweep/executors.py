"""Where sweep points run: any :class:`concurrent.futures.Executor`, opened by name.

* ``local`` (default): a :class:`~concurrent.futures.ProcessPoolExecutor` on this machine.
* ``serial``: every point in this process, one after another (debugging, tiny sweeps).
* ``dask-local``: a ``dask.distributed`` LocalCluster of worker processes (one thread each)
  and its ``Client.get_executor()``; the dashboard is off.
* ``dask://HOST:PORT``: a running Dask scheduler (``dask scheduler`` + ``dask worker``
  on many machines); the workers need ``dtsim`` installed and the same data files.
* ``ray`` / ``ray://HOST:PORT``: Ray tasks, through :class:`RayExecutor`.

Dask and Ray are imported only here and only when asked for (``import simulator`` stays
light); a missing package raises :class:`~simulator.errors.ScenarioError` with the
command that installs it.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from concurrent.futures import Executor, Future, ProcessPoolExecutor
from contextlib import contextmanager
from typing import Any

from simulator.errors import ScenarioError

__all__ = ["open_executor", "InlineExecutor", "RayExecutor", "EXECUTOR_HELP"]

EXECUTOR_HELP = "local | serial | dask-local | dask://HOST:PORT | ray | ray://HOST:PORT"


def default_workers() -> int:
    """Worker processes when none are asked for: the CPUs this process may use."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)


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
def open_executor(spec: str = "local", workers: int | None = None) -> Iterator[Executor]:
    """Open the executor named by ``spec`` (see the module docstring) and close it on exit.

    ``workers``: processes for ``local`` and ``dask-local``, CPUs for a local ``ray``
    (default: the CPUs available here); ignored for remote schedulers.
    """
    if workers is not None and workers < 1:
        raise ScenarioError(f"--workers {workers}: need at least 1")
    n = workers or default_workers()
    if spec == "local":
        with ProcessPoolExecutor(max_workers=n) as pool:
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
        from dask.distributed import Client, LocalCluster
    except ImportError:
        raise _missing(spec, "dist (dask.distributed)") from None
    if spec == "dask-local":
        cluster = LocalCluster(n_workers=workers, threads_per_worker=1, processes=True, dashboard_address=None)
        client = Client(cluster)
    else:
        address = "tcp://" + spec[len("dask://"):]
        try:
            client = Client(address, timeout=30)
        except OSError as exc:
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
