"""The torch 2.13 / torchax 0.0.13 workaround: placeholders exactly for the named-tensor overloads torch lacks."""

import json
import subprocess
import sys

from tests.helpers import REPO

PROBE = """
import json
from converter import torchax_runtime as rt
before = rt.missing_overloads()
torchax = rt.import_torchax()
print(json.dumps({"before": before, "after": rt.missing_overloads(), "version": torchax.__version__}))
"""


def test_torchax_imports_with_placeholders_for_exactly_the_missing_overloads():
    result = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, cwd=REPO, check=True)
    probe = json.loads(result.stdout.strip().splitlines()[-1])
    assert probe["after"] == []  # every name torchax needs now resolves
    # the placeholders were added only for names this torch really lacks
    import torch

    from converter.torchax_runtime import REMOVED_NAMED_OVERLOADS

    assert set(probe["before"]) <= set(REMOVED_NAMED_OVERLOADS)
    for name in set(REMOVED_NAMED_OVERLOADS) - set(probe["before"]):
        op, overload = name.split(".")
        getattr(getattr(torch.ops.aten, op), overload)
