"""The `vae-convert` command. `vae-convert MODEL --to flax|torchax --out DIR` converts (MODEL is a registry name);
other subcommands: `sample`."""
from __future__ import annotations

import signal
import sys
import traceback
from pathlib import Path

import click

from converter import __version__
from converter.errors import ConvertError
from converter.registry import MODELS, get_model

EXIT_INTERRUPTED = 130


class ModelGroup(click.Group):
    """`vae-convert wan2.1 ...` is `vae-convert convert wan2.1 ...`: a first word that is no subcommand is a model."""

    def resolve_command(self, ctx, args):
        if args and args[0] not in self.commands and not args[0].startswith("-"):
            return "convert", self.commands["convert"], args
        return super().resolve_command(ctx, args)


@click.group(cls=ModelGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="vae-convert")
def cli():
    """Convert Hugging Face video-VAE checkpoints to Flax NNX (Orbax) or torchax (safetensors) weights.

    \b
      vae-convert wan2.1 --to flax --out ckpt/
      vae-convert wan2.1 --source path/to/vae --to torchax --out ckpt-tx/
    """


@cli.command()
@click.argument("model", type=click.Choice(sorted(MODELS)), metavar="MODEL")
@click.option("--to", "target", type=click.Choice(["flax", "torchax"]), required=True, help="Target implementation.")
@click.option("--out", type=click.Path(path_type=Path), required=True, help="Output directory (must not exist).")
@click.option("--source", help="Local diffusers folder, .safetensors file, shard index, or Hub repo id[@rev].")
@click.option("--revision", help="Hub revision (branch, tag or commit) of the source.")
@click.option("--format", "fmt", type=click.Choice(["orbax", "safetensors"]),
              help="Weights format: orbax (default for flax) or safetensors (default and only for torchax).")
@click.option("--dtype", type=click.Choice(["auto", "float32", "bfloat16", "float16"]), default="auto",
              show_default=True, help="Output dtype; auto keeps the source's.")
@click.option("--offline", is_flag=True, help="Use the local Hugging Face cache only (also HF_HUB_OFFLINE=1).")
@click.option("--no-validate", "skip_validation", is_flag=True, help="Skip the decode/encode check.")
@click.option("--force", is_flag=True, help="Replace an existing --out (only once the new output is complete).")
@click.option("--keep-invalid", is_flag=True, help="Keep an output that fails validation (the exit code still says so).")
@click.option("--allow-nonfinite", is_flag=True, help="Convert weights that hold NaN or Inf instead of refusing.")
@click.option("--mapping", "mapping_file", type=click.Path(path_type=Path, dir_okay=False),
              help="Use this mapping file instead of the family's (for developing mappings).")
@click.option("--dry-run", is_flag=True, help="Print what would be fetched and written; fetch and write nothing.")
@click.option("--push-to-hub", metavar="ORG/NAME", help="Publish the output with a model card (token: HF_TOKEN or login).")
@click.option("--private", is_flag=True, help="With --push-to-hub: create the repo private.")
@click.option("--push-revision", metavar="BRANCH", help="With --push-to-hub: the branch to commit to.")
@click.option("--create-pr", is_flag=True, help="With --push-to-hub: open a pull request instead of committing.")
@click.option("--commit-message", help="With --push-to-hub: the commit message.")
@click.option("-v", "--verbose", is_flag=True, help="Tracebacks on errors.")
def convert(model, target, out, source, revision, fmt, dtype, offline, skip_validation, force, keep_invalid,
            allow_nonfinite, mapping_file, dry_run, push_to_hub, private, push_revision, create_pr, commit_message,
            verbose):
    """Convert MODEL's VAE (see `vae-convert --help` for names) to --to's weights at --out."""
    from converter.convert import Request, convert as run, dry_run as plan

    request = Request(get_model(model), source, revision, offline, target, fmt, dtype, out, force,
                      not skip_validation, mapping_file, allow_nonfinite, keep_invalid, push_to_hub)
    if dry_run:
        click.echo(_guarded(lambda: plan(request), verbose))
        click.echo("dry run: nothing fetched or written")
        return
    summary = _guarded(lambda: run(request), verbose)
    checks = f", validation {sum(c.ok for c in summary.checks)}/{len(summary.checks)} ✓" if summary.checks else \
        ", not validated"
    click.echo(f"✓ {model} -> {summary.target} ({summary.fmt}, {summary.dtype}): {summary.tensors} tensors, "
               f"{summary.parameters / 1e6:.1f}M parameters, {summary.bytes / 1e6:.1f} MB in {summary.seconds:.1f}s"
               f"{checks} -> {summary.out}")
    if push_to_hub:
        _publish(summary.out, push_to_hub, private, push_revision, create_pr, commit_message, verbose)


