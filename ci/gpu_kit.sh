#!/usr/bin/env bash
# Download the wheels the GPU machine lacks into .whl/ (git-ignored), and check that they install
# there with --no-deps and nothing missing. Runs on a machine with the package index; the GPU
# machine has none, so the wheels travel with the working tree. See ci/README.md.
#
#   ci/gpu_kit.sh            # from the project root; then run ci/gpu_check.sh on the GPU machine
#
# The target: Python 3.12 on manylinux x86-64 with the packages of IMAGE below preinstalled
# (CUDA 13 driver, CuPy for CUDA 13, PyTorch; no dask, distributed, kvikio, RMM, dask-cuda or
# obstore). Exit status 1 names each unmet requirement, or a kit over MAX_MIB.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
dest="$root/.whl"
python="${PYTHON:-python3}"
MAX_MIB="${MAX_MIB:-40}"  # the tree and the wheels travel together, at most 64 MiB in all

# What the GPU image holds. A name without a version satisfies any version; [extras] listed are
# installed too. The second block is what the first one's packages need (pip installed them with
# the image), so requirements on them are met.
read -r -d '' IMAGE <<'EOF' || true
python 3.12.3
numpy 2.5.2
cupy-cuda13x[ctk] 14.2.0
cuda-toolkit[cufile,nvrtc,cudart,cublas,cufft,curand,cusolver,cusparse]  # CuPy's [ctk] and nvidia-cufile
nvidia-cufile
cuda-bindings
cuda-core
cuda-pathfinder
nvidia-ml-py
torch 2.11.0
pandas
pyarrow
xarray
click
cloudpickle
pyyaml
toolz
msgpack
psutil
jinja2
pytest
pytest-timeout
hypothesis
# needed by the packages above, so present
packaging        # pytest, xarray
pluggy           # pytest
iniconfig        # pytest
fsspec           # torch
filelock         # torch
typing-extensions  # torch
sympy            # torch
networkx         # torch
markupsafe       # jinja2
python-dateutil  # pandas
six              # python-dateutil
pytz             # pandas
tzdata           # pandas
attrs            # hypothesis
sortedcontainers # hypothesis
fastrlock        # cupy-cuda13x 14
EOF

# dask-cuda 26.10 imports distributed internals; rapids-dask-dependency 26.10 pins the dask and
# distributed it works with, so take exactly those. Never a CuPy here (two CuPys: the image has one).
pkgs=(
  kvikio-cu13==26.10.0 libkvikio-cu13==26.10.0 rapids-logger==0.3.0
  rmm-cu13==26.10.0 librmm-cu13==26.10.0
  dask-cuda==26.10.0 rapids-dask-dependency==26.10.0
  dask==2026.7.1 distributed==2026.7.1
  partd==1.4.2 locket==1.0.0 zict==3.0.0 tblib==3.2.2 tornado==6.6.1
  obstore==0.12.1
)
platforms=()
for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_24_x86_64 manylinux_2_17_x86_64 \
         manylinux2014_x86_64 manylinux1_x86_64; do platforms+=(--platform "$p"); done

mkdir -p "$dest"
grep -qx '.whl/' "$root/.gitignore" 2>/dev/null || echo "warning: .whl/ is not in .gitignore" >&2
# Start from an empty folder: an old wheel of another version would be a second wheel of a package.
rm -f "$dest"/*.whl
echo "== gpu_kit: downloading ${#pkgs[@]} wheels for CPython 3.12 manylinux x86-64 into .whl/"
"$python" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  "${platforms[@]}" -d "$dest" "${pkgs[@]}"

image_file="$(mktemp)"
trap 'rm -f "$image_file"' EXIT
printf '%s\n' "$IMAGE" > "$image_file"
echo "== gpu_kit: Requires-Dist of every wheel against the GPU image and the kit"
"$python" "$root/ci/wheel_requires.py" --image "$image_file" --python 3.12.3 --max-mib "$MAX_MIB" \
  --waive "bokeh=rapids-dask-dependency pins it for distributed's dashboard only, which the check never opens" \
  "$dest"
