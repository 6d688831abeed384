"""``dtsim calibrate``: measure a device with real PyTorch kernels and write a profile.

The only torch code of the simulator. PyTorch is imported lazily, inside the functions that
need it, so ``import simulator.calibrate`` works without it (``dtsim calibrate`` then says
how to install it). Modules:

* :mod:`~simulator.calibrate.device` - device selection, dtype support, the torch import;
* :mod:`~simulator.calibrate.shapes` - the block, GEMM and attention shapes to measure;
* :mod:`~simulator.calibrate.timing` - median and spread of repeated runs (CPU / CUDA);
* :mod:`~simulator.calibrate.kernels` - GEMM, attention, memory-bound, optimizer, launch;
* :mod:`~simulator.calibrate.fit` - efficiency tables and alpha-beta fits (numpy);
* :mod:`~simulator.calibrate.profile_file` - the profile mapping and its YAML file;
* :mod:`~simulator.calibrate.block` - the closed loop (real block vs simulator);
* :mod:`~simulator.calibrate.comm` - collectives over N local processes;
* :mod:`~simulator.calibrate.runner` - one calibration from start to end.
"""

from simulator.calibrate.device import INSTALL_HINT, CalibrationError, TorchMissingError
from simulator.calibrate.profile_file import write_profile
from simulator.calibrate.runner import Calibration, CalibrationOptions, Progress, run_calibration

__all__ = [
    "INSTALL_HINT",
    "CalibrationError",
    "TorchMissingError",
    "Calibration",
    "CalibrationOptions",
    "Progress",
    "run_calibration",
    "write_profile",
]
