"""Builds mproc's Python package: the _mproc extension (C, CPython API) plus
the pure-Python modules mproc.torch and mproc.multiprocessing.

The extension links libmproc statically (libmproc.a), so the installed
package needs no libmproc at run time. It is built from this source tree:
the library must be built first (`make build` at the top, or set
MPROC_BUILD_DIR to another CMake build folder, e.g. build-asan). The
build's mproc-shm-manager (it needs only libc) is copied beside the
extension, where libmproc looks for its daemon, so the package's
file_system segments are reclaimed when their processes are killed.

    make python                                    # in place, for tests
    /usr/bin/python3 -m pip install ./python --no-build-isolation
"""
import os
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
BUILD = os.path.abspath(os.environ.get("MPROC_BUILD_DIR", os.path.join(ROOT, "build")))
ARCHIVE = os.path.join(BUILD, "libmproc.a")
DAEMON = os.path.join(BUILD, "mproc-shm-manager")

if not os.path.exists(ARCHIVE) and not {"sdist", "egg_info", "clean"} & set(sys.argv):
    sys.exit(f"mproc: {ARCHIVE} is missing: build the library first (`make build` in {ROOT}), "
             "or point MPROC_BUILD_DIR at a build folder holding libmproc.a")


class build_ext_with_daemon(build_ext):
    """build_ext, then the daemon into the extension's folder (mproc/ in
    place, or the build_lib that pip installs): libmproc, linked into the
    extension, looks for mproc-shm-manager beside the object holding it."""

    def run(self):
        super().run()
        if not os.access(DAEMON, os.X_OK):
            sys.exit(f"mproc: {DAEMON} is missing: build the library first (`make build` in "
                     f"{ROOT}); the package ships its leak-reclaiming daemon")
        ext_path = self.get_ext_fullpath("mproc._mproc")
        self.copy_file(DAEMON, os.path.join(os.path.dirname(ext_path), "mproc-shm-manager"))


def private_libs():
    """The static library's own dependencies (threads, rt, dl for the CUDA
    runtime it loads at run time, m, elfutils' dw for backtraces), as CMake
    wrote them into the build's mproc.pc."""
    pc = os.path.join(BUILD, "mproc.pc")
    if os.path.exists(pc):
        for line in open(pc):
            if line.startswith("Libs.private:"):
                return line.split(":", 1)[1].split()
    return ["-pthread", "-lrt", "-ldl", "-lm", "-ldw"]


# The extension exports PyInit__mproc alone: libmproc's mp_* and the module's
# mpy_* stay inside it, so a program that also loads another libmproc (a C
# extension linked against the system's libmproc.so) gets each its own.
extra_compile = ["-std=c11", "-D_GNU_SOURCE", "-Wall", "-Wextra", "-Wno-missing-field-initializers",
                 "-fvisibility=hidden"]
extra_link = private_libs() + ["-Wl,--exclude-libs,ALL"]
sanitize = os.environ.get("MPROC_SANITIZE")
if sanitize:
    extra_compile += [f"-fsanitize={sanitize}", "-fno-omit-frame-pointer"]
    extra_link += [f"-fsanitize={sanitize}"]

ext = Extension(
    "mproc._mproc",
    sources=[os.path.join("src", f) for f in ("module.c", "storage.c", "channel.c", "internal.c",
                                              "fast.c", "fast_recv.c", "fastpickle.c")],
    include_dirs=[os.path.join(ROOT, "include"), os.path.join(ROOT, "src")],
    extra_objects=[ARCHIVE],
    # relinked when the library changes, not only when these sources do
    depends=[ARCHIVE, os.path.join("src", "mpy.h"), os.path.join("src", "fast_impl.h")],
    extra_compile_args=extra_compile,
    extra_link_args=extra_link,
)

setup(
    name="mproc",
    version="0.1.0",
    description="torch.multiprocessing on libmproc: `import mproc.torch as mp`",
    packages=["mproc"],
    ext_modules=[ext],
    cmdclass={"build_ext": build_ext_with_daemon},
    python_requires=">=3.9",
)
