"""Types and helpers shared by the image-folder, array and video calibration sources.

No torch here: calibration data is read with numpy and Pillow (and OpenCV for video).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Any, TypeVar

import numpy as np
from rich.console import Console
from rich.progress import track

from vitedge.core import limits
from vitedge.core.errors import CalibrationError, UsageError

# Preprocessed items are kept in memory while their total stays under this; beyond it
# they are decoded again for every pass (same order). Read at call time, so tests can
# lower it.
CACHE_BYTES = 512 * 1024 * 1024

NOUNS = {"images": "images", "arrays": "images", "video": "frames"}


@dataclass(frozen=True)
class SourceSummary:
    """What a calibration / validation source held and what was actually used."""

    path: str
    kind: str  # "images" | "arrays" | "video"
    found: int  # candidate items seen
    used: int  # items actually yielded
    skipped: dict[str, int]  # reason -> count
    converted: dict[str, int]  # original colour mode -> count, over the used items
    subset_size: int | None  # the --calib-size asked for (None = all)
    seed: int
    data_hash: str  # sha256 hex identifying exactly the items used (and their labels)
    labeled: bool
    class_names: tuple[str, ...] | None
    notes: tuple[str, ...] = ()  # anything a user should know, e.g. why labels were dropped
    classes_present: int | None = None  # distinct labels among the used items (labeled only)

    def to_dict(self) -> dict[str, Any]:
        record = asdict(self)  # the fields in order; tuples become lists, as JSON has them
        record["class_names"] = list(self.class_names) if self.class_names is not None else None
        record["notes"] = list(self.notes)
        return record

    def one_line(self) -> str:
        noun = NOUNS.get(self.kind, "items")
        available = self.found - sum(self.skipped.values())
        if self.subset_size is not None and self.used < available and self.kind != "video":
            head = f"{self.used} of {available} {noun} (seed {self.seed}) from {self.path}"
        elif self.kind == "video":
            head = f"{self.used} of {self.found} {noun} (evenly spaced) from {self.path}"
        else:
            head = f"{self.used} {noun} from {self.path}"
        if self.labeled:
            present = self.classes_present
            total = len(self.class_names) if self.class_names is not None else None
            if present is not None and total is not None and present < total:
                head += f" ({present} of {total} classes)"
            elif total is not None or present is not None:
                head += f" ({total if total is not None else present} classes)"
            else:
                head += " (labeled)"
        parts = [head]
        if self.subset_size is not None and self.subset_size > self.used:
            parts.append(f"asked for {self.subset_size} but only {self.used} usable, using all")
        if self.skipped:
            parts.append("skipped " + ", ".join(f"{v} {k}" for k, v in by_count(self.skipped).items()))
        if self.converted:
            parts.append("converted " + ", ".join(f"{v} {k}" for k, v in by_count(self.converted).items()))
        parts.extend(self.notes)
        return "; ".join(parts)


@dataclass
class Batch:
    images: np.ndarray  # float32 NCHW, model-ready (preprocessed)
    labels: np.ndarray | None  # int64 N, or None when the source has no labels
    ids: list[str]  # relative path / "array[i]" / "frame@<index>"


@dataclass
class Item:
    """One usable calibration item. ``ref`` is what the kind's loader needs to decode it."""

    id: str
    sort_key: Any
    sha: str  # sha256 of the item's bytes (file bytes / array bytes / frame index for video)
    label: int | None
    ref: Any
    mode: str | None = None  # original colour mode label when it had to be converted
    data: np.ndarray | None = field(default=None, repr=False)  # preprocessed, when cached


# Decodes a list of items (in order) into float32 CHW arrays.
Loader = Callable[[list[Item]], list[np.ndarray]]


@dataclass(frozen=True)
class SourceRequest:
    """What open_source was asked, as every opener needs it: the path as the user wrote it, the
    seeded subset (--calib-size, --seed), the fewest usable items, and whether to show progress."""

    path_text: str
    limit: int | None
    seed: int
    min_count: int
    progress: bool


