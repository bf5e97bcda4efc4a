"""Running a model over many samples on Ray: Ray Data ``map_batches`` over a pool of actors.

Each actor holds one ``bulk.Runner``: one onnxruntime session with the native op library registered (a CVM
graph is exported in its batched serving form on the driver, so the actors only run onnxruntime). The driver
puts the samples into Ray's object store a chunk at a time, with their indices; each result is written at its
indices, so the output is in input order whatever order the chunks finish in, and is bit-identical to
``bulk.run_many``. A killed actor is restarted and its chunks retried (``RETRIES`` times each). Ray is the
optional extra ``ray``, imported only here; the workers need cvm-onnx installed (docs/scale-out.md).
"""
from __future__ import annotations

import logging
import os
import socket
import time
import warnings
from typing import Any, Callable

import numpy as np

from cvm_onnx.core.errors import CVMError, RuntimeFailure, UnsupportedError
from cvm_onnx.core.format.edges import Edges

from .bulk import CHUNK, ModelArg, Output, Plan, Progress, Runner, Samples, planned
from .sessions import usable_cpus

JOIN = 5.0
"""Seconds Ray adds to a run from a process not yet connected to it (the connection and the actors' start-up;
docs/scale-out.md): a run estimated to take less here runs here."""
RETRIES = 3
"""Restarts of a dead actor, and retries of a chunk whose actor died, before the run fails."""
WAIT = 10
"""Seconds to wait for a connection to a cluster's address before saying that nothing answers there."""


def _ray(data: bool = True):
    """The ray module (with ray.data unless ``data`` is False); ``UnsupportedError`` without the extra."""
    try:
        import ray
        if data:
            import ray.data
    except ImportError:
        raise UnsupportedError("running on Ray needs the extra ray: in the checkout, pip install -e '.[ray]'") \
            from None
    return ray


class _Actor:
    """A Ray Data actor: one runner; a batch of rows (index, data) becomes rows (index, out0, out1, ...)."""

    def __init__(self, plan):
        self.runner = Runner(plan)

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        outs = self.runner(batch["data"], batch["index"])
        return {"index": batch["index"], **{f"out{k}": o for k, o in enumerate(outs)}}


