"""Shared fixtures (helpers live in tests/helpers.py)."""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

import pytest

# The tests compile hundreds of small models once each, and compiling is most of a case's time: XLA's CPU backend
# compiles them without LLVM's optimisations (a parity case: 13 s -> 8 s) and with its older fusion emitters, not the
# MLIR ones, which take longer to emit the same loops (a CogVideoX decode step: 2.3 s -> 1.7 s to compile). Results
# change only by rounding. Set before JAX is imported, here and in every process a test starts (they inherit it).
TEST_XLA_FLAGS = "--xla_backend_optimization_level=0 --xla_cpu_use_fusion_emitters=false"
os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {TEST_XLA_FLAGS}".strip()
# For the same reason the models take XLA's own convolutions, as on every accelerator, not the CPU's faster routes
# (models/common/conv.py), which compile in twice the time; the modules whose subject the routes are take them
# (cpu_conv_routes, below): the routes' own tests; test_parity.py takes them at each config's longest input.
from converter.models.common.conv import XLA_CONV_ENV  # noqa: E402 (after XLA_FLAGS: it imports JAX)

os.environ[XLA_CONV_ENV] = "1"

# the helpers' asserts (what a folder holds, an exit code) report their values, as the tests' own do
pytest.register_assert_rewrite("tests.helpers")

from converter.registry import FAMILIES  # noqa: E402
from tests.fake_hub import FakeHub, Repo  # noqa: E402
from tests.helpers import save_diffusers  # noqa: E402

WAN = FAMILIES["wan"]
REPO = Path(__file__).resolve().parent.parent


class ReadBesideTheRepository(OSError):
    """A test read a file beside the repository: a clone alone would not have it (tests/data/README.md)."""


def _beside_the_repository(path) -> bool:
    """Whether `path` lies in the folder holding the repository but outside the repository, the environment and the
    temporary folder: where a clone's neighbours (a data folder, another checkout) would be."""
    if isinstance(path, int):
        return False
    path = os.path.abspath(os.fsdecode(path))
    return path.startswith(str(REPO.parent) + os.sep) and not any(
        path == root or path.startswith(root + os.sep) for root in _ALLOWED
    )


# where the tests may read: the repository, the environment, the temporary folder and the home folder, less any of
# them that holds the repository's folder (a clone in /tmp/x/: the temporary folder would allow all that is beside it)
_ALLOWED = [
    root
    for root in (sys.prefix, sys.base_prefix, tempfile.gettempdir(), os.path.expanduser("~"))
    if not (str(REPO.parent) + os.sep).startswith(root.rstrip(os.sep) + os.sep)
] + [str(REPO)]


def _refuse_reads_beside_the_repository(event, args):
    if event in ("open", "os.scandir", "os.listdir") and args and args[0] is not None:
        if _beside_the_repository(args[0]):
            raise ReadBesideTheRepository(f"{args[0]} lies beside the repository; copy it into tests/data/")


# Every test process refuses to read beside the repository (unless the repository sits at the top of the file
# system, where everything is beside it): a test that does fails here rather than in a clone that has nothing beside it
if REPO.parent != Path(REPO.anchor):
    sys.addaudithook(_refuse_reads_beside_the_repository)
WAN_REPO = "Wan-AI/Wan2.1-T2V-1.3B-Diffusers"  # the registry's repo for `wan2.1`

# The modules that take longest, slowest first. pytest-xdist hands out work units in collection order
# (`--no-loadscope-reorder`, Makefile), so the units started last are short ones and neither worker idles long at the
# end; by default it would order them by their number of tests, which put the slowest ones last.
SLOWEST_MODULES = (
    "test_parity.py",
    "test_tiling.py",
    "test_full_size.py",
    "test_source_formats.py",
    "test_wan.py",
    "test_sharding.py",
    "test_interrupts.py",
    "test_multihost.py",
    "test_export.py",
    "test_compile_cache.py",
    "test_bench.py",
)


def pytest_addoption(parser):
    parser.addoption(
        "--family",
        action="append",
        default=[],
        help="run only this family's tests: its cases of the generic tests and its own test file (make test-family)",
    )