@dataclass
class Collected:
    """The usable items of a source as they are read, each with its preprocessed pixels while
    they fit the cache budget, and the reasons the unusable ones were skipped, counted."""

    budget: int = field(default_factory=lambda: CACHE_BYTES)  # read at call time: tests lower it
    items: list[Item] = field(default_factory=list)
    skipped: dict[str, int] = field(default_factory=dict)
    cached: int = 0

    def add(self, item: Item, pixels: np.ndarray | None) -> None:
        if pixels is not None and self.cached + pixels.nbytes <= self.budget:
            item.data = pixels
            self.cached += pixels.nbytes
        self.items.append(item)

    def skip(self, reason: str) -> None:
        count_into(self.skipped, [reason])

    def require(self, request: SourceRequest, noun: str, what_to_do: str) -> None:
        """A CalibrationError, saying what was skipped and ``what_to_do``, when too few items are usable."""
        too_few(len(self.items), noun, request.path_text, request.min_count, self.skipped, what_to_do)


def summarize(kind: str, request: SourceRequest, found: int, used: list[Item], skipped: dict[str, int], *,
              labeled: bool = False, class_names: tuple[str, ...] | None = None, notes: Sequence[str] = (),
              hash_extra: str = "") -> SourceSummary:
    """The summary of a source that found ``found`` candidates and uses ``used``, in order."""
    return SourceSummary(
        path=request.path_text,
        kind=kind,
        found=found,
        used=len(used),
        skipped=by_count(skipped),
        converted=by_count(count_into({}, (it.mode for it in used))),
        subset_size=request.limit,
        seed=request.seed,
        data_hash=data_hash(kind, used, extra=hash_extra),
        labeled=labeled,
        class_names=class_names,
        notes=tuple(notes),
        classes_present=len({it.label for it in used}) if labeled else None,
    )


class CalibrationSource:
    """Preprocessed, model-ready items, in a fixed order, batch by batch."""

    def __init__(self, summary: SourceSummary, items: list[Item], loader: Loader):
        self.summary = summary
        self._items = items
        self._loader = loader

    def __len__(self) -> int:
        return len(self._items)

    def __repr__(self) -> str:
        return f"CalibrationSource({self.summary.one_line()!r})"

    @property
    def ids(self) -> list[str]:
        return [it.id for it in self._items]

    @property
    def labels(self) -> list[int] | None:
        """Each item's class index, in order; None for unlabeled data."""
        return [int(it.label) for it in self._items] if self.summary.labeled else None

    def shard(self, start: int, stop: int) -> "CalibrationSource":
        """Items ``start:stop`` (same order, same summary): one worker's part of a sharded validation."""
        return CalibrationSource(self.summary, self._items[start:stop], self._loader)

    def batches(self, batch_size: int) -> Iterator[Batch]:
        """Yield the items in order; every call starts again from the first item."""
        if int(batch_size) < 1:
            raise UsageError(f"batch size must be at least 1, got {batch_size}")
        batch_size = int(batch_size)
        labeled = self.summary.labeled
        for start in range(0, len(self._items), batch_size):
            chunk = self._items[start : start + batch_size]
            missing = [it for it in chunk if it.data is None]
            fresh = dict(zip((id(it) for it in missing), self._loader(missing))) if missing else {}
            arrays = [it.data if it.data is not None else fresh[id(it)] for it in chunk]
            labels = np.asarray([it.label for it in chunk], dtype=np.int64) if labeled else None
            yield Batch(np.stack(arrays).astype(np.float32, copy=False), labels, [it.id for it in chunk])


def check_inputs_vary(images: np.ndarray, preprocess: dict[str, Any] | None = None) -> None:
    """Refuse data that preprocessing made (nearly) one value: a --std of 1e30 turns every image into zeros, a --mean
    of 1e6 into one number float32 cannot tell apart, and FP32 then answers every image alike; calibrating on that and
    gating INT8 against it proves nothing. The calibration pass checks its first batch (``images``) as it reads it."""
    if not len(images):
        return
    spread, centre, varies = limits.input_spread(images)
    if varies:
        return
    pre = preprocess or {}
    stats = f" (mean {pre.get('mean')}, std {pre.get('std')})" if pre.get("std") is not None else ""
    raise UsageError(f"the model's inputs are all one value after preprocessing (spread {spread:.3g} around {centre:.3g} on "
                     f"{len(images)} images): --mean/--std{stats} erase the images, or the images are blank; pass the "
                     "--mean/--std the model was trained with")


