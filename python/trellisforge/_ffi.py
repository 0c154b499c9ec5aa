"""cffi (ABI mode) over zig/include/trellisforge.h; errors become TrellisError with the library's
message."""
from __future__ import annotations

import os
import pathlib

import cffi

_PACKAGE_DIR = pathlib.Path(__file__).resolve().parent
_SOURCE_ROOT = _PACKAGE_DIR.parent.parent
_HEADER_CANDIDATES = (
    _PACKAGE_DIR / "trellisforge.h",
    _SOURCE_ROOT / "zig" / "include" / "trellisforge.h",
)
_LIBRARY_NAME = "libtrellisforge.so"

STATUS_NAMES = {
    0: "ok", 1: "invalid argument", 2: "io", 3: "format", 4: "not found",
    5: "unsupported", 6: "out of memory", 7: "cuda", 8: "internal",
}


class TrellisError(RuntimeError):
    """A call into libtrellisforge failed; `status` is the tf_status code."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status
        self.status_name = STATUS_NAMES.get(status, f"status {status}")


def _header_text() -> str:
    for candidate in _HEADER_CANDIDATES:
        if candidate.is_file():
            lines = candidate.read_text().splitlines()
            break
    else:
        raise ImportError(f"trellisforge.h not found in {[str(c) for c in _HEADER_CANDIDATES]}")
    # cffi's cdef takes declarations only: drop the preprocessor lines and the C++ guard braces.
    keep = [
        line for line in lines
        if not line.lstrip().startswith("#") and line.strip() not in ('extern "C" {', "}")
    ]
    return "\n".join(keep)


def library_path() -> pathlib.Path:
    override = os.environ.get("TRELLISFORGE_LIB")
    if override:
        return pathlib.Path(override)
    for candidate in (_PACKAGE_DIR / _LIBRARY_NAME, _SOURCE_ROOT / "zig-out" / "lib" / _LIBRARY_NAME):
        if candidate.is_file():
            return candidate
    raise ImportError(
        f"{_LIBRARY_NAME} not found beside the package or in zig-out/lib; build it with "
        "`python -m ziglang build` or set TRELLISFORGE_LIB"
    )


def _point_at_nccl() -> None:
    """The library dlopens libnccl.so.2; where only the nvidia-nccl wheel provides it, say where."""
    if "TRELLISFORGE_NCCL" in os.environ:
        return
    try:
        import nvidia.nccl  # the nvidia-nccl-cu* wheel
    except ImportError:
        return
    for base in getattr(nvidia.nccl, "__path__", []):
        candidate = pathlib.Path(base) / "lib" / "libnccl.so.2"
        if candidate.is_file():
            os.environ["TRELLISFORGE_NCCL"] = str(candidate)
            return


_point_at_nccl()
ffi = cffi.FFI()
ffi.cdef(_header_text())
lib = ffi.dlopen(str(library_path()))


def check(status: int) -> None:
    if status != 0:
        raise TrellisError(status, ffi.string(lib.tf_last_error()).decode("utf-8", "replace"))


def version() -> str:
    return ffi.string(lib.tf_version()).decode()


def cuda_device_count() -> int:
    """GPUs of this machine (0 when CUDA is unusable)."""
    out = ffi.new("uint32_t *")
    return int(out[0]) if lib.tf_cuda_device_count(out) == 0 else 0


def cuda_available() -> tuple[bool, str]:
    """(True, "") when a GPU with our kernels is usable, else (False, the reason)."""
    status = lib.tf_cuda_available()
    if status == 0:
        return True, ""
    return False, ffi.string(lib.tf_last_error()).decode("utf-8", "replace")
