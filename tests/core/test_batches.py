"""Tests for gradexplorer.batches: images, tensor files, random batches, labels, shape checks."""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image, ImageFile

from gradexplorer.base.errors import BatchError
from gradexplorer.batches import (
    DEFAULT_PREPROCESS_DESCRIPTION,
    check_batch_shape,
    describe,
    load_batch,
    load_images,
    load_tensor_file,
    parse_labels,
    random_batch,
)
from gradexplorer.capturing.inputs import Batch
from gradexplorer.models.loaded_model import LoadedModel


def identity_preprocess(img: Image.Image) -> torch.Tensor:
    """RGB PIL image → (3, H, W) float in [0, 1], no resizing: pixels stay checkable."""
    return torch.from_numpy(np.asarray(img, dtype=np.float32) / 255.0).permute(2, 0, 1)


def make_image(path: Path, mode: str = "RGB", size=(40, 30), color=(200, 30, 10), **save) -> Path:
    Image.new(mode, size, color).save(path, **save)
    return path


def make_marker(path: str) -> None:
    Path(path).write_text("the pickle ran code")


class Evil:
    """Unpickling this writes a marker file: proof that code ran."""

    def __init__(self, marker: Path) -> None:
        self.marker = str(marker)

    def __reduce__(self):
        return (make_marker, (self.marker,))


def message(exc_info) -> str:
    return str(exc_info.value)


# ---------------------------------------------------------------------------
# Images
# ---------------------------------------------------------------------------


def test_rgb_png_and_jpeg_default_preprocess(tmp_path):
    png = make_image(tmp_path / "a.png", size=(400, 300))
    jpg = make_image(tmp_path / "b.jpg", size=(300, 500), quality=95)
    batch = load_images([png, jpg])
    assert isinstance(batch, Batch)
    assert batch.tensor.shape == (2, 3, 224, 224)
    assert batch.tensor.dtype == torch.float32
    assert batch.names == ["a.png", "b.jpg"]
    assert batch.labels is None
    assert batch.preprocessing == DEFAULT_PREPROCESS_DESCRIPTION
    assert "ImageNet" in batch.preprocessing and "224" in batch.preprocessing
    # ImageNet normalisation of red 200/255: (0.784 - 0.485) / 0.229
    assert batch.tensor[0, 0].mean().item() == pytest.approx((200 / 255 - 0.485) / 0.229, abs=1e-4)
    assert [im.mode for im in batch.images] == ["RGB", "RGB"]
    assert batch.images[0].size == (400, 300)
    assert batch.source.startswith("2 images from ")


def test_rgba_transparent_pixel_becomes_white(tmp_path):
    img = Image.new("RGBA", (4, 4), (255, 0, 0, 255))
    img.putpixel((0, 0), (0, 0, 0, 0))  # fully transparent black
    img.putpixel((1, 0), (0, 0, 0, 128))  # half transparent black
    img.save(tmp_path / "alpha.png")
    batch = load_images([tmp_path / "alpha.png"], preprocess=identity_preprocess, preprocess_description="identity")
    assert batch.tensor.shape == (1, 3, 4, 4)
    assert batch.tensor[0, :, 0, 0].tolist() == [1.0, 1.0, 1.0]
    assert batch.tensor[0, :, 0, 1].tolist() == pytest.approx([127 / 255] * 3, abs=2 / 255)
    assert batch.tensor[0, :, 1, 1].tolist() == [1.0, 0.0, 0.0]
    assert "alpha channel composited onto white" in batch.preprocessing
    assert batch.preprocessing.endswith("identity")
    assert batch.images[0].mode == "RGB"


def test_grayscale_image_gives_three_channels(tmp_path):
    make_image(tmp_path / "grey.png", mode="L", color=77)
    batch = load_images([tmp_path / "grey.png"], preprocess=identity_preprocess)
    assert batch.tensor.shape == (1, 3, 30, 40)
    assert torch.all(batch.tensor == 77 / 255)
    assert "grayscale converted to RGB" in batch.preprocessing
    assert "custom preprocess" in batch.preprocessing


def test_16_bit_grayscale_is_scaled_not_clipped(tmp_path):
    arr = np.full((8, 8), 32768, dtype=np.uint16)
    Image.fromarray(arr).save(tmp_path / "deep.png")
    batch = load_images([tmp_path / "deep.png"], preprocess=identity_preprocess)
    assert batch.tensor.mean().item() == pytest.approx(128 / 255, abs=1 / 255)


