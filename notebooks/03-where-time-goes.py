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
# # Where the time goes in a 3D-parallel GPT run
#
# **Question.** GPT-3 175B trains with Megatron-style 3D parallelism on 128 DGX A100 (1,024
# GPUs): tensor parallel 8 inside each node, 8 pipeline stages across nodes (1F1B), 16
# data-parallel replicas with a distributed optimizer, full recomputation. Where does one
# iteration go (compute, tensor-parallel all-reduces, pipeline bubble, data-parallel
# tail), how full is memory over the step, which links are busiest, and how does the number
# of micro-batches change the pipeline bubble?

# %%
from pathlib import Path

import plotly.graph_objects as go

import simulator
from simulator.viz.breakdown import breakdown_figure
from simulator.viz.links import link_heatmap_figure, top_links_figure
from simulator.viz.memory import memory_figure
from simulator.viz.static import StaticFigures
from simulator.viz.timeline import timeline_figure

ROOT = Path.cwd() if (Path.cwd() / "scenarios").is_dir() else Path.cwd().parent
figures = StaticFigures(ROOT / "notebooks" / "figures", prefix="03-where-time-goes")
SCENARIO = ROOT / "scenarios" / "gpt3-175b-3d-dgx-a100.yaml"
scenario = simulator.load_scenario(SCENARIO)
sim = simulator.run_simulation(scenario, record_series=True)  # record link loads over time for the heatmap
result = sim.result
print(f"{result.name}: step {result.step_time_s:.2f} s, {result.tflops_per_gpu:.0f} TFLOP/s per GPU, "
      f"MFU {result.mfu:.1%}, {result.micro_batches} micro-batches per pipeline")

# %% [markdown]
# ## The breakdown per pipeline stage
#
# Each bar is one pipeline stage (identical ranks of a stage are simulated once). The parts
# add up to the step time: compute (including the recomputed forward), communication that
# compute did not hide, the pipeline bubble and idle time.

# %%
figures.add("breakdown", breakdown_figure(result))

# %%
b = result.breakdown
print(f"critical rank {b.rank} (stage {b.stage}), step {result.step_time_s:.2f} s:")
print(f"  compute        {b.compute_s:7.2f} s  {b.compute_s / result.step_time_s:6.1%}")
for kind, seconds in sorted(b.exposed_comm_s.items(), key=lambda kv: -kv[1]):
    print(f"  exposed {kind:<6} {seconds:7.2f} s  {seconds / result.step_time_s:6.1%}"
          f"   (in flight {b.comm_s.get(kind, 0.0):.2f} s)")
print(f"  bubble         {b.bubble_s:7.2f} s  {b.bubble_s / result.step_time_s:6.1%}")
print(f"  idle           {b.idle_s:7.2f} s  {b.idle_s / result.step_time_s:6.1%}")
# the sentences below are derived from the numbers above, so they stay true when the model changes
COMM_NAMES = {"tp": "tensor-parallel communication", "pp": "pipeline point-to-point transfers",
              "dp": "data-parallel gradient reduction", "cp": "context-parallel exchange",
              "shard": "sharded-parameter gathers"}
largest = max(b.exposed_comm_s, key=lambda kind: b.exposed_comm_s[kind])
share = b.exposed_comm_s[largest] / result.step_time_s
bubble_share = b.bubble_s / result.step_time_s
print(f"\nThe largest exposed communication is the {COMM_NAMES.get(largest, largest)} ({share:.1%} of the step); "
      f"the pipeline bubble costs {bubble_share:.1%}, {'more' if bubble_share > share else 'less'} than that.")

# %% [markdown]
# ## The timeline
#
# One row per stream of each drawn rank (compute, tp, pp, dp). Hover a bar for its FLOPs,
# achieved TFLOP/s, bytes and algorithm. The 1F1B warm-up and cool-down are visible as the
# staircase at both ends; `dtsim run ... --trace out.json.gz` writes the same for Perfetto.

# %%
figures.add("timeline", timeline_figure(sim, max_ranks=4))

# %% [markdown]
# ## Memory over the step
#
# Stage 0 holds the most in-flight micro-batches under 1F1B (p of them), so its activation
# memory peaks highest; full recomputation keeps only each layer's input.

# %%
figures.add("memory", memory_figure(sim))

# %%
for m in result.memory:
    print(f"stage {m.stage}: peak {m.peak_bytes / 2**30:6.2f} GiB (activations {m.activations_bytes / 2**30:5.2f} GiB)")
highest = max(result.memory, key=lambda m: m.activations_bytes)
print(f"\nStage {highest.stage} holds the most activations ({highest.activations_bytes / 2**30:.2f} GiB); "
      f"its peak is {highest.peak_bytes / highest.capacity_bytes:.0%} of the GPU's memory.")

