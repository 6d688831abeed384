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
# # Network what-ifs: what the scale-out network costs a training job
#
# **Question.** A GPT-3 13B job trains with ZeRO-3 on 16 p4d.24xlarge (128 A100-40GB, four
# 100 Gb/s EFA NICs per node). ZeRO-3 gathers every layer's parameters over the network
# twice per micro-batch and reduce-scatters the gradients, so the network matters. What does
# the job lose on plain TCP instead of EFA? With 100, 400 or 3200 Gb/s per node? On a fat tree
# whose leaves are 2:1 or 4:1 oversubscribed? And what do the collectives themselves look
# like, nccl-tests style?
#
# All numbers come from `simulator.simulate` and `simulator.simulate_collective`; each
# variant changes only `cluster.fabric` fields of the same scenario.

# %%
from pathlib import Path

import plotly.graph_objects as go

import simulator
from simulator.costs.collectives import bus_bandwidth_factor
from simulator.viz.collective import bus_bandwidth_figure
from simulator.viz.static import StaticFigures

ROOT = Path.cwd() if (Path.cwd() / "scenarios").is_dir() else Path.cwd().parent
figures = StaticFigures(ROOT / "notebooks" / "figures", prefix="05-network-what-ifs")

BASE = {
    "name": "GPT-3 13B ZeRO-3 on 16 x p4d.24xlarge",
    "model": "gpt3-13b",
    "cluster": {"node": "p4d.24xlarge", "nodes": 16},
    "parallelism": {"sharding": "zero3"},
    "training": {"micro_batch": 4, "global_batch": 1024, "precision": "bf16", "recompute": "full"},
}
NICS = 4  # p4d.24xlarge: 4 x 100 Gb/s EFA


def run(fabric: dict) -> simulator.Result:
    data = {**BASE, "cluster": {**BASE["cluster"], "fabric": fabric}}
    return simulator.simulate(simulator.Scenario.model_validate(data))


def describe(name: str, r: simulator.Result, base: simulator.Result | None = None) -> str:
    exposed = sum(r.breakdown.exposed_comm_s.values())
    slower = "" if base is None else f"  {r.step_time_s / base.step_time_s - 1:+7.1%}"
    return (f"{name:<28} step {r.step_time_s:7.2f} s  MFU {r.mfu:6.1%}  exposed comm {exposed:6.2f} s "
            f"({exposed / r.step_time_s:5.1%}){slower}")


baseline = run({})
print(describe("EFA 4 x 100 Gb/s (p4d)", baseline))

# %% [markdown]
# ## EFA against TCP
#
# The same NICs driven by NCCL's socket transport: the kernel TCP stack reaches a fraction of
# line rate per flow and adds tens of microseconds per message (the efficiency and latency
# come from `topologies/transports.yaml`, with their sources).

# %%
tcp = run({"transport": "ethernet-tcp"})
print(describe("EFA", baseline))
print(describe("TCP, same NICs", tcp, baseline))
print(f"\nOn TCP the step takes {tcp.step_time_s / baseline.step_time_s:.2f}x as long: the parameter all-gathers "
      f"no longer hide behind compute (exposed communication {sum(tcp.breakdown.exposed_comm_s.values()):.1f} s "
      f"against {sum(baseline.breakdown.exposed_comm_s.values()):.1f} s).")

# %% [markdown]
# ## Bandwidth per node: 100, 400, 3200 Gb/s
#
# The node keeps its four NICs; each gets a quarter of the total.

# %%
by_bandwidth = {}
for gbps in (100, 200, 400, 800, 1600, 3200):
    by_bandwidth[gbps] = run({"nic_bandwidth": f"{gbps / NICS:g}Gbps"})
for gbps, r in by_bandwidth.items():
    print(describe(f"{gbps:>5} Gb/s per node", r, by_bandwidth[400]))
knee = next((g for g, r in by_bandwidth.items()
             if r.step_time_s <= 1.05 * by_bandwidth[3200].step_time_s), 3200)
print(f"\nFrom {knee} Gb/s per node the step is within 5% of the 3200 Gb/s one: beyond that the "
      f"network hides behind compute. At 100 Gb/s it takes "
      f"{by_bandwidth[100].step_time_s / by_bandwidth[400].step_time_s:.2f}x the 400 Gb/s step.")

