"""``dtsim validate``: simulate every published run and nccl-tests point; print and document the errors."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer
from rich import box
from rich.table import Table

from simulator.cli.common import check_output_dir, check_output_file, console, err_console, print_table, safe

__all__ = ["validate"]


def validate(
    json_path: Annotated[Path | None, typer.Option("--json", help="write every record's result as JSON")] = None,
    docs: Annotated[Path, typer.Option("--docs", help="folder for validation.md / .svg / .html")] = Path("docs"),
    source: Annotated[list[str] | None, typer.Option("--source", help="only these sources (megatron-sc21, "
                                                     "megatron-core, llm-foundry, torchtitan, moe)")] = None,
    no_docs: Annotated[bool, typer.Option("--no-docs", help="do not write docs/validation.md")] = False,
) -> None:
    """Simulate every published training run and nccl-tests point; print and document the errors."""
    from rich.progress import Progress

    from simulator.validation.records import load_records
    from simulator.validation.report import SOURCE_NAMES, write_markdown
    from simulator.validation.runner import validate as run_validation

    check_output_file(json_path, "--json")
    if not no_docs:
        check_output_dir(docs, "--docs")
    sources = set(source) if source else None
    total = sum(1 for r in load_records() if not sources or r.source in sources)
    with Progress(console=err_console, transient=True) as progress:
        task = progress.add_task("simulating published runs", total=total)
        result = run_validation(sources=sources, progress=lambda _id: progress.advance(task))
    table = Table(title="predicted vs measured step time (seconds); peak memory reserved, GiB", title_justify="left",
                  box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False)
    for col in ("record", "GPUs", "measured", "predicted", "error", "peak", "mem err"):
        # record names fold (never an ellipsis); numbers stay whole on one line
        table.add_column(col, justify="left" if col == "record" else "right", no_wrap=col != "record",
                         overflow="fold")
    for r in result.records:
        colour = "green" if abs(r.error) <= 0.10 else "yellow" if abs(r.error) <= 0.25 else "red"
        memory_error = "-" if r.memory_error is None else f"{100 * r.memory_error:+.1f}%"
        if r.oom:
            memory_error += " [red]FALSE OOM[/]"
        table.add_row(safe(r.record.id), str(r.record.gpus), f"{r.record.measured_step_s:.3f}",
                      f"{r.predicted_step_s:.3f}", f"[{colour}]{100 * r.error:+.1f}%[/]",
                      f"{r.peak_reserved_bytes / 2**30:.1f}", memory_error)
    print_table(table)
    summary = result.summary()
    per = Table(title="mean absolute percentage error", title_justify="left")
    for col in ("source", "records", "MAPE", "worst", "false OOM", "peak memory MAPE"):
        per.add_column(col, justify="left" if col == "source" else "right", no_wrap=col != "source")

    def memory(row: dict[str, Any]) -> str:
        return f"{100 * row['memory_mape']:.1f}% ({row['memory_records']})" if "memory_mape" in row else "-"

    for name, row in summary["per_source"].items():
        per.add_row(SOURCE_NAMES.get(name, name), str(row["records"]), f"{100 * row['mape']:.1f}%",
                    f"{100 * row['max_abs_error']:.1f}%", str(row["false_oom"]), memory(row))
    o = summary["overall"]
    per.add_row("[bold]all[/]", str(o["records"]), f"[bold]{100 * o['mape']:.1f}%[/]", f"{100 * o['max_abs_error']:.1f}%",
                str(o["false_oom"]), memory(o))
    c = summary["collectives"]
    per.add_row("nccl-tests all-reduce >= 1 MiB", str(c["points"]), f"{100 * c['mape']:.1f}%",
                f"{100 * c['max_abs_error']:.1f}%", "", "")
    per.add_row("nccl-tests all-reduce < 1 MiB", str(c["small"]["points"]), f"{100 * c['small']['mape']:.1f}%",
                f"{100 * c['small']['max_abs_error']:.1f}%", "", "")
    print_table(per)
    for pair in result.fp8_pairs():
        console.print(f"fp8/bf16 speed-up {pair.fp8.record.id} vs {pair.bf16.record.id}: measured "
                      f"{pair.measured_speedup:.3f}, predicted {pair.predicted_speedup:.3f} ({100 * pair.error:+.1f}%)",
                      highlight=False)
    from simulator.validation.records import unmapped_summary

    if unmapped_summary():
        console.print(unmapped_summary(), style="dim", soft_wrap=True)
    if json_path is not None:
        data = {"summary": summary,
                "records": [{"id": r.record.id, "source": r.record.source, "gpus": r.record.gpus,
                             "measured_step_s": r.record.measured_step_s, "predicted_step_s": r.predicted_step_s,
                             "error": r.error, "mfu": r.mfu, "oom": r.oom,
                             "peak_memory_bytes": r.peak_memory_bytes,
                             "peak_allocated_bytes": r.peak_allocated_bytes,
                             "peak_reserved_bytes": r.peak_reserved_bytes,
                             "measured_peak_memory_bytes": r.record.measured_peak_memory_bytes,
                             "memory_error": r.memory_error, "stated": r.record.stated,
                             "mapping_assumptions": r.record.assumptions, "breakdown": r.breakdown,
                             "unstated": [{"setting": path, "value": value, "error": alt.error, "oom": alt.oom}
                                          for path, value, alt in result.unstated.get(r.record.id, [])]}
                            for r in result.records],
                "collectives": [{"id": c.record.id, "bytes": c.record.nbytes, "measured_s": c.record.measured_s,
                                 "predicted_s": c.predicted_s, "error": c.error, "algorithm": c.algorithm}
                                for c in result.comm]}
        json_path.write_text(json.dumps(data, indent=2))
        console.print(f"results written to {safe(json_path)}")
    if not no_docs:
        path = write_markdown(result, docs)
        console.print(f"report written to {safe(path)}")
