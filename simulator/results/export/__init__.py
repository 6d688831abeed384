"""Trace export: a simulated iteration as files that trace viewers and analysis tools read.

* :mod:`~simulator.results.export.chrome`: Chrome Trace Event JSON for Perfetto or
  chrome://tracing (:func:`write_trace`, :func:`trace_document`);
* :mod:`~simulator.results.export.hta`: one Kineto-like file per rank as Holistic Trace
  Analysis reads it (:func:`write_hta_traces`, :func:`hta_document`, :func:`nccl_kernel_name`);
* shared by both: :mod:`~simulator.results.export.threads` (time and thread layout,
  :func:`assign_lanes`), :mod:`~simulator.results.export.args` (:func:`row_args`) and
  :mod:`~simulator.results.export.files` (JSON / gzip output).
"""

from __future__ import annotations

from simulator.results.export.args import row_args
from simulator.results.export.chrome import (
    DEFAULT_MAX_LINKS,
    LINK_COUNTER_ARG,
    MEMORY_COUNTER,
    MEMORY_TOTAL_COUNTER,
    trace_document,
    write_trace,
)
from simulator.results.export.hta import (
    CUDA_LAUNCH_KERNEL_CBID,
    HTA_CPU_PID_OFFSET,
    HTA_CPU_TID,
    HTA_FIRST_CORRELATION,
    HTA_FIRST_STREAM,
    HTA_LAUNCH_LEAD_US,
    hta_document,
    nccl_kernel_name,
    write_hta_traces,
)
from simulator.results.export.threads import ITERATION_TID, STREAM_ORDER, assign_lanes

__all__ = [
    "write_trace",
    "trace_document",
    "write_hta_traces",
    "hta_document",
    "assign_lanes",
    "row_args",
    "nccl_kernel_name",
    "STREAM_ORDER",
    "ITERATION_TID",
    "MEMORY_COUNTER",
    "MEMORY_TOTAL_COUNTER",
    "LINK_COUNTER_ARG",
    "DEFAULT_MAX_LINKS",
    "HTA_CPU_PID_OFFSET",
    "HTA_CPU_TID",
    "HTA_FIRST_STREAM",
    "HTA_LAUNCH_LEAD_US",
    "CUDA_LAUNCH_KERNEL_CBID",
    "HTA_FIRST_CORRELATION",
]