# %%
fig = go.Figure()
fig.add_scatter(x=list(by_bandwidth), y=[r.tokens_per_s for r in by_bandwidth.values()], mode="lines+markers",
                name="tokens/s")
fig.update_layout(title="GPT-3 13B ZeRO-3, 128 A100: throughput against network bandwidth per node",
                  xaxis={"title": "network bandwidth per node (Gb/s, 1 Gb/s = 1e9 bit/s)", "type": "log",
                         "tickvals": list(by_bandwidth), "ticktext": [f"{g:g}" for g in by_bandwidth]},
                  yaxis={"title": "tokens/s", "rangemode": "tozero"})
figures.add("bandwidth", fig)

# %% [markdown]
# ## Oversubscribed fabrics
#
# A fat tree's leaf switch gives half its ports to nodes and half to spine uplinks;
# oversubscription r keeps only 1/r of the uplinks. NCCL's rings visit the nodes in order,
# so a ring leaves a leaf once and enters it once: with 64-port switches (8 p4d nodes of 4
# NICs under a leaf) the 16 nodes span two leaves and few flows need the spine. With small
# 16-port switches (2 nodes per leaf, 8 leaves) each leaf's ring crossings need 4 uplinks
# per direction, and a 4:1 leaf has only 2.

# %%
by_fabric = {}
for radix in (64, 16):
    for ratio in (1.0, 2.0, 4.0):
        by_fabric[radix, ratio] = run({"switch_radix": radix, "oversubscription": ratio})
for (radix, ratio), r in by_fabric.items():
    busiest = r.links[0]
    print(describe(f"{radix}-port, {ratio:g}:1", r, by_fabric[radix, 1.0])
          + f"  busiest {busiest.label} {busiest.utilisation:.0%}")
hurt = by_fabric[16, 4.0].step_time_s / by_fabric[16, 1.0].step_time_s - 1
calm = by_fabric[64, 4.0].step_time_s / by_fabric[64, 1.0].step_time_s - 1
print(f"\n4:1 oversubscription costs {calm:+.1%} with two big leaves and {hurt:+.1%} with eight small ones: "
      f"what matters is how many ring hops cross a leaf's uplinks, not the ratio alone.")

# %% [markdown]
# ## The collectives themselves (nccl-tests style)
#
# `simulate_collective` times one collective over all GPUs of a cluster; bus bandwidth
# follows nccl-tests: algorithm bandwidth times 2(n-1)/n for all-reduce.

# %%
sizes = [2**k for k in range(20, 31, 2)]  # 1 MiB .. 1 GiB
clusters = {
    "2 x p4d EFA": {"node": "p4d.24xlarge", "nodes": 2},
    "2 x p4d TCP": {"node": "p4d.24xlarge", "nodes": 2, "fabric": {"transport": "ethernet-tcp"}},
    "2 x p5 EFA (3200 Gb/s)": {"node": "p5.48xlarge", "nodes": 2},
}
curves = {}
for name, cluster in clusters.items():
    factor = bus_bandwidth_factor("all_reduce", 16)  # 2 (n - 1) / n, as nccl-tests
    curves[name] = [(s, s / simulator.simulate_collective(cluster=cluster, op="all_reduce", nbytes=s) * factor)
                    for s in sizes]
    busbw = [bw / 1e9 for _, bw in curves[name]]
    print(f"{name:<24} all-reduce bus bandwidth: 1 MiB {busbw[0]:6.1f} GB/s, 1 GiB {busbw[-1]:6.1f} GB/s")
figures.add("busbw", bus_bandwidth_figure(curves, title="all-reduce bus bandwidth over 16 GPUs"))

# %% [markdown]
# ## Static copies of the figures
#
# The interactive figures above need JavaScript. The cell below also writes them as PNG
# images to `notebooks/figures/` when Kaleido (`kaleido>=1`, in the `notebooks` extra) and a
# Chrome or Chromium are available, and otherwise prints why it wrote none; GitHub and
# nbconvert show the copies below.
#
# ![Throughput against network bandwidth per node](figures/05-network-what-ifs-bandwidth.png)
# ![All-reduce bus bandwidth against message size](figures/05-network-what-ifs-busbw.png)

# %%
figures.save()
