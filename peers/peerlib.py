"""Setup shared by Tandem's PyTorch peer programs.

Import this module before torch: it pins OpenBLAS (and OpenMP) to one
thread, which must happen before the library is loaded. Then call
setup_torch() in every process that runs PyTorch work, and blas_warning()
once, in the process that prints the results.
"""

import os
import socket
import statistics
import subprocess

# Before torch loads OpenBLAS: one thread a rank, as Tandem's ranks run.
os.environ["OPENBLAS_NUM_THREADS"] = "1"
os.environ["OMP_NUM_THREADS"] = "1"
# Gloo and TensorPipe pick an interface from the host name; on loopback
# benchmarks that must be lo.
os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
os.environ.setdefault("TP_SOCKET_IFNAME", "lo")

# The libblas.so.3 Debian's python3-torch is linked against; update-alternatives
# points it at OpenBLAS, BLIS, ATLAS or the reference BLAS.
DEBIAN_LIBBLAS = "/usr/lib/x86_64-linux-gnu/libblas.so.3"

LOCALHOST = "127.0.0.1"


def setup_torch():
    """Imports torch, limits it to one thread, and returns the module."""
    import torch

    torch.set_num_threads(1)
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:
        pass  # already set in this process
    return torch


def _libblas_from_ldconfig():
    try:
        out = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return ""
    for line in out.splitlines():
        line = line.strip()
        if line.startswith("libblas.so.3 ") and "x86-64" in line and "=> " in line:
            return line.split("=> ", 1)[1].strip()
    return ""


def libblas_path():
    """The file libblas.so.3 resolves to, "" when there is none."""
    lib = DEBIAN_LIBBLAS if os.path.exists(DEBIAN_LIBBLAS) else _libblas_from_ldconfig()
    return os.path.realpath(lib) if lib else ""


def blas_warning():
    """Prints a warning line when libblas.so.3 is not OpenBLAS.

    The line starts with "# WARNING: libblas.so.3 is PATH," (tandem bench
    reads the path from it): PyTorch on another BLAS, above all the reference
    one, runs several times slower than at its best, and a comparison with
    it flatters Tandem.
    """
    path = libblas_path()
    if "openblas" in path.lower():
        return
    shown = path or "missing"
    print(f"# WARNING: libblas.so.3 is {shown}, not OpenBLAS: install it "
          "(apt-get install -y libopenblas0-pthread); PyTorch runs several times "
          "slower without it and these figures do not show it at its best", flush=True)


def free_port():
    """A TCP port on loopback that was free a moment ago."""
    with socket.socket() as s:
        s.bind((LOCALHOST, 0))
        return s.getsockname()[1]


def parse_size(text):
    """Parses a size in bytes: 4096, 4K, 1M, 64M (powers of 1024)."""
    text = text.strip().upper().removesuffix("B").removesuffix("I")
    scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
    if scale != 1:
        text = text[:-1]
    n = int(text) * scale
    if n <= 0:
        raise ValueError(f"size {text!r} is not positive")
    return n


def median(values):
    return statistics.median(values)
