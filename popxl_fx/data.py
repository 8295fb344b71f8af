"""MNIST and Fashion-MNIST through torchvision's own dataset classes, staged offline when needed.

The data root holds torchvision's layout (``<root>/FashionMNIST/raw/train-images-idx3-ubyte``,
...). `prepare` fills it from the first source that has the four IDX files:

1. files already staged under the root;
2. torchvision's download, tried only when one of its mirrors answers within a few seconds;
3. Debian's ``dataset-fashion-mnist`` package (``/usr/share/datasets/fashion-mnist``);
4. a user-given ``data_dir`` holding the IDX files (plain or ``.gz``) directly.

With no source, `DataNotFoundError` says how to get the data. Nothing is ever synthesised.

Example::

    train, test = get_data_loaders(batch_size=32, test_batch_size=80)
    images, labels = next(iter(train))  # float32 [32, 1, 28, 28], int64 [32]
"""

from __future__ import annotations

import gzip
import os
import shutil
import socket
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import torch
import torchvision
from torch.utils.data import DataLoader, Dataset
from torchvision import transforms

__all__ = [
    "DATASETS",
    "IDX_FILES",
    "NORMALIZE",
    "Normalised",
    "SYSTEM_DIRS",
    "DataNotFoundError",
    "default_data_dir",
    "default_transform",
    "get_data_loaders",
    "mnist",
    "preload",
    "prepare",
    "raw_dir",
]

PathLike = str | os.PathLike

DATASETS = {"fashion-mnist": torchvision.datasets.FashionMNIST, "mnist": torchvision.datasets.MNIST}
# Pixel mean and std of each training set after ToTensor (values in [0, 1]).
NORMALIZE = {"fashion-mnist": (0.2860, 0.3530), "mnist": (0.1307, 0.3081)}
# The names torchvision's MNIST classes look for in their raw/ folder.
IDX_FILES = (
    "train-images-idx3-ubyte",
    "train-labels-idx1-ubyte",
    "t10k-images-idx3-ubyte",
    "t10k-labels-idx1-ubyte",
)
# Where distribution packages put the files.
DEBIAN_FASHION_DIR = "/usr/share/datasets/fashion-mnist"  # apt-get install dataset-fashion-mnist
SYSTEM_DIRS: dict[str, tuple[str, ...]] = {
    "fashion-mnist": (DEBIAN_FASHION_DIR,),
    "mnist": (),
}
PROBE_TIMEOUT_S = 3.0
DOWNLOAD_TIMEOUT_S = 30.0
# Written beside Fashion-MNIST files staged under MNIST's names, so they are never mistaken
# for real MNIST later without the caller asking for the stand-in again.
STAND_IN_MARKER = "FASHION_MNIST_STAND_IN"


class DataNotFoundError(FileNotFoundError):
    """No source of the requested data set could be found."""


def default_data_dir() -> Path:
    """``$POPXL_FX_DATA_DIR``, else ``~/.cache/popxl_fx/data``."""
    env = os.environ.get("POPXL_FX_DATA_DIR")
    return Path(env) if env else Path.home() / ".cache" / "popxl_fx" / "data"


def raw_dir(root: PathLike, dataset: str) -> Path:
    """The folder torchvision's class for ``dataset`` reads its IDX files from."""
    return Path(root) / _dataset_class(dataset).__name__ / "raw"


def _dataset_class(dataset: str):
    if dataset not in DATASETS:
        raise ValueError(f"Unknown dataset {dataset!r}; choose one of {sorted(DATASETS)}.")
    return DATASETS[dataset]


def _find_idx_files(folder: PathLike) -> dict[str, Path] | None:
    """Each IDX name mapped to its file in ``folder`` (plain or .gz); None if any is missing."""
    found = {}
    for name in IDX_FILES:
        candidates = [Path(folder) / name, Path(folder) / f"{name}.gz"]
        hit = next((c for c in candidates if c.is_file()), None)
        if hit is None:
            return None
        found[name] = hit
    return found


def _stage(files: dict[str, Path], dest: Path) -> None:
    """Copy (gunzipping where needed) the IDX files into ``dest`` under torchvision's names."""
    dest.mkdir(parents=True, exist_ok=True)
    for name, src in files.items():
        # one partial file per process: the processes of a torchrun job may stage at once
        part = dest / f"{name}.{os.getpid()}.part"
        opener = gzip.open if src.suffix == ".gz" else open
        with opener(src, "rb") as fin, open(part, "wb") as fout:
            shutil.copyfileobj(fin, fout)
        # Rename last so an interrupted copy never looks like a staged file.
        os.replace(part, dest / name)
    (dest / STAND_IN_MARKER).unlink(missing_ok=True)


