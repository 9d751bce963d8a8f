#!/usr/bin/env bash
# Installs the Debian packages Loom builds against (the CUDA toolkit and NCCL are expected under
# /usr/local/cuda, or NCCL_HOME). Skips what is already there.
set -euo pipefail
packages=(cmake ninja-build g++ libtbb-dev libboost-dev libboost-program-options-dev
          libgtest-dev libbenchmark-dev)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  sudo=""; [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
command -v nvcc >/dev/null || [ -x /usr/local/cuda/bin/nvcc ] || {
  echo "nvcc not found: install the CUDA toolkit (12.4 or newer) under /usr/local/cuda" >&2; exit 1; }
# cuobjdump (and the nvdisasm it runs) for the SASS check of the MoE kernels
# (scripts/sass_check.py): the toolkit's where it has them, else NVIDIA's wheels from PyPI,
# unpacked under ~/.cache/loom/cuda-tools. Best effort: without them that check is not registered.
tools="$HOME/.cache/loom/cuda-tools"
if [ ! -x /usr/local/cuda/bin/cuobjdump ] && [ ! -x "$tools/bin/cuobjdump" ]; then
  python3 - "$tools" <<'PY' || echo "warning: no cuobjdump fetched; the SASS check will not run" >&2
import glob, os, subprocess, sys, tempfile, zipfile
tools = sys.argv[1]
os.makedirs(os.path.join(tools, "bin"), exist_ok=True)
with tempfile.TemporaryDirectory() as tmp:
    for tool in ("nvdisasm", "cuobjdump"):  # cuobjdump last: its presence marks the pair done
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps",
                        "--only-binary=:all:", "-d", tmp, f"nvidia-cuda-{tool}==13.*"], check=True)
        wheel = glob.glob(os.path.join(tmp, f"nvidia_cuda_{tool}-*.whl"))[0]
        with zipfile.ZipFile(wheel) as z:
            member = next(n for n in z.namelist() if n.endswith(f"/bin/{tool}"))
            target = os.path.join(tools, "bin", tool)
            with z.open(member) as src, open(target, "wb") as dst:
                dst.write(src.read())
            os.chmod(target, 0o755)
PY
fi
