"""The `vae-convert` command, and the only module that prints. `vae-convert MODEL --to TARGET --out DIR` converts
(MODEL is a name from `vae-convert list`); other subcommands: export, publish, info, list, check-mappings,
random-checkpoint.

Every failure is one line on stderr and a documented exit code (converter/errors.py); exit 1 is kept for bugs, whose
traceback goes to a file the message names."""

from __future__ import annotations

import os
import tempfile
import traceback
from pathlib import Path

import click

from converter.errors import ConvertError, MappingError, UsageError
from converter.registry import COMPONENT_MODELS, FAMILIES, MODELS, config_from_dict, get_model, get_models
from converter.targets import TARGETS

FORMAT_NAMES = tuple(dict.fromkeys(fmt for target in TARGETS.values() for fmt in target.formats))


class ModelGroup(click.Group):
    """`vae-convert wan2.1 ...` is `vae-convert convert wan2.1 ...`: a first word that is no subcommand is a model."""

    def resolve_command(self, ctx, args):
        if args and args[0] not in self.commands and not args[0].startswith("-"):
            return "convert", self.commands["convert"], args
        return super().resolve_command(ctx, args)


class ModelArgument(click.ParamType):
    """A model name, or `name:component` for another pipeline component than its VAE (its --component)."""

    name = "model"

    def convert(self, value, param, ctx):
        names = sorted({name for name, _ in COMPONENT_MODELS})
        if value.partition(":")[0] not in names:
            self.fail(f"{value!r} is not a model name (known: {', '.join(names)})", param, ctx)
        return value


@click.group(
    cls=ModelGroup,
    context_settings={"help_option_names": ["-h", "--help"]},
    epilog=f"Models: {', '.join(MODELS)} (`vae-convert list` says more).",
)
@click.option(
    "--version",
    is_flag=True,
    expose_value=False,
    is_eager=True,
    callback=lambda ctx, _, shown: shown and (click.echo(_versions()) or ctx.exit()),
    help="The versions of vae-convert and of what it runs with (jax, flax, orbax, torch, torchax ...).",
)
def cli():
    """Convert VAE checkpoints (diffusers' layout or the original release files, local or on the Hugging Face
    Hub) to Flax NNX (Orbax) or torchax (safetensors) weights, and back to diffusers.

    \b
      vae-convert wan2.1 --to flax --out ckpt/
      vae-convert wan2.1 --source Wan2.1_VAE.pth --to torchax --out ckpt-tx/
      vae-convert export ckpt/ --out back-to-diffusers/
    """


