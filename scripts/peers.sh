#!/usr/bin/env bash
# The peers the benchmarks compare against, kept in the git-ignored peers/ folder and
# never imported by the package (benchmarks import them when present):
#   mamba_ssm's Triton SSD (ops/triton only), Liger-Kernel (pure Python), and
#   flash-attention's Triton rotary (ops/triton/rotary.py only).
#   scripts/peers.sh fetch     # here, with PyPI reachable: download into peers/
#   scripts/peers.sh install   # on the GPU machine (no network): unpack into peers/site,
#                              # which benchmarks/peers.py puts on sys.path
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
mkdir -p peers
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
    # wheels are zip files: unpacked without pip (the device's environment may lack it)
    $PY -c "import sys, zipfile; [zipfile.ZipFile(w).extractall(sys.argv[1]) for w in sys.argv[2:]]" \
      "$site" peers/liger_kernel-*.whl peers/einops-*.whl peers/packaging-*.whl
    # mamba_ssm: the Python package without its CUDA extensions; the Triton SSD path
    # imports only torch, triton and einops-free modules of ops/triton.
    tar -xzf peers/mamba_ssm-*.tar.gz -C peers --wildcards '*/mamba_ssm/*.py'
    cp -r peers/mamba_ssm-*/mamba_ssm "$site/"
    # its __init__ imports the compiled selective-scan extension, which is not built
    grep "^__version__" peers/mamba_ssm-*/mamba_ssm/__init__.py > "$site/mamba_ssm/__init__.py"
    # flash-attention: only its Triton rotary kernel, as a top-level module
    tar -xzf peers/flash_attn-*.tar.gz -C peers --wildcards '*/flash_attn/ops/triton/rotary.py'
    cp peers/flash_attn-*/flash_attn/ops/triton/rotary.py "$site/flash_attn_triton_rotary.py"
    ls "$site" ;;
  *) echo "usage: scripts/peers.sh fetch|install" >&2; exit 2 ;;
esac
