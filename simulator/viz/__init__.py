"""Figures and the HTML report (plotly lives here only; ``import simulator`` never imports this).

* :mod:`simulator.viz.timeline`: per rank and stream, one iteration;
* :mod:`simulator.viz.breakdown`: stacked compute / exposed communication / bubble / idle;
* :mod:`simulator.viz.memory`: memory over time by category against device capacity;
* :mod:`simulator.viz.links`: link utilisation heatmap and the busiest links;
* :mod:`simulator.viz.scaling`: throughput and scaling efficiency versus GPU count;
* :mod:`simulator.viz.faults`: the step-time distribution of ``sim.samples`` and the perturbations;
* :mod:`simulator.viz.collective`: nccl-tests-style bus bandwidth against message size;
* :mod:`simulator.viz.static`: static PNG/SVG copies of figures (Kaleido and a Chrome, where available);
* :mod:`simulator.viz.report`: all of the above in one self-contained HTML file.
"""
