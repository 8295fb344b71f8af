"""popxl_fx.data: staging IDX files into torchvision's layout, and the error when none exist."""

import gzip
import math
import shutil
from pathlib import Path

import pytest
import torch
import torchvision

from popxl_fx import data

DEBIAN_DIR = Path(data.DEBIAN_FASHION_DIR)


# Images (and labels) per set in `small_gz`'s files: what is staged where does not depend on
# the files' size, and each staging of the full sets gunzips 55 MB (~0.3 s of CPU).
SMALL = 100


def _skip_without_debian_files() -> None:
    if data._find_idx_files(DEBIAN_DIR) is None:
        pytest.skip(
            f"Fashion-MNIST not installed in {DEBIAN_DIR}: apt-get install -y dataset-fashion-mnist"
        )


def _head(src: Path, n: int) -> bytes:
    """The first ``n`` items of a gzipped IDX file as an IDX file of its own (count ``n``)."""
    with gzip.open(src, "rb") as f:
        magic = f.read(4)  # 0, 0, the type code, the number of dimensions
        dims = [int.from_bytes(f.read(4), "big") for _ in range(magic[3])]
        body = f.read(n * math.prod(dims[1:]))
    return b"".join([magic, *(d.to_bytes(4, "big") for d in [n, *dims[1:]]), body])


@pytest.fixture(scope="module")
def small_gz(tmp_path_factory) -> Path:
    """A folder of the four gzipped IDX files holding the first `SMALL` images and labels of
    Debian's real Fashion-MNIST files (torchvision's classes read them as they read those)."""
    _skip_without_debian_files()
    folder = tmp_path_factory.mktemp("small_gz")
    for name in data.IDX_FILES:
        head = _head(DEBIAN_DIR / f"{name}.gz", SMALL)
        (folder / f"{name}.gz").write_bytes(gzip.compress(head, compresslevel=1))
    return folder


@pytest.fixture(scope="module")
def staged(tmp_path_factory) -> Path:
    """Fashion-MNIST staged from Debian's package once for the tests that only read a staged
    root (each staging gunzips 55 MB)."""
    _skip_without_debian_files()
    root = tmp_path_factory.mktemp("staged")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(data, "_mirror_reachable", lambda dataset: False)
        assert data.prepare("fashion-mnist", data_dir=root, download=True) == root
    return root


@pytest.fixture
def offline(monkeypatch):
    """No download and no system directories: only what a test puts in its temp dir counts."""
    monkeypatch.setattr(data, "_mirror_reachable", lambda dataset: False)
    monkeypatch.setattr(data, "SYSTEM_DIRS", {"fashion-mnist": (), "mnist": ()})


def _gunzip_into(src: Path, dest: Path) -> None:
    dest.mkdir(parents=True)
    for name in data.IDX_FILES:
        with gzip.open(src / f"{name}.gz", "rb") as fin, open(dest / name, "wb") as fout:
            shutil.copyfileobj(fin, fout)


def test_stage_from_debian_package(staged):
    root = staged  # data.prepare("fashion-mnist", data_dir=staged), the mirror unreachable
    raw = staged / "FashionMNIST" / "raw"
    assert sorted(p.name for p in raw.iterdir()) == sorted(data.IDX_FILES)
    # torchvision's own class must find them without downloading.
    train = torchvision.datasets.FashionMNIST(str(root), train=True, download=False)
    test = torchvision.datasets.FashionMNIST(str(root), train=False, download=False)
    assert train.data.shape == (60000, 28, 28) and test.data.shape == (10000, 28, 28)
    assert sorted(torch.unique(train.targets).tolist()) == list(range(10))


def test_stage_from_user_dir_of_plain_idx_files(small_gz, tmp_path, offline):
    src = tmp_path / "idx"
    _gunzip_into(small_gz, src)
    test = data.mnist(False, data_dir=src, dataset="fashion-mnist")
    assert (src / "FashionMNIST" / "raw" / "t10k-labels-idx1-ubyte").is_file()
    image, label = test[0]
    assert image.shape == (1, 28, 28) and image.dtype == torch.float32
    # Normalize uses the training set's statistics, so the test set is near (0, 1), not equal.
    assert abs(float(image.mean())) < 2.0 and 0 <= label < 10


