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

# %% [markdown]
# ## 2. Cluster size and checkpoint interval against time-to-train
#
# **Question.** Llama 3 405B trains on 15.6T tokens (Dubey et al. 2024). On 16,384 H100 the
# Llama 3 team saw 419 unexpected interruptions in 54 days and kept over 90% effective
# training time. How long does the run really take on that cluster, how does that change
# with the cluster's size, and how often should it checkpoint?
#
# `dtsim goodput` answers from one simulated step: the scenario's `reliability` section
# (default: the failure rates of the paper's Table 5) gives the job's mean time between
# failures, the model's states give the checkpoint, Daly's model (2006) gives the optimal
# interval and the expected wall-clock, split into productive steps, checkpoint writes,
# lost work and restarts (`simulator/goodput/`, formulas in `simulator/costs/goodput.py`).

# %%
from dataclasses import replace
from pathlib import Path

import plotly.graph_objects as go

import simulator
from simulator.goodput import estimate, inputs_for, node_price
from simulator.goodput.montecarlo import monte_carlo
from simulator.viz.goodput import breakdown_figure, ettr_vs_interval_figure, ettr_vs_nodes_figure
from simulator.viz.static import StaticFigures

ROOT = Path.cwd() if (Path.cwd() / "scenarios").is_dir() else Path.cwd().parent
goodput_figures = StaticFigures(ROOT / "notebooks" / "figures", prefix="07-goodput")
TOKENS = 15.6e12  # Llama 3 405B's pre-training tokens (paper §3.1)
DAY = 86400.0

scenario = simulator.load_scenario(ROOT / "scenarios" / "llama3-405b-16k-h100.yaml")
result = simulator.simulate(scenario)
inputs = inputs_for(scenario, result)
price = node_price(inputs.node_type)
est = estimate(inputs, TOKENS, usd_per_node_hour=price)
run = est.run
print(f"{scenario.world_size:,} GPUs, step {est.step_time_s:.2f} s, {est.steps:,} steps")
print(f"job MTBF {est.job_mtbf_s / 3600:.2f} h, checkpoint {est.checkpoint_bytes / 1e12:.2f} TB written in "
      f"{est.write_s:.1f} s, interval {est.interval_s / 60:.1f} min ({est.interval_steps} steps)")
print(f"ETTR {est.ettr:.1%}: {run.wall_s / DAY:.1f} days instead of {run.productive_s / DAY:.1f}, "
      f"{run.failures:.0f} failures and {run.planned:.0f} planned stops, cost ${est.cost_usd / 1e6:.1f}M")
for label, attr in (("checkpoint writes", "checkpoint_s"), ("lost work", "lost_s"), ("restarts", "restart_s")):
    print(f"  {label:18} {getattr(run, attr) / DAY:5.2f} days ({getattr(run, attr) / run.wall_s:.1%})")
goodput_figures.add("breakdown", breakdown_figure(est))

# %% [markdown]
# The step is simulated (dtsim's step is slower than the paper's 400 TFLOP/s per GPU, so the
# failure-free days are more than Meta's); the rest is the reliability model. Restarts, at
# the assumed 10 minutes each, dominate what failures cost; a 5.7 TB checkpoint at Tectonic's
# 2 TB/s takes seconds, so the optimal interval is minutes and checkpoints and lost work each
# cost about one percent.
#
# **Cluster size.** The job's failure rate grows with its GPUs, so the time lost grows with
# the cluster while the time to train shrinks. Below, the same job with data-parallel
# replicas added or removed (the simulated step time, tokens per step in proportion to dp;
# `scenarios/sweeps/llama3-405b-goodput-nodes.yaml` simulates each size), and one check: the
# 8,192-node job simulated whole.