@cli.command()
@click.argument("model", type=ModelArgument(), metavar="MODEL")
@click.option("--to", "target", type=click.Choice(list(TARGETS)), required=True, help="Target implementation.")
@click.option("--out", type=click.Path(path_type=Path), required=True, help="Output directory (must not exist).")
@click.option(
    "--component",
    metavar="NAME",
    help="The pipeline component to convert: vae (default), audio_vae, vocoder, or all (each one the model has, into "
    "OUT/<component>/, all or nothing); `vae-convert list` shows a model's; MODEL:NAME says the same.",
)
@click.option(
    "--source",
    help="Local diffusers folder, .safetensors file, shard index, original release file (.pth/.pt), or Hub repo "
    "id[@rev].",
)
@click.option("--revision", help="Hub revision (branch, tag or commit) of the source.")
@click.option(
    "--source-format",
    metavar="NAME",
    help="The source's key layout (the family's mapping file names them: diffusers, original, ...); default: "
    "recognised from its keys.",
)
@click.option(
    "--config",
    "config_file",
    type=click.Path(path_type=Path, dir_okay=False),
    help="A config.json to use instead of the source's or the model's (keys it leaves out keep the model's).",
)
@click.option(
    "--format",
    "fmt",
    type=click.Choice(FORMAT_NAMES),
    help="Weights format: orbax (default for flax) or safetensors (default and only for torchax).",
)
@click.option(
    "--dtype",
    type=click.Choice(["auto", "float32", "bfloat16", "float16"]),
    default="auto",
    show_default=True,
    help="Output dtype; auto keeps the source's.",
)
@click.option("--offline", is_flag=True, help="Use the local Hugging Face cache only (also HF_HUB_OFFLINE=1).")
@click.option("--no-validate", "skip_validation", is_flag=True, help="Skip the decode/encode check.")
@click.option("--no-preview", is_flag=True, help="Do not draw validation.png (the picture of the validation).")
@click.option("--force", is_flag=True, help="Replace an earlier output at --out (only once the new one is complete).")
@click.option(
    "--keep-invalid", is_flag=True, help="Keep an output that fails validation (the exit code still says so)."
)
@click.option("--allow-nonfinite", is_flag=True, help="Convert weights that hold NaN or Inf instead of refusing.")
@click.option(
    "--mapping",
    "mapping_file",
    type=click.Path(path_type=Path, dir_okay=False),
    help="Use this mapping file instead of the family's (for developing mappings).",
)
@click.option("--dry-run", is_flag=True, help="Print what would be fetched and written; fetch and write nothing.")
@click.option(
    "--push-to-hub", metavar="ORG/NAME", help="Publish the output with a model card (token: HF_TOKEN or login)."
)
@click.option("--private", is_flag=True, help="With --push-to-hub: create the repo private.")
@click.option("--push-revision", metavar="BRANCH", help="With --push-to-hub: the branch to commit to.")
@click.option("--create-pr", is_flag=True, help="With --push-to-hub: open a pull request instead of committing.")
@click.option("--commit-message", help="With --push-to-hub: the commit message.")
@click.option("-v", "--verbose", is_flag=True, help="Tracebacks on errors.")
def convert(
    model,
    target,
    out,
    component,
    source,
    revision,
    source_format,
    config_file,
    fmt,
    dtype,
    offline,
    skip_validation,
    no_preview,
    force,
    keep_invalid,
    allow_nonfinite,
    mapping_file,
    dry_run,
    push_to_hub,
    private,
    push_revision,
    create_pr,
    commit_message,
    verbose,
):
    """Convert MODEL's VAE (names: `vae-convert list`), or another of its pipeline components, to --to's weights at
    --out."""

    entries = _guarded(lambda: get_models(model, component), verbose)
    if len(entries) > 1:
        given = {"--source-format": source_format, "--config": config_file, "--mapping": mapping_file}
        _guarded(lambda: _refuse_per_component_options(given, push_to_hub), verbose)

    def requests():
        from converter.pipeline import Request

        return [
            Request(
                model=entry,
                target=TARGETS[target],
                out=out if len(entries) == 1 else out / entry.component,
                source=source,
                revision=revision,
                offline=offline,
                fmt=fmt,
                dtype=dtype,
                force=force,
                validate=not skip_validation,
                preview=not no_preview,
                mapping_file=mapping_file,
                source_format=source_format,
                config_file=config_file,
                allow_nonfinite=allow_nonfinite,
                keep_invalid=keep_invalid,
                say=_say,
                progress=_progress,
            )
            for entry in entries
        ]

    if dry_run:
        from converter.pipeline import dry_run as plan

        lines = _guarded(lambda: "\n".join(plan(r) for r in requests()), verbose)
        if push_to_hub:
            lines += f"\nthen publish to https://huggingface.co/{push_to_hub}"
        click.echo(lines)
        click.echo("dry run: nothing fetched or written")
        return
    if push_to_hub:
        from converter.publish import check_write_access

        _guarded(lambda: check_write_access(push_to_hub), verbose)
    from converter.pipeline import convert_components

    summaries = _guarded(lambda: convert_components(requests(), out, force, _say), verbose)
    for summary, entry in zip(summaries, entries, strict=True):
        click.echo(_summary_line(entry.qualified if len(summaries) > 1 else model, summary))
    if push_to_hub:
        _publish(out, push_to_hub, private, push_revision, create_pr, commit_message, verbose)


def _refuse_per_component_options(given: dict, push_to_hub: str | None):
    named = [option for option, value in given.items() if value]
    if named:
        raise UsageError(f"{', '.join(named)} describe one component's source; not with --component all")
    if push_to_hub:
        raise UsageError("--push-to-hub publishes one output; publish each OUT/<component> (`vae-convert publish`)")


