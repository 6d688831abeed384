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
# # Calibrate: measure this machine, check the model against it, use the profile
#
# **Question.** How fast is the device in front of us (a GPU where there is one, else the
# CPU) at the kernels a transformer runs, how well does the simulator predict a real
# transformer block on it from those measurements (the *closed loop*), and how does a
# measured profile change a prediction?
#
# `dtsim calibrate` times GEMMs, fused attention, memory-bound kernels and the launch
# overhead with real PyTorch, fits the efficiency tables of the simulator's roofline model,
# and then runs a real transformer block forward + backward and compares it with the
# simulator's prediction from the fitted tables. This notebook runs the `--quick` version
# (about 15 s on 2 CPU cores; a GPU takes a few seconds).

# %%
import importlib.util
import tempfile
from pathlib import Path

import plotly.graph_objects as go

import simulator
from simulator.calibrate import CalibrationOptions, run_calibration, write_profile
from simulator.scenario.calibration import builtin_profile_path, load_profile_spec
from simulator.viz.static import StaticFigures

if importlib.util.find_spec("torch") is None:
    raise SystemExit("this notebook needs PyTorch: pip install torch==2.13.0 && pip install 'dtsim[calibrate]'")
import torch

device = "cuda" if torch.cuda.is_available() else "cpu"
figures = StaticFigures((Path.cwd() if (Path.cwd() / "scenarios").is_dir() else Path.cwd().parent) / "notebooks"
                        / "figures", prefix="04-calibrate")
print(f"torch {torch.__version__}, calibrating {device}")

# %%
calibration = run_calibration(CalibrationOptions(device=device, quick=True, threads=2 if device == "cpu" else None))
profile = calibration.profile
precision = calibration.dtype
peak = profile["peak_flops"].get(precision) if profile.get("peak_flops") else None
print(f"device     {profile['device']} ({precision})")
print(f"peak       {peak or 'datasheet peak of ' + str(profile['gpu'])}")
print(f"memory     {profile.get('memory_bandwidth', 'datasheet')} x efficiency {profile['memory_efficiency']}")
print(f"launch     {profile['launch_overhead']}")
for warning in calibration.warnings:
    print(f"warning: {warning}")

# %% [markdown]
# ## The closed loop
#
# A real block (the default GPT-3 Small block, scaled down on a CPU) runs forward and
# backward in PyTorch; the simulator predicts the same block from the fitted tables. The
# error says how far the roofline-with-efficiency-tables model is from the real thing on
# this device; the split shows which kernels the prediction is made of.

# %%
loop = calibration.closed_loop
print(f"block      {loop.block.describe()}")
print(f"measured   {loop.measured.median_s * 1e3:.1f} ms (spread {loop.measured.spread:.0%})")
print(f"predicted  {loop.predicted_s * 1e3:.1f} ms: "
      + ", ".join(f"{kind} {seconds * 1e3:.1f} ms" for kind, seconds in loop.predicted_by_kind_s.items()))
if calibration.warnings:
    why = ("the warnings above apply: kernels timed while other processes shared the device make the tables "
           "slow and the comparison noisy; calibrate again on an idle machine before trusting this number")
elif loop.error_pct < 0:
    why = ("work the simulator's kernel list leaves out (layout copies around attention, bias-gradient sums, "
           "autograd bookkeeping) is the usual part of such a gap")
else:
    why = "the block's kernels overlap or fuse better in PyTorch than timed one by one"
print(f"\nThe simulator predicts this block {abs(loop.error_pct):.1f}% "
      f"{'faster' if loop.error_pct < 0 else 'slower'} than it runs: {why}.")

# %% [markdown]
# ## The measured GEMM curve against the built-in table
#
# Efficiency is the fraction of the peak a GEMM of a given size reaches. Small GEMMs cannot
# fill the device; large ones approach a ceiling below the peak. The built-in A100 table
# comes from published matmul benchmarks (its sources are in the file).

