# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.6
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Scaling curves: GPT-3 13B on p4d.24xlarge and p5.48xlarge under DDP, ZeRO-3 and MiCS
#
# **Question.** We want to train GPT-3 13B on 1 to 16 nodes of AWS p4d.24xlarge (8 x A100-40GB,
# 4 x 100 Gb/s EFA) or p5.48xlarge (8 x H100-80GB, 32 x 100 Gb/s EFA). Which data-parallel
# strategy fits in memory, how does throughput grow with the cluster, and how far from linear
# does each one scale? Weak scaling: every GPU processes 4 sequences of 2048 tokens per step.
#
# The sweep file `scenarios/sweeps/gpt3-13b-p4d-p5-scaling.yaml` describes the 30 points
# (2 node types x 5 sizes x 3 strategies); `dtsim sweep` runs the same file from the command
# line. Here we run it from Python on a local process pool.

# %%
import tempfile
from pathlib import Path

from simulator.sweep import expand_sweep, feasible_rows, load_sweep, open_executor, run_sweep
from simulator.viz.scaling import scaling_figure
from simulator.viz.static import StaticFigures

ROOT = Path.cwd() if (Path.cwd() / "scenarios").is_dir() else Path.cwd().parent
figures = StaticFigures(ROOT / "notebooks" / "figures", prefix="02-scaling-curves")
SWEEP = ROOT / "scenarios" / "sweeps" / "gpt3-13b-p4d-p5-scaling.yaml"
print(SWEEP.read_text())

# %%
sweep = load_sweep(SWEEP)
points = expand_sweep(sweep)
with open_executor("local", workers=2) as executor:
    run = run_sweep(points, Path(tempfile.mkdtemp()), executor=executor, series=sweep.spec.series_fields())
print(f"{len(run.rows)} points: {run.simulated} simulated, {run.failed} recorded as failing, in {run.wall_s:.1f} s")

# %% [markdown]
# ## Who fits?
#
# Plain DDP keeps every parameter, gradient and Adam state on every GPU: 16 bytes per
# parameter. The sweep records such points with the reason instead of dropping them.

# %%
GiB = 2**30
for row in run.rows:
    if row["parallelism.sharding"] == "none" and row["cluster.nodes"] == 1:
        print(f"{row['cluster.node']}: DDP -> {row['error']}")
for node in ("p4d.24xlarge", "p5.48xlarge"):
    peaks = {r["parallelism.sharding"]: r["peak_memory_bytes"] / GiB for r in run.rows
             if r["cluster.node"] == node and r["cluster.nodes"] == 16}
    print(f"{node}, 16 nodes, peak memory per GPU: " + ", ".join(f"{k} {v:.1f} GiB" for k, v in peaks.items()))

# %% [markdown]
# DDP does not fit on either node type at any size. ZeRO-3 shards the model states over all
# GPUs, so its memory keeps falling as nodes are added; MiCS shards them over the 8 GPUs of
# one node only, so its memory stays that of one node.
#
# ## Throughput and scaling efficiency
#
# Left: tokens per second against GPUs, with each series' ideal (linear) line dashed.
# Right: scaling efficiency, throughput relative to linear scaling from one node.

# %%
feasible = feasible_rows(run.rows)
figures.add("scaling", scaling_figure(feasible, series_key="series",
                                      title="GPT-3 13B weak scaling, 4 sequences per GPU"))

# %%
table = {}
for r in feasible:
    table.setdefault((r["cluster.node"], r["parallelism.sharding"]), {})[r["cluster.nodes"]] = r
print(f"{'node':<14} {'sharding':<8}" + "".join(f"{n:>10} nodes" for n in (1, 2, 4, 8, 16)))
for (node, sharding), by_nodes in table.items():
    cells = "".join(f"{by_nodes[n]['scaling_efficiency']:>16.0%}" if n in by_nodes else f"{'-':>16}"
                    for n in (1, 2, 4, 8, 16))
    print(f"{node:<14} {sharding:<8}{cells}")

# %%
p4d_z3 = table["p4d.24xlarge", "zero3"][16]
p4d_mics = table["p4d.24xlarge", "mics"][16]
p5_z3 = table["p5.48xlarge", "zero3"][16]
p5_mics = table["p5.48xlarge", "mics"][16]
print(f"On 16 p4d nodes ZeRO-3 keeps {p4d_z3['scaling_efficiency']:.0%} of linear scaling and MiCS "
      f"{p4d_mics['scaling_efficiency']:.0%}: MiCS moves parameters over NVSwitch and only the 1/8 gradient "
      f"shards over the 400 Gb/s EFA, {p4d_mics['tokens_per_s'] / p4d_z3['tokens_per_s']:.2f}x ZeRO-3's throughput.")
print(f"On p5 (8x the network bandwidth per node) ZeRO-3 keeps {p5_z3['scaling_efficiency']:.0%} and MiCS "
      f"{p5_mics['scaling_efficiency']:.0%}; the gap narrows to {p5_mics['tokens_per_s'] / p5_z3['tokens_per_s']:.2f}x.")
print(f"At 16 nodes p5 delivers {p5_mics['tokens_per_s'] / p4d_mics['tokens_per_s']:.1f}x p4d's tokens/s with MiCS.")

# %% [markdown]
# ## Next
#
# * `dtsim sweep scenarios/sweeps/gpt3-13b-p4d-p5-scaling.yaml --executor dask-local` runs the
#   same sweep on a local Dask cluster and writes `results.csv` and `scaling.html`; an
#   interrupted sweep resumes from its cache.
# * `dtsim search SCENARIO` searches the parallel layouts (tp, pp, cp, sharding, micro-batch,
#   recompute) for the fastest or cheapest one.

# %% [markdown]
# ## Static copies of the figures
#
# The interactive figures above need JavaScript. The cell below also writes them as PNG
# images to `notebooks/figures/` when Kaleido (`kaleido>=1`, in the `notebooks` extra) and a
# Chrome or Chromium are available, and otherwise prints why it wrote none; GitHub and
# nbconvert show the copies below.
#
# ![Throughput and scaling efficiency against GPUs](figures/02-scaling-curves-scaling.png)

# %%
figures.save()
