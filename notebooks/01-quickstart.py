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
# # Quick start: simulate one training iteration, read it, change one thing
#
# **Question.** GPT-3 XL (1.3B) trains with PyTorch DDP on four AWS p4d.24xlarge (32 A100-40GB).
# How long is one step, where does the time go, does it fit in memory, and what happens if we
# switch to tensor parallelism of 2 inside each node, or move to p5.48xlarge?
#
# Everything below comes from `simulator`: the notebook only loads scenarios, runs them and
# reads the results.

# %%
from pathlib import Path

import simulator
from simulator.viz.breakdown import breakdown_figure
from simulator.viz.memory import memory_figure
from simulator.viz.static import StaticFigures

ROOT = Path.cwd() if (Path.cwd() / "scenarios").is_dir() else Path.cwd().parent
figures = StaticFigures(ROOT / "notebooks" / "figures", prefix="01-quickstart")
print(ROOT / "scenarios" / "quickstart.yaml")
print((ROOT / "scenarios" / "quickstart.yaml").read_text())

# %% [markdown]
# ## Load and simulate
#
# `load_scenario` validates the YAML (errors name the file, line and field) and resolves the
# model preset and the node type. `run_simulation` runs one iteration as discrete events and
# returns a `simulator.Simulation`: its `result` (a `simulator.Result`, what `simulate` returns)
# and the rows the figures are drawn from.

# %%
scenario = simulator.load_scenario(ROOT / "scenarios" / "quickstart.yaml")
sim = simulator.run_simulation(scenario)
result = sim.result

GiB = 2**30
print(f"world size      {result.world_size} GPUs (tp {result.tp}, pp {result.pp}, dp {result.dp})")
print(f"parameters      {result.params / 1e9:.2f} B")
print(f"step time       {result.step_time_s * 1e3:.1f} ms")
print(f"throughput      {result.tokens_per_s:,.0f} tokens/s")
print(f"per GPU         {result.tflops_per_gpu:.1f} TFLOP/s, MFU {result.mfu:.1%}")
print(f"peak memory     {result.peak_memory_bytes / GiB:.2f} GiB of {result.gpu_memory_bytes / GiB:.0f} GiB"
      f" -> {'OUT OF MEMORY' if result.oom else 'fits'}")

# %% [markdown]
# ## Where the step goes
#
# `result.breakdown` is the critical rank's step split into compute, communication that the
# compute could not hide (by group: `dp`, `tp`, `pp`, ...), pipeline bubble and idle time.
# These parts add up to the step time.

# %%
b = result.breakdown
parts = {"compute": b.compute_s, **{f"exposed {k}": v for k, v in b.exposed_comm_s.items()},
         "bubble": b.bubble_s, "idle": b.idle_s}
for name, seconds in parts.items():
    print(f"{name:>12}: {seconds * 1e3:8.2f} ms  {seconds / result.step_time_s:6.1%}")
print(f"{'sum':>12}: {sum(parts.values()) * 1e3:8.2f} ms  (step {result.step_time_s * 1e3:.2f} ms)")
hidden = 1 - b.exposed_comm_s.get("dp", 0.0) / b.comm_s["dp"]
print(f"\nDDP's gradient all-reduce is in flight for {b.comm_s['dp'] * 1e3:.1f} ms; "
      f"{hidden:.0%} of it is hidden behind the backward pass.")

# %%
figures.add("breakdown", breakdown_figure(result))

# %%
figures.add("memory", memory_figure(sim))

# %% [markdown]
# ## Change one field and compare
#
# Overrides use the same dotted paths as the YAML (`--set` on the command line). We compare
# the baseline with tensor parallelism 2 (the model split across two GPUs of a node, so each
# GPU's GEMMs halve and two all-reduces per layer appear) and with the same job on
# p5.48xlarge (H100, 3200 Gb/s of EFA per node).

# %%
variants = {
    "baseline (DDP, p4d)": [],
    "tp 2 (p4d)": ["parallelism.tp=2"],
    "DDP on p5.48xlarge": ["cluster.node=p5.48xlarge"],
}
results = {name: simulator.simulate(simulator.load_scenario(ROOT / "scenarios" / "quickstart.yaml", overrides=o))
           for name, o in variants.items()}
print(f"{'variant':<22} {'step ms':>9} {'tokens/s':>12} {'MFU':>6} {'peak GiB':>9}  exposed comm ms")
for name, r in results.items():
    exposed = ", ".join(f"{k} {v * 1e3:.1f}" for k, v in r.breakdown.exposed_comm_s.items() if v > 0) or "none"
    print(f"{name:<22} {r.step_time_s * 1e3:9.1f} {r.tokens_per_s:12,.0f} {r.mfu:6.1%} "
          f"{r.peak_memory_bytes / GiB:9.2f}  {exposed}")

# %%
base, tp2, p5 = results.values()
print(f"tp 2 changes the step by {tp2.step_time_s / base.step_time_s - 1:+.1%}: its per-layer all-reduces "
      f"expose {tp2.breakdown.exposed_comm_s.get('tp', 0.0) * 1e3:.1f} ms, while peak memory drops "
      f"from {base.peak_memory_bytes / GiB:.1f} to {tp2.peak_memory_bytes / GiB:.1f} GiB.")
print(f"p5.48xlarge is {base.step_time_s / p5.step_time_s:.2f}x faster per step "
      f"({p5.tflops_per_gpu:.0f} against {base.tflops_per_gpu:.0f} TFLOP/s per GPU).")

# %% [markdown]
# ## Next
#
# * `dtsim run scenarios/quickstart.yaml --report out/q.html --trace out/q.json.gz` writes the
#   same figures as an HTML report and a trace for https://ui.perfetto.dev.
# * `02-scaling-curves` sweeps cluster sizes, `03-where-time-goes` opens a 3D-parallel run,
#   `04-calibrate` measures this machine, `05-network-what-ifs` changes the network.

# %% [markdown]
# ## Static copies of the figures
#
# The interactive figures above need JavaScript. The cell below also writes them as PNG
# images to `notebooks/figures/` when Kaleido (`kaleido>=1`, in the `notebooks` extra) and a
# Chrome or Chromium are available, and otherwise prints why it wrote none; GitHub and
# nbconvert show the copies below.
#
# ![Time breakdown per rank](figures/01-quickstart-breakdown.png)
# ![Memory over the step (GiB)](figures/01-quickstart-memory.png)

# %%
figures.save()
