"""Device listing, choice and free memory."""

import sys

import pytest
import torch

import gradexplorer.base.devices as devices_mod
from gradexplorer.base.devices import DeviceInfo, free_memory, list_devices, resolve_device
from gradexplorer.base.errors import GradExplorerError

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
needs_mps = pytest.mark.skipif(
    not (hasattr(torch.backends, "mps") and torch.backends.mps.is_available()), reason="needs MPS"
)

MEMINFO = """\
MemTotal:       16384000 kB
MemFree:         1000000 kB
MemAvailable:    8192000 kB
Buffers:          100000 kB
"""


@pytest.fixture
def fake_meminfo(tmp_path, monkeypatch):
    path = tmp_path / "meminfo"
    path.write_text(MEMINFO)
    monkeypatch.setattr(devices_mod, "_MEMINFO", path)
    return path


def test_cpu_is_always_listed_last():
    listed = list_devices()
    assert listed and all(isinstance(info, DeviceInfo) for info in listed)
    assert listed[-1].name == "cpu"
    assert listed[-1].label.startswith("cpu")
    assert len({info.name for info in listed}) == len(listed)


def test_cpu_memory_comes_from_meminfo(fake_meminfo):
    cpu = list_devices()[-1]
    assert cpu.total_memory == 16384000 * 1024
    assert cpu.free_memory == 8192000 * 1024
    assert cpu.label.endswith(f"{16384000 * 1024 // 2**30} GiB")
    assert free_memory("cpu") == 8192000 * 1024
    assert free_memory(torch.device("cpu")) == 8192000 * 1024


def test_cpu_memory_unknown_without_meminfo(tmp_path, monkeypatch):
    monkeypatch.setattr(devices_mod, "_MEMINFO", tmp_path / "absent")
    assert free_memory("cpu") is None
    cpu = list_devices()[-1]
    assert cpu.total_memory is None and cpu.free_memory is None
    assert "GiB" not in cpu.label


def test_real_meminfo_when_present():
    if not devices_mod._MEMINFO.exists():
        pytest.skip("no /proc/meminfo here")
    free = free_memory("cpu")
    assert isinstance(free, int) and free > 0


def test_cpu_label_names_the_processor(tmp_path, monkeypatch, fake_meminfo):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nmodel name\t: Test CPU 9000\n")
    monkeypatch.setattr(devices_mod, "_CPUINFO", cpuinfo)
    assert list_devices()[-1].label == "cpu - Test CPU 9000, 15 GiB"


def test_auto_picks_the_best_device():
    device = resolve_device("auto")
    if torch.cuda.is_available():
        assert device == torch.device("cuda", 0)
    elif hasattr(torch.backends, "mps") and torch.backends.mps.is_available():
        assert device == torch.device("mps")
    else:
        assert device == torch.device("cpu")
    assert resolve_device() == device


@pytest.mark.parametrize("spec", ["cpu", "CPU", " cpu ", torch.device("cpu")])
def test_cpu_spellings(spec):
    assert resolve_device(spec) == torch.device("cpu")


@pytest.mark.parametrize("spec", ["tpu", "gpu", "banana", "cuda:x", "xla"])
def test_unknown_device_names_the_available_ones(spec):
    with pytest.raises(GradExplorerError) as info:
        resolve_device(spec)
    assert repr(str(spec)) in info.value.problem or str(spec) in info.value.problem
    assert "cpu" in info.value.fix


def test_absent_cuda_device_is_refused():
    missing = torch.cuda.device_count() + 3 if torch.cuda.is_available() else 0
    with pytest.raises(GradExplorerError) as info:
        resolve_device(f"cuda:{missing}")
    assert "not available" in info.value.problem
    assert "cpu" in info.value.fix


@pytest.mark.skipif(torch.cuda.is_available(), reason="machine has CUDA")
def test_cuda_without_cuda_is_refused():
    with pytest.raises(GradExplorerError, match="not available"):
        resolve_device("cuda")


@needs_cuda
def test_cuda_devices_are_listed_first_with_memory():
    listed = list_devices()
    cuda = [info for info in listed if info.name.startswith("cuda:")]
    assert len(cuda) == torch.cuda.device_count()
    assert listed[0].name == "cuda:0"
    first = cuda[0]
    assert first.label.startswith("cuda:0 - ") and first.label.endswith("GiB")
    assert torch.cuda.get_device_name(0) in first.label
    assert first.total_memory > 0
    assert 0 < first.free_memory <= first.total_memory


@needs_cuda
def test_cuda_resolves_with_an_index_and_reports_free_memory():
    assert resolve_device("cuda") == torch.device("cuda", 0)
    assert resolve_device("cuda:0") == torch.device("cuda", 0)
    assert resolve_device("auto") == torch.device("cuda", 0)
    free = free_memory("cuda:0")
    assert isinstance(free, int) and free > 0
    assert free_memory(torch.device("cuda")) == pytest.approx(free, rel=0.2)


@needs_mps
def test_mps_is_listed_and_resolves():
    assert "mps" in [info.name for info in list_devices()]
    assert resolve_device("mps") == torch.device("mps")


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's allocator and /proc: Linux")
def test_release_host_memory_gives_freed_memory_back():
    """Memory freed in small blocks stays in the process (glibc keeps the pages, as it kept
    efficientnet_v2_l's working memory after a run) until release_host_memory gives it back."""
    from gradexplorer.base.devices import release_host_memory

    def rss() -> int:
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS:"))

    release_host_memory()
    blocks = [bytearray(64 << 10) for _ in range(3200)]  # 200 MiB from glibc's heap, written
    fence = bytearray(64 << 10)  # above them: the heap's top stays in use, so free() trims nothing
    held = rss()
    del blocks
    kept = rss()
    release_host_memory()
    given_back = rss()
    assert kept > given_back + (100 << 20), (held, kept, given_back)
    del fence