def check_limit(limit: int | None) -> None:
    if limit is not None and int(limit) < 1:
        raise UsageError(f"--calib-size must be at least 1, got {limit}")


def choose_subset(items: list[Item], limit: int | None, seed: int) -> list[Item]:
    """Sort by id (natural index order for arrays and frames), then a seeded subset."""
    items = sorted(items, key=lambda it: it.sort_key)
    if limit is None or limit >= len(items):
        return items
    picked = np.random.default_rng(seed).choice(len(items), int(limit), replace=False)
    return [items[i] for i in sorted(int(i) for i in picked)]


def keep_subset(items: list[Item], limit: int | None, seed: int) -> list[Item]:
    """choose_subset, then drop the cached pixels of every item the subset leaves out."""
    used = choose_subset(items, limit, seed)
    chosen = {id(it) for it in used}
    for it in items:
        if id(it) not in chosen:
            it.data = None
    return used


def data_hash(kind: str, items: Sequence[Item], extra: str = "") -> str:
    """sha256 over the kind and each used item's id, content hash and label, in order.

    Ids are relative (to the folder) so moving the data keeps the hash.
    """
    h = hashlib.sha256()
    h.update(json.dumps(["vitedge-calibration-v1", kind, extra]).encode())
    h.update(b"\n")
    for it in items:
        h.update(json.dumps([it.id, it.sha, it.label]).encode())
        h.update(b"\n")
    return h.hexdigest()


def fill_cache(items: list[Item], loader: Loader, budget: int | None = None, chunk: int = 64) -> None:
    """Decode uncached items, in order, while the cached total stays under the budget."""
    budget = CACHE_BYTES if budget is None else budget
    total = sum(it.data.nbytes for it in items if it.data is not None)
    todo = [it for it in items if it.data is None]
    for start in range(0, len(todo), chunk):
        if total >= budget:
            return
        part = todo[start : start + chunk]
        for it, arr in zip(part, loader(part)):
            if total + arr.nbytes > budget:
                return
            it.data = arr
            total += arr.nbytes


def too_few(count: int, noun: str, path: str, min_count: int, skipped: dict[str, int], what_to_do: str) -> None:
    if count >= min_count:
        return
    why = ""
    if skipped:
        why = " (" + ", ".join(f"{v} {k}" for k, v in by_count(skipped).items()) + " skipped)"
    raise CalibrationError(
        f"only {count} usable {noun} in {path}{why}; at least {min_count} needed: {what_to_do}"
    )


T = TypeVar("T")
R = TypeVar("R")


def ordered_map(fn: Callable[[T], R], inputs: Sequence[T], *, progress: bool, description: str) -> Iterator[R]:
    """``map(fn, inputs)`` in order on a few threads (Pillow and OpenCV release the GIL),
    with at most a few results in flight, and a rich progress bar on stderr if asked."""
    results = _threaded(fn, inputs)
    if progress:

        results = track(results, total=len(inputs), description=description,
                        console=Console(stderr=True), transient=True)
    yield from results


def _threaded(fn: Callable[[T], R], inputs: Sequence[T]) -> Iterator[R]:
    workers = max(1, min(4, os.cpu_count() or 1))
    if workers == 1 or len(inputs) < 4:
        for x in inputs:
            yield fn(x)
        return
    window = workers * 4
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="vitedge-calib") as pool:
        pending = [pool.submit(fn, x) for x in inputs[:window]]
        nxt = len(pending)
        while pending:
            fut = pending.pop(0)
            if nxt < len(inputs):
                pending.append(pool.submit(fn, inputs[nxt]))
                nxt += 1
            yield fut.result()


def count_into(counts: dict[str, int], keys: Iterable[str | None]) -> dict[str, int]:
    for k in keys:
        if k:
            counts[k] = counts.get(k, 0) + 1
    return counts


def by_count(counts: dict[str, int]) -> dict[str, int]:
    """Most frequent first, then by name: a stable order for summaries and messages."""
    return dict(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))
