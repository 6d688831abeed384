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
# the network change the step time, and what does an unbalanced router cost?
#
# Every token's hidden vector goes to the GPUs that hold its 2 experts (dispatch) and comes
# back (combine): with expert parallelism those are all-to-all exchanges inside each MoE
# layer, forward and backward. All numbers below come from `simulator.simulate`; each variant
# changes only the fields it names of the shipped scenario `scenarios/mixtral-8x7b-ep8-p5.yaml`.

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
    communication kinds that name the all-to-all, dispatch or combine."""
    def is_ep(kind: str) -> bool:
        return any(word in kind.replace("-", "_") for word in ("all_to_all", "alltoall", "dispatch", "combine"))

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
# group must divide it: ep 1, 2, 4 or 8. A smaller ep keeps more experts on each GPU
# (8/ep of them per layer), so more memory and no exchange outside the group; ep 16 needs
# pp 1 and puts half of every all-to-all on EFA.

# %%
layouts = {f"ep {ep} x pp 2": variant(parallelism={"ep": ep, "pp": 2}) for ep in (1, 2, 4, 8)}
layouts["ep 16 x pp 1"] = variant(parallelism={"ep": 16, "pp": 1})
by_layout = {name: run(data) for name, data in layouts.items()}
for name, r in by_layout.items():
    print(describe(name, r, baseline))
fits = {name: r for name, r in by_layout.items() if not r.oom}
best = min(fits, key=lambda n: fits[n].step_time_s) if fits else None
cross = by_layout["ep 16 x pp 1"]
print(f"\n{len(fits)} of {len(by_layout)} layouts fit in memory"
      + (f"; the fastest that fits is {best} at {fits[best].step_time_s:.3f} s a step (MFU {fits[best].mfu:.1%})."
         if best else "."))
print(f"ep 16 (the exchange crosses EFA) against ep 8 (inside a node): all-to-all in flight "
      f"{expert_comm_s(cross)[0]:.3f} s vs {expert_comm_s(baseline)[0]:.3f} s, step "
      f"{cross.step_time_s / baseline.step_time_s - 1:+.1%}.")

# %% [markdown]
# ## The network between the two nodes
#
# ep 8 keeps the all-to-all on NVLink, so the scale-out network carries only the gradient
# reduction (and the pipeline's activations); ep 16 sends half of every exchange through it.
# Each layout again with the network per node cut from 3,200 Gb/s to 400 and 100.

# %%
by_network: dict[str, dict[int, simulator.Result]] = {}
for name in ("ep 8 x pp 2", "ep 16 x pp 1"):
    by_network[name] = {}
    for gbps in (100, 400, 3200):
        data = copy.deepcopy(layouts[name])
        data["cluster"]["fabric"] = {"nic_bandwidth": f"{gbps / NICS:g}Gbps"}
        by_network[name][gbps] = run(data)
        print(describe(f"{name}, {gbps:>4} Gb/s per node", by_network[name][gbps], by_network[name][3200]))
for name, runs in by_network.items():
    print(f"{name}: at 100 Gb/s per node the step takes {runs[100].step_time_s / runs[3200].step_time_s:.2f}x "
          f"the 3,200 Gb/s one (exposed all-to-all {expert_comm_s(runs[100])[1]:.3f} s vs "
          f"{expert_comm_s(runs[3200])[1]:.3f} s).")

# %%
fig = go.Figure()
for name, runs in by_network.items():
    fig.add_scatter(x=list(runs), y=[r.step_time_s for r in runs.values()], mode="lines+markers", name=name)
fig.update_layout(title="Mixtral 8x7B on 2 x p5.48xlarge: step time against network bandwidth per node",
                  xaxis={"title": "network bandwidth per node (Gb/s)", "type": "log",
                         "tickvals": [100, 400, 3200], "ticktext": ["100", "400", "3200"]},
                  yaxis={"title": "step time (s)", "rangemode": "tozero"})
figures.add("network", fig)

# %% [markdown]
# ## Routing skew
#
# A real router does not spread tokens evenly. `training.moe_routing.skew` draws each
# micro-batch's per-expert token counts from a seeded distribution (0 = perfect balance);
# the busiest expert's GEMMs and the largest all-to-all message set the pace of each MoE
# layer. Five seeds per skew give the spread. (The MoE-specific Result fields, such as the
# expected slowdown against perfect balance that dtsim reports, say the same per run; here
# only the step time is compared.)

# %%
SKEWS = (0.0, 0.25, 0.5, 1.0)
SEEDS = range(5)
by_skew = {s: [run(variant(training={"moe_routing": {"skew": s, "seed": seed}})) for seed in SEEDS]
           for s in SKEWS}
balanced = by_skew[0.0][0].step_time_s
for s, runs in by_skew.items():
    steps = [r.step_time_s for r in runs]
    print(f"skew {s:4.2f}: step {min(steps):.3f} .. {max(steps):.3f} s, mean {sum(steps) / len(steps):.3f} s "
          f"({sum(steps) / len(steps) / balanced - 1:+.1%} vs balanced)")
worst = max(SKEWS)
mean_worst = sum(r.step_time_s for r in by_skew[worst]) / len(SEEDS)
print(f"\nAt skew {worst} routing imbalance costs {mean_worst / balanced - 1:+.1%} of the step on average over "
      f"{len(SEEDS)} seeds (spread {min(r.step_time_s for r in by_skew[worst]) / balanced - 1:+.1%} .. "
      f"{max(r.step_time_s for r in by_skew[worst]) / balanced - 1:+.1%}); MFU on active parameters falls from "
      f"{by_skew[0.0][0].mfu:.1%} to {sum(r.mfu for r in by_skew[worst]) / len(SEEDS):.1%}.")

# %%
fig = go.Figure()
for s, runs in by_skew.items():
    fig.add_box(y=[r.step_time_s for r in runs], name=f"skew {s:g}", boxpoints="all")
fig.update_layout(title="Mixtral 8x7B, ep 8: step time against routing skew (5 seeds each)",
                  yaxis={"title": "step time (s)"}, showlegend=False)
figures.add("skew", fig)

# %% [markdown]
# ## Static copies of the figures
#
# The interactive figures above need JavaScript. The cell below also writes them as PNG
# images to `notebooks/figures/` when Kaleido (`kaleido>=1`, in the `notebooks` extra) and a
# Chrome or Chromium are available, and otherwise prints why it wrote none.
#
# ![Step time against network bandwidth per node](figures/06-moe-network.png)
# ![Step time against routing skew](figures/06-moe-skew.png)

# %%
figures.save()
