"""Which devices a capture can run on, and how much memory they have free."""

from __future__ import annotations

import ctypes
import gc
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

from gradexplorer.base.errors import GradExplorerError

_MEMINFO = Path("/proc/meminfo")
_CPUINFO = Path("/proc/cpuinfo")


@dataclass(frozen=True)
class DeviceInfo:
    """One device a model can run on.

    Attributes
    ----------
    name : str
        What ``resolve_device`` accepts: ``"cpu"``, ``"cuda:0"``, ``"mps"``.
    label : str
        For menus: ``"cuda:0 - NVIDIA H200, 139 GiB"``.
    total_memory : int or None
        Bytes, when known.
    free_memory : int or None
        Bytes free when the list was made, when known.
    """

    name: str
    label: str
    total_memory: int | None
    free_memory: int | None


def list_devices() -> list[DeviceInfo]:
    """The devices available now, best first: CUDA devices, then MPS, then the CPU.

    Returns
    -------
    list of DeviceInfo
        Never empty: the CPU is always there. Asking a CUDA device for its free memory
        starts a CUDA context on it.
    """
    devices = []
    total: int | None
    if torch.cuda.is_available():
        for index in range(torch.cuda.device_count()):
            name = f"cuda:{index}"
            props = torch.cuda.get_device_properties(index)
            total = int(props.total_memory)
            devices.append(
                DeviceInfo(name, _label(name, props.name, total), total, free_memory(name))
            )
    if _mps_available():
        total = _mps_total_memory()
        devices.append(DeviceInfo("mps", _label("mps", "Apple GPU", total), total, None))
    total = meminfo_bytes("MemTotal")
    devices.append(DeviceInfo("cpu", _label("cpu", _cpu_name(), total), total, free_memory("cpu")))
    return devices


def resolve_device(spec: str | torch.device = "auto") -> torch.device:
    """Turn the user's device choice into a ``torch.device`` that exists here.

    Parameters
    ----------
    spec : str or torch.device
        ``"auto"`` (``cuda:0`` if there is one, else ``mps``, else ``cpu``), ``"cpu"``,
        ``"cuda"`` (same as ``"cuda:0"``), ``"cuda:N"`` or ``"mps"``.

    Returns
    -------
    torch.device
        With an explicit index for CUDA.

    Raises
    ------
    GradExplorerError
        When the device is unknown or not available (any more); the message lists the ones
        that are.
    """
    text = str(spec).strip().lower()
    if text == "auto":
        if torch.cuda.is_available() and torch.cuda.device_count() > 0:
            return torch.device("cuda", 0)
        if _mps_available():
            return torch.device("mps")
        return torch.device("cpu")
    try:
        device = torch.device(text)
    except (RuntimeError, ValueError):
        raise _not_available(str(spec), "is not a device name") from None
    if device.type == "cpu":
        return torch.device("cpu")
    if device.type == "cuda":
        index = 0 if device.index is None else device.index
        if not torch.cuda.is_available() or index >= torch.cuda.device_count():
            raise _not_available(str(spec), "is not available on this machine")
        return torch.device("cuda", index)
    if device.type == "mps":
        if not _mps_available():
            raise _not_available(str(spec), "is not available on this machine")
        return torch.device("mps")
    raise _not_available(str(spec), "is not supported by gradexplorer")


def free_memory(device: str | torch.device) -> int | None:
    """Bytes free on ``device`` now, or None when it cannot be told.

    Parameters
    ----------
    device : str or torch.device
        ``"cpu"``, ``"cuda:N"``, ``"mps"``.

    Returns
    -------
    int or None
        CPU: ``MemAvailable`` from ``/proc/meminfo`` (None elsewhere than Linux). CUDA:
        ``torch.cuda.mem_get_info``. MPS: the recommended working-set size less what the
        driver holds, when this torch can say.
    """
    device = torch.device(device)
    if device.type == "cpu":
        return meminfo_bytes("MemAvailable")
    if device.type == "cuda":
        try:
            free, _total = torch.cuda.mem_get_info(0 if device.index is None else device.index)
        except (RuntimeError, AssertionError, ValueError):  # vanished or no CUDA build
            return None
        return int(free)
    if device.type == "mps":
        total = _mps_total_memory()
        try:
            used = int(torch.mps.driver_allocated_memory())
        except (AttributeError, RuntimeError):
            return None
        return None if total is None else max(total - used, 0)
    return None


def release_host_memory() -> None:
    """Give the memory a finished capture freed back to the system.

    Python and torch free a capture's working memory when it ends, but glibc's allocator
    keeps the pages for later: a process that had run efficientnet_v2_l statistics-only
    stayed gigabytes over its size before the run, and each later run added to it. A garbage
    collection (a replaced capture's cycles) and ``malloc_trim(0)`` return them
    (``docs/benchmarks.md``, the memory estimate). Elsewhere than glibc, only the collection.
    """
    gc.collect()
    if not sys.platform.startswith("linux"):
        return
    try:
        trim = ctypes.CDLL("libc.so.6").malloc_trim
    except (OSError, AttributeError):  # not glibc (musl has no malloc_trim)
        return
    trim(0)


def _not_available(spec: str, why: str) -> GradExplorerError:
    names = ", ".join(info.name for info in list_devices())
    return GradExplorerError(f"The device '{spec}' {why}.", f"Choose auto or one of: {names}.")


def _label(name: str, model: str | None, total: int | None) -> str:
    parts = [part for part in (model, _gib(total)) if part]
    return f"{name} - {', '.join(parts)}" if parts else name


def _gib(size: int | None) -> str | None:
    return None if size is None else f"{size // 2**30} GiB"


def _mps_available() -> bool:
    backend = getattr(torch.backends, "mps", None)
    return bool(backend is not None and backend.is_available())


def _mps_total_memory() -> int | None:
    try:
        return int(torch.mps.recommended_max_memory())
    except (AttributeError, RuntimeError):
        return None


def meminfo_bytes(field: str) -> int | None:
    """A field of ``/proc/meminfo`` (``"MemTotal"``, ``"MemAvailable"``) in bytes.

    ``None`` where the file is missing (not Linux) or the field is absent or unreadable.
    """
    try:
        text = _MEMINFO.read_text()
    except OSError:
        return None
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key == field:
            parts = value.split()
            try:
                # /proc/meminfo says "kB" and means KiB.
                return int(parts[0]) * 1024
            except (IndexError, ValueError):
                return None
    return None


def _cpu_name() -> str | None:
    try:
        text = _CPUINFO.read_text()
    except OSError:
        return None
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "model name" and value.strip():
            return value.strip()
    return None