def run_on_ray(model: ModelArg, inputs: str | os.PathLike | np.ndarray, output: str | os.PathLike | None = None,
               address: str | None = None, actors: int | None = None, chunk: int = CHUNK, provider: str = "cpu",
               runtime_env: dict[str, Any] | None = None, progress: Progress | None = None,
               edges: Edges | None = None, cuda_graph: bool = False,
               here_if_faster: Callable[[str], None] | None = None) -> Output:
    """``bulk.run_many`` on Ray: ``actors`` actors (default one per CPU of the cluster), one CPU (and one GPU
    for ``provider="cuda"``) and one onnxruntime thread each, ``chunk`` samples per task, ``runtime_env``
    theirs (how cvm-onnx reaches them when the cluster image lacks it). Uses the Ray instance this process is connected to, else connects to
    ``address`` and disconnects at the end (None: as ``ray.init``, the cluster ``RAY_ADDRESS`` names or one
    started on this machine with ``ray start``, else a new local one). ``edges``: as in ``run_many``. On CUDA
    each actor's calls go through IO binding (``sessions.Bound``), with ``cuda_graph`` a captured CUDA graph.

    ``here_if_faster``: from a process not yet connected to Ray, on the CPU provider, where Ray cannot be faster
    than ``bulk.run_many`` on this machine (``slower``), or the run there is estimated to take less than ``JOIN``
    (one call on the first sample, timed, times the calls, over the workers; a batched call usually takes less
    per sample, so the estimate leans towards Ray), the samples run there instead and ``here_if_faster`` is told
    why."""
    if actors is not None and actors < 1:
        raise RuntimeFailure(f"the number of actors must be >= 1, got {actors}")
    if here_if_faster is not None and provider == "cpu" and not cuda_graph and not _ray(False).is_initialized():
        from .bulk import run_many

        local, data = planned(model, inputs, 1, edges=edges)  # one sample a call (a batched .onnx: its batch)
        why = slower(address, data.count, chunk)
        if why is None:
            took = _first_call(local, data)
            calls = -(-data.count // local.batch)
            workers = min(calls, usable_cpus() if isinstance(local.model, bytes) else 1)
            if (estimate := took * calls / workers) < JOIN:
                why = (f"the run here takes about {estimate:.2f} s ({calls} calls, the first in {took:.3f} s), "
                       f"less than Ray adds to it (connecting or starting, and the actors' start-up: about "
                       f"{JOIN:.0f} s)")
        if why:
            here_if_faster(why)
            return run_many(model, inputs, output, chunk=chunk, progress=progress, edges=edges)
    p, data = planned(model, inputs, chunk, onnxruntime=True, provider=provider, threads=1, edges=edges,
                      cuda_graph=cuda_graph)
    ray = _ray()
    import pyarrow as pa
    from ray.data import ActorPoolStrategy, DataContext
    from ray.data.extensions import ArrowTensorArray

    started = not ray.is_initialized()
    if started:
        if progress:
            progress(0, data.count, "starting Ray")
        _connect(ray, address)
    context = DataContext.get_current()
    saved = context.enable_progress_bars, context.raise_original_map_exception
    # our errors come back as themselves, and are printed once, by the caller
    context.enable_progress_bars, context.raise_original_map_exception = False, True
    log = logging.getLogger("ray.data")
    level = log.level
    log.setLevel(logging.CRITICAL)
    try:
        # no more actors than chunks: an actor without a chunk only costs its start-up
        pool = min(actors or max(1, int(ray.cluster_resources().get("CPU", 1))), -(-data.count // chunk))
        blocks = []
        for a in range(0, data.count, chunk):
            b = min(a + chunk, data.count)
            blocks.append(ray.put(pa.table({"index": np.arange(a, b),
                                            "data": ArrowTensorArray.from_numpy(data.chunk(a, b))})))
        with warnings.catch_warnings():  # Ray 2.60 deprecates the retry keywords of map_batches, naming no
            warnings.simplefilter("ignore", DeprecationWarning)  # replacement; its defaults retry forever
            results = ray.data.from_arrow_refs(blocks).map_batches(
                _Actor, fn_constructor_args=(p,), batch_size=chunk, batch_format="numpy", num_cpus=1,
                num_gpus=1 if provider == "cuda" else None,
                compute=ActorPoolStrategy(size=pool), runtime_env=runtime_env, max_restarts=RETRIES,
                max_task_retries=RETRIES)
        if progress:
            progress(0, data.count, f"starting {pool} Ray actor(s)")
        done = 0
        with Output(output, p.names, data.count, data.stacked) as out:
            for batch in _batches(results):
                out.write(batch["index"], [batch[f"out{k}"] for k in range(len(p.names))])
                done += len(batch["index"])
                if progress:
                    progress(done, data.count, "samples")
            if done != data.count:
                raise RuntimeFailure(f"Ray returned {done} results for {data.count} samples")
            out.commit()
        return out
    finally:
        context.enable_progress_bars, context.raise_original_map_exception = saved
        log.setLevel(level)
        if started:
            ray.shutdown()


def _first_call(local: Plan, data: Samples) -> float:
    """Seconds one call of ``local``'s runner takes here on the first sample of ``data`` (the session made first,
    not timed)."""
    runner = Runner(local)
    start = time.perf_counter()
    runner(data.chunk(0, 1), [0])
    return time.perf_counter() - start


def slower(address: str | None, count: int, chunk: int) -> str | None:
    """Why Ray, reached at ``address`` from a process not yet connected to it, cannot run ``count`` samples
    (``chunk`` a task) faster than ``bulk.run_many`` on this machine, or None: a new local instance would have
    this machine's CPUs only (``starts_local_instance``), and one chunk is one actor's work after Ray's
    connection and the actor's start-up (seconds), which the chunk alone takes less than here."""
    if address != "local" and starts_local_instance(address):
        return ("no Ray cluster to join (RAY_ADDRESS unset, none started here by `ray start`); a new local "
                "instance would add its start-up to this machine's CPUs, which the run here uses too")
    if 0 < count <= chunk:
        return (f"{count} sample(s) make one chunk of --chunk {chunk}, which one actor would run alone after Ray's "
                "connection and its start-up")
    return None


def starts_local_instance(address: str | None) -> bool:
    """Whether ``run_on_ray(address=...)`` would start a new Ray instance on this machine: this process is not
    connected to one, and ``address`` None names no cluster (``RAY_ADDRESS`` unset, none started here by ``ray
    start``) or is ``local``. Such an instance has this machine's CPUs only, which ``bulk.run_many`` uses too
    (``workers``), without Ray's start-up (tens of seconds on a busy machine) and its copies through the object
    store: on one machine Ray cannot be faster."""
    ray = _ray(data=False)
    if ray.is_initialized():
        return False
    if address == "local":
        return True
    if address is not None:
        return False
    from ray._private.services import canonicalize_bootstrap_address

    try:
        return canonicalize_bootstrap_address(None) is None
    except Exception:  # noqa: BLE001  (Ray's own lookup failed: ray.init will say why)
        return False


def _listening(address: str | None) -> None:
    """A ``RuntimeFailure`` unless something accepts a connection at ``address``'s HOST:PORT within ``WAIT``
    seconds (``ray.init`` retries such an address for many minutes); ``auto``, ``local`` and None are Ray's to
    find."""
    host, _, port = (address or "").removeprefix("ray://").rpartition(":")
    if not host or not port.isdigit():
        return
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=WAIT).close()
    except OSError as e:
        raise RuntimeFailure(f"no Ray cluster answers at {address}: {e.strerror or e}; start one there (ray start "
                             "--head) or give the address `ray start` printed (docs/scale-out.md)") from None


def _connect(ray, address: str | None) -> None:
    """``ray.init`` for ``address``, Ray's warnings off (the token notice of a new local instance); a cluster that
    cannot be reached is a ``RuntimeFailure`` naming token authentication, which a Ray >= 2.59 cluster started
    with ``ray start`` requires by default while a client given an address does not send a token unless told."""
    from ray.exceptions import AuthenticationError

    _listening(address)
    try:
        ray.init(address=address, logging_level=logging.ERROR, log_to_driver=False)
    except (ConnectionError, AuthenticationError) as e:
        where = f"at {address}" if address else "(RAY_ADDRESS, or a cluster started here)"
        raise RuntimeFailure(
            f"cannot connect to the Ray cluster {where}: {type(e).__name__}: {getattr(e, 'message', e)}. A Ray "
            "cluster started with `ray start` (Ray >= 2.59) requires token authentication: set RAY_AUTH_MODE=token "
            "and the cluster's token, RAY_AUTH_TOKEN=... or RAY_AUTH_TOKEN_PATH=FILE (`ray get-auth-token` on the "
            "head prints it), or start the cluster with RAY_AUTH_MODE=disabled; else check the address "
            "(docs/scale-out.md)") from None


def _batches(dataset):
    """The dataset's result blocks; an error of ours raised in an actor comes out as itself."""
    try:
        yield from dataset.iter_batches(batch_size=None, batch_format="numpy")
    except Exception as e:
        cause = getattr(e, "cause", e)
        if isinstance(cause, CVMError):
            raise type(cause)(cause.problems) from None
        raise RuntimeFailure(f"the Ray run failed: {type(e).__name__}: {e}") from None