@cli.command()
@click.argument("source", type=click.Path(path_type=Path), metavar="DIR")
@click.option("--out", type=click.Path(path_type=Path), required=True, help="Output directory (must not exist).")
@click.option(
    "--dtype",
    type=click.Choice(["auto", "float32", "bfloat16", "float16"]),
    default="auto",
    show_default=True,
    help="Output dtype; auto keeps DIR's.",
)
@click.option("--no-validate", "skip_validation", is_flag=True, help="Skip the decode/encode check.")
@click.option("--no-preview", is_flag=True, help="Do not draw validation.png (the picture of the validation).")
@click.option("--force", is_flag=True, help="Replace an earlier output at --out (only once the new one is complete).")
@click.option("--keep-invalid", is_flag=True, help="Keep an output that fails validation (the exit code says so).")
@click.option("--push-to-hub", metavar="ORG/NAME", help="Publish the result with a model card.")
@click.option("--private", is_flag=True, help="With --push-to-hub: create the repo private.")
@click.option("--push-revision", metavar="BRANCH", help="With --push-to-hub: the branch to commit to.")
@click.option("--create-pr", is_flag=True, help="With --push-to-hub: open a pull request instead of committing.")
@click.option("--commit-message", help="With --push-to-hub: the commit message.")
@click.option("-v", "--verbose", is_flag=True, help="Tracebacks on errors.")
def export(
    source, out, dtype, skip_validation, no_preview, force, keep_invalid, push_to_hub, private, push_revision,
    create_pr, commit_message, verbose,
):  # fmt: skip
    """Write a Flax output DIR (converted, or saved with converter.save) back as a diffusers checkpoint at --out:
    config.json and diffusion_pytorch_model.safetensors, validated against the Flax model."""
    from converter.export import ExportRequest
    from converter.export import export as run

    if push_to_hub:
        from converter.publish import check_write_access

        _guarded(lambda: check_write_access(push_to_hub), verbose)
    request = ExportRequest(
        source=source,
        out=out,
        dtype=dtype,
        force=force,
        validate=not skip_validation,
        preview=not no_preview,
        keep_invalid=keep_invalid,
        say=_say,
        progress=_progress,
    )
    summary = _guarded(lambda: run(request), verbose)
    click.echo(_summary_line(source, summary))
    if push_to_hub:
        _publish(summary.out, push_to_hub, private, push_revision, create_pr, commit_message, verbose)


@cli.command()
@click.argument("out", type=click.Path(path_type=Path), metavar="DIR")
@click.argument("repo_id", metavar="ORG/NAME")
@click.option("--private", is_flag=True, help="Create the repo private.")
@click.option("--revision", help="The branch to commit to.")
@click.option("--create-pr", is_flag=True, help="Open a pull request instead of committing.")
@click.option("--commit-message", help="The commit message.")
@click.option("-v", "--verbose", is_flag=True, help="Tracebacks on errors.")
def publish(out, repo_id, private, revision, create_pr, commit_message, verbose):
    """Upload a converted output DIR to the Hub as ORG/NAME, with a generated model card."""
    from converter.output import read_output
    from converter.publish import check_write_access

    _guarded(lambda: read_output(out.expanduser().absolute()), verbose)
    _guarded(lambda: check_write_access(repo_id), verbose)
    _publish(out.expanduser().absolute(), repo_id, private, revision, create_pr, commit_message, verbose)


def _publish(out, repo_id, private, revision, create_pr, commit_message, verbose):
    from converter.publish import publish as upload

    url = _guarded(lambda: upload(out, repo_id, private, revision, create_pr, commit_message), verbose)
    click.echo(f"✓ published {out} -> {url}")


@cli.command()
@click.argument("out", type=click.Path(path_type=Path), metavar="DIR")
@click.option("--json", "as_json", is_flag=True, help="The manifest (vae_convert.json) as JSON on stdout.")
def info(out, as_json):
    """What a converted output DIR holds: model, target, dtype, source, mapping, tool and its validation (for each
    component, where DIR holds the outputs of --component all)."""
    import json

    from converter.output import component_outputs, read_manifest

    folder = out.expanduser().absolute()
    parts = {p.name: p for p in component_outputs(folder)} or {None: folder}
    manifests = {name: _guarded(lambda p=path: read_manifest(p), False) for name, path in parts.items()}
    if as_json:
        click.echo(json.dumps(manifests[None] if None in manifests else manifests, indent=2))
        return
    click.echo(
        "\n\n".join((f"{name}/\n" if name else "") + _describe_output(manifest) for name, manifest in manifests.items())
    )


