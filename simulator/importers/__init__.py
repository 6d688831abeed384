"""Config importers: a framework's own configuration -> a dtsim scenario mapping (``dtsim import``).

One module per framework (:mod:`.megatron`, :mod:`.torchtitan`, :mod:`.deepspeed`, :mod:`.nemo`), each a pure
function returning an :class:`~simulator.importers.common.Imported` (the scenario mapping, the
inputs left unused and notes); :func:`~simulator.importers.common.render` writes it as YAML.
"""

from simulator.importers.common import Imported, render
from simulator.importers.deepspeed import import_deepspeed
from simulator.importers.megatron import import_megatron
from simulator.importers.nemo import import_nemo
from simulator.importers.torchtitan import import_torchtitan

__all__ = ["Imported", "render", "import_megatron", "import_torchtitan", "import_deepspeed", "import_nemo"]
