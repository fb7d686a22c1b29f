"""Every ```python block of README.md and docs/*.md runs as written, in a
fresh interpreter: a renamed call or a changed behaviour in the package
breaks the docs' example here, not in a user's hands. A snippet may use the
names PRELUDE gives (what the text around it assumes: a dataset), and a
DataLoader it makes is iterated to the end."""
import glob
import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PRELUDE = """\
import mproc.torch
import torch
from torch.utils.data import DataLoader, TensorDataset
dataset = TensorDataset(torch.arange(16.0))
"""
POSTLUDE = """
for _name, _value in list(globals().items()):
    if isinstance(_value, DataLoader):
        assert sum(b[0].sum().item() for b in _value) == 120.0, _name
"""


def blocks():
    out = []
    for path in [os.path.join(ROOT, "README.md")] + sorted(glob.glob(f"{ROOT}/docs/*.md")):
        with open(path) as f:
            text = f.read()
        for m in re.finditer(r"^```python\n(.*?)^```$", text, re.S | re.M):
            line = text.count("\n", 0, m.start()) + 1
            out.append(pytest.param(m.group(1), id=f"{os.path.basename(path)}:{line}"))
    return out


BLOCKS = blocks()


def test_docs_have_python_blocks():
    assert len(BLOCKS) >= 3  # the extraction itself works


@pytest.mark.parametrize("code", BLOCKS)
def test_block_runs(code, tmp_path):
    script = tmp_path / "block.py"
    # a guard, as docs/python.md asks of spawn's users: children import it
    script.write_text("if __name__ == '__main__':\n" +
                      "".join("    " + ln + "\n" for ln in (PRELUDE + code + POSTLUDE).split("\n")))
    # the package as this run found it, even through a relative PYTHONPATH
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                       timeout=120, cwd=tmp_path, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
