#!/usr/bin/env bash
# The peers the benchmarks compare against, kept in the git-ignored peers/ folder and
# never imported by the package (benchmarks import them when present):
#   mamba_ssm's Python files (its Triton SSD and its Mamba2 module; no compiled mamba_ssm
#   extension), Liger-Kernel (pure Python), flash-attention's Triton rotary
#   (ops/triton/rotary.py only), and causal-conv1d (a CUDA extension, built here for the
#   GPU machine by `build-causal-conv1d`).
#   scripts/peers.sh fetch     # here, with PyPI reachable: download into peers/
#   scripts/peers.sh build-causal-conv1d   # here (nvcc, no GPU needed): the causal-conv1d
#                              # wheel for the GPU machine's Python and torch, into peers/
#   scripts/peers.sh install   # on the GPU machine (no network): unpack into peers/site,
#                              # which benchmarks/peers.py puts on sys.path
# Not a peer, but carried the same way: the transformers that the Hugging Face patch is
# tested against (the newest of pyproject's range), when the GPU machine's image has an
# older one:
#   scripts/peers.sh fetch-transformers     # here: its wheels and its dependencies' for
#                              # the GPU machine (DEVICE_PYTHON, 3.12), into peers/transformers
#   scripts/peers.sh install-transformers   # there: unpacked into peers/transformers-site;
#   PYTHONPATH=$PWD/peers/transformers-site:$PWD python3 -m pytest tests/test_huggingface.py
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
mkdir -p peers
# unzip_into DIR WHEEL...: wheels are zip files, unpacked without pip (the device's
# environment may lack it)
unzip_into() {
  $PY -c "import sys, zipfile; [zipfile.ZipFile(w).extractall(sys.argv[1]) for w in sys.argv[2:]]" "$@"
}
case "${1:-}" in
  fetch)
    # pure-Python wheels: Liger-Kernel, and what mamba_ssm's Triton files import
    $PY -m pip download --quiet --no-deps liger-kernel einops packaging -d peers
    # sdists straight from the index: building their metadata would start CUDA builds
    $PY - <<'PYEOF'
import json, urllib.parse, urllib.request
for name in ["mamba_ssm", "flash-attn"]:
    index = f"https://pypi.org/pypi/{name}/json"
    meta = json.load(urllib.request.urlopen(index))
    sdist = [u for u in meta["urls"] if u["packagetype"] == "sdist"][0]
    url = urllib.parse.urljoin(index, sdist["url"])
    urllib.request.urlretrieve(url, "peers/" + sdist["filename"])
    print(name, meta["info"]["version"], sdist["filename"])
