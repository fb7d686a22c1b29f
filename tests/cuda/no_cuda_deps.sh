#!/bin/sh
# No CUDA library among the link-time dependencies of mproc, built or
# installed (issue 18): libmproc is never linked with libcudart or libcuda
# (src/cuda/cudart.c loads the runtime with dlopen), and neither mproc.pc nor
# the CMake package names CUDA.
#
# usage: no_cuda_deps.sh LIBMPROC_SO LIBMPROC_A BUILD_DIR [PROGRAM...]
# PROGRAMs (linked with mproc) must not need a CUDA library either. The
# install goes to BUILD_DIR/cuda_install_check, removed afterwards.
set -u
lib=$1 archive=$2 build=$3
shift 3
fail=0

check_elf() {
    needed=$(readelf -d "$1" | grep '(NEEDED)') || { echo "FAIL: readelf -d $1"; fail=1; return; }
    if echo "$needed" | grep -qi cuda; then
        echo "FAIL: $1 needs a CUDA library:"
        echo "$needed" | grep -i cuda
        fail=1
    else
        echo "ok: $1 needs no CUDA library ($(echo "$needed" | wc -l) NEEDED entries)"
    fi
}

# Undefined cuda* symbols would mean some code calls CUDA directly, not
# through the loaded table.
check_undefined() { # [nm flag] file
    file=$(eval echo "\${$#}")
    if nm "$@" 2>/dev/null | grep -E ' U cuda[A-Z]'; then
        echo "FAIL: $file references CUDA symbols directly"
        fail=1
    else
        echo "ok: $file has no undefined cuda* symbol"
    fi
}

check_elf "$lib"
check_undefined -D "$lib"
check_undefined "$archive"
for p in "$@"; do
    check_elf "$p"
done

prefix=$build/cuda_install_check
rm -rf "$prefix"
if ! cmake --install "$build" --prefix "$prefix" >"$build/cuda_install_check.log" 2>&1; then
    echo "FAIL: cmake --install $build --prefix $prefix (see $build/cuda_install_check.log)"
    exit 1
fi
installed=$(find "$prefix" -name 'libmproc.so*' -type f | head -n 1)
if [ -z "$installed" ]; then
    echo "FAIL: no libmproc.so under $prefix"
    fail=1
else
    check_elf "$installed"
fi
for f in $(find "$prefix" -name 'mproc.pc' -o -name 'mproc*.cmake'); do
    if grep -qi cuda "$f"; then
        echo "FAIL: $f names CUDA:"
        grep -i cuda "$f"
        fail=1
    else
        echo "ok: $f names no CUDA"
    fi
done
rm -rf "$prefix"
exit $fail