@cli.command()
@click.argument("out", type=click.Path(path_type=Path, exists=True, file_okay=False), metavar="DIR")
@click.argument("repo_id", metavar="ORG/NAME")
@click.option("--private", is_flag=True, help="Create the repo private.")
@click.option("--revision", help="The branch to commit to.")
@click.option("--create-pr", is_flag=True, help="Open a pull request instead of committing.")
@click.option("--commit-message", help="The commit message.")
@click.option("-v", "--verbose", is_flag=True, help="Tracebacks on errors.")
def publish(out, repo_id, private, revision, create_pr, commit_message, verbose):
    """Upload a converted output DIR to the Hub as ORG/NAME, with a generated model card."""
    from converter.hub import check_write_access

    _guarded(lambda: check_write_access(repo_id), verbose)
    _publish(out, repo_id, private, revision, create_pr, commit_message, verbose)


def _publish(out, repo_id, private, revision, create_pr, commit_message, verbose):
    from converter.hub import publish as upload

    url = _guarded(lambda: upload(out, repo_id, private, revision, create_pr, commit_message), verbose)
    click.echo(f"✓ published {out} -> {url}")


@cli.command()
@click.argument("model", type=click.Choice(sorted(MODELS)), metavar="MODEL")
@click.argument("out", type=click.Path(path_type=Path))
@click.option("--small", is_flag=True, help="Small widths instead of the real architecture's size.")
@click.option("--seed", default=0, show_default=True)
def sample(model, out, small, seed):
    """Write a diffusers-format checkpoint of MODEL with random weights to OUT (offline demos and tests)."""
    from converter.sample import write_sample

    if out.exists():
        _fail(f"{out} exists; choose a new folder", 6)
    parameters = _guarded(lambda: write_sample(get_model(model), out, small, seed), False)
    click.echo(f"✓ sample {model} checkpoint ({parameters / 1e6:.1f}M parameters, random weights) -> {out}")


@cli.command("check-mappings")
@click.argument("files", nargs=-1, type=click.Path(path_type=Path))
@click.option("--target", type=click.Choice(["flax", "torchax"]), help="Check one target only.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable result on stdout.")
def check_mappings(files, target, as_json):
    """Prove every rule in FILES (default: all of mappings/) for every registered config and target, no weights.

    Exits 0 only when every source key hits exactly one rule, every target leaf is filled once with the right
    shape, and no rule is dead.
    """
    import json

    from converter import check
    from converter.errors import MappingError

    reports, seconds = check.run(list(files), target)
    click.echo(json.dumps(check.as_json(reports, seconds), indent=2) if as_json else check.as_text(reports, seconds))
    if not all(r.ok for r in reports):
        sys.exit(MappingError.exit_code)


def _guarded(action, verbose):
    try:
        return action()
    except ConvertError as e:
        if verbose:
            traceback.print_exc()
        _fail(str(e), e.exit_code)
    except KeyboardInterrupt:
        _fail("interrupted; nothing was written", EXIT_INTERRUPTED)
    except Exception as e:  # a bug, not bad input: still one line unless --verbose
        if verbose:
            traceback.print_exc()
        _fail(f"internal error: {type(e).__name__}: {e} (run with --verbose for the traceback)", 1)


def _fail(message: str, code: int):
    click.echo(f"error: {message}", err=True)
    sys.exit(code)


def _terminate(signum, frame):
    # SIGTERM unwinds like Ctrl-C, so the work folder is removed on the way out.
    raise KeyboardInterrupt


def main():
    signal.signal(signal.SIGTERM, _terminate)
    cli()