# %% [markdown]
# ## The busiest links
#
# Which links carry the most traffic and when. The sentence under the figure names the
# busiest ones from the simulated loads.

# %%
print("; ".join(f"{link.label}: {link.utilisation:.0%} busy ({link.tier})" for link in result.links[:3]))
figures.add("top-links", top_links_figure(sim))

# %%
figures.add("link-heatmap", link_heatmap_figure(sim, max_links=16))

# %% [markdown]
# ## Micro-batches against the bubble
#
# With p stages and m micro-batches, 1F1B idles each stage for (p - 1) forward-backward
# slots, so the bubble is (p - 1) / (m + p - 1) of the step (Narayanan et al. 2021). We vary
# the global batch (so m = global / (micro-batch * dp)) and read the simulated bubble.

# %%
rows = []
for global_batch in (128, 256, 512, 1536):
    r = simulator.simulate(simulator.load_scenario(SCENARIO, overrides=[f"training.global_batch={global_batch}"]))
    p, m = r.pp, r.micro_batches
    tail = r.breakdown.exposed_comm_s.get("dp", 0.0) / r.step_time_s  # gradient reduction after the schedule
    rows.append((m, r.breakdown.bubble_s / r.step_time_s, (p - 1) / (m + p - 1), r.tflops_per_gpu, tail))
print(f"{'m':>4} {'simulated bubble':>17} {'(p-1)/(m+p-1)':>14} {'TFLOP/s/GPU':>12}")
for m, sim_frac, ideal, tflops, _ in rows:
    print(f"{m:>4} {sim_frac:17.1%} {ideal:14.1%} {tflops:12.1f}")
first, last = rows[0], rows[-1]
print(f"\nGoing from {first[0]} to {last[0]} micro-batches "
      f"{'shrinks' if last[1] < first[1] else 'grows'} the bubble from {first[1]:.1%} to {last[1]:.1%} and "
      f"{'raises' if last[3] > first[3] else 'lowers'} throughput per GPU from {first[3]:.0f} to {last[3]:.0f} TFLOP/s.")
stages = sorted(result.stage_breakdown, key=lambda s: s.stage)
heavy = stages[-1].compute_s / stages[0].compute_s - 1
above = [str(m) for m, simulated, formula, _, _ in rows if simulated > formula]
below = [row for row in rows if row[1] <= row[2]]
if above:
    print(f"At m = {', '.join(above)} the simulated bubble is above the formula: the stages are not equal (the "
          f"last one also runs the output layer and the loss, {heavy:+.1%} compute) and the point-to-point "
          "transfers between nodes are on the critical path; every other stage waits for the slowest one once "
          "per micro-batch.")
if below:
    m, simulated, formula, _, tail = below[0]
    print(f"At m = {', '.join(str(row[0]) for row in below)} it is at or below the formula: the formula is a "
          "share of the pipeline schedule only, while the step also holds the exposed data-parallel gradient "
          f"reduction after it ({tail:.1%} of the step at m = {m}; {formula:.1%} x (1 - {tail:.1%}) = "
          f"{formula * (1 - tail):.1%}, against {simulated:.1%} simulated).")

# %%
fig = go.Figure()
fig.add_scatter(x=[r[0] for r in rows], y=[100 * r[1] for r in rows], mode="lines+markers", name="simulated")
fig.add_scatter(x=[r[0] for r in rows], y=[100 * r[2] for r in rows], mode="lines", name="(p-1)/(m+p-1)",
                line={"dash": "dash"})
fig.update_layout(title="Pipeline bubble against micro-batches (pp = 8)", xaxis={"title": "micro-batches m",
                  "type": "log"}, yaxis={"title": "bubble (% of step)"})
figures.add("bubble", fig)

# %% [markdown]
# ## Static copies of the figures
#
# The interactive figures above need JavaScript. The cell below also writes them as PNG
# images to `notebooks/figures/` when Kaleido (`kaleido>=1`, in the `notebooks` extra) and a
# Chrome or Chromium are available, and otherwise prints why it wrote none; GitHub and
# nbconvert show the copies below.
#
# ![Time breakdown per rank](figures/03-where-time-goes-breakdown.png)
# ![Timeline of one step](figures/03-where-time-goes-timeline.png)
# ![Memory over the step (GiB)](figures/03-where-time-goes-memory.png)
# ![Busiest links](figures/03-where-time-goes-top-links.png)
# ![Link utilisation over the step](figures/03-where-time-goes-link-heatmap.png)
# ![Pipeline bubble against micro-batches](figures/03-where-time-goes-bubble.png)

# %%
figures.save()
