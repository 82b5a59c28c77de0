#!/usr/bin/env bash
# Build npydask's wheel, install it (not editable) with its dependencies in a fresh virtual
# environment, and run the command line and a small computation from a folder outside the source
# tree, so that a module missing from the wheel fails CI. Called by .ci/run.
#
#   ci/wheel_smoke.sh            # PYTHON=python3.12 ci/wheel_smoke.sh for another interpreter
#
# pip's cache is reused (no --no-cache-dir), so a warm run downloads nothing.
set -euo pipefail
src="$(cd "$(dirname "$0")/.." && pwd)"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
python="${PYTHON:-python3}"
unset PYTHONPATH  # the installed wheel, never the source tree, must answer
export SRC="$src"

echo "== wheel: build"
"$python" -m venv "$work/venv"
pip=("$work/venv/bin/pip" --disable-pip-version-check -q)
# Build from a clean copy of the files git knows (tracked, or new and not ignored): a stale
# build/ folder in the checkout would otherwise put modules in the wheel that the config leaves out.
# pip builds in an isolated environment (setuptools, wheel from the index).
tree="$src"
if git -C "$src" rev-parse --git-dir >/dev/null 2>&1; then
    tree="$work/src"
    mkdir "$tree"
    git -C "$src" ls-files -z --cached --others --exclude-standard \
        | (cd "$src" && tar --null --ignore-failed-read -T - -cf -) | tar -xf - -C "$tree"
fi
"${pip[@]}" wheel --no-deps -w "$work/dist" "$tree"
wheels=("$work"/dist/npydask-*.whl)
echo "built $(basename "${wheels[0]}")"
"$python" -c "
import sys, zipfile
names = zipfile.ZipFile(sys.argv[1]).namelist()
print('packages:', ' '.join(sorted({n.rpartition('/')[0] for n in names if n.startswith('npydask/')})))
wheel = zipfile.ZipFile(sys.argv[1])
info = next(n.rpartition('/')[0] for n in names if n.endswith('.dist-info/METADATA'))
metadata = wheel.read(info + '/METADATA').decode().splitlines()
assert 'License-Expression: BSD-3-Clause' in metadata, [m for m in metadata if m.startswith('License')]
assert info + '/licenses/LICENSE' in names, [n for n in names if 'dist-info' in n]
print('license: BSD-3-Clause,', info + '/licenses/LICENSE')
" "${wheels[0]}"

echo "== wheel: install in a fresh virtual environment"
"${pip[@]}" install "${wheels[0]}"

echo "== wheel: run from outside the source tree"
mkdir "$work/run"
cd "$work/run"
bin="$work/venv/bin"
"$bin/python" - <<'EOF'
import os
import npydask
assert not npydask.__file__.startswith(os.environ.get("SRC", "//")), npydask.__file__
print("npydask", npydask.__version__, "from", os.path.dirname(npydask.__file__))
EOF
"$bin/npydask" --help >/dev/null
"$bin/python" -m npydask --help >/dev/null
"$bin/python" -m npydask.cli --version
"$bin/python" -c "import numpy as np; np.save('a.npy', np.arange(60, dtype='<f4').reshape(3, 4, 5))"
"$bin/npydask" info a.npy
"$bin/npydask" info a.npy --json | "$bin/python" -c "
import json, sys
(f,) = json.load(sys.stdin)['files']
assert (f['path'], f['shape'], f['dtype']) == ('a.npy', [3, 4, 5], '<f4'), f
"
"$bin/python" - <<'EOF'
import numpy as np
import npydask

expected = np.load("a.npy")
x = npydask.from_npy("a.npy", chunks=(1, 4, 5))
got = x.compute(scheduler="threads")
assert x.numblocks == (3, 1, 1) and got.dtype == expected.dtype and np.array_equal(got, expected)
assert float(x.sum().compute()) == float(expected.sum())
print("from_npy from the wheel: equal to numpy.load")
EOF
echo "== wheel: ok"
