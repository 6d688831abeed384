"""``python -m simulator.cli``: the same as ``dtsim``."""

from simulator.cli import main

main()
