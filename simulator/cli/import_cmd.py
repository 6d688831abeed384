"""``dtsim import``: write a scenario YAML from a framework's own configuration.

Four sub-commands of ``dtsim import`` (shared/CONTRACT.md):
``megatron --node NODE --nodes N [--out FILE] -- <pretrain_gpt.py arguments>``,
``torchtitan JOB.toml --node NODE --nodes N [--out FILE]``,
``deepspeed DS_CONFIG.json --model HF_CONFIG.json --node NODE --nodes N [--out FILE]`` and
``nemo CONFIG.yaml --node NODE --nodes N [--out FILE]``.
The mapping lives in :mod:`simulator.importers`; this module reads files, checks that the
written scenario validates, and prints or writes it. Contradictions and bad files exit 2.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from simulator.cli.common import check_output_file, cluster_spec, console, fail, guard, printable, safe

__all__ = ["import_app"]

import_app = typer.Typer(
    name="import", no_args_is_help=True, add_completion=False,
    help="Write a scenario from a framework's config: megatron (pretrain_gpt.py arguments), torchtitan (job "
         "TOML), deepspeed (ds_config.json + HF config.json), nemo (Megatron GPT training YAML). Unused inputs are listed in the file's header.")

Node = Annotated[str, typer.Option("--node", help="node type (e.g. dgx-a100) or a node YAML file")]
Nodes = Annotated[int, typer.Option("--nodes", min=1, help="number of nodes")]
Out = Annotated[Path | None, typer.Option("--out", help="write the scenario here (default: stdout)")]


def _cluster(node: str, nodes: int) -> tuple[dict[str, Any], int, str]:
    spec = guard(lambda: cluster_spec({"node": node, "nodes": nodes}))
    where = f"--nodes {nodes} x {spec.gpus_in_node} GPUs of {spec.node_type.name}"
    return {"node": node, "nodes": nodes}, spec.world_size, where


def _read(path: Path, what: str) -> str:
    """The text of the config file: a regular UTF-8 file within the ``file_bytes`` limit (never
    a FIFO or device read without end: :func:`simulator.safe_input.read_text`)."""
    from simulator.safe_input import read_text

    text: str = guard(lambda: read_text(path, expected=f"the {what}"))
    return text


def _emit(make: Any, out: Path | None) -> None:
    """Build the import, validate the scenario it writes, print it or write it to ``out``."""
    from simulator.importers import render
    from simulator.scenario import Scenario

    check_output_file(out, "--out")
    imported = guard(make)
    guard(lambda: Scenario.model_validate(imported.scenario))
    text = render(imported)
    if out is None:
        typer.echo("\n".join(printable(line) for line in text.split("\n")), nl=False)
        return
    try:
        out.write_text(text, encoding="utf-8")
    except OSError as exc:
        fail(f"{out}: cannot write: {exc.strerror or exc}")
    console.print(f"wrote {safe(out)} ({len(imported.ignored)} input(s) ignored, listed in its header)", highlight=False)


@import_app.command(context_settings={"ignore_unknown_options": True, "allow_extra_args": True})
def megatron(
    node: Node,
    nodes: Nodes,
    arguments: Annotated[list[str] | None, typer.Argument(help="pretrain_gpt.py arguments, after --")] = None,
    out: Out = None,
) -> None:
    """Megatron-LM / Megatron-Core pretrain_gpt.py arguments (after --) -> scenario."""
    from simulator.importers import import_megatron

    cluster, world, where = _cluster(node, nodes)
    _emit(lambda: import_megatron(list(arguments or []), cluster=cluster, world=world, where=where), out)


@import_app.command()
def torchtitan(
    job: Annotated[Path, typer.Argument(help="torchtitan job TOML (e.g. llama3_8b.toml)")],
    node: Node,
    nodes: Nodes,
    out: Out = None,
) -> None:
    """torchtitan job TOML -> scenario (FSDP2/HSDP, TP, PP, CP, activation checkpointing, float8)."""
    from simulator.importers import import_torchtitan

    cluster, world, where = _cluster(node, nodes)
    text = _read(job, "torchtitan job TOML")
    _emit(lambda: import_torchtitan(text, source=str(job), cluster=cluster, world=world, where=where), out)


@import_app.command()
def deepspeed(
    config: Annotated[Path, typer.Argument(help="DeepSpeed ds_config.json")],
    model: Annotated[Path, typer.Option("--model", help="Hugging Face config.json of the model")],
    node: Node,
    nodes: Nodes,
    seq_len: Annotated[int | None, typer.Option("--seq-len", min=1, help="sequence length (default: "
                                                "max_position_embeddings)")] = None,
    out: Out = None,
) -> None:
    """DeepSpeed ds_config.json + HF config.json -> scenario (ZeRO stage, buckets, offload, precision)."""
    from simulator.importers import import_deepspeed

    cluster, world, where = _cluster(node, nodes)
    ds_text, hf_text = _read(config, "DeepSpeed config"), _read(model, "model config")
    _emit(lambda: import_deepspeed(ds_text, hf_text, ds_source=str(config), hf_source=str(model), cluster=cluster,
                                   world=world, where=where, seq_len=seq_len), out)


@import_app.command()
def nemo(
    config: Annotated[Path, typer.Argument(help="NeMo Megatron GPT training YAML (megatron_gpt_config.yaml format, "
                                           "or a NeMo-Framework-Launcher conf/training file)")],
    node: Node,
    nodes: Nodes,
    vocab_size: Annotated[int | None, typer.Option("--vocab-size", min=1, help="the tokenizer's vocabulary before "
                                                   "padding (needed unless the file names GPT-2 BPE or Llama 3)")] = None,
    out: Out = None,
) -> None:
    """NeMo Megatron GPT training YAML -> scenario (TP/PP/CP/SP, distributed optimizer, recomputation, fp8)."""
    from simulator.importers import import_nemo

    cluster, world, where = _cluster(node, nodes)
    text = _read(config, "NeMo training config")
    _emit(lambda: import_nemo(text, source=str(config), cluster=cluster, world=world, where=where,
                              vocab_size=vocab_size), out)