PYEOF
    ls -la peers ;;
  install)
    site=peers/site
    rm -rf "$site" && mkdir -p "$site"
    unzip_into "$site" peers/liger_kernel-*.whl peers/einops-*.whl peers/packaging-*.whl
    # mamba_ssm: the Python package without its CUDA extensions. The Triton SSD path
    # (ops/triton) and the Mamba2 module (modules/mamba2.py) import torch, triton, einops,
    # huggingface_hub and, where present, causal_conv1d: no compiled mamba_ssm extension.
    tar -xzf peers/mamba_ssm-*.tar.gz -C peers --wildcards '*/mamba_ssm/*.py'
    cp -r peers/mamba_ssm-*/mamba_ssm "$site/"
    # its __init__ imports the compiled selective-scan extension, which is not built
    grep "^__version__" peers/mamba_ssm-*/mamba_ssm/__init__.py > "$site/mamba_ssm/__init__.py"
    # flash-attention: only its Triton rotary kernel, as a top-level module
    tar -xzf peers/flash_attn-*.tar.gz -C peers --wildcards '*/flash_attn/ops/triton/rotary.py'
    cp peers/flash_attn-*/flash_attn/ops/triton/rotary.py "$site/flash_attn_triton_rotary.py"
    # causal-conv1d (its compiled causal_conv1d_cuda and its Python package; mamba_ssm's
    # fused Mamba2 path needs it): only a wheel built for this interpreter's version. Its
    # extension links against the torch it was built with (build-causal-conv1d's
    # TORCH_VERSION): under another torch its import fails and the benchmarks skip it.
    tag=$($PY -c "import sys; print('cp%d%d' % sys.version_info[:2])")
    found=0
    for w in peers/causal_conv1d-*.whl; do
      [ -e "$w" ] || continue
      case "$w" in
        *-"$tag"-"$tag"-*) unzip_into "$site" "$w"
                           found=1; echo "causal-conv1d: $(basename "$w")" ;;
        *) echo "causal-conv1d: $(basename "$w") is not for $tag; skipped" ;;
      esac
    done
    [ "$found" = 1 ] || echo "causal-conv1d: no $tag wheel in peers/ (scripts/peers.sh build-causal-conv1d); mamba_ssm's fused Mamba2 path and the causal_conv1d peer will be skipped"
    ls "$site" ;;
  fetch-transformers)
    # TRANSFORMERS_VERSION (5.25.0) and the wheels it needs, for DEVICE_PYTHON on
    # x86_64 Linux; numpy left out (torch's image has one, and a second would shadow it)
    rm -rf peers/transformers && mkdir -p peers/transformers
    $PY -m pip download --quiet --only-binary=:all: --implementation cp \
      --python-version "${DEVICE_PYTHON:-3.12}" --platform manylinux_2_28_x86_64 \
      --platform manylinux2014_x86_64 --platform any -d peers/transformers \
      "transformers==${TRANSFORMERS_VERSION:-5.25.0}"
    rm -f peers/transformers/numpy-*.whl
    ls peers/transformers ;;
  install-transformers)
    site=peers/transformers-site
    rm -rf "$site" && mkdir -p "$site"
    unzip_into "$site" peers/transformers/*.whl
    PYTHONPATH="$PWD/$site" $PY -c "import transformers; print('transformers', transformers.__version__, 'in $site')" ;;
  build-causal-conv1d)
    # causal-conv1d's CUDA extension for the GPU machine, for sm_90 only, against the GPU
    # machine's Python version (PYTHON: an interpreter of that version) and torch
    # (TORCH_VERSION; PyPI's default Linux wheel of 2.11.0 is the CUDA 13.0 build), with
    # CUDA_HOME's nvcc (of the same CUDA major version). No GPU is needed. Steps: a fresh
    # venv with that torch; the causal-conv1d sdist (CAUSAL_CONV1D_VERSION); its setup.py,
    # which compiles for sm_75 to sm_121 whatever TORCH_CUDA_ARCH_LIST says, patched to
    # sm_90 alone; `pip wheel` under nice with MAX_JOBS jobs; the extension's debug
    # sections stripped; the wheel repacked (its RECORD rewritten) into peers/.
    #   PYTHON=python3.12 MAX_JOBS=1 scripts/peers.sh build-causal-conv1d
    work=${WORK:-$(mktemp -d)}
    version=${CAUSAL_CONV1D_VERSION:-1.7.0}
    cuda=${CUDA_HOME:-/usr/local/cuda}
    echo "building causal-conv1d $version in $work"
    $PY -m venv "$work/venv"
    vpy="$work/venv/bin/python"
    "$vpy" -m pip install -q --upgrade pip "setuptools<82" wheel ninja packaging  # torch 2.11 wants setuptools<82
    "$vpy" -m pip install -q "torch==${TORCH_VERSION:-2.11.0}" numpy
    "$vpy" -c "import sys, torch; print('Python', sys.version.split()[0], '| torch', torch.__version__, '| CUDA', torch.version.cuda)"
    "$cuda/bin/nvcc" --version | tail -1
    # the sdist straight from the index (as fetch does)
    "$vpy" - "$version" "$work" <<'PYEOF'
import json, sys, urllib.parse, urllib.request
index = "https://pypi.org/pypi/causal-conv1d/json"
meta = json.load(urllib.request.urlopen(index))
sdist = [u for u in meta["releases"][sys.argv[1]] if u["packagetype"] == "sdist"][0]
urllib.request.urlretrieve(urllib.parse.urljoin(index, sdist["url"]), sys.argv[2] + "/" + sdist["filename"])
print("sdist", sdist["filename"], sdist["digests"]["sha256"])
PYEOF
    tar -xzf "$work"/causal_conv1d-"$version".tar.gz -C "$work"
    src="$work/causal_conv1d-$version"
    "$vpy" - "$src/setup.py" <<'PYEOF'
import sys
path = sys.argv[1]
text = open(path).read()
anchor = "    # HACK: The compiler flag -D_GLIBCXX_USE_CXX11_ABI"
assert text.count(anchor) == 1, "setup.py changed: find where cc_flag's -gencode list ends"
keep = ('    # sm_90 only (scripts/peers.sh build-causal-conv1d)\n'
        '    cc_flag = [f for f in cc_flag if not f.startswith("-gencode") and not f.startswith("arch=")]'
        ' + ["-gencode", "arch=compute_90,code=sm_90"]\n\n')
open(path, "w").write(text.replace(anchor, keep + anchor))
PYEOF
    (cd "$work" && export CUDA_HOME="$cuda" PATH="$cuda/bin:$work/venv/bin:$PATH" TORCH_CUDA_ARCH_LIST=9.0 \
       CAUSAL_CONV1D_FORCE_BUILD=TRUE MAX_JOBS=${MAX_JOBS:-1} \
     && time nice -n 19 "$vpy" -m pip wheel -v --no-build-isolation --no-deps "$src" -w "$work/dist") \
      > "$work/build.log" 2>&1 || { tail -30 "$work/build.log"; exit 1; }
    grep -o -- "-gencode arch=[^ ]*" "$work/build.log" | sort | uniq -c
    "$vpy" -m wheel unpack "$work"/dist/causal_conv1d-"$version"-*.whl -d "$work/unpacked"
    strip --strip-debug "$work"/unpacked/causal_conv1d-"$version"/causal_conv1d_cuda*.so
    "$vpy" -m wheel pack "$work/unpacked/causal_conv1d-$version" -d peers
    ls -la peers/causal_conv1d-"$version"-*.whl ;;
  *) echo "usage: scripts/peers.sh fetch|install|fetch-transformers|install-transformers|build-causal-conv1d" >&2; exit 2 ;;
esac
