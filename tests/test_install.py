"""scripts/install.sh's build stamp (scripts/build_stamp.py): the hash of the build's
inputs changes with every input that changes the built extension (a source under csrc/,
setup.py, the build settings, the compiler) and with nothing else (MAX_JOBS, a file
outside csrc/), so the README's second command skips an unchanged build and rebuilds a
changed one."""
import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "build_stamp.py"
_spec = importlib.util.spec_from_file_location("build_stamp", SCRIPT)
build_stamp = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(build_stamp)


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    root = tmp_path_factory.mktemp("tree")
    shutil.copytree(ROOT / "csrc", root / "csrc")
    shutil.copy(ROOT / "setup.py", root / "setup.py")
    (root / "README.md").write_text("x")
    return root


@pytest.fixture
def stamp(monkeypatch):
    import os
    for k in list(os.environ):
        if k.startswith("BARACUDA_") or k in build_stamp.ENV_KEYS or k == "MAX_JOBS":
            monkeypatch.delenv(k)

    def run(root, **env):
        with monkeypatch.context() as m:
            for k, v in env.items():
                m.setenv(k, v)
            return build_stamp.inputs(str(root))
    return run


def test_stamp_follows_the_build_inputs(tree, stamp):
    base = stamp(tree)
    # the script prints the same hash
    out = subprocess.run([sys.executable, str(SCRIPT), "inputs", str(tree)], check=True, cwd="/",
                         capture_output=True, text=True, env={**__import__("os").environ})
    assert out.stdout.strip() == base
    assert len(base) == 64 and stamp(tree) == base
    # not inputs: the build's parallelism, a file outside csrc/, the rebuild switch
    assert stamp(tree, MAX_JOBS="7") == base
    (tree / "README.md").write_text("y")
    assert stamp(tree) == base
    assert stamp(tree, BARACUDA_REBUILD="1") == base
    # inputs: the build settings, the compiler, any source
    for env in ({"BARACUDA_FORCE_CPU": "1"}, {"BARACUDA_FORCE_CPU": "0"}, {"TORCH_CUDA_ARCH_LIST": "9.0"},
                {"CXX": "g++-nonexistent"}, {"CXXFLAGS": "-O0"}):
        assert stamp(tree, **env) != base, env
    src = next(p for p in sorted((tree / "csrc").rglob("*.cpp")))
    text = src.read_text()
    src.write_text(text + "\n// changed\n")
    assert stamp(tree) != base
    src.write_text(text)
    assert stamp(tree) == base
    (tree / "csrc" / "new.h").write_text("// a new header\n")
    assert stamp(tree) != base
    (tree / "csrc" / "new.h").unlink()
    setup = (tree / "setup.py").read_text()
    (tree / "setup.py").write_text(setup + "\n# changed\n")
    assert stamp(tree) != base
    (tree / "setup.py").write_text(setup)
    assert stamp(tree) == base


def test_cpu_only_stamp_leaves_out_the_cuda_kernels(tree, stamp):
    """BARACUDA_FORCE_CPU=1 builds no file of csrc/kernels/cuda: a change there does not
    change that build's stamp, and does change the CUDA build's."""
    cu = next(p for p in sorted((tree / "csrc" / "kernels" / "cuda").glob("*.cu")))
    text = cu.read_text()
    cpu, cuda = stamp(tree, BARACUDA_FORCE_CPU="1"), stamp(tree)
    cu.write_text(text + "\n// changed\n")
    try:
        assert stamp(tree, BARACUDA_FORCE_CPU="1") == cpu
        assert stamp(tree) != cuda
    finally:
        cu.write_text(text)
    # ... which holds only while no source outside it includes one of its files
    outside = [p for p in (ROOT / "csrc").rglob("*")
               if p.is_file() and (ROOT / "csrc" / "kernels" / "cuda") not in p.parents]
    assert outside
    for p in outside:
        assert '#include "kernels/cuda/' not in p.read_text(errors="replace"), p


def test_installed_checks_this_tree(tree):
    run = lambda root: subprocess.run([sys.executable, str(SCRIPT), "installed", str(root)],  # noqa: E731
                                      cwd="/", capture_output=True).returncode
    assert run(tree) == 1  # the interpreter does not import baracuda_torch from a stray copy
