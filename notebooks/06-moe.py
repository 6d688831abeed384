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
# # Mixture of experts: expert parallelism, the network, and routing skew
#
# **Question.** Mixtral 8x7B (8 experts, 2 per token) trains on 2 p5.48xlarge (16 H100,
# NVSwitch inside a node, 32 x 100 Gb/s EFA per node). How do the expert-parallel size and
# the network change the step time, and what does an unbalanced router cost? (The network
# section uses Qwen3-30B-A3B, whose 128 experts allow an expert group wider than a node.)
#
# Every token's hidden vector goes to the GPUs that hold its 2 experts (dispatch) and comes
# back (combine): with expert parallelism those are all-to-all exchanges inside each MoE
# layer, forward and backward. All numbers below come from `simulator.simulate`; each Mixtral
# variant changes only the fields it names of the shipped scenario
# `scenarios/mixtral-8x7b-ep8-p5.yaml`.

# %%
import copy
from pathlib import Path

import plotly.graph_objects as go

import simulator
from simulator.viz.static import StaticFigures
from simulator.yamlio import load_yaml, to_plain

ROOT = Path.cwd() if (Path.cwd() / "scenarios").is_dir() else Path.cwd().parent
figures = StaticFigures(ROOT / "notebooks" / "figures", prefix="06-moe")
BASE = to_plain(load_yaml(ROOT / "scenarios" / "mixtral-8x7b-ep8-p5.yaml"))
NICS = 32  # p5.48xlarge: 32 x 100 Gb/s EFA (topologies/nodes/p5.48xlarge.yaml)


def variant(**changes: dict) -> dict:
    """The shipped scenario with some sections' fields replaced, e.g. parallelism={"ep": 4}."""
    data = copy.deepcopy(BASE)
    for section, fields in changes.items():
        data.setdefault(section, {}).update(fields)
    return data


def run(data: dict) -> simulator.Result:
    return simulator.simulate(simulator.Scenario.model_validate(data))


def expert_comm_s(r: simulator.Result) -> tuple[float, float]:
    """(in flight, exposed) seconds of the expert-parallel token exchange: the breakdown's
    communication kind ``ep`` (dispatch and combine)."""
    def is_ep(kind: str) -> bool:
        return kind == "ep" or any(word in kind for word in ("all_to_all", "alltoall", "dispatch", "combine"))

    return (sum(t for k, t in r.breakdown.comm_s.items() if is_ep(k)),
            sum(t for k, t in r.breakdown.exposed_comm_s.items() if is_ep(k)))


def describe(name: str, r: simulator.Result, base: simulator.Result | None = None) -> str:
    flight, exposed = expert_comm_s(r)
    slower = "" if base is None else f"  {r.step_time_s / base.step_time_s - 1:+7.1%}"
    oom = "  OOM" if r.oom else ""
    return (f"{name:<30} step {r.step_time_s:7.3f} s  MFU {r.mfu:6.1%}  all-to-all {flight:6.3f} s in flight, "
            f"{exposed:6.3f} s exposed ({exposed / r.step_time_s:5.1%}){slower}{oom}")


baseline = run(BASE)
print(describe("ep 8 x pp 2 (shipped)", baseline))
print("\ncommunication kinds in this breakdown:", ", ".join(sorted(baseline.breakdown.comm_s)))

# %% [markdown]
# ## Expert-parallel size
#
# With pp 2 the 8 GPUs of a stage form its data-parallel group, and the expert-parallel
# group must divide it and the 8 experts: ep 1, 2, 4 or 8. A smaller ep keeps more experts
# on each GPU (8/ep of them per layer): more memory and a smaller exchange, and the experts'
# data-parallel group (8/ep) reduces their gradients across it. Mixtral's 8 experts cap ep
# at 8, and every group of 8 consecutive ranks is one node: on 2 p5.48xlarge its all-to-all
# never leaves NVLink.