# %%
nodes = [64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768]
by_nodes = [estimate(inputs.scaled(n), TOKENS, usd_per_node_hour=price) for n in nodes]
for n, e in zip(nodes, by_nodes):
    print(f"{n:6,} nodes: ETTR {e.ettr:6.1%}, {e.wall_s / DAY:7.1f} days (no failures {e.steps * e.step_time_s / DAY:7.1f}),"
          f" MTBF {e.job_mtbf_s / 3600:6.2f} h, interval {e.interval_s / 60:5.1f} min")
big = scenario.model_copy(update={"cluster": scenario.cluster.model_copy(update={"nodes": 8192}),
                                  "training": scenario.training.model_copy(update={"global_batch": 8192})})
big = simulator.Scenario.model_validate(big.model_dump(mode="json", by_alias=True))
big_est = estimate(inputs_for(big, simulator.simulate(big)), TOKENS, usd_per_node_hour=price)
scaled = by_nodes[nodes.index(8192)]
print(f"\n8,192 nodes simulated: step {big_est.step_time_s:.2f} s, ETTR {big_est.ettr:.1%}, {big_est.wall_s / DAY:.1f} days "
      f"(scaled estimate: {scaled.step_time_s:.2f} s, {scaled.ettr:.1%}, {scaled.wall_s / DAY:.1f} days)")
best = min(zip(nodes, by_nodes), key=lambda p: p[1].wall_s)
goodput_figures.add("nodes", ettr_vs_nodes_figure(nodes, by_nodes, marked=inputs.nodes))

# %%
e2k, e16k = by_nodes[nodes.index(2048)], by_nodes[nodes.index(16384)]
print(f"2,048 -> 16,384 nodes (8x GPUs): {e2k.wall_s / DAY:.1f} -> {e16k.wall_s / DAY:.1f} days, "
      f"{e2k.wall_s / e16k.wall_s:.2f}x faster instead of 8x; ETTR {e2k.ettr:.1%} -> {e16k.ettr:.1%}")
print(f"shortest time-to-train of these sizes: {best[0]:,} nodes, {best[1].wall_s / DAY:.1f} days")

# %% [markdown]
# **Checkpoint interval.** Too often wastes time writing, too rarely loses more work per
# failure. Young's first-order optimum is sqrt(2 C M); Daly's higher-order one is a little
# shorter here (C is small against M). Around the optimum ETTR is flat; an hourly
# checkpoint, common in practice, costs more at this failure rate.

# %%
intervals = [60 * m for m in (0.5, 1, 2, 4, 8, 15, 30, 60, 120, 240)]
by_interval = [estimate(inputs, TOKENS, usd_per_node_hour=price, interval_s=t) for t in intervals]
for t, e in zip(intervals, by_interval):
    print(f"every {t / 60:6.1f} min: ETTR {e.ettr:.2%}, {e.wall_s / DAY:.1f} days, lost {e.run.lost_s / DAY:.2f} d, "
          f"checkpoints {e.run.checkpoint_s / DAY:.2f} d")
hourly = by_interval[intervals.index(3600)]
print(f"\nYoung {est.young_interval_s / 60:.2f} min, Daly {est.daly_interval_s / 60:.2f} min; hourly instead of the "
      f"optimum: {(hourly.wall_s - est.wall_s) / DAY:+.2f} days, ${(hourly.cost_usd - est.cost_usd) / 1e6:+.2f}M")
goodput_figures.add("interval", ettr_vs_interval_figure([e.interval_s for e in by_interval], by_interval,
                                                       optimum_s=est.interval_s))

# %% [markdown]
# **Checkpoint store, spares and elasticity.** With a slower store (say 100 GB/s) the
# interval and the checkpoint share grow and asynchronous checkpointing earns its keep;
# when a hardware failure has to wait for a replacement (here an assumed 2-hour requeue),
# hot spares or continuing at reduced data parallelism (elastic) recover most of it.

# %%
def variant(**changes: object) -> object:
    spec = inputs.spec
    checkpoint = spec.checkpoint.model_copy(update=changes.pop("checkpoint", {}))
    return estimate(replace(inputs, spec=spec.model_copy(update={**changes, "checkpoint": checkpoint})), TOKENS,
                    usd_per_node_hour=price)


