import errno
import os

import pytest
import torch
from torch import nn

from gradexplorer.base.errors import CaptureFileError
from gradexplorer.capturing.capture import capture
from gradexplorer.files.capture_file import FORMAT, VERSION, atomic_save, load_capture, save_capture


def small_capture(mode="full"):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(inplace=True), nn.Flatten(), nn.Linear(4 * 6 * 6, 3))
    return capture(model, torch.randn(2, 3, 8, 8), mode=mode, input_grad=True,
                   meta={"model": "tiny", "weights": None, "categories": ["a", "b", "c"]})


def test_export_opens_with_plain_torch_load_and_round_trips(tmp_path):
    cap = small_capture()
    path = save_capture(cap, tmp_path / "cap.pt")
    data = torch.load(path, weights_only=True)
    assert data["format"] == FORMAT and data["version"] == VERSION
    meta = data["meta"]
    for key in ("model", "weights", "target", "device", "dtype", "mode", "torch_version", "created",
                "layer_order", "categories"):
        assert key in meta
    assert meta["layer_order"] == ["0", "1", "2", "3"]
    call = data["layers"]["0"]["calls"][0]
    assert torch.equal(call["activation"], cap["0"].calls[0].activation)
    assert torch.equal(call["grad_output"], cap["0"].calls[0].grad_output)
    assert torch.equal(call["grad_input"], data["input_grad"])  # the first layer gets the batch
    assert set(call["stats"]) == {"activation", "grad_output", "grad_input"}
    assert torch.equal(data["layers"]["3"]["param_grads"]["weight"], cap["3"].param_grads["weight"])
    assert torch.equal(data["input_grad"], cap.input_grad)
    back = load_capture(path)
    assert back.layer_order == cap.layer_order
    for (_, _, a), (_, _, b) in zip(back.iter_calls(), cap.iter_calls()):
        for kind in ("activation", "grad_output", "grad_input"):
            x, y = getattr(a, kind), getattr(b, kind)
            assert (x is None and y is None) or torch.equal(x, y)
        assert a.stats["activation"]["hist_range"] == b.stats["activation"]["hist_range"]
        assert a.shape == b.shape
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_stats_only_export_has_no_tensors(tmp_path):
    path = save_capture(small_capture("stats"), tmp_path / "s.pt")
    data = torch.load(path, weights_only=True)
    call = data["layers"]["1"]["calls"][0]
    assert call["activation"] is None and call["grad_output"] is None
    assert call["stats"]["grad_output"]["l2"] > 0
    assert data["layers"]["3"]["param_grads"]["weight"] is None
    assert data["meta"]["mode"] == "stats"


def test_foreign_and_newer_files_are_refused(tmp_path):
    foreign = tmp_path / "foreign.pt"
    torch.save({"weights": torch.zeros(3)}, foreign)
    with pytest.raises(CaptureFileError, match="not a gradexplorer capture"):
        load_capture(foreign)
    newer = tmp_path / "newer.pt"
    torch.save({"format": FORMAT, "version": VERSION + 1, "meta": {}, "layers": {}}, newer)
    with pytest.raises(CaptureFileError, match="newer gradexplorer"):
        load_capture(newer)
    junk = tmp_path / "junk.pt"
    junk.write_bytes(b"\x00garbage")
    with pytest.raises(CaptureFileError, match=r"junk\.pt"):
        load_capture(junk)
    with pytest.raises(CaptureFileError, match="no file"):
        load_capture(tmp_path / "missing.pt")


def test_pickled_code_in_a_capture_file_never_runs(tmp_path):
    marker = tmp_path / "ran"

    class Evil:
        def __reduce__(self):
            return (open, (str(marker), "w"))

    path = tmp_path / "evil.pt"
    torch.save({"format": FORMAT, "version": 1, "x": Evil()}, path)
    with pytest.raises(CaptureFileError):
        load_capture(path)
    assert not marker.exists()


@pytest.mark.skipif(os.geteuid() == 0, reason="root can write to read-only folders")
def test_read_only_folder(tmp_path):
    folder = tmp_path / "ro"
    folder.mkdir()
    folder.chmod(0o500)
    try:
        with pytest.raises(CaptureFileError, match="permission denied"):
            save_capture(small_capture(), folder / "c.pt")
    finally:
        folder.chmod(0o700)