# %%
by_layout = {ep: run(variant(parallelism={"ep": ep, "pp": 2})) for ep in (1, 2, 4, 8)}
for ep, r in by_layout.items():
    print(describe(f"ep {ep} x pp 2", r, baseline) + f"  peak {r.peak_memory_bytes / 2**30:5.1f} GiB")
fits = {ep: r for ep, r in by_layout.items() if not r.oom}
best = min(fits, key=lambda ep: fits[ep].step_time_s) if fits else None
print(f"\n{len(fits)} of {len(by_layout)} expert-parallel sizes fit in memory"
      + (f"; the fastest that fits is ep {best} at {fits[best].step_time_s:.3f} s a step (MFU {fits[best].mfu:.1%})."
         if best else "."))

# %% [markdown]
# ## Tensor and expert tensor parallelism
#
# With tp 2 (and sequence parallelism, which Megatron-Core requires with MoE) attention is split
# over GPU pairs while the experts fold the same 8 GPUs of a stage into etp x ep x expert-dp.
# etp 1 keeps each expert whole on its GPU and exchanges tokens over ep only; etp 2 splits each
# expert's FFN over a pair, adding an all-gather and a reduce-scatter of the routed tokens over
# the pair around the experts, and halves the expert memory per GPU.

# %%
by_tp = {f"tp 2, ep {ep}, etp {etp}": run(variant(parallelism={"tp": 2, "sequence_parallel": True, "ep": ep,
                                                                  "etp": etp, "pp": 2}))
         for ep, etp in ((8, 1), (4, 1), (4, 2))}
for name, r in by_tp.items():
    print(describe(name, r, baseline) + f"  expert dp {r.moe.edp}  peak {r.peak_memory_bytes / 2**30:5.1f} GiB")

# %% [markdown]
# ## The network under the all-to-all
#
# Qwen3-30B-A3B has 128 experts, so on the same two nodes ep can be 8 (each expert group one
# node, the exchange on NVLink) or 16 (every group spans both nodes: 8 of each token's 16
# destinations are on the other node, behind EFA). Both layouts again with the network per
# node cut from 3,200 Gb/s to 400 and 100 (32 NICs each, a 32nd of it per NIC).

# %%
QWEN = {"name": "Qwen3-30B-A3B on 2 x p5.48xlarge", "framework": "megatron-core",
        "model": {"preset": "qwen3-30b-a3b", "seq_len": 4096}, "cluster": {"node": "p5.48xlarge", "nodes": 2},
        "parallelism": {"sharding": "zero1", "moe": {"dispatcher": "alltoall"}},
        "training": {"micro_batch": 1, "global_batch": 128, "precision": "bf16", "recompute": "full"}}
by_network: dict[str, dict[int, simulator.Result]] = {}
for ep in (8, 16):
    name = f"ep {ep}" + (" (inside a node)" if ep == 8 else " (across EFA)")
    by_network[name] = {}
    for gbps in (100, 400, 3200):
        data = copy.deepcopy(QWEN)
        data["parallelism"]["ep"] = ep
        data["cluster"]["fabric"] = {"nic_bandwidth": f"{gbps / NICS:g}Gbps"}
        by_network[name][gbps] = run(data)
for name, runs in by_network.items():
    for gbps, r in runs.items():
        print(describe(f"{name}, {gbps:>4} Gb/s", r, runs[3200]))
(inside, in_runs), (across, out_runs) = by_network.items()
print(f"\nAt 3,200 Gb/s per node, {across} takes {out_runs[3200].step_time_s / in_runs[3200].step_time_s:.2f}x the "
      f"step of {inside} (all-to-all in flight {expert_comm_s(out_runs[3200])[0]:.2f} s against "
      f"{expert_comm_s(in_runs[3200])[0]:.2f} s); at 100 Gb/s, {out_runs[100].step_time_s / in_runs[100].step_time_s:.1f}x.")
for name, runs in by_network.items():
    print(f"{name}: at 100 Gb/s per node the step takes {runs[100].step_time_s / runs[3200].step_time_s:.2f}x "
          f"the 3,200 Gb/s one (all-to-all in flight {expert_comm_s(runs[100])[0]:.2f} s against "
          f"{expert_comm_s(runs[3200])[0]:.2f} s).")