def test_palette_image_is_converted(tmp_path):
    img = Image.new("RGB", (10, 10), (0, 128, 255)).convert("P", palette=Image.Palette.ADAPTIVE, colors=4)
    img.save(tmp_path / "pal.png")
    with Image.open(tmp_path / "pal.png") as reread:
        assert reread.mode == "P"
    batch = load_images([tmp_path / "pal.png"], preprocess=identity_preprocess)
    assert batch.tensor.shape == (1, 3, 10, 10)
    assert batch.tensor[0, :, 0, 0].tolist() == pytest.approx([0, 128 / 255, 1.0], abs=1e-6)
    assert "palette image converted to RGB" in batch.preprocessing


def test_mixed_modes_name_which_files_were_converted(tmp_path):
    make_image(tmp_path / "a.png")
    make_image(tmp_path / "b.png", mode="L", color=5)
    batch = load_images([tmp_path], preprocess=identity_preprocess)
    assert "grayscale converted to RGB (b.png)" in batch.preprocessing


def test_large_originals_are_kept_shrunk(tmp_path):
    make_image(tmp_path / "big.png", size=(3000, 1500))
    batch = load_images([tmp_path / "big.png"])
    assert batch.images[0].size == (1024, 512)
    assert batch.tensor.shape == (1, 3, 224, 224)


def test_corrupt_bytes_are_refused(tmp_path):
    bad = tmp_path / "noise.jpg"
    bad.write_bytes(b"\xff\xd8\xff\xe0 this is not really a jpeg" * 3)
    with pytest.raises(BatchError) as exc:
        load_images([bad])
    assert "noise.jpg" in message(exc)
    assert "is not a readable image" in message(exc)
    assert "choose PNG or JPEG" in exc.value.fix


def test_empty_file_is_refused(tmp_path):
    empty = tmp_path / "empty.png"
    empty.touch()
    with pytest.raises(BatchError) as exc:
        load_images([empty])
    assert "empty.png" in message(exc)
    assert "the file is empty" in message(exc)
    assert "PNG or JPEG" in exc.value.fix


