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
# # Mixture of experts: expert parallelism, the network, routing skew, DeepEP and DualPipe
#
# **Question.** Mixtral 8x7B (8 experts, 2 per token) trains on 2 p5.48xlarge (16 H100,
# NVSwitch inside a node, 32 x 100 Gb/s EFA per node). How do the expert-parallel size and
# the network change the step time, and what does an unbalanced router cost? (The network
# section uses Qwen3-30B-A3B, whose 128 experts allow an expert group wider than a node.)
# The last section asks what DeepSeek's DeepEP kernels and DualPipe schedule buy, and at what
# memory cost, on a reduced DeepSeek-V3 on 4 DGX H800.
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
from plotly.subplots import make_subplots

import simulator
from simulator.cluster.mesh import mesh_for
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
    communication kind ``ep`` (the alltoall dispatcher's dispatch and combine), or ``tp_ep``
    (the allgather and deepep dispatchers' exchange over Megatron-Core's etp x ep group)."""
    def is_ep(kind: str) -> bool:
        return kind in ("ep", "tp_ep") or any(word in kind for word in ("all_to_all", "alltoall", "dispatch", "combine"))

    return (sum(t for k, t in r.breakdown.comm_s.items() if is_ep(k)),
            sum(t for k, t in r.breakdown.exposed_comm_s.items() if is_ep(k)))


def ep_nodes(data: dict) -> int:
    """How many nodes rank 0's expert-parallel group spans (dtsim's rank placement: mesh_for)."""
    sc = simulator.Scenario.model_validate(data)
    return len({r // sc.cluster.node_type.gpus for r in mesh_for(sc).expert_group(0, "ep")})


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
# at 8. Whether an expert group stays inside a node depends on where dtsim places the ranks
# of a pipeline stage; the cell prints how many nodes each group spans.

# %%
by_layout = {ep: run(variant(parallelism={"ep": ep, "pp": 2})) for ep in (1, 2, 4, 8)}
for ep, r in by_layout.items():
    print(describe(f"ep {ep} x pp 2", r, baseline) + f"  peak {r.peak_memory_bytes / 2**30:5.1f} GiB"
          + f"  expert group spans {ep_nodes(variant(parallelism={'ep': ep, 'pp': 2}))} node(s)")
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
# ## DeepEP's dispatch and DualPipe
#
# DeepSeek-V3 trains with two pieces of its own around the expert exchange (arXiv:2412.19437
# §3.2): DeepEP's kernels (`parallelism.moe.dispatcher: deepep`) send a token once to each
# destination GPU inside a node over NVLink and once to each destination node over InfiniBand,
# where it is forwarded over NVLink, instead of once per chosen expert; `fp8_dispatch` sends the
# dispatch (not the combine) in fp8 with a scale per 128 elements. DualPipe
# (`pipeline_schedule: dualpipe`) feeds micro-batches in from both ends of the pipeline and pairs
# one micro-batch's forward with another's backward, so each one's dispatch and combine run
# beside the other's compute; every rank then holds two pipeline stages. DeepEP's internode
# kernels need InfiniBand (dtsim refuses them on EFA), so this section leaves the p5 scenario for
# a DeepSeek-V3 cut down so that each simulation is cheap: the `deepseek-v3` preset
# (multi-head latent attention, sigmoid router, a first dense block) with the widths below, on 4
# DGX H800 (8 x 400 Gb/s InfiniBand a node), pp 2 (stage 0 takes the embedding, the dense block
# and 4 MoE blocks, stage 1 the other 3 and the head), ZeRO-1, no recomputation, 16 micro-batches
# a pipeline. dtsim places a pipeline stage's ranks every pp-th GPU (pp inside dp,
# `simulator/cluster/mesh.py`), so with pp 2 a node holds 4 ranks of each stage: expert
# parallelism 4 keeps each expert group in one node, 16 spreads it over all four (the cell
# prints the count).
# `overlap_ep_comm` stays off, so whatever DualPipe hides is its own doing.

# %%
SMALL_DEEPSEEK = {"preset": "deepseek-v3", "layers": 8, "hidden": 2048, "heads": 16, "ffn_hidden": 10944,
                  "experts": 64, "experts_per_token": 6, "shared_experts": 2, "expert_ffn_hidden": 1408,
                  "moe_layers": {"first_dense": 1}}
DISPATCH = {"alltoall": {"dispatcher": "alltoall"}, "deepep": {"dispatcher": "deepep"},
            "deepep fp8": {"dispatcher": "deepep", "fp8_dispatch": True}}
H800_NODES, H800_PP = 4, 2


def deepseek_like(ep: int, dispatch: str, schedule: str) -> dict:
    return {"name": f"reduced DeepSeek-V3, ep {ep}, {dispatch}, {schedule}", "framework": "megatron-core",
            "model": SMALL_DEEPSEEK, "cluster": {"node": "dgx-h800", "nodes": H800_NODES},
            "parallelism": {"pp": H800_PP, "ep": ep, "stage_layers": [5, 3], "sharding": "zero1",
                            "pipeline_schedule": schedule, "moe": {**DISPATCH[dispatch], "overlap_ep_comm": False}},
            "training": {"micro_batch": 1, "global_batch": 16 * H800_NODES * 8 // H800_PP, "precision": "bf16",
                         "recompute": "none"}}


EP_PLACES = {ep: f"ep {ep} ({n} node{'s' if n > 1 else ''})"
             for ep in (4, 16) for n in [ep_nodes(deepseek_like(ep, "alltoall", "1f1b"))]}
SCHEDULES = ("1f1b", "dualpipe")
by_kernel = {(ep, d, sched): run(deepseek_like(ep, d, sched)) for ep in EP_PLACES for d in DISPATCH for sched in SCHEDULES}
ref = by_kernel[(4, "alltoall", "1f1b")]
print(f"reduced DeepSeek-V3: {ref.moe.params_total / 1e9:.2f} B parameters, {ref.moe.params_active / 1e9:.2f} B active "
      f"a token; {H800_NODES * 8} H800, pp {H800_PP}\n")
for (ep, d, sched), r in by_kernel.items():
    print(describe(f"ep {ep:>2}, {d:<10}, {sched:<8}", r, ref) + f"  peak {r.peak_memory_bytes / 2**30:5.1f} GiB")

# %%
def pct(new: simulator.Result, old: simulator.Result) -> str:
    return f"{new.step_time_s / old.step_time_s - 1:+.1%}"


for ep, place in EP_PLACES.items():
    a2a, deepep, fp8 = (by_kernel[(ep, d, "1f1b")] for d in DISPATCH)
    print(f"{place}, 1F1B: DeepEP changes the step by {pct(deepep, a2a)} against the alltoall dispatcher "
          f"({a2a.step_time_s:.3f} -> {deepep.step_time_s:.3f} s; exposed dispatch/combine "
          f"{expert_comm_s(a2a)[1]:.3f} -> {expert_comm_s(deepep)[1]:.3f} s), and fp8 dispatch by a further "
          f"{pct(fp8, deepep)} (exposed {expert_comm_s(fp8)[1]:.3f} s).")
cross = {d: by_kernel[(16, d, "1f1b")].step_time_s / by_kernel[(4, d, "1f1b")].step_time_s for d in DISPATCH}
print(f"{EP_PLACES[16]} against {EP_PLACES[4]}, 1F1B: " +
      ", ".join(f"{ratio - 1:+.1%} with {d}" for d, ratio in cross.items()) + ".")
for ep, place in EP_PLACES.items():
    for d in DISPATCH:
        one, dual = by_kernel[(ep, d, "1f1b")], by_kernel[(ep, d, "dualpipe")]
        print(f"{place}, {d}: DualPipe {pct(dual, one)} step ({one.step_time_s:.3f} -> {dual.step_time_s:.3f} s; "
              f"exposed dispatch/combine {expert_comm_s(one)[1]:.3f} -> {expert_comm_s(dual)[1]:.3f} s, pipeline "
              f"bubble {one.breakdown.bubble_s:.3f} -> {dual.breakdown.bubble_s:.3f} s) for "
              f"{dual.peak_memory_bytes / one.peak_memory_bytes:.2f}x the peak memory "
              f"({one.peak_memory_bytes / 2**30:.1f} -> {dual.peak_memory_bytes / 2**30:.1f} GiB).")
print(f"At pp {H800_PP} DualPipe's bubble, (pp/2 - 1)(F&B + B - 3W) (arXiv:2412.19437 Table 2), has "
      f"{H800_PP // 2 - 1} slots: rank 0 idles "
      f"{max(by_kernel[(ep, d, 'dualpipe')].breakdown.bubble_s for ep in EP_PLACES for d in DISPATCH):.3f} s at most "
      f"in the pipeline bubble against "
      f"{min(by_kernel[(ep, d, '1f1b')].breakdown.bubble_s for ep in EP_PLACES for d in DISPATCH):.3f} s or more "
      f"under 1F1B; each rank holds both stages, hence the memory.")
fastest = min(by_kernel, key=lambda key: by_kernel[key].step_time_s)
print(f"\nFastest: ep {fastest[0]}, {fastest[1]}, {fastest[2]}, {by_kernel[fastest].step_time_s:.3f} s a step, "
      f"{1 - by_kernel[fastest].step_time_s / ref.step_time_s:.1%} under {EP_PLACES[4]} with the alltoall dispatcher and 1F1B "
      f"({ref.step_time_s:.3f} s), at {by_kernel[fastest].peak_memory_bytes / 2**30:.1f} GiB peak against "
      f"{ref.peak_memory_bytes / 2**30:.1f} GiB.")

# %%
# one hue per expert placement, light for 1F1B and dark for DualPipe
PALETTE = {(4, "1f1b"): "#9ecae1", (4, "dualpipe"): "#2171b5", (16, "1f1b"): "#fdae6b", (16, "dualpipe"): "#d94801"}
fig = make_subplots(rows=1, cols=2, subplot_titles=("step time", "exposed dispatch/combine"))
for ep, place in EP_PLACES.items():
    for sched in SCHEDULES:
        runs = [by_kernel[(ep, d, sched)] for d in DISPATCH]
        name = f"{place}, {sched}"
        fig.add_bar(x=list(DISPATCH), y=[r.step_time_s for r in runs], name=name, legendgroup=name,
                    marker_color=PALETTE[(ep, sched)], row=1, col=1)
        fig.add_bar(x=list(DISPATCH), y=[expert_comm_s(r)[1] for r in runs], name=name, legendgroup=name,
                    marker_color=PALETTE[(ep, sched)], showlegend=False, row=1, col=2)
fig.update_layout(title=f"Reduced DeepSeek-V3, {H800_NODES} x DGX H800, pp {H800_PP}", barmode="group",
                  legend={"orientation": "h", "y": -0.15})
fig.update_yaxes(title_text="time (s)", rangemode="tozero")
figures.add("deepep", fig)

# %% [markdown]
# ## Static copies of the figures
#
# The interactive figures above need JavaScript. The cell below also writes them as PNG
# images to `notebooks/figures/` when Kaleido (`kaleido>=1`, in the `notebooks` extra) and a
# Chrome or Chromium are available, and otherwise prints why it wrote none.
#
# ![Qwen3-30B-A3B step time against network bandwidth per node](figures/06-moe-network.png)
# ![Step time against routing skew](figures/06-moe-skew.png)
# ![Reduced DeepSeek-V3: step time and exposed dispatch/combine by dispatcher, expert placement and schedule](figures/06-moe-deepep.png)

# %%
figures.save()