def test_already_staged_is_not_copied_again(staged, monkeypatch):
    monkeypatch.setattr(data, "_mirror_reachable", lambda dataset: False)
    monkeypatch.setattr(data, "SYSTEM_DIRS", {"fashion-mnist": (), "mnist": ()})
    raw = staged / "FashionMNIST" / "raw"
    before = {p.name: p.stat().st_mtime_ns for p in raw.iterdir()}
    # With every source gone the staged copy alone must be enough, and it is left as it is.
    assert data.prepare("fashion-mnist", data_dir=staged) == staged
    assert {p.name: p.stat().st_mtime_ns for p in raw.iterdir()} == before


def test_clear_error_when_nothing_found(tmp_path, offline):
    with pytest.raises(data.DataNotFoundError) as info:
        data.prepare("fashion-mnist", data_dir=tmp_path / "empty")
    msg = str(info.value)
    assert "No fashion-mnist data found" in msg
    assert "apt-get install -y dataset-fashion-mnist" in msg
    assert "--data-dir" in msg and "train-images-idx3-ubyte" in msg
    assert isinstance(info.value, FileNotFoundError)


def test_mnist_is_not_replaced_by_fashion_unless_asked(small_gz, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(data, "_mirror_reachable", lambda dataset: False)
    monkeypatch.setitem(data.SYSTEM_DIRS, "fashion-mnist", (str(small_gz),))  # as Debian's
    with pytest.raises(data.DataNotFoundError, match="allow_fashion_as_mnist=True"):
        data.prepare("mnist", data_dir=tmp_path)
    root = data.prepare("mnist", data_dir=tmp_path, allow_fashion_as_mnist=True)
    assert "NOTICE" in capsys.readouterr().out
    mnist = torchvision.datasets.MNIST(str(root), train=False, download=False)
    data.prepare("fashion-mnist", data_dir=tmp_path)
    fashion = torchvision.datasets.FashionMNIST(str(root), train=False, download=False)
    assert torch.equal(mnist.targets, fashion.targets)
    # The stand-in is remembered as such: without the option it is refused again.
    with pytest.raises(data.DataNotFoundError):
        data.prepare("mnist", data_dir=tmp_path)


def test_loaders_are_reproducible_and_fixed_shape(staged):
    a_train, a_test = data.get_data_loaders(64, 1000, data_dir=staged, seed=3)
    b_train, _ = data.get_data_loaders(64, 1000, data_dir=staged, seed=3)
    (xa, ya), (xb, yb) = next(iter(a_train)), next(iter(b_train))
    assert torch.equal(xa, xb) and torch.equal(ya, yb)
    assert xa.shape == (64, 1, 28, 28) and ya.dtype == torch.int64
    assert len(a_train) == 60000 // 64 and len(a_test) == 10


def test_preloaded_equals_per_image_transform(staged):
    per_image = data.mnist(True, data_dir=staged)
    fast = data.preload(per_image, "fashion-mnist")
    assert len(fast) == len(per_image)
    picked = (0, 1, 12345, 59999)
    for i in picked:
        (a, la), (b, lb) = per_image[i], fast[i]
        assert torch.equal(a, b) and la == int(lb)
    # a DataLoader fetches a batch in one go (`Normalised.__getitems__`): the same images
    images, labels = next(iter(torch.utils.data.DataLoader(fast, batch_size=4, sampler=picked)))
    assert torch.equal(images, torch.stack([per_image[i][0] for i in picked]))
    assert labels.tolist() == [per_image[i][1] for i in picked]


def test_unknown_dataset():
    with pytest.raises(ValueError, match="Unknown dataset"):
        data.prepare("cifar")


def test_prepare_expands_a_home_relative_data_dir(small_gz, tmp_path, monkeypatch):
    monkeypatch.setitem(data.SYSTEM_DIRS, "fashion-mnist", (str(small_gz),))  # as Debian's
    monkeypatch.setenv("HOME", str(tmp_path))
    root = data.prepare("fashion-mnist", data_dir="~/datasets", download=False)
    assert root == tmp_path / "datasets"
    assert not (tmp_path / "~").exists()
