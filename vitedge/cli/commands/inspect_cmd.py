"""`vitedge inspect MODEL`: what vitedge understood about a model, and where each fact came from."""

from __future__ import annotations

import json

import click
from rich.console import Console
from rich.table import Table

from vitedge.cli.options import CheckedPath, with_intake
from vitedge.core.errors import UsageError
from vitedge.models.intake import load_model
from vitedge.models.presets import PRESETS
from vitedge.core.ui import literal


@click.command("inspect")
@click.argument("model", type=CheckedPath(path_type=str), required=False)
@with_intake
@click.option("--json", "as_json", is_flag=True, help="Print the spec as JSON.")
@click.option("--list-archs", is_flag=True, help="List the named presets --arch accepts.")
def command(model: str | None, intake, as_json: bool, list_archs: bool) -> None:
    """Show family, image and patch size, tokens, width, depth, heads, classes,
    parameters and preprocessing of MODEL, with where each came from
    (the file, a preset, a flag or a default)."""

    if list_archs:

        for p in PRESETS.values():
            click.echo(f"{p.name:34s} patch {p.patch_size:>2}  width {p.embed_dim:>4}  depth {p.depth:>2}  heads {p.num_heads:>2}  {p.image_size}px  {p.variant}")
        return
    if model is None:
        raise UsageError("inspect needs a MODEL path (or --list-archs)")

    loaded = load_model(model, intake)
    if as_json:
        click.echo(json.dumps(loaded.spec.to_dict(), indent=2, sort_keys=True))
        return
    print_spec(loaded)


def print_spec(loaded) -> None:

    spec = loaded.spec
    src = spec.sources
    pre = spec.preprocess
    unknown = "unknown"

    def val(v):
        return unknown if v is None else str(v)

    table = Table(title=literal(loaded.path), show_header=True, header_style="bold")
    table.add_column("field")
    table.add_column("value")
    table.add_column("from")
    h, w = spec.image_size
    rows = [
        ("family", f"{spec.family} ({spec.variant})" + (f", {spec.arch_name}" if spec.arch_name else ""), "file"),
        ("image size", f"{h} x {w}", src.get("image_size", "file")),
        ("channels", f"{pre.channels} ({pre.color_mode})", src.get("channels", "default")),
        ("patch size", val(spec.patch_size), src.get("patch_size", "file")),
        ("tokens", val(spec.num_tokens) + (f" ({spec.grid[0]}x{spec.grid[1]} patches + {spec.num_prefix_tokens} prefix)" if spec.num_tokens else ""), src.get("patch_size", "file")),
        ("embedding width", val(spec.embed_dim), src.get("embed_dim", "file")),
        ("depth", val(spec.depth), src.get("depth", "file")),
        ("heads", val(spec.num_heads), src.get("num_heads", "file") if spec.num_heads else "-"),
        ("output", "embedding (no classification head)" if spec.output_kind == "embedding" else f"{val(spec.num_classes)} classes", src.get("num_classes", "file")),
        ("parameters", f"{spec.num_params:,}" if spec.num_params else unknown, "file"),
        ("resize", f"to cover {pre.resize_size[0]} x {pre.resize_size[1]} (crop_pct {pre.crop_pct:g}), {pre.interpolation}", src.get("preprocess", "default")),
        ("crop", f"centre {pre.crop_size[0]} x {pre.crop_size[1]}", src.get("preprocess", "default")),
        ("mean", ", ".join(f"{m:.4g}" for m in pre.mean), src.get("preprocess", "default")),
        ("std", ", ".join(f"{s:.4g}" for s in pre.std), src.get("preprocess", "default")),
    ]
    if spec.class_names:
        names = ", ".join(spec.class_names[:8]) + (" ..." if len(spec.class_names) > 8 else "")
        rows.append(("class names", names, "file"))
    for row in rows:
        table.add_row(*(literal(cell) for cell in row))  # class names and the rest come from the model file
    Console().print(table)