def _is_staged(root: Path, dataset: str, allow_stand_in: bool) -> bool:
    raw = raw_dir(root, dataset)
    if not all((raw / name).is_file() for name in IDX_FILES):
        return False
    return allow_stand_in or not (raw / STAND_IN_MARKER).exists()


def _mirror_reachable(dataset: str) -> bool:
    """True when one of torchvision's mirrors for ``dataset`` accepts a connection quickly."""
    for mirror in _dataset_class(dataset).mirrors:
        url = urlsplit(mirror)
        port = url.port or (443 if url.scheme == "https" else 80)
        try:
            with socket.create_connection((url.hostname, port), timeout=PROBE_TIMEOUT_S):
                return True
        except OSError:
            continue
    return False


def _download(dataset: str, root: Path) -> bool:
    """torchvision's own download; False (with a note) if it fails part way."""
    previous = socket.getdefaulttimeout()
    socket.setdefaulttimeout(DOWNLOAD_TIMEOUT_S)
    try:
        _dataset_class(dataset)(str(root), train=True, download=True)
        return True
    except (RuntimeError, OSError) as err:
        print(f"popxl_fx.data: downloading {dataset} failed ({err}); trying local files.")
        return False
    finally:
        socket.setdefaulttimeout(previous)


def _local_sources(dataset: str, data_dir: PathLike | None) -> list[Path]:
    sources = [Path(d) for d in SYSTEM_DIRS.get(dataset, ())]
    if data_dir is not None:
        sources += [Path(data_dir), raw_dir(data_dir, dataset)]
    return sources


def _stage_fashion_as_mnist(root: Path, data_dir: PathLike | None) -> bool:
    sources = [raw_dir(root, "fashion-mnist"), *_local_sources("fashion-mnist", data_dir)]
    files = next((f for f in map(_find_idx_files, sources) if f is not None), None)
    if files is None:
        return False
    dest = raw_dir(root, "mnist")
    _stage(files, dest)
    (dest / STAND_IN_MARKER).write_text("These are Fashion-MNIST files under MNIST's names.\n")
    return True


def _not_found(dataset: str, root: Path, data_dir: PathLike | None, download: bool) -> str:
    tried = [f"staged files in {raw_dir(root, dataset)}"]
    mirrors = ", ".join(_dataset_class(dataset).mirrors)
    tried.append(f"download from {mirrors}" if download else "download (disabled)")
    tried += [str(p) for p in _local_sources(dataset, data_dir)]
    names = ", ".join(f"{n}[.gz]" for n in IDX_FILES)
    fix = (
        f"Install Debian's package: `apt-get install -y dataset-fashion-mnist` (files land in "
        f"{DEBIAN_FASHION_DIR}), or pass --data-dir DIR (data_dir=DIR) with the "
        f"four IDX files: {names}."
    )
    if dataset == "mnist":
        fix += (
            " No Debian package ships MNIST itself; to run on Fashion-MNIST files under "
            "MNIST's names pass allow_fashion_as_mnist=True (--fashion-as-mnist on the "
            "command line of the examples and benchmarks)."
        )
    return f"No {dataset} data found. Tried: " + "; ".join(tried) + ". " + fix


def prepare(
    dataset: str = "fashion-mnist",
    data_dir: PathLike | None = None,
    download: bool = True,
    allow_fashion_as_mnist: bool = False,
) -> Path:
    """Make sure torchvision's class for ``dataset`` finds its files offline; returns the root.

    Args:
        dataset: "fashion-mnist" or "mnist".
        data_dir: root to stage into (default `default_data_dir()`); it may also hold the four
            IDX files directly, as a source.
        download: allow torchvision's download when a mirror is reachable.
        allow_fashion_as_mnist: for dataset="mnist" with no MNIST source, stage Fashion-MNIST's
            files under MNIST's names (a notice is printed).
    Raises:
        DataNotFoundError: no source has the files.
    """
    _dataset_class(dataset)
    # seeds pass "~/.torch/datasets"
    data_dir = Path(data_dir).expanduser() if data_dir is not None else None
    root = data_dir if data_dir is not None else default_data_dir()
    if _is_staged(root, dataset, allow_stand_in=False):
        return root
    if download and _mirror_reachable(dataset) and _download(dataset, root):
        return root
    for source in _local_sources(dataset, data_dir):
        files = None if (source / STAND_IN_MARKER).exists() else _find_idx_files(source)
        if files is not None:
            _stage(files, raw_dir(root, dataset))
            return root
    if dataset == "mnist" and allow_fashion_as_mnist and _stand_in(root, data_dir):
        return root
    raise DataNotFoundError(_not_found(dataset, root, data_dir, download))


