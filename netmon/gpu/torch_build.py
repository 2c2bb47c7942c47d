"""What the installed torch was built for, read from its torch/version.py without importing torch
(the daemon never imports it): the CUDA it was built with, or that it is a CPU build."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

# torch/version.py, written when torch is built: `cuda: Optional[str] = '12.4'`, or None in a
# CPU build (older releases leave out the annotation).
CUDA_LINE = re.compile(r"^cuda\s*(?::[^=]*)?=\s*(?P<value>.+?)\s*$", re.MULTILINE)
_VERSION_LINE = re.compile(r"^__version__\s*=\s*['\"]([^'\"]+)", re.MULTILINE)


def torch_version_py(version_py: Path | None = None) -> str | None:
    """The text of the installed torch's torch/version.py (or of the file given); None when it
    cannot be read."""
    if version_py is None:
        spec = importlib.util.find_spec("torch")
        if spec is None or spec.origin is None:
            return None
        version_py = Path(spec.origin).parent / "version.py"
    try:
        return version_py.read_text()
    except OSError:
        return None


def torch_name(text: str) -> str:
    """torch's name for messages, with the version its version.py gives ("torch 2.4.0+cu124")."""
    version = _VERSION_LINE.search(text)
    return f"torch {version.group(1)}" if version else "torch"


def torch_without_cuda(version_py: Path | None = None) -> str | None:
    """Why the installed torch (or the one whose torch/version.py is given) cannot run NCCL
    ranks; None for a CUDA build."""
    if version_py is None and importlib.util.find_spec("torch") is None:
        return "torch is not installed"
    text = torch_version_py(version_py)
    if text is None:
        return None  # no way to tell without importing it: let the ranks say
    found = CUDA_LINE.search(text)
    if found is None or found.group("value") not in ("None", "''", '""'):
        return None
    return (
        f"{torch_name(text)} is a CPU build (torch.version.cuda is None): install a CUDA build "
        "of torch"
    )