def _describe_output(manifest: dict) -> str:
    from converter.validate import check_from_dict

    source = manifest.get("source", {})
    if "revision" in source:
        origin = f"{source['origin']} (Hub) at commit {source['revision']}" + "".join(
            f"\n  {f}  sha256 {d}" for f, d in source.get("sha256", {}).items()
        )
        if "verified" in source:
            origin += f"\n  verified: {source['verified']}"
    elif "exported_from" in source:
        earlier = (source.get("output") or source.get("flax_output") or {}).get("source", {})
        origin = (
            f"exported from the {source['exported_from']} output {source['origin']} (made from {earlier.get('origin')})"
        )
    elif "saved_from" in source:
        origin = f"saved by converter.save from {source['origin']}"
    else:
        digests = source.get("sha256", {})
        origin = f"{source.get('origin')} (local)" + "".join(f"\n  {f}  sha256 {d}" for f, d in digests.items())
    mapping = manifest.get("mapping", {})
    lines = [
        f"model:    {manifest.get('model')} (family {manifest.get('family')})",
        f"target:   {manifest.get('target')} ({manifest.get('format')}), dtype {manifest.get('dtype')}",
        f"source:   {origin}",
        *([f"layout:   {source['format']}"] if "format" in source else []),
        *[f"dropped:  {d['tensors']} tensor(s) by rule {name}" for name, d in source.get("dropped", {}).items()],
        *[
            f"filled:   {key} = {value}, absent from the file (as diffusers' loader fills it)"
            for key, value in source.get("filled", {}).items()
        ],
        *(
            [f"config:   {', '.join(source['config_inferred'])} read from the tensors (the file brought none)"]
            if source.get("config_inferred")
            else []
        ),
        f"mapping:  {mapping.get('file')} sha256 {mapping.get('sha256')}",
        f"tool:     {manifest.get('tool')} {manifest.get('version')}",
    ]
    if manifest.get("environment"):
        lines.append("ran with: " + ", ".join(f"{k} {v}" for k, v in manifest["environment"].items()))
    if manifest.get("config_ignored"):
        lines.append(f"config:   ignored {', '.join(manifest['config_ignored'])}")
    validation = manifest.get("validation")
    if validation is None:
        lines.append("validation: not run (--no-validate)")
    else:
        checks = [check_from_dict(c) for c in validation["checks"]]
        # the rows decide: a manifest that says ok above a row over its tolerance contradicts itself
        if validation["ok"] and all(c.ok for c in checks):
            verdict = "passed"
        elif validation["ok"]:
            verdict = "FAILED (the manifest says passed, but a check is over its tolerance)"
        else:
            verdict = "FAILED (kept with --keep-invalid)"
        lines.append(
            f"validation: {verdict}, each value within {validation['rtol']:.0e} x max(1, |its reference|, its "
            "channel's median |reference|)"
        )
        lines += [c.line() for c in checks]
    return "\n".join(lines)