slow = {"storage_write_bandwidth": 100e9, "storage_read_bandwidth": 100e9}
cases = {
    "as above": est,
    "store at 100 GB/s": variant(checkpoint=slow),
    "store at 100 GB/s, asynchronous": variant(checkpoint={**slow, "asynchronous": True}),
    "requeue 2 h, no spares": variant(requeue_time=7200.0),
    "requeue 2 h, 16 hot spares": variant(requeue_time=7200.0, hot_spares=16),
    "requeue 2 h, elastic": variant(requeue_time=7200.0, elastic=True),
}
for label, e in cases.items():
    cost = f"${e.cost_usd / 1e6:5.1f}M" if e.cost_usd is not None else "no price"
    print(f"{label:34} ETTR {e.ettr:6.2%}, {e.wall_s / DAY:6.1f} days, interval {e.interval_s / 60:5.1f} min, {cost}")

# %% [markdown]
# **Spread.** The expectation hides how lucky a run can be. 200 seeded trials replay
# exponential failure schedules exactly (`simulator.goodput.montecarlo`).

# %%
mc = monte_carlo(inputs, est, trials=200, seed=0)
w, r = mc.spread["wall_s"], mc.spread["ettr"]
print(f"wall-clock p5 {w['p5'] / DAY:.1f}, p50 {w['p50'] / DAY:.1f}, p95 {w['p95'] / DAY:.1f} days "
      f"(expectation {est.wall_s / DAY:.1f}); ETTR p5 {r['p5']:.1%} .. p95 {r['p95']:.1%}")
fig = go.Figure(go.Bar(x=["p5", "p50", "p95"], y=[w[k] / DAY for k in ("p5", "p50", "p95")]))
fig.update_layout(title="Llama 3 405B on 16,384 H100: wall-clock over 200 seeded trials", yaxis_title="days")
goodput_figures.add("spread", fig)

# %% [markdown]
# **Against the paper.** The Llama 3 paper reports "higher than 90% effective training time"
# over its 54-day snapshot with 466 interruptions. The cell below counts the interruptions the
# model expects in 54 days on this cluster (the rates are the paper's, so they should agree)
# and finds the restart time at which the model's ETTR would fall to 90%.

# %%
snapshot_s = 54 * DAY
expected = snapshot_s / est.job_mtbf_s + snapshot_s / inputs.spec.planned_mtbf
print(f"interruptions in 54 days: {expected:.0f} (paper: 466 = 419 unexpected + 47 planned)")
low, high = 60.0, 3600.0  # restart time bisection: ETTR falls as restarts lengthen
for _ in range(40):
    mid = (low + high) / 2
    low, high = (mid, high) if variant(restart_time=mid).ettr > 0.90 else (low, mid)
print(f"ETTR {est.ettr:.1%} with {inputs.spec.restart_time / 60:.0f}-minute restarts; ETTR = 90% at "
      f"{low / 60:.1f}-minute restarts")

# %% [markdown]
# The interruption count agrees by construction. The paper does not state its restart time;
# the model with the assumed 10-minute restarts is consistent with ">90%", and says that the
# paper's figure bounds the mean restart (detection, relaunch, checkpoint read) at the value
# printed above. The paper's effective time also counts losses this model has no rate for
# (its 3 manual interventions, evaluation), and its step was faster (400 TFLOP/s per GPU
# against dtsim's simulated step), which shortens the run but not its ETTR.
#
# ![Where the wall-clock goes](figures/07-goodput-breakdown.png)
# ![ETTR and time-to-train against cluster size](figures/07-goodput-nodes.png)
# ![ETTR against the checkpoint interval](figures/07-goodput-interval.png)
# ![Wall-clock over 200 seeded trials](figures/07-goodput-spread.png)

# %%
goodput_figures.save()
