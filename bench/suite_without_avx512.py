"""The test suite's wall time on this CPU with the code paths a CPU without AVX512 takes: an approximation of the
slower machine kind, which no session here has been lent. --run runs another command so (a bench: its ratios).

    python bench/suite_without_avx512.py              # the README's test command (`python -m pytest`), in the repo
    python bench/suite_without_avx512.py --native     # the same command as it runs here, for the comparison
    python bench/suite_without_avx512.py --run "python bench/decode_smollm2.py --dtype fp32"   # a bench, emulated

What changes (in every Python process the suite starts, through a `sitecustomize` on PYTHONPATH and the environment):
torch reports no AVX512-BF16 and no AMX, so `compute.dtype: auto` trains in fp32 and the bf16 tests are skipped, as
there; ATen's kernels run at AVX2 (`ATEN_CPU_CAPABILITY`), oneDNN and MKL at AVX2 at most. What does not: this CPU's
clock, caches, memory and core count. So the figure measures what the instruction set and the dtype cost the suite,
not the other kind's speed; compare it with `--native` in the same session (machines are noisy). Both modes start
with an empty torch.compile cache, as a fresh machine does. The hook reaches every process the suite starts because
the tests keep the caller's PYTHONPATH after their own (tests/conftest.py: pythonpath).
"""
from __future__ import annotations

import os
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import typer

from speedrun.typer_app import new_app

ROOT = Path(__file__).resolve().parents[1]
# Patches torch once it is imported, in every process: importing torch here would add its import time to each one.
HOOK = '''import importlib.abc, importlib.machinery, sys


class _NoAvx512(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != "torch":
            return None
        sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            module.cpu._is_avx512_bf16_supported = lambda: False
            module.cpu._is_amx_tile_supported = lambda: False
        spec.loader.exec_module = exec_module
        return spec


sys.meta_path.insert(0, _NoAvx512())
'''
AVX2 = {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_ENABLE_INSTRUCTIONS": "AVX2"}
app = new_app()


def summary(out: str) -> str:
    """pytest's last line (counts and its own time) and its slowest durations."""
    lines = out.splitlines()
    start = next((i for i, line in enumerate(lines) if "slowest" in line and "durations" in line), len(lines))
    return "\n".join(lines[start:])


@app.command(help=__doc__)
def main(native: bool = typer.Option(False, help="run the suite as it runs on this CPU, without the emulation"),
         run_cmd: str = typer.Option("", "--run", help="a command to run instead of the suite (split as a "
                                     "shell would), its output printed whole"),
         args: list[str] = typer.Argument(None, help="pytest arguments (default: the whole suite, as configured)")
         ) -> None:
    env = dict(os.environ)
    with tempfile.TemporaryDirectory() as hook_dir, tempfile.TemporaryDirectory() as inductor_dir:
        # a cold compile cache in both modes, as on a fresh machine; and inductor's cache does not key its kernels
        # by ATEN_CPU_CAPABILITY: AVX512 kernels cached here fail under the emulation (SystemError in the kernel)
        env["TORCHINDUCTOR_CACHE_DIR"] = inductor_dir
        if not native:
            (Path(hook_dir) / "sitecustomize.py").write_text(HOOK)
            env["PYTHONPATH"] = os.pathsep.join(p for p in (hook_dir, env.get("PYTHONPATH")) if p)
            env.update(AVX2)
            check = subprocess.run([sys.executable, "-c", "import torch; from speedrun.common import use_bf16; "
                                    "print(torch.backends.cpu.get_cpu_capability(), use_bf16('auto', 'cpu'))"],
                                   env=env, capture_output=True, text=True, check=True).stdout.split()
            if check != ["AVX2", "False"]:
                raise SystemExit(f"the emulation did not take: torch reports {check} (want AVX2, bf16 False)")
        t0 = time.perf_counter()
        cmd = shlex.split(run_cmd) if run_cmd else [sys.executable, "-m", "pytest", *(args or [])]
        run = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
        wall = time.perf_counter() - t0
    print(summary(run.stdout + run.stderr) if run.returncode == 0 and not run_cmd else run.stdout + run.stderr)
    kind = "native" if native else "without AVX512 (emulated: " + ", ".join(f"{k}={v}" for k, v in AVX2.items()) + \
        ", no AVX512-BF16/AMX, so fp32)"
    what = "the command" if run_cmd else "pytest"
    print(f"\n{kind}: {what} exit {run.returncode}, {wall:.0f} s wall ({wall / 60:.1f} min)")
    if run.returncode:
        raise SystemExit(run.returncode)


if __name__ == "__main__":
    app()
