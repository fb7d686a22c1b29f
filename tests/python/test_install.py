"""The package as pip installs it, used from elsewhere: self-contained (the
extension links libmproc.a; its daemon comes with it), so it works moved
away from the source tree and the build folder."""
import os
import shutil
import subprocess
import sys
from pathlib import Path

from conftest import killed_holder_leaves

SOURCE = Path(__file__).resolve().parents[2] / "python"


def test_installed_package_is_self_contained(tmp_path):
    target = tmp_path / "site"
    # A build folder of its own: python/build may hold what an earlier
    # setup.py put there, and pip would install that too.
    cfg = tmp_path / "build.cfg"
    cfg.write_text(f"[build]\nbuild_base = {tmp_path / 'build'}\n")
    env = dict(os.environ, DIST_EXTRA_CONFIG=str(cfg))
    r = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-build-isolation",
                        "--no-deps", "--no-cache-dir", "--disable-pip-version-check",
                        "--target", str(target), str(SOURCE)],
                       capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    moved = tmp_path / "elsewhere"
    shutil.move(target, moved)
    pkg = moved / "mproc"
    daemon = pkg / "mproc-shm-manager"
    assert os.access(daemon, os.X_OK), sorted(os.listdir(pkg))
    ext = next(pkg.glob("_mproc*.so"))
    for f in (ext, daemon):
        needed = subprocess.run(["readelf", "-d", str(f)], capture_output=True, text=True).stdout
        assert "libmproc" not in needed and "cuda" not in needed.lower(), needed
    assert exported_functions(ext) == ["PyInit__mproc"]
    assert killed_holder_leaves(tmp_path, pythonpath=str(moved), package=pkg) == []


def exported_functions(path):
    """The code and data symbols a shared object exports, sorted."""
    out = subprocess.run(["nm", "-D", "--defined-only", str(path)],
                         capture_output=True, text=True, check=True).stdout
    return sorted(line.split()[-1] for line in out.splitlines()
                  if line.split()[-2] in ("T", "D", "B", "R"))


def test_extension_exports_only_its_init():
    """libmproc is linked into the extension: its mp_* symbols (and the
    module's mpy_*) must not be exported, or a process that also loads
    another libmproc (a C extension linked against libmproc.so) would have
    one bind to the other's functions. The installed copy is checked in the
    test above."""
    from mproc import _mproc
    exported = exported_functions(_mproc.__file__)
    assert exported == ["PyInit__mproc"], exported