def test_truncated_jpeg_is_refused(tmp_path):
    whole = make_image(tmp_path / "whole.jpg", size=(256, 256), quality=95)
    data = whole.read_bytes()
    cut = tmp_path / "cut.jpg"
    cut.write_bytes(data[: len(data) // 2])
    with pytest.raises(BatchError) as exc:
        load_images([cut])
    assert "cut.jpg" in message(exc)
    assert "truncated JPEG data" in message(exc)
    assert "PNG or JPEG" in exc.value.fix


def test_truncated_jpeg_is_refused_even_when_pillow_is_told_to_allow_it(tmp_path, monkeypatch):
    monkeypatch.setattr(ImageFile, "LOAD_TRUNCATED_IMAGES", True)
    data = make_image(tmp_path / "whole.jpg", size=(256, 256), quality=95).read_bytes()
    (tmp_path / "cut.jpg").write_bytes(data[: len(data) // 2])
    with pytest.raises(BatchError, match="truncated JPEG data"):
        load_images([tmp_path / "cut.jpg"])
    assert ImageFile.LOAD_TRUNCATED_IMAGES is True  # the caller's setting is put back


def test_text_file_named_png_is_refused(tmp_path):
    fake = tmp_path / "notes.png"
    fake.write_text("just some text, not pixels\n")
    with pytest.raises(BatchError) as exc:
        load_images([fake])
    assert "notes.png" in message(exc)
    assert "not a recognised image format" in message(exc)


def test_folder_expands_to_sorted_images_and_ignores_other_files(tmp_path):
    folder = tmp_path / "pics"
    folder.mkdir()
    make_image(folder / "b.jpg")
    make_image(folder / "a.png")
    make_image(folder / "C.PNG")
    (folder / "README").write_text("not an image")
    (folder / "notes.txt").write_text("not an image")
    (folder / "._a.png").write_bytes(b"\x00\x05\x16\x07 AppleDouble")
    (folder / "sub").mkdir()
    make_image(folder / "sub" / "nested.png")
    batch = load_images([folder], preprocess=identity_preprocess)
    assert batch.names == ["C.PNG", "a.png", "b.jpg"]
    assert len(batch) == 3
    assert str(folder) in batch.source


def test_empty_folder_is_refused(tmp_path):
    folder = tmp_path / "nothing"
    folder.mkdir()
    with pytest.raises(BatchError) as exc:
        load_images([folder])
    assert "nothing" in message(exc)
    assert "no image files" in message(exc)
    assert "PNG or JPEG" in exc.value.fix


def test_folder_without_images_lists_what_it_found(tmp_path):
    (tmp_path / "README.md").write_text("hi")
    with pytest.raises(BatchError, match=r"no image files \(found: README.md\)"):
        load_images([tmp_path])


def test_different_sizes_after_preprocessing_are_refused(tmp_path):
    make_image(tmp_path / "small.png", size=(10, 10))
    make_image(tmp_path / "wide.png", size=(20, 10))
    with pytest.raises(BatchError) as exc:
        load_images([tmp_path], preprocess=identity_preprocess)
    assert "'small.png' → (3, 10, 10)" in message(exc)
    assert "'wide.png' → (3, 10, 20)" in message(exc)
    assert "one size" in exc.value.fix


def test_missing_path_is_named(tmp_path):
    with pytest.raises(BatchError, match=r"gone\.png' does not exist"):
        load_images([tmp_path / "gone.png"])


def test_load_images_takes_integer_labels(tmp_path):
    make_image(tmp_path / "a.png")
    make_image(tmp_path / "b.png")
    batch = load_images([tmp_path], preprocess=identity_preprocess, labels="4, 2")
    assert batch.labels.tolist() == [4, 2]
    assert batch.labels.dtype == torch.int64


# ---------------------------------------------------------------------------
# Tensor files
# ---------------------------------------------------------------------------


def test_pt_file_with_a_tensor(tmp_path):
    x = torch.randn(4, 3, 8, 8)
    torch.save(x, tmp_path / "x.pt")
    batch = load_tensor_file(tmp_path / "x.pt")
    assert torch.equal(batch.tensor, x)
    assert batch.labels is None
    assert batch.names == ["x[0]", "x[1]", "x[2]", "x[3]"]
    assert batch.source == f"4 samples from {tmp_path / 'x.pt'}"
    assert "none" in batch.preprocessing


def test_pt_file_with_input_and_labels_dict(tmp_path):
    x = torch.randn(3, 3, 8, 8)
    y = torch.tensor([2, 0, 1])
    torch.save({"inputs": x, "targets": y}, tmp_path / "d.pt")
    batch = load_tensor_file(tmp_path / "d.pt")
    assert torch.equal(batch.tensor, x)
    assert batch.labels.tolist() == [2, 0, 1]
    assert batch.labels.dtype == torch.int64
    # labels given by the user replace those in the file
    assert load_tensor_file(tmp_path / "d.pt", labels="1").labels.tolist() == [1, 1, 1]


def test_pt_file_labels_of_wrong_length_are_refused(tmp_path):
    torch.save({"x": torch.randn(3, 2), "y": torch.tensor([1, 2])}, tmp_path / "d.pt")
    with pytest.raises(BatchError, match="give 2 labels for 3 samples"):
        load_tensor_file(tmp_path / "d.pt")


def test_capture_file_input_is_used(tmp_path):
    x = torch.randn(2, 3, 8, 8)
    torch.save({"format": "gradexplorer.capture", "version": 1, "input": x, "stats": {}}, tmp_path / "run.gxcap")
    batch = load_tensor_file(tmp_path / "run.gxcap")
    assert torch.equal(batch.tensor, x)
    # load_batch recognises it by content, not by its ending
    assert torch.equal(load_batch([str(tmp_path / "run.gxcap")]).tensor, x)


def test_uint8_tensor_is_scaled_to_unit_range(tmp_path):
    torch.save(torch.full((2, 3, 4, 4), 255, dtype=torch.uint8), tmp_path / "u8.pt")
    batch = load_tensor_file(tmp_path / "u8.pt")
    assert batch.tensor.dtype == torch.float32
    assert torch.all(batch.tensor == 1.0)
    assert "uint8" in batch.preprocessing and "[0, 1]" in batch.preprocessing


def test_integer_token_ids_are_kept(tmp_path):
    torch.save(torch.tensor([[1, 5, 9]]), tmp_path / "ids.pt")
    assert load_tensor_file(tmp_path / "ids.pt").tensor.dtype == torch.int64


def test_pt_file_with_a_list_of_strings_is_refused(tmp_path):
    torch.save(["cat.jpg", "dog.jpg"], tmp_path / "list.pt")
    with pytest.raises(BatchError) as exc:
        load_tensor_file(tmp_path / "list.pt")
    assert "list.pt" in message(exc)
    assert "a list of 2 items (str)" in message(exc)
    assert "torch.save(x, 'input.pt')" in exc.value.fix


def test_pt_file_dict_without_input_lists_its_keys(tmp_path):
    torch.save({"weights": torch.zeros(2), "epoch": 3}, tmp_path / "sd.pt")
    with pytest.raises(BatchError) as exc:
        load_tensor_file(tmp_path / "sd.pt")
    assert "'weights', 'epoch'" in message(exc)
    assert "no input tensor" in message(exc)
    assert "'input'" in exc.value.fix


def test_pickled_object_is_refused_and_never_runs(tmp_path):
    marker = tmp_path / "ran.txt"
    # Control: the payload does run code when unpickled the unsafe way.
    control = tmp_path / "control.txt"
    pickle.loads(pickle.dumps(Evil(control)))
    assert control.exists()

    torch.save(Evil(marker), tmp_path / "evil.pt")
    with pytest.raises(BatchError) as exc:
        load_tensor_file(tmp_path / "evil.pt")
    assert not marker.exists()
    assert "evil.pt" in message(exc)
    assert "pickled Python objects" in message(exc)
    assert "make_marker" in message(exc)
    assert "torch.save(x, 'input.pt')" in exc.value.fix
    with pytest.raises(BatchError):
        load_batch([str(tmp_path / "evil.pt")])
    assert not marker.exists()


def test_damaged_and_empty_pt_files_are_refused(tmp_path):
    (tmp_path / "junk.pt").write_bytes(b"hello, not a checkpoint")
    (tmp_path / "empty.pt").touch()
    with pytest.raises(BatchError, match=r"junk\.pt' is not a readable PyTorch file"):
        load_tensor_file(tmp_path / "junk.pt")
    with pytest.raises(BatchError, match=r"empty.pt' is not a readable PyTorch file \(the file is empty\)"):
        load_tensor_file(tmp_path / "empty.pt")


def test_single_sample_without_batch_dim_is_left_for_the_shape_check(tmp_path):
    torch.save(torch.randn(3, 16, 16), tmp_path / "one.pt")
    batch = load_tensor_file(tmp_path / "one.pt")
    assert batch.tensor.shape == (3, 16, 16)
    with pytest.raises(BatchError, match="batch dimension is missing"):
        check_batch_shape(batch, (3, 16, 16))


# ---------------------------------------------------------------------------
# Random batches
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("text", ["2x3x224x224", "2,3,224,224", "2 x 3 x 224 x 224", "(2, 3, 224, 224)", "2×3×224×224"])
def test_random_shape_strings(text):
    batch = random_batch(text)
    assert batch.tensor.shape == (2, 3, 224, 224)
    assert batch.names == ["random[0]", "random[1]"]


def test_random_batch_is_deterministic_given_seed():
    a, b, c = random_batch((4, 5), seed=3), random_batch("4x5", seed=3), random_batch("4x5", seed=4)
    assert torch.equal(a.tensor, b.tensor)
    assert not torch.equal(a.tensor, c.tensor)
    assert abs(random_batch("64x64x16").tensor.std().item() - 1) < 0.05
    assert "seed 3" in a.source


def test_random_batch_without_seed_reports_the_seed_it_used():
    batch = random_batch("2x3", seed=None)
    seed = int(batch.source.rsplit("seed ", 1)[1])
    assert torch.equal(random_batch("2x3", seed=seed).tensor, batch.tensor)


@pytest.mark.parametrize("bad", ["", "2xx3", "two by three", "2x3.5", "-2x3", "2x0x4", "99999x99999x99"])
def test_bad_shape_strings_are_refused_with_an_example(bad):
    with pytest.raises(BatchError) as exc:
        random_batch(bad)
    assert "2x3x224x224" in exc.value.fix or "at least 1" in exc.value.fix or "smaller" in exc.value.fix


def test_bad_shape_string_names_the_value_and_gives_an_example():
    with pytest.raises(BatchError) as exc:
        random_batch("2xx3")
    assert "'2xx3' is not a shape" in message(exc)
    assert "e.g. '2x3x224x224'" in exc.value.fix


# ---------------------------------------------------------------------------
# Labels
# ---------------------------------------------------------------------------

CATEGORIES = ["tench", "goldfish", "tabby", "tiger cat", "crane", "golden retriever", "crane"]


def test_labels_as_ints():
    assert parse_labels("3,1,0", 3).tolist() == [3, 1, 0]
    assert parse_labels([3, 1, 0], 3).dtype == torch.int64
    assert parse_labels(" 2 ", 4).tolist() == [2, 2, 2, 2]
    assert parse_labels(5, 2).tolist() == [5, 5]


def test_labels_as_names_case_insensitive():
    labels = parse_labels("Tabby, TIGER CAT, golden_retriever", 3, CATEGORIES)
    assert labels.tolist() == [2, 3, 5]
    assert parse_labels("goldfish", 2, CATEGORIES).tolist() == [1, 1]
    assert parse_labels("1, tabby", 2, CATEGORIES).tolist() == [1, 2]


def test_unknown_name_suggests_close_matches():
    with pytest.raises(BatchError) as exc:
        parse_labels("tabby cat", 1, CATEGORIES)
    assert "'tabby cat' is not one of the model's classes" in message(exc)
    assert "did you mean" in exc.value.fix and "'tabby'" in exc.value.fix


def test_ambiguous_name_asks_for_the_index():
    with pytest.raises(BatchError) as exc:
        parse_labels("crane", 1, CATEGORIES)
    assert "4, 6" in message(exc)
    assert "index" in exc.value.fix


def test_label_count_mismatch():
    with pytest.raises(BatchError) as exc:
        parse_labels("1,2", 3)
    assert "2 labels were given for 3 samples" in message(exc)
    assert "one label per sample" in exc.value.fix


def test_label_out_of_range_and_names_without_categories():
    with pytest.raises(BatchError, match="out of range: the model has 7 classes"):
        parse_labels("7", 1, CATEGORIES)
    with pytest.raises(BatchError, match="model has no class names"):
        parse_labels("tabby", 1)
    with pytest.raises(BatchError, match="negative"):
        parse_labels("-1", 1)


# ---------------------------------------------------------------------------
# Shape checks
# ---------------------------------------------------------------------------


def batch_of(*shape) -> Batch:
    return Batch(tensor=torch.zeros(shape), labels=None, names=[], source="test")


def test_shape_check_accepts_other_spatial_sizes_and_unknown_shape():
    check_batch_shape(batch_of(2, 3, 224, 224), (3, 224, 224))
    check_batch_shape(batch_of(2, 3, 100, 60), (3, 224, 224))
    check_batch_shape(batch_of(2, 1, 5), None)


def test_shape_check_wrong_rank_suggests_unsqueeze():
    with pytest.raises(BatchError) as exc:
        check_batch_shape(batch_of(3, 224, 224), (3, 224, 224))
    assert "(B, 3, 224, 224)" in message(exc)
    assert "(3, 224, 224)" in message(exc)
    assert "unsqueeze(0)" in exc.value.fix


def test_shape_check_other_rank():
    with pytest.raises(BatchError) as exc:
        check_batch_shape(batch_of(2, 50), (3, 224, 224))
    assert "(B, 3, 224, 224)" in message(exc) and "(2, 50)" in message(exc)
    with pytest.raises(BatchError, match="squeeze"):
        check_batch_shape(batch_of(1, 2, 3, 8, 8), (3, 8, 8))


def test_shape_check_wrong_channel_count():
    with pytest.raises(BatchError) as exc:
        check_batch_shape(batch_of(2, 1, 224, 224), (3, 224, 224))
    assert "(B, 3, 224, 224)" in message(exc)
    assert "(2, 1, 224, 224)" in message(exc)
    assert "1 channel instead of 3" in message(exc)
    assert "RGB" in exc.value.fix


# ---------------------------------------------------------------------------
# load_batch and describe
# ---------------------------------------------------------------------------


def test_load_batch_dispatches_random_and_shapes():
    assert load_batch(["random:2x3x8x8"]).tensor.shape == (2, 3, 8, 8)
    assert load_batch(["2x3x8x8"]).tensor.shape == (2, 3, 8, 8)
    model = LoadedModel(module=torch.nn.Identity(), spec="x", name="x", input_shape=(3, 8, 8))
    assert load_batch(["random"], model).tensor.shape == (2, 3, 8, 8)


def test_load_batch_uses_model_preprocess_and_category_names(tmp_path):
    make_image(tmp_path / "a.png", size=(8, 8))
    make_image(tmp_path / "b.png", size=(8, 8))
    model = LoadedModel(
        module=torch.nn.Identity(),
        spec="toy",
        name="toy",
        categories=CATEGORIES,
        preprocess=identity_preprocess,
        preprocess_description="as is",
        input_shape=(3, 8, 8),
    )
    batch = load_batch([str(tmp_path)], model, labels="tabby, tench")
    assert batch.tensor.shape == (2, 3, 8, 8)
    assert batch.labels.tolist() == [2, 0]
    assert batch.preprocessing == "as is"


def test_load_batch_checks_shape_against_the_model(tmp_path):
    torch.save(torch.randn(2, 1, 8, 8), tmp_path / "x.pt")
    model = LoadedModel(module=torch.nn.Identity(), spec="toy", name="toy", input_shape=(3, 8, 8))
    with pytest.raises(BatchError, match=r"\(B, 3, 8, 8\)"):
        load_batch([str(tmp_path / "x.pt")], model)


def test_load_batch_missing_path_and_nothing_given(tmp_path):
    with pytest.raises(BatchError) as exc:
        load_batch([str(tmp_path / "absent.jpg")])
    assert "absent.jpg' does not exist" in message(exc)
    with pytest.raises(BatchError, match="no input was given"):
        load_batch([])
    with pytest.raises(BatchError, match="need a demo model"):
        load_batch(["demo"])


def test_load_batch_demo_asks_core_demos_for_the_model_spec(monkeypatch):
    import types

    seen = []

    def demo_batch(spec):
        seen.append(spec)
        return random_batch("3x1x4x4")

    monkeypatch.setitem(__import__("sys").modules, "gradexplorer.models.demos",
                        types.SimpleNamespace(demo_batch=demo_batch))
    model = LoadedModel(module=torch.nn.Identity(), spec="demo:shapes", name="d", input_shape=(1, 4, 4))
    batch = load_batch(["demo"], model, labels="0,1,2")
    assert seen == ["demo:shapes"]
    assert batch.labels.tolist() == [0, 1, 2]


def test_load_batch_refuses_tensor_file_among_images(tmp_path):
    make_image(tmp_path / "a.png")
    torch.save(torch.zeros(1, 3, 4, 4), tmp_path / "x.pt")
    with pytest.raises(BatchError, match="must be the only input"):
        load_batch([str(tmp_path / "a.png"), str(tmp_path / "x.pt")])


def test_describe(tmp_path):
    make_image(tmp_path / "a.png")
    text = describe(load_images([tmp_path]))
    assert text.startswith(f"1 image (3×224×224) from {tmp_path}, preprocessing: resize shorter side to 256")
    assert describe(random_batch("2x3x8x8")) == "2 random samples (3×8×8) from N(0, 1), seed 0, preprocessing: none"
    odd = Batch(tensor=torch.zeros(5, 10), labels=torch.zeros(5, dtype=torch.long), names=[], source="somewhere")
    assert describe(odd) == "5 samples (10) from somewhere, with labels, preprocessing: none"


def test_text_for_a_picture_model_says_it_takes_pictures():
    """resnet18 given text: it takes pictures, said so with what to give instead; not the
    advice for a model without a tokenizer, a .pt file of token ids, which it cannot take."""
    from gradexplorer.base.errors import BatchError
    from gradexplorer.batches import load_batch
    from gradexplorer.models import load_model

    model = load_model("resnet18")
    with pytest.raises(BatchError) as info:
        load_batch(["text:the cat sat"], model)
    assert info.value.problem == "'resnet18' takes pictures (3×224×224), not text;"
    assert "token ids" not in str(info.value) and "pictures" in info.value.fix