# %%
builtin = load_profile_spec(str(builtin_profile_path("a100-80gb")))
curve = profile["gemm"][precision]
fig = go.Figure()
fig.add_scatter(x=[10**x for x in curve["log10_flops"]], y=curve["efficiency"], mode="lines+markers",
                name=f"measured: {profile['device']} {precision}")
ref = builtin.gemm["bf16"]
fig.add_scatter(x=[10**x for x in ref.log10_flops], y=ref.efficiency, mode="lines", name="built-in: A100 80GB bf16",
                line={"dash": "dash"})
fig.update_layout(title="GEMM efficiency against size",
                  xaxis={"title": "FLOP per GEMM (2 m n k; decimal prefixes: 1G = 1e9)", "type": "log"},
                  yaxis={"title": "fraction of peak", "range": [0, 1.05]})
figures.add("gemm-efficiency", fig)

# %% [markdown]
# ## Using the profile in a simulation
#
# A profile is a YAML file; a scenario uses it with `cluster.calibration: PATH` (or
# `--set cluster.calibration=PATH`). On a GPU the profile names the catalog GPU and its
# tables replace the built-in ones. A CPU profile describes the CPU alone, so simulating with
# it answers "what if every GPU of this cluster computed like this machine": the communication
# model is unchanged, the compute is this device's. dtsim refuses a profile measured on another
# device than the cluster's GPU unless you say so: `cluster.calibration_other_device: true` (or
# `cluster.gpu: <the profile's GPU>` when the cluster really has that GPU).

# %%
ROOT = Path.cwd() if (Path.cwd() / "scenarios").is_dir() else Path.cwd().parent
path = write_profile(profile, Path(tempfile.mkdtemp()) / f"{device}.yaml")
small = ["model=gpt3-125m", "training.micro_batch=1", "training.global_batch=32"]
default = simulator.simulate(simulator.load_scenario(ROOT / "scenarios" / "quickstart.yaml", overrides=small))
measured = simulator.simulate(simulator.load_scenario(ROOT / "scenarios" / "quickstart.yaml",
                                                      overrides=[*small, f"cluster.calibration={path}",
                                                                 "cluster.calibration_other_device=true"]))
for name, r in (("built-in A100 tables", default), (f"this {device}", measured)):
    b = r.breakdown
    print(f"{name:<22} step {r.step_time_s * 1e3:10.1f} ms  compute {b.compute_s * 1e3:10.1f} ms  "
          f"exposed comm {sum(b.exposed_comm_s.values()) * 1e3:7.1f} ms")
print(f"\nWith this {device}'s kernels the same GPT-3 125M step takes {measured.step_time_s / default.step_time_s:,.0f}x "
      f"as long, and communication, hidden behind {default.breakdown.compute_s * 1e3:.0f} ms of A100 compute, "
      f"stays hidden behind {measured.breakdown.compute_s:.1f} s of this device's.")

# %% [markdown]
# ## On a GPU
#
# `dtsim calibrate --device cuda --out topologies/calibration/my-gpu.yaml` measures bf16 (or
# `--dtype fp16/fp32`) GEMMs up to 8192-wide, FlashAttention-style attention and HBM
# bandwidth; `--scenario FILE` measures that scenario's own block and GEMM shapes, and
# `--comm N` fits collectives over N local GPUs with NCCL, which then rescale the
# intra-node links. The profile records the device, driver, torch version and every raw
# measurement in its metadata.

# %% [markdown]
# ## Static copies of the figures
#
# The interactive figures above need JavaScript. The cell below also writes them as PNG
# images to `notebooks/figures/` when Kaleido (`kaleido>=1`, in the `notebooks` extra) and a
# Chrome or Chromium are available, and otherwise prints why it wrote none; GitHub and
# nbconvert show the copies below. The measured curve is that of the machine that last ran this
# notebook.
#
# ![GEMM efficiency against size](figures/04-calibrate-gemm-efficiency.png)

# %%
figures.save()