# %%
fig = go.Figure()
for name, runs in by_network.items():
    fig.add_scatter(x=list(runs), y=[r.step_time_s for r in runs.values()], mode="lines+markers", name=name)
fig.update_layout(title="Qwen3-30B-A3B on 2 x p5.48xlarge: step time against network bandwidth per node",
                  xaxis={"title": "network bandwidth per node (Gb/s)", "type": "log",
                         "tickvals": [100, 400, 3200], "ticktext": ["100", "400", "3200"]},
                  yaxis={"title": "step time (s)", "type": "log"})
figures.add("network", fig)

# %% [markdown]
# ## Routing skew
#
# A real router does not spread tokens evenly. `training.moe_routing.skew` draws each
# micro-batch's per-expert token counts from a seeded distribution (0 = perfect balance);
# the busiest expert's GEMMs and the largest all-to-all message set the pace of each MoE
# layer. Three seeds per skew give the spread of the simulated step (perfect balance needs one).
# Each Result also reports the spread over `training.moe_routing.seeds` redraws (8 by default)
# without simulating them: the slowdown's p10 and p90 and the time above balance they imply.

# %%
SKEWS = (0.0, 0.1, 0.25, 0.5)
SEEDS = range(3)
by_skew = {s: [run(variant(training={"moe_routing": {"skew": s, "seed": seed}})) for seed in (SEEDS if s else [0])]
           for s in SKEWS}
balanced = by_skew[0.0][0].step_time_s
for s, runs in by_skew.items():
    steps = [r.step_time_s for r in runs]
    print(f"skew {s:4.2f}, {len(steps)} seed(s): step {min(steps):.3f} .. {max(steps):.3f} s, mean "
          f"{sum(steps) / len(steps):.3f} s "
          f"({sum(steps) / len(steps) / balanced - 1:+.1%} vs balanced)")
worst = max(SKEWS)
mean_worst = sum(r.step_time_s for r in by_skew[worst]) / len(SEEDS)
print(f"\nAt skew {worst} routing imbalance costs {mean_worst / balanced - 1:+.1%} of the step on average over "
      f"{len(SEEDS)} seeds (spread {min(r.step_time_s for r in by_skew[worst]) / balanced - 1:+.1%} .. "
      f"{max(r.step_time_s for r in by_skew[worst]) / balanced - 1:+.1%}); MFU on active parameters falls from "
      f"{by_skew[0.0][0].mfu:.1%} to {sum(r.mfu for r in by_skew[worst]) / len(SEEDS):.1%}.")
spread = by_skew[worst][0].moe
print(f"The Result's own spread over {spread.imbalance_seeds} routing seeds (analytic, one simulation): slowdown of the "
      f"expert phase x{spread.imbalance_slowdown_p10:.3f} (p10) to x{spread.imbalance_slowdown_p90:.3f} (p90), "
      f"{spread.imbalance_s_p10:.2f} to {spread.imbalance_s_p90:.2f} s above balance per step.")

# %%
fig = go.Figure()
for s, runs in by_skew.items():
    fig.add_box(y=[r.step_time_s for r in runs], name=f"skew {s:g}", boxpoints="all")
fig.update_layout(title="Mixtral 8x7B, ep 8: step time against routing skew (3 seeds each)",
                  yaxis={"title": "step time (s)"}, showlegend=False)
figures.add("skew", fig)

# %% [markdown]
# ## Static copies of the figures
#
# The interactive figures above need JavaScript. The cell below also writes them as PNG
# images to `notebooks/figures/` when Kaleido (`kaleido>=1`, in the `notebooks` extra) and a
# Chrome or Chromium are available, and otherwise prints why it wrote none.
#
# ![Qwen3-30B-A3B step time against network bandwidth per node](figures/06-moe-network.png)
# ![Step time against routing skew](figures/06-moe-skew.png)

# %%
figures.save()
