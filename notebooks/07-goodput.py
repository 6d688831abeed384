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
# # Goodput: stragglers, bad links and failures, from one iteration to a whole training run
#
# **Questions.** What does one slow GPU or one bad link do to a training step, and how do
# cluster size and checkpoint interval trade against the time to train? Every number below
# comes from `simulator.simulate`; each variant changes only the fields it names of a shipped
# scenario.

# %% [markdown]
# ## 1. How a straggler and a bad link propagate
#
# The quick-start job (`scenarios/quickstart.yaml`: GPT-3 XL under PyTorch DDP on 4 x
# p4d.24xlarge, 32 A100) with the perturbations of the scenario section `faults`: a rank whose
# kernels run slower (`stragglers`), one NIC's cable at a fraction of its bandwidth or failed
# (`links`), and random variation of every kernel's time (`jitter`). The discrete-event engine
# plays them out; nothing below adds a formula for their knock-on effects, and symmetry reduction
# is switched off so every one of the 32 ranks is simulated (`Result.faults` says so).

# %%
import copy
from pathlib import Path

import plotly.graph_objects as go

import simulator
from simulator.viz.static import StaticFigures
from simulator.yamlio import load_yaml, to_plain

ROOT = Path.cwd() if (Path.cwd() / "scenarios").is_dir() else Path.cwd().parent
figures = StaticFigures(ROOT / "notebooks" / "figures", prefix="07-goodput")
QUICK = to_plain(load_yaml(ROOT / "scenarios" / "quickstart.yaml"))


def perturbed(base: dict, faults: dict | None = None, **changes: dict) -> simulator.Result:
    """``base`` with a faults section and some sections' fields replaced, simulated."""
    data = copy.deepcopy(base)
    for section, fields in changes.items():
        data.setdefault(section, {}).update(fields)
    if faults:
        data["faults"] = faults
    return simulator.simulate(simulator.Scenario.model_validate(data))


healthy = perturbed(QUICK)
print(f"healthy: step {healthy.step_time_s:.4f} s, compute {healthy.breakdown.compute_s:.4f} s, exposed "
      f"communication {healthy.breakdown.exposed_comm_total_s * 1e3:.1f} ms, {healthy.engine['simulated_ranks']} "
      f"simulated rank(s) standing for {healthy.world_size}")

# %% [markdown]
# ### One slow GPU
#
# Rank 3 runs its kernels 1.1 to 2 times slower (a throttled GPU). Under DDP every gradient
# bucket's all-reduce needs rank 3's gradients, so the other 31 ranks wait for it at every
# bucket: the whole step follows the slowest rank.

# %%
SLOWDOWNS = (1.0, 1.1, 1.25, 1.5, 2.0)
by_slowdown = {s: perturbed(QUICK, {"stragglers": [{"ranks": [3], "slowdown": s}]}) for s in SLOWDOWNS}
for s, r in by_slowdown.items():
    b = r.breakdown
    print(f"rank 3 at x{s:<4g}: step {r.step_time_s:.4f} s = x{r.step_time_s / healthy.step_time_s:.3f} the healthy "
          f"step; critical rank {b.rank}, its compute {b.compute_s:.4f} s, exposed communication "
          f"{b.exposed_comm_total_s * 1e3:.1f} ms")
worst = by_slowdown[max(SLOWDOWNS)]
print(f"\nOne GPU of {healthy.world_size} at x{max(SLOWDOWNS):g} makes the step x"
      f"{worst.step_time_s / healthy.step_time_s:.3f}: the 31 healthy GPUs idle for "
      f"{worst.step_time_s - healthy.step_time_s:.3f} s a step while they wait. "
      f"{worst.faults.symmetry if worst.faults else ''}.")

# %% [markdown]
# In a pipeline the slow GPU stretches its own stage, and the other stages wait for its
# micro-batches: the same model with pp 4 on one node (two pipelines of four stages), rank 4
# (the first stage of the second pipeline) at 1.5x.

# %%
PIPE = {"parallelism": {"sharding": "none", "pp": 4}, "cluster": {"node": "p4d.24xlarge", "nodes": 1},
        "training": {"micro_batch": 4, "global_batch": 64}}
pipe = perturbed(QUICK, **PIPE)
pipe_slow = perturbed(QUICK, {"stragglers": [{"ranks": [4], "slowdown": 1.5}]}, **PIPE)
print(f"pp 4: step {pipe.step_time_s:.4f} s healthy, {pipe_slow.step_time_s:.4f} s with rank 4 at x1.5 "
      f"(x{pipe_slow.step_time_s / pipe.step_time_s:.3f})")
bubble_before = {b.stage: b.bubble_s for b in pipe.stage_breakdown}
for b in sorted(pipe_slow.stage_breakdown, key=lambda b: b.rank):
    print(f"  rank {b.rank} (stage {b.stage}): compute {b.compute_s:.4f} s, bubble {b.bubble_s:.4f} s "
          f"(healthy {bubble_before[b.stage]:.4f} s)")