@cli.command("list")
@click.option("--markdown", is_flag=True, help="A Markdown table (the README's).")
def list_models(markdown):
    """The model names MODEL takes, each pipeline component under its own (`ltx-2:audio_vae`, or `ltx-2 --component
    audio_vae`): Hub repo, VAE, parameters and how pipelines scale its latents. A repo marked * was not verified: no
    public page of it was found; its id follows the family's naming."""
    from converter.targets import meta_torch

    rows = [("MODEL", "HUB REPO (subfolder)", "VAE", "PARAMETERS", "LATENT SCALING")]
    for family in FAMILIES.values():
        for m in family.models:
            config = config_from_dict(family, m.config)
            parameters = sum(p.numel() for p in meta_torch(family, config).parameters())
            qualified = get_model(m.name, family.component).qualified
            name, aliases = (f"`{qualified}`", [f"`{a}`" for a in m.aliases]) if markdown else (qualified, m.aliases)
            name += f" ({', '.join(aliases)})" if aliases else ""
            repo = f"{m.repo_id}{'' if m.verified else ' *'} ({m.subfolder}/)" if m.subfolder else m.repo_id
            rows.append((name, repo, config.variant, f"{parameters / 1e6:.1f}M", config.latent_scaling))
    if markdown:
        for i, row in enumerate(rows):
            click.echo(f"| {' | '.join(row)} |")
            if i == 0:
                click.echo("|" + "---|" * len(row))
        return
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for row in rows:
        click.echo("  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip())


@cli.command("random-checkpoint")
@click.argument("model", type=ModelArgument(), metavar="MODEL")
@click.argument("out", type=click.Path(path_type=Path))
@click.option("--small", is_flag=True, help="Small widths instead of the real architecture's size.")
@click.option("--seed", default=0, show_default=True)
def random_checkpoint(model, out, small, seed):
    """Write a diffusers-format checkpoint of MODEL with random weights to OUT (offline demos and tests)."""
    from converter.random_checkpoint import write_random_checkpoint

    parameters = _guarded(lambda: write_random_checkpoint(get_model(model), out, small, seed), False)
    click.echo(f"✓ random {model} checkpoint ({parameters / 1e6:.1f}M parameters) -> {out}")


@cli.command("check-mappings")
@click.argument("files", nargs=-1, type=click.Path(path_type=Path))
@click.option("--target", type=click.Choice(list(TARGETS)), help="Check one target only.")
@click.option(
    "--pairings",
    type=click.Path(path_type=Path, file_okay=False, exists=True),
    multiple=True,
    help="Folder of pairings files (every key of an original release with its diffusers key): prove the source "
    "formats against them (repeat for several folders).",
)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable result on stdout.")
def check_mappings(files, target, pairings, as_json):
    """Prove every rule in FILES (default: all of mappings/) for every registered config and target, no weights.

    Exits 0 only when every source key hits exactly one rule, every target leaf is filled once with the right
    shape, and no rule is dead; with --pairings, also when every source format renames each listed key as listed.
    """
    import json

    from converter import check_mappings as checker

    # a mapping file that breaks the checker itself is still one line with its exit code, as for a conversion
    reports, seconds = _guarded(lambda: checker.run(list(files), target, list(pairings) or None), False)
    click.echo(
        json.dumps(checker.as_json(reports, seconds), indent=2) if as_json else checker.as_text(reports, seconds)
    )
    if not all(r.ok for r in reports):
        raise click.exceptions.Exit(MappingError.exit_code)


def _versions() -> str:
    from converter.environment import report

    return report()


def _summary_line(what, summary) -> str:
    checks = (
        f", validation {sum(c.ok for c in summary.comparisons)}/{len(summary.comparisons)} ✓"
        if summary.comparisons
        else ", not validated"
    )
    return (
        f"✓ {what} -> {summary.target} ({summary.fmt}, {summary.dtype}): {summary.tensors} tensors, "
        f"{summary.parameters / 1e6:.1f}M parameters, {summary.bytes / 1e6:.1f} MB in {summary.seconds:.1f}s"
        f"{checks} -> {summary.out}"
    )


def _say(message: str):
    click.echo(message, err=True)


def _progress(items, label: str):
    with click.progressbar(items, label=label, file=None, show_pos=True) as bar:
        yield from bar


def _guarded(action, verbose: bool):
    try:
        return action()
    except ConvertError as e:
        if verbose:
            traceback.print_exc()
        _fail(str(e), e.exit_code)
    except Exception as e:  # a bug, not bad input: one line, the traceback in a file
        if verbose:
            traceback.print_exc()
        _fail(f"internal error (a bug in vae-convert): {type(e).__name__}: {str(e)[:200]}; {_crash_report()}", 1)


def _crash_report() -> str:
    """Writes the traceback being handled to a new private file of an unpredictable name (never through a name someone
    else made), and says where; says so instead when it cannot be written."""
    try:
        fd, report = tempfile.mkstemp(prefix="vae-convert-crash-", suffix=".txt")
        with os.fdopen(fd, "w") as file:
            file.write(traceback.format_exc())
    except Exception as e:  # the report of a bug must not itself fail
        return f"the traceback could not be saved ({type(e).__name__}: {e}); --verbose prints it"
    return f"traceback in {report}"


def _fail(message: str, code: int):
    click.echo(f"error: {message}", err=True)
    raise click.exceptions.Exit(code)


def run() -> int:
    """Runs the command line; returns the exit code."""
    try:
        result = cli.main(standalone_mode=False, prog_name="vae-convert")
    except click.ClickException as e:  # usage errors: exit 2
        e.show()
        return e.exit_code
    return result if isinstance(result, int) else 0