def test_read_only_folder_even_as_root(tmp_path, monkeypatch):
    """Simulated: the temporary file refused with EROFS (what a read-only mount says, even to root)."""
    import gradexplorer.base.file_write

    def refuse(*a, **k):
        raise OSError(errno.EROFS, "Read-only file system")

    monkeypatch.setattr(gradexplorer.base.file_write, "_open_temp", refuse)
    with pytest.raises(CaptureFileError, match="permission denied"):
        save_capture(small_capture(), tmp_path / "c.pt")


def test_disk_full_leaves_no_partial_file_and_keeps_the_old_one(tmp_path):
    path = tmp_path / "c.pt"
    path.write_bytes(b"previous export")

    def full_disk_saver(obj, fh):
        fh.write(b"x" * 1000)
        raise OSError(errno.ENOSPC, "No space left on device")

    with pytest.raises(CaptureFileError, match="disk is full"):
        atomic_save({"a": 1}, path, saver=full_disk_saver)
    assert path.read_bytes() == b"previous export"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.pt"]
    with pytest.raises(CaptureFileError, match="does not exist"):
        save_capture(small_capture(), tmp_path / "nope" / "c.pt")


def test_a_capture_larger_than_the_free_space_is_refused_before_writing(tmp_path, monkeypatch):
    import gradexplorer.base.file_write

    cap = small_capture()
    monkeypatch.setattr(gradexplorer.base.file_write, "_free_bytes", lambda folder: 16)
    with pytest.raises(CaptureFileError, match="Not enough disk space") as info:
        save_capture(cap, tmp_path / "c.pt")
    assert "16 B free" in info.value.problem
    assert list(tmp_path.iterdir()) == []
    monkeypatch.setattr(gradexplorer.base.file_write, "_free_bytes", lambda folder: 10 << 30)
    assert save_capture(cap, tmp_path / "c.pt").is_file()


def test_the_root_module_and_the_reasons_for_absent_gradients_round_trip(tmp_path):
    """A default capture of a ViT holds the root module (layer ""), the containers that own
    parameters and a never-called out_proj; the file keeps them, every parameter gradient by
    its full name, and why a gradient is absent. A file written before those fields existed
    still opens, without reasons."""
    from gradexplorer.files.schema import check_capture_data
    from tests.core.test_capture_exactness import LastState, tiny_vit

    torch.manual_seed(0)
    vit = tiny_vit()
    cap = capture(vit, torch.randn(2, 3, 32, 32))
    path = save_capture(cap, tmp_path / "vit.pt")
    back = load_capture(path)
    assert back.layer_order == cap.layer_order and back.layer_order[0] == ""
    assert set(back.param_grads) == {n for n, _ in vit.named_parameters()}
    for name, g in cap.param_grads.items():
        assert torch.equal(back.param_grads[name], g), name
    out_proj = "encoder.layers.encoder_layer_0.self_attention.out_proj"
    assert not back[out_proj].called and back.meta["not_called"] == cap.meta["not_called"]
    assert back[""].calls[0].absent == cap[""].calls[0].absent == {"grad_input": "it does not require a gradient"}

    lstm = capture(LastState(batch_first=True).eval(), torch.randint(0, 10, (2, 4)), mode="stats")
    path = save_capture(lstm, tmp_path / "lstm.pt")
    assert load_capture(path)["rnn"].calls[0].absent == lstm["rnn"].calls[0].absent
    assert "grad_output" in lstm["rnn"].calls[0].absent

    data = torch.load(path, weights_only=True)
    for layer in data["layers"].values():
        layer.pop("param_absent")
        for call in layer["calls"]:
            call.pop("absent")
    check_capture_data(data)
    torch.save(data, tmp_path / "older.pt")
    older = load_capture(tmp_path / "older.pt")
    assert older["rnn"].calls[0].absent == {} and older["rnn"].calls[0].stats["grad_output"] is None

    data["layers"]["rnn"]["calls"][0]["absent"] = {"grad_output": 3}
    torch.save(data, tmp_path / "bad.pt")
    with pytest.raises(CaptureFileError, match=r"absent\['grad_output'\] is an int, expected a string"):
        load_capture(tmp_path / "bad.pt")