def _stand_in(root: Path, data_dir: PathLike | None) -> bool:
    ok = _is_staged(root, "mnist", allow_stand_in=True) or _stage_fashion_as_mnist(root, data_dir)
    if ok:
        print(
            "popxl_fx.data: NOTICE: MNIST is not available offline; using Fashion-MNIST files "
            f"under MNIST's names in {raw_dir(root, 'mnist')} (allow_fashion_as_mnist=True)."
        )
    return ok


def default_transform(dataset: str) -> transforms.Compose:
    """ToTensor then Normalize with the training set's pixel mean and std."""
    mean, std = NORMALIZE[dataset]
    return transforms.Compose([transforms.ToTensor(), transforms.Normalize((mean,), (std,))])


def mnist(
    train: bool,
    data_dir: PathLike | None = None,
    dataset: str = "fashion-mnist",
    download: bool = True,
    allow_fashion_as_mnist: bool = False,
    transform=None,
) -> Dataset:
    """torchvision's (Fashion-)MNIST dataset, normalised; `prepare` says where files come from."""
    root = prepare(dataset, data_dir, download, allow_fashion_as_mnist)
    tf = transform if transform is not None else default_transform(dataset)
    return _dataset_class(dataset)(str(root), train=train, download=False, transform=tf)


class Normalised(Dataset):
    """A (Fashion-)MNIST set through `default_transform`'s float32 arithmetic (``/ 255``, minus
    the mean, over the std: the same ops, bit for bit), normalised as the DataLoader fetches a
    batch: the set stays uint8 (a quarter of the float32 copy) and a run that reads a few
    batches normalises only those (normalising the 60,000 training images took ~0.2 s)."""

    def __init__(self, ds: torchvision.datasets.MNIST, dataset: str) -> None:
        self.data, self.targets = ds.data, ds.targets
        self.mean, self.std = (torch.tensor(v, dtype=torch.float32) for v in NORMALIZE[dataset])

    def __len__(self) -> int:
        return len(self.data)

    def _images(self, index: Any) -> torch.Tensor:
        x = self.data[index].unsqueeze(-3).to(torch.float32)  # [..., 1, 28, 28]
        return x.div(255).sub_(self.mean).div_(self.std)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self._images(i), self.targets[i]

    def __getitems__(self, indices: list[int]) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """A batch in one go (DataLoader's batched fetch): one normalisation for the batch."""
        index = torch.as_tensor(indices)
        return list(zip(self._images(index), self.targets[index]))


def preload(ds: torchvision.datasets.MNIST, dataset: str) -> Normalised:
    """``ds`` normalised with `default_transform`'s float32 ops on the whole uint8 tensor, a
    batch at a time (`Normalised`), not image by image through PIL."""
    return Normalised(ds, dataset)


def get_data_loaders(
    batch_size: int,
    test_batch_size: int,
    data_dir: PathLike | None = None,
    dataset: str = "fashion-mnist",
    download: bool = True,
    shuffle: bool = True,
    seed: int = 0,
    allow_fashion_as_mnist: bool = False,
    preloaded: bool = True,
) -> tuple[DataLoader, DataLoader]:
    """(train, test) DataLoaders with fixed batch shapes (drop_last) for static IPU graphs.

    The training order is shuffled with a generator seeded by ``seed``, so two loaders built with
    the same arguments yield the same batches. ``preloaded`` reads each set as one uint8 tensor
    and normalises the batches it hands out (`preload`: bit-identical to the per-image
    transform and much faster).
    """
    kwargs: dict[str, Any] = {
        "data_dir": data_dir,
        "dataset": dataset,
        "download": download,
        "allow_fashion_as_mnist": allow_fashion_as_mnist,
    }
    train_set, test_set = mnist(True, **kwargs), mnist(False, **kwargs)
    if preloaded:
        train_set, test_set = preload(train_set, dataset), preload(test_set, dataset)
    gen = torch.Generator().manual_seed(seed)
    train = DataLoader(
        train_set, batch_size=batch_size, shuffle=shuffle, drop_last=True, generator=gen
    )
    test = DataLoader(test_set, batch_size=test_batch_size, shuffle=False, drop_last=True)
    return train, test