def item_family(item) -> set[str]:
    """The families a test is about: its `family` marks (tests.helpers.family_params, per_family) and, for a family's
    own test file (tests/test_<folder>.py), every family in that folder."""
    names = {mark.args[0] for mark in item.iter_markers("family")}
    folder = item.path.stem.removeprefix("test_")
    return names | {name for name, family in FAMILIES.items() if family.folder == folder}


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the groups
def pytest_collection_modifyitems(config, items):
    rank = {name: i for i, name in enumerate(SLOWEST_MODULES)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: each module's own order is kept
    # A work unit is a module (its module fixtures set up once), or one family case of a generic module (its fixture
    # converts that case once): the generic modules' cases spread over the workers.
    for item in items:
        cases = [mark.kwargs["case"] for mark in item.iter_markers("family") if "case" in mark.kwargs]
        item.add_marker(pytest.mark.xdist_group(":".join([item.path.name, *cases[:1]])))
    wanted = set(config.getoption("family"))
    if wanted:
        unknown = wanted - {*FAMILIES, *(family.folder for family in FAMILIES.values())}
        if unknown:
            raise pytest.UsageError(f"--family {', '.join(sorted(unknown))}: known: {', '.join(FAMILIES)}")
        wanted |= {name for name, family in FAMILIES.items() if family.folder in wanted}
        chosen = {item.nodeid for item in items if item_family(item) & wanted}
        config.hook.pytest_deselected(items=[item for item in items if item.nodeid not in chosen])
        items[:] = [item for item in items if item.nodeid in chosen]


@pytest.fixture(scope="session", autouse=True)
def caches(tmp_path_factory):
    """One JAX persistent compilation cache for the CLI runs this test process starts, new each session: the many
    conversions of the same small checkpoints compile their validation steps once. One per xdist worker, as JAX
    writes its entries in place (another process could read one half-written); tests of the cache itself and of
    interrupted runs leave it out. This process itself compiles in memory only: it runs hundreds of models, and
    compiling one of them while writing it to the cache segfaulted twice (in JAX's compile-and-write-cache path, an
    LTX test late in a worker's life) where a CLI run, a few steps, never has. The Flax models' structures are kept
    in a folder of the session's too, never in the user's cache folder."""
    import jax

    from converter.api import COMPILE_CACHE_ENV
    from converter.structure_cache import STRUCTURE_CACHE_ENV

    jax.config.update("jax_enable_compilation_cache", False)  # in this process only: a CLI run starts its own JAX
    with pytest.MonkeyPatch.context() as patch:
        patch.setitem(os.environ, COMPILE_CACHE_ENV, str(tmp_path_factory.mktemp("jax-compile-cache")))
        patch.setitem(os.environ, STRUCTURE_CACHE_ENV, str(tmp_path_factory.mktemp("structures")))
        yield


@pytest.fixture(scope="module", autouse=True)
def released_executables():
    """Each module's compiled programs are let go after it. XLA:CPU keeps memory maps for every executable it has
    compiled, and a test worker that ran hundreds of models reached the kernel's limit on one process's maps
    (vm.max_map_count, 65,530 on this project's machines; 63,560 seen in a worker), where the next compile
    segfaulted (in a Wan torchax step, an LTX Flax step: wherever a worker happened to be)."""
    yield
    import gc

    import jax

    jax.clear_caches()
    gc.collect()


@pytest.fixture(scope="module")
def cpu_conv_routes():
    """The module's models take the CPU's convolution routes, as users' CPU runs do (no step compiled without them is
    kept: the Flax steps' cache is one for the process)."""
    import jax

    jax.clear_caches()
    with pytest.MonkeyPatch.context() as patch:
        patch.delenv(XLA_CONV_ENV)
        yield
    jax.clear_caches()


@pytest.fixture(scope="session")
def default_arch(tmp_path_factory):
    """family -> its default architecture at small widths, saved by diffusers and converted to every target
    (tests.helpers.Converted), once a test process: the modules that need a family's default checkpoint share it."""
    from tests.helpers import converted_outputs

    cache = {}

    def get(family):
        if family.name not in cache:
            cache[family.name] = converted_outputs(family, "default-arch", tmp_path_factory.mktemp(family.name))
        return cache[family.name]

    return get


@pytest.fixture(scope="session")
def wan_small(tmp_path_factory):
    """A small Wan checkpoint saved by diffusers (the default architecture at small widths), and the model."""
    path = tmp_path_factory.mktemp("wan_small") / "vae"
    return path, save_diffusers(WAN, path, WAN.testing().small_configs["default-arch"])


@pytest.fixture(scope="session")
def wan_small_outputs(wan_small, tmp_path_factory):
    """wan_small converted through the CLI to each target (no validation): {target: output folder}; tests change
    only copies of them."""
    from converter.targets import TARGETS
    from tests.helpers import run_in_process

    root = tmp_path_factory.mktemp("wan_small_outputs")
    for target in TARGETS:
        run_in_process(
            "wan2.1", "--source", wan_small[0], "--to", target, "--out", root / target, "--no-validate", check=True
        )
    return {target: root / target for target in TARGETS}


@pytest.fixture
def hub(tmp_path, monkeypatch, wan_small):
    """The loopback Hub serving the small Wan checkpoint as the `wan2.1` pipeline repo, with a fresh cache and no
    login; Hub retries back off in hundredths of a second."""
    server = FakeHub()
    source, _ = wan_small
    vae = {f"vae/{p.name}": p.read_bytes() for p in source.iterdir()}
    # the rest of a pipeline repo, which must never be fetched
    server.repos[WAN_REPO] = Repo(
        {**vae, "model_index.json": b"{}", "transformer/diffusion_pytorch_model.safetensors": b"\0" * 4096},
        branches=("main", "v1"),
    )
    monkeypatch.setenv("HF_ENDPOINT", server.url)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))  # no stored login from the machine
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf-cache"))
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setenv("VAE_CONVERT_HUB_BACKOFF", "0.01")
    yield server
    server.close()