first = next(b for b in pipe_slow.stage_breakdown if b.rank == 0)
print(f"Rank 4 computes {max(pipe_slow.stage_breakdown, key=lambda b: b.compute_s).compute_s:.4f} s. Rank 0, the "
      f"healthy first stage of the other pipeline, waits {first.bubble_s - bubble_before[0]:.4f} s longer in its bubble: "
      "each stage's data-parallel all-reduce joins it to its twin in the slow pipeline.")

# %% [markdown]
# ### One bad link
#
# NIC 0 of node 1 (one of its four 100 Gb/s EFA adapters) at a fraction of its bandwidth, and
# failed (`bandwidth_factor: 0`). NCCL keeps using a slow NIC: every ring channel through it
# runs at its pace, so each all-reduce ends when that channel does. A failed NIC is left out,
# and the GPUs behind it reach the network through the node's other NICs.

# %%
FACTORS = (1.0, 0.5, 0.25, 0.1, 0.0)
by_factor = {f: perturbed(QUICK, {"links": [{"select": "node=1 nic=0", "bandwidth_factor": f}]}) for f in FACTORS}
for f, r in by_factor.items():
    state = "failed" if f == 0 else f"x{f:g} bandwidth"
    print(f"NIC 0 of node 1 {state:>15}: step {r.step_time_s:.4f} s (x{r.step_time_s / healthy.step_time_s:.3f}), "
          f"exposed communication {r.breakdown.exposed_comm_total_s * 1e3:6.1f} ms, busiest link "
          f"{r.links[0].label} at {r.links[0].utilisation:.0%}")
slowest = min(f for f in FACTORS if f > 0)
print(f"\nAt x{slowest:g} the one NIC costs x{by_factor[slowest].step_time_s / healthy.step_time_s:.3f} of the step; "
      f"failed outright it costs x{by_factor[0.0].step_time_s / healthy.step_time_s:.3f}: "
      + ("a degraded link that stays in use is worse than one that fails."
         if by_factor[slowest].step_time_s > by_factor[0.0].step_time_s else "failing it costs more."))

# %%
fig = go.Figure()
fig.add_scatter(x=list(by_slowdown), y=[r.step_time_s / healthy.step_time_s for r in by_slowdown.values()],
                mode="lines+markers", name="rank 3 slowed (x axis: its slowdown)")
fig.add_scatter(x=[1 / f for f in FACTORS if f > 0],
                y=[by_factor[f].step_time_s / healthy.step_time_s for f in FACTORS if f > 0],
                mode="lines+markers", name="NIC 0 of node 1 degraded (x axis: 1 / bandwidth factor)")
fig.update_layout(title="GPT-3 XL DDP on 4 x p4d: one slow GPU or one slow NIC against the whole step",
                  xaxis={"title": "how much slower the one GPU or NIC is (x)", "type": "log"},
                  yaxis={"title": "step time / healthy step time"})
figures.add("propagation", fig)

# %% [markdown]
# ### Jitter: the step waits for the slowest of 32
#
# Every kernel's time varies by 5% (lognormal, mean 1), drawn anew on every rank; 30 seeded
# iterations give the distribution (`sim.samples: 30`). Each all-reduce waits for the slowest
# rank's gradients, so the step is the sum of maxima, not of means.

# %%
jitter = perturbed(QUICK, {"jitter": {"compute_cv": 0.05, "seed": 0}}, sim={"samples": 30})
s = jitter.faults.samples
print(f"{s.samples} iterations: mean {s.mean_s:.4f} s (x{s.mean_s / healthy.step_time_s:.4f} the healthy step), "
      f"p50 {s.p50_s:.4f} s, p99 {s.p99_s:.4f} s, from {min(s.step_times_s):.4f} to {max(s.step_times_s):.4f} s")
print(f"slowest rank: {len(s.slowest_counts)} different ranks across the samples (most often rank "
      f"{next(iter(s.slowest_counts))}, {next(iter(s.slowest_counts.values()))} times): no rank is a straggler, "
      "each iteration has its own")

# %%
fig = go.Figure()
fig.add_histogram(x=s.step_times_s, nbinsx=15, name="jittered iterations")
fig.add_vline(x=healthy.step_time_s, line_dash="dash", annotation_text="no jitter")
fig.update_layout(title=f"Step time over {s.samples} iterations, 5% kernel jitter on 32 A100",
                  xaxis={"title": "step time (s)"}, yaxis={"title": "iterations"}, showlegend=False)
figures.add("jitter", fig)

# %% [markdown]
# ### Static copies of the figures
#
# The cell below writes the figures above as PNG images to `notebooks/figures/` when Kaleido
# and a Chrome or Chromium are available, and otherwise prints why it wrote none.
#
# ![One slow GPU or NIC against the step](figures/07-goodput-propagation.png)
# ![Step time under kernel jitter](figures/07-goodput-jitter.png)

# %%
figures.save()
