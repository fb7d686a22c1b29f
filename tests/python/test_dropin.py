"""torch.multiprocessing programs (programs/*.py) run unchanged with the
import swapped for mproc.torch."""
import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
PROGRAMS = ["hogwild.py", "producer_consumer.py", "spawn_fail.py", "pool_map.py"]


@pytest.mark.parametrize("name", PROGRAMS)
def test_program_with_import_swapped(name, tmp_path):
    src = open(os.path.join(HERE, "programs", name)).read()
    assert "import torch.multiprocessing as mp" in src
    swapped = tmp_path / name
    swapped.write_text(src.replace("import torch.multiprocessing as mp", "import mproc.torch as mp"))
    r = subprocess.run([sys.executable, str(swapped)], capture_output=True, text=True, timeout=120,
                       env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)))
    assert r.returncode == 0, r.stdout + r.stderr
    assert " ok" in r.stdout
