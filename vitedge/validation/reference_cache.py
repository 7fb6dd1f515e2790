"""On-disk cache of validation outputs, so validation does not recompute what it already knows.

The FP32 side of a validation is the same for every target that runs the same reference graph
on the same runtime with the same settings, for a warm rebuild and for `vitedge validate`
re-runs. An entry is keyed by everything that can change those outputs:

- the reference graph's bytes (the file and its weight side files: ONNX external data, OpenVINO .bin;
  an OpenVINO .xml without its generated layer names, see ``graph_sha256``);
- the data's content hash (``SourceSummary.data_hash``: the items used, their content and labels)
  and the preprocessing that turns them into inputs;
- the runtime (backend name and its versions) and every backend option (device, precision hints,
  streams, threads) plus the thread count requested for this run: kept in the key, conservatively,
  since thread count can change float reductions in the last bits;
- the inference batch size, the CPU (model, ISA flags: kernels differ by ISA) and a format version.

Entries are single ``.npz`` files under ``<cache root>/reference/`` (the calibration cache's root:
``--cache-dir``, ``$VITEDGE_CACHE_DIR``, ``~/.cache/vitedge``), written atomically. One that cannot
be read, or does not match its key and the data's length, is ignored with a one-line warning and
recomputed, never trusted. After a write, the least recently used entries are removed while the
folder holds more than ``MAX_BYTES``.

The INT8 side uses the same key, so its outputs are reused only for a *byte-identical* artifact
(same graph and weights, the same data, runtime and version, settings, batch and CPU): the one the
accuracy budget of the same build accepted (it runs the files each target ships, at validation's
batch), a warm rebuild of an unchanged model, or `vitedge validate` run again on the same machine. Any change to
the quantized graph, the runtime or the CPU misses and runs the artifact. The user turns that
reuse off alone with ``--no-int8-cache`` (``int8_outputs=False``), or every reuse with
``--no-reference-cache``; validation.json records where each side's outputs came from.

A cached output must not be able to forge a verdict (INT8 outputs copied from FP32 would give 100 %
agreement), so nothing is believed on its name alone:

- **Every entry is authenticated.** vitedge creates a per-cache secret, ``reference/.key`` (32 random
  bytes, mode 0600, created exclusively, never followed through a symlink), and stores in each entry
  an HMAC-SHA256 over its metadata and the bytes of its outputs and labels. An entry without a valid
  HMAC (written by anything else, edited, or copied from another cache) is ignored with a one-line
  warning and recomputed. A key that is not a regular file of this user, private to it (no group or
  other permission bits), is not used: then nothing is read from or written to the cache (one
  warning says so). This stops anyone who can write to the cache folder but cannot read the key
  (another user of a shared or world-writable cache); it cannot stop someone running as the same
  user, who can read the key too.
- **An INT8 hit is spot-checked.** Before cached INT8 outputs are believed, ``verify_sample`` runs
  the artifact again on up to ``SAMPLE_BATCHES`` batches picked at random (``secrets``, so not
  predictable from the entry) with exactly the batch composition and settings the entry was computed
  with, and compares them with the cached rows. Any difference beyond float noise rejects the entry
  (warning) and the whole data set runs. This also catches an entry that is authentic but wrong (a
  runtime that changed behind an unchanged version string, a bug in the key). It costs one or two
  batches of INT8 inference per hit: on a warm rebuild, and on a cold build, whose validation reads the
  outputs the accuracy budget computed for the artifact it accepted (issue 28 item 4). The FP32 side is authenticated only (a spot check
  would open the FP32 model, which is what its cache saves).

Sharing the FP32 outputs between runtimes (issue 28 item 4): ONNX Runtime's reference (the FP32 ONNX graph)
and OpenVINO's (its conversion of the same bytes, which records their sha256 in its rt_info) compute the same
model. Outputs computed on a miss are also stored under a shared key (``shared_key_parts``: the FP32 SOURCE
graph's bytes, data, preprocessing, batch, CPU; no runtime), naming in the entry the runtime that computed
them. Another runtime that misses its own key takes them only after ``cross_check`` runs its own FP32 graph
on up to ``SAMPLE_BATCHES`` random batches and finds the same top-1 on every row and max |diff| within
``CROSS_RUNTIME_TOLERANCE`` of the output scale; else a one-line warning and its own pass. They are never
stored under that runtime's own key. The same HMAC rules apply to shared entries; the spot check is what ties
one to the runtime that uses it, and a reference that cannot be tied to its source bytes
(``fp32_source_sha256`` None) never shares.

The near-tie gate's FP32 preprocessing probe (``vitedge.validation.run``: FP32 with the mean moved by
-0.25 and +0.25) goes through the same lookups: its own key adds ``kind`` "fp32-probe" and the shift,
its shared key a ``variant`` {``probe_mean_shift``} (``SharedFp32.variant``), and its spot check runs
this runtime's FP32 graph on the shifted batches.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import hmac
import json
import os
import re
import secrets
import stat
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from vitedge import __version__
from vitedge.backends.openvino import ir_source_sha256
from vitedge.core.cpu import read_cpu
from vitedge.files.atomic import atomic_write_path, sha256_file
from vitedge.onnxkit.files import onnx_sha256
from vitedge.onnxkit.metadata import FP32_SOURCE_KEY, get_metadata
from vitedge.quantize.cache import cache_key, default_cache_dir
from vitedge.validation.accuracy import Outputs, collect_outputs

if TYPE_CHECKING:
    from onnx import ModelProto

FORMAT = "vitedge-reference-cache-2"  # 2: entries carry an HMAC (see the module docstring)
KEY_FILE = ".key"
_ENTRY_NAME = re.compile(r"^[0-9a-f]{64}\.npz$")  # path_for: a cache_key (sha256 hex) and .npz
SAMPLE_BATCHES = 2  # batches of a cached INT8 entry run again before it is believed
SUBDIR = "reference"
# Shared FP32 outputs (see "Sharing the FP32 outputs between runtimes" above) are believed when this
# runtime's own FP32 graph, run on a spot check, is within this fraction of the output scale of them
# (max |diff| / max |output|) and has the same top-1 on every row. Measured between ONNX Runtime and
# OpenVINO FP32 on the AVX2 CPU of the development machine (benchmarks/fp32_cross_runtime.py, 64 items at
# batch 8, docs/reports.md): digits ViT 3.9e-07, post-norm ViT 2.7e-07, random-weight timm ViT-S/16 1.5e-06
# of the output scale, no top-1 differs. 1e-3 is a margin of over 600x for deeper graphs and other CPUs
# (not measured: ViT-B/16, AVX-512/AMX machines), and still far below what INT8 changes.
CROSS_RUNTIME_TOLERANCE = 1e-3
MAX_BYTES = 2 * 2**30  # the reference/ folder is pruned, least recently used first, past this size

HIT, MISS, OFF = "hit", "miss", "off"
SHARED = "shared"  # the FP32 outputs another runtime computed for the same FP32 source graph, spot-checked here


@dataclass(frozen=True)
class ReferenceCacheSettings:
    enabled: bool = True  # False: nothing is read or written, FP32 and INT8 outputs are computed
    root: Path | None = None  # the cache root; None: $VITEDGE_CACHE_DIR or ~/.cache/vitedge
    int8_outputs: bool = True  # also reuse the INT8 outputs of a byte-identical artifact (needs enabled)

    def for_int8(self) -> "ReferenceCacheSettings":
        """The settings for the artifact's outputs: enabled only when both switches are on."""
        return dataclasses.replace(self, enabled=self.enabled and self.int8_outputs)

    def folder(self) -> Path:
        root = Path(self.root).expanduser() if self.root is not None else default_cache_dir()
        return root / SUBDIR


@dataclass
class ReferenceLookup:
    """Where the FP32 outputs of one validation came from, for validation.json and the log."""

    cache: str  # HIT | MISS | OFF
    batch: int
    key: str | None = None
    path: str | None = None
    note: str | None = None  # a warning: a corrupt entry, an unwritable folder
    label: str = "FP32 reference"  # what the outputs are, for the log line (not stored)
    shared: dict[str, Any] | None = None  # cache SHARED: the runtime that computed them and the spot check (shared_record)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"cache": self.cache, "batch": self.batch}
        if self.key is not None:
            out["key"] = self.key
        if self.path is not None:
            out["path"] = self.path
        if self.note is not None:
            out["note"] = self.note
        if self.shared is not None:
            out["shared"] = self.shared
        return out

    def one_line(self, items: int) -> str:
        if self.cache == SHARED and self.shared is not None:
            return f"{self.label}: {shared_text(self.shared, items)}"
        if self.cache == HIT:
            return f"{self.label}: {items} outputs read from the cache ({self.key[:12]}), not recomputed"
        how = f"{self.label}: {items} outputs computed at batch {self.batch}"
        if self.cache == OFF:
            return how + ("; reference cache off" if self.label.startswith("FP32") else "; not cached")
        return how + (f", cached as {self.key[:12]}" if self.path else "")


def graph_sha256(path: Path) -> str:
    """sha256 of a model file as the runtime reads it: the file, its ONNX external data, or its OpenVINO .bin.

    In an OpenVINO IR the layer and tensor names (``name=``, ``names=``) are left out: the conversion
    numbers them from a process-wide counter (``Reshape_368962``), so the same ONNX graph converts to
    another .xml on each build, and names do not change what the network computes. Everything else
    (layer types, ids, edges, shapes, attributes, rt_info, the weights in .bin) is hashed."""
    path = Path(path)
    if path.suffix == ".onnx":
        return onnx_sha256(path)
    if path.suffix != ".xml":
        return sha256_file(path)
    text = _IR_NAMES.sub("", path.read_text(encoding="utf-8", errors="surrogateescape"))
    side = path.with_suffix(".bin")
    return cache_key({"xml_without_names": hashlib.sha256(text.encode("utf-8", "surrogateescape")).hexdigest(),
                      "bin": sha256_file(side) if side.is_file() else None})


_IR_NAMES = re.compile(r'\s(?:name|names)="[^"]*"')


def model_sha256(model: str | Path | ModelProto) -> str | None:
    """``graph_sha256`` of a model file, or the sha256 of an in-memory ONNX ModelProto's deterministic
    serialization; None when it cannot be serialized (past protobuf's 2 GiB): then nothing is cached."""
    if isinstance(model, (str, Path)):
        return graph_sha256(Path(model))
    try:
        return hashlib.sha256(model.SerializeToString(deterministic=True)).hexdigest()
    except Exception:  # noqa: BLE001 - too large or not a protobuf: run it, cache nothing
        return None


def key_parts(reference_path: Path | None, source, pre, backend, options, threads: int | None, batch: int, *,
              graph_hash: str | None = None) -> dict[str, Any]:
    """Everything the outputs of the graph at ``reference_path`` (or of the graph whose hash is
    ``graph_hash``) depend on (see the module docstring)."""
    try:
        versions = backend.versions()
    except Exception:  # noqa: BLE001 - a runtime that cannot say: the key says so, and stays conservative
        versions = {"unknown": backend.name}
    cpu = read_cpu().to_dict()
    return {
        "format": FORMAT,
        "vitedge_version": __version__,
        "graph_sha256": graph_hash if graph_hash is not None else graph_sha256(reference_path),
        "data_hash": source.summary.data_hash,
        "items": len(source),
        "preprocess": pre.to_dict() if hasattr(pre, "to_dict") else repr(pre),
        "runtime": backend.name,
        "runtime_versions": versions,
        "backend_options": _plain(options),
        "threads": threads,
        "batch": int(batch),
        "cpu": {"machine": cpu["machine"], "model": cpu["model"], "flags": cpu["flags"]},
    }


def _plain(options: object) -> Any:
    if options is None:
        return None
    if hasattr(options, "to_dict"):
        return options.to_dict()
    if dataclasses.is_dataclass(options):
        return dataclasses.asdict(options)
    return repr(options)


class ReferenceCache:
    def __init__(self, settings: ReferenceCacheSettings):
        self.settings = settings
        self.folder = settings.folder()
        self._key: bytes | None = None

    def secret(self) -> bytes:
        """This cache's HMAC key, created on first use (0600); an OSError when it cannot be made or is not
        private to this user (then the cache is not used)."""
        if self._key is not None:
            return self._key
        path = self.folder / KEY_FILE
        self.folder.mkdir(parents=True, exist_ok=True)
        flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
        except FileExistsError:
            pass
        else:
            try:
                os.write(fd, secrets.token_bytes(32))
            finally:
                os.close(fd)
        try:
            fd = os.open(path, flags)
        except OSError as err:
            raise OSError(err.errno, f"its key {path} cannot be opened ({err.strerror}; a symlink?)") from None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or (hasattr(os, "getuid") and st.st_uid != os.getuid()) or st.st_mode & 0o077:
                raise OSError(1, f"its key {path} is not a private file of this user (mode {stat.S_IMODE(st.st_mode):o}, "
                                 f"owner uid {st.st_uid}); remove it and vitedge makes a new one")
            key = os.read(fd, 64)
        finally:
            os.close(fd)
        if len(key) < 32:
            raise OSError(5, f"its key {path} is truncated; remove it and vitedge makes a new one")
        self._key = key
        return key

    def mac(self, meta_json: str, values: np.ndarray, labels: np.ndarray | None) -> str:
        h = hmac.new(self.secret(), meta_json.encode("utf-8"), hashlib.sha256)
        h.update(b"\0values\0" + str(values.dtype).encode() + str(values.shape).encode())
        h.update(np.ascontiguousarray(values).tobytes())
        if labels is not None:
            h.update(b"\0labels\0" + str(labels.dtype).encode() + str(labels.shape).encode())
            h.update(np.ascontiguousarray(labels).tobytes())
        return h.hexdigest()

    def path_for(self, key: str) -> Path:
        return self.folder / f"{key}.npz"

    def load(self, key: str, items: int) -> tuple[Outputs | None, str | None]:
        """The stored outputs, or None; and a warning when an entry was there but is not usable."""
        found, _origin, note = self.load_entry(key, items)
        return found, note

    def load_entry(self, key: str, items: int) -> tuple[Outputs | None, dict[str, Any] | None, str | None]:
        """``load``, and the entry's ``origin`` (what computed it, written by ``save``; under its HMAC)."""
        path = self.path_for(key)
        if not path.is_file():
            return None, None, None
        try:
            with np.load(path, allow_pickle=False) as data:
                meta_json = str(data["meta"])
                meta = json.loads(meta_json)
                values = np.array(data["values"], dtype=np.float32)
                labels = np.array(data["labels"]) if "labels" in data.files else None
                mac = str(data["mac"]) if "mac" in data.files else ""
            if meta.get("format") != FORMAT or meta.get("key") != key:
                raise ValueError("written for another key or format")
            if not hmac.compare_digest(mac, self.mac(meta_json, values, labels)):
                raise ValueError("its HMAC does not match this cache's key: not written by this cache, or edited")
            if values.ndim != 2 or len(values) != items or (labels is not None and len(labels) != items):
                raise ValueError(f"holds {len(values)} outputs for {items} inputs")
        except Exception as err:  # noqa: BLE001 - corrupt, truncated, foreign: recompute and overwrite
            why = str(err).splitlines()[0][:120] if str(err) else type(err).__name__
            return None, None, f"ignored the unreadable validation cache entry {path} ({why}); recomputed"
        origin = meta.get("origin")
        return Outputs(values, labels), origin if isinstance(origin, dict) else None, None

    def save(self, key: str, parts: dict[str, Any], outputs: Outputs, origin: dict[str, Any] | None = None) -> Path:
        path = self.path_for(key)
        arrays: dict[str, np.ndarray] = {"values": np.asarray(outputs.values, dtype=np.float32)}
        if outputs.labels is not None:
            arrays["labels"] = np.asarray(outputs.labels)
        meta: dict[str, Any] = {"format": FORMAT, "key": key, "parts": parts}
        if origin is not None:
            meta["origin"] = origin
        meta_json = json.dumps(meta, sort_keys=True)
        mac = self.mac(meta_json, arrays["values"], arrays.get("labels"))
        with atomic_write_path(path) as tmp, open(tmp, "wb") as f:
            np.savez(f, meta=np.array(meta_json), mac=np.array(mac), **arrays)
        self.prune(keep=path)
        return path

    def prune(self, keep: Path | None = None, limit: int = MAX_BYTES) -> None:
        """Remove the least recently used (written or read) entries while this cache's entries exceed ``limit`` bytes.

        Only entries this cache wrote are counted or removed: a regular file named ``<64 hex digits>.npz`` (the
        names :meth:`path_for` gives) whose HMAC verifies with this cache's key (checked just before it is
        removed). A user's own .npz put in the folder, a symlink, or an entry another cache or an older vitedge
        wrote is never deleted, nor counted against the limit."""
        entries = []
        for p in self.folder.glob("*.npz"):
            try:
                st = p.lstat()
            except OSError:
                continue
            if _ENTRY_NAME.match(p.name) and stat.S_ISREG(st.st_mode):
                entries.append((st.st_mtime, st.st_size, p))
        entries.sort()
        total = sum(size for _, size, _ in entries)
        for _, size, p in entries:
            if total <= limit:
                break
            if keep is not None and p == keep:
                continue
            if not self.wrote(p):
                total -= size  # not ours: neither counted nor touched
                continue
            try:
                p.unlink()
                total -= size
            except OSError:
                pass

    def wrote(self, path: Path) -> bool:
        """True when ``path`` is an entry this cache wrote: its name is its key and its HMAC verifies."""
        key = path.name[: -len(".npz")]
        try:
            with np.load(path, allow_pickle=False) as data:
                meta_json = str(data["meta"])
                values = np.array(data["values"])
                labels = np.array(data["labels"]) if "labels" in data.files else None
                mac = str(data["mac"]) if "mac" in data.files else ""
            meta = json.loads(meta_json)
            return (isinstance(meta, dict) and meta.get("format") == FORMAT and meta.get("key") == key
                    and hmac.compare_digest(mac, self.mac(meta_json, values, labels)))
        except Exception:  # noqa: BLE001 - unreadable, not an npz, no key: not provably ours
            return False


@dataclass(frozen=True)
class SharedFp32:
    """How a runtime may take the FP32 outputs another runtime computed for the same FP32 source graph.

    ``source_sha256``: the FP32 ONNX graph this runtime's reference graph is (ONNX Runtime) or was
    converted from (OpenVINO's rt_info, ``fp32_source_sha256``); ``run_batch(images)``: this runtime's
    own FP32 graph on one batch, for the spot check that ties the shared outputs to it."""

    source_sha256: str
    runtime: str
    versions: dict[str, str]
    run_batch: Callable[[np.ndarray], np.ndarray]
    variant: dict[str, float] | None = None  # what else the outputs depend on (the near-tie probe's mean shift)


def fp32_source_sha256(reference_path: Path) -> str | None:
    """The sha256 (``onnx_sha256``) of the FP32 ONNX graph a reference file computes: its own for an ONNX
    file, the one an OpenVINO IR records it was converted from; None when it cannot say (an IR built by an
    older vitedge, a foreign IR, another format): then its outputs are never shared."""
    path = Path(reference_path)
    if path.suffix == ".onnx":
        return (recorded_fp32_source(path) or onnx_sha256(path)) if path.is_file() else None
    if path.suffix == ".xml":
        return ir_source_sha256(path)
    return None


FUSED, EXPORTED = "fused", "exported"  # artifacts.fp32_graph.form


def fp32_graph_record(path: Path) -> dict[str, str]:
    """What the FP32 ONNX graph a bundle ships is (the manifest's ``artifacts.fp32_graph``): ``form`` FUSED for the
    onnx target's rewrite of the exported graph (q/k/v merged, attention cores fused; it records the graph it
    computes), else EXPORTED; ``source_sha256``: the exported graph's ``onnx_sha256``, under which its FP32 outputs
    are shared with the references converted from that graph (``fp32_source_sha256``)."""
    recorded = recorded_fp32_source(path)
    return {"form": FUSED if recorded else EXPORTED, "source_sha256": recorded or onnx_sha256(path)}


def recorded_fp32_source(path: Path) -> str | None:
    """The FP32 graph an ONNX reference records it computes (``FP32_SOURCE_KEY``: the onnx bundle's reference with the
    INT8 graph's float rewrites, each checked numerically), read without its weights; None when it records none."""
    import onnx

    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception:  # noqa: BLE001 - an unreadable file shares nothing; its own sha256 says so
        return None
    return get_metadata(model).get(FP32_SOURCE_KEY)


def shared_key_parts(source_sha256: str, source, pre, batch: int, variant: dict[str, float] | None = None) -> dict[str, Any]:
    """The key of FP32 outputs shared between runtimes: the FP32 SOURCE graph's bytes (not a runtime's
    rendition of it), the data, the preprocessing, the batch, the CPU and ``variant`` (what else changes the
    inputs: the preprocessing probe's mean shift). No runtime: any runtime whose own FP32 graph comes from
    those bytes may read it, after its spot check (``cross_check``)."""
    cpu = read_cpu().to_dict()
    parts = {"format": FORMAT, "kind": "fp32-shared", "vitedge_version": __version__, "source_sha256": source_sha256,
             "data_hash": source.summary.data_hash, "items": len(source),
             "preprocess": pre.to_dict() if hasattr(pre, "to_dict") else repr(pre), "batch": int(batch),
             "cpu": {"machine": cpu["machine"], "model": cpu["model"], "flags": cpu["flags"]}}
    if variant:
        parts["variant"] = dict(variant)
    return parts


@dataclass
class SpotCheck:
    """``cross_check``'s result: the items it ran, the largest difference, the output scale, and why it failed."""

    items: list[list[int]]  # [first, last] of each batch run
    max_abs_diff: float
    output_scale: float
    reason: str | None  # None: agreed


def cross_check(run_batch: Callable[[np.ndarray], np.ndarray], source, batch: int, shared: Outputs,
                tolerance: float = CROSS_RUNTIME_TOLERANCE, batches: int = SAMPLE_BATCHES) -> SpotCheck:
    """Run up to ``batches`` batches of ``source`` picked at random (``secrets``) on this runtime's own FP32
    graph, with the batch composition the shared outputs were computed with, and compare: they agree when
    max |diff| <= ``tolerance`` x the output scale (max |output| of the rows run) and every row has the same top-1."""
    items, err, scale = [], 0.0, 0.0
    for start, got in _rerun_sample(run_batch, source, batch, batches):
        got = got.reshape(len(got), -1)
        want = shared.values[start:start + len(got)]
        items.append([start, start + len(got) - 1])
        if got.shape != want.shape:
            return SpotCheck(items, float("inf"), scale, f"this runtime's FP32 outputs have shape {got.shape[1:]}, "
                                                         f"the shared ones {want.shape[1:]}")
        scale = max(scale, float(np.max(np.abs(want))) if want.size else 0.0)
        err = max(err, float(np.max(np.abs(got - want))) if got.size else 0.0)
        flips = np.flatnonzero(got.argmax(1) != want.argmax(1)) if got.size else np.array([], dtype=int)
        if len(flips):
            return SpotCheck(items, err, scale, f"item {start + int(flips[0])} has another top-1 on this runtime's FP32 graph "
                                                f"({len(flips)} of the {len(got)} items of its batch)")
    if not np.isfinite(err) or err > tolerance * scale:
        return SpotCheck(items, err, scale, f"this runtime's FP32 outputs differ from the shared ones by up to {err:.3g} "
                                            f"({err / scale if scale else float('inf'):.2g} of the output scale {scale:.3g}, "
                                            f"limit {tolerance:g})")
    return SpotCheck(items, err, scale, None)


def shared_record(origin: dict[str, Any], key: str, check: SpotCheck) -> dict[str, Any]:
    """What validation.json says about shared FP32 outputs: who computed them and what the spot check saw."""
    return {"runtime": origin.get("runtime"), "runtime_versions": origin.get("runtime_versions"), "key": key,
            "source_sha256": origin.get("source_sha256"), "spot_check_items": check.items,
            "max_abs_diff": check.max_abs_diff, "output_scale": check.output_scale,
            "relative_diff": check.max_abs_diff / check.output_scale if check.output_scale else None,
            "tolerance": CROSS_RUNTIME_TOLERANCE}


def shared_text(shared: dict[str, Any], items: int) -> str:
    """The log and report line of shared FP32 outputs, in plain words."""
    checked = sum(b - a + 1 for a, b in shared.get("spot_check_items") or [])
    rel = shared.get("relative_diff")
    return (f"{items} outputs computed by {shared.get('runtime')} from the same FP32 ONNX graph, not run again here: "
            f"{checked} items run on this runtime's own FP32 graph agreed (same top-1, max difference "
            f"{'n/a' if rel is None else f'{rel:.2g}'} of the output scale, limit {shared.get('tolerance'):g})")


def _take_shared(cache: ReferenceCache, share: SharedFp32, source, pre, batch: int
                 ) -> tuple[Outputs | None, dict[str, Any] | None, str | None, bool]:
    """Shared FP32 outputs another runtime computed for ``share`` that pass its spot check: (outputs, their record,
    a warning, whether another runtime's entry was found). The warning says what differed when it was not believed.
    An entry this runtime computed itself is not taken: then nothing changes from a runtime without sharing."""
    parts = shared_key_parts(share.source_sha256, source, pre, batch, share.variant)
    key = cache_key(parts)
    found, origin, note = cache.load_entry(key, len(source))
    if found is None:
        return None, None, note, False  # none, or unreadable: computed here and stored again
    origin = origin or {}
    if origin.get("runtime") == share.runtime:  # its own outputs: this runtime's own key decides (threads, options)
        return None, None, None, False
    check = cross_check(share.run_batch, source, batch, found)
    if check.reason is not None:
        return None, None, (f"did not use the FP32 outputs {origin.get('runtime', 'another runtime')} computed for the same "
                            f"FP32 graph ({check.reason}); ran this runtime's own FP32 pass"), True
    with contextlib.suppress(OSError):
        os.utime(cache.path_for(key))
    return found, shared_record(origin, key, check), None, True


def _give_shared(cache: ReferenceCache, share: SharedFp32, source, pre, batch: int, outputs: Outputs) -> None:
    """Store this runtime's FP32 outputs under the shared key, naming the runtime that computed them."""
    parts = shared_key_parts(share.source_sha256, source, pre, batch, share.variant)
    origin = {"runtime": share.runtime, "runtime_versions": share.versions, "source_sha256": share.source_sha256}
    with contextlib.suppress(OSError):
        cache.save(cache_key(parts), parts, outputs, origin=origin)


def _join(a: str | None, b: str | None) -> str | None:
    return "; ".join(x for x in (a, b) if x) or None


def reference_outputs(runner, source, pre, *, batch: int, settings: ReferenceCacheSettings | None,
                      key_of: Callable[[], dict[str, Any]], compute: Callable[[], Outputs] | None = None,
                      label: str = "FP32 reference", keep: Callable[[Outputs], bool] | None = None,
                      verify: Callable[[Outputs], str | None] | None = None,
                      share: SharedFp32 | None = None) -> tuple[Outputs, ReferenceLookup]:
    """The outputs of ``runner`` (the FP32 reference unless ``label`` says otherwise) on ``source``: read
    from the cache when ``settings`` enable it and an entry for ``key_of()`` (its key parts) exists;
    otherwise computed at ``batch`` (or by ``compute``, a caller's own pass) and stored, unless
    ``keep(outputs)`` says they are not worth storing (a partial pass). A hit is believed only when
    ``verify(outputs)`` (if given: ``verify_sample``) returns None; its reason otherwise, and the
    outputs are computed. With ``share`` (FP32 only), a miss first looks for the outputs another runtime
    computed for the same FP32 source graph and takes them when its spot check agrees (cache SHARED,
    not stored under this runtime's key); outputs computed here are also stored for the others."""
    run = compute or (lambda: collect_outputs(runner, source, pre, batch_size=batch))
    if settings is None or not settings.enabled:
        return run(), ReferenceLookup(OFF, batch, label=label)
    parts = key_of()
    key = cache_key(parts)
    cache = ReferenceCache(settings)
    try:
        cache.secret()
    except OSError as err:  # no private key: nothing cached can be authenticated, so nothing is read or written
        note = f"the validation cache in {cache.folder} is not used: {err.strerror or err}"
        return run(), ReferenceLookup(MISS, batch, key, None, note, label=label)
    found, note = cache.load(key, len(source))
    rejected = verify(found) if found is not None and verify is not None else None
    if rejected is not None:
        note, found = f"ignored the validation cache entry {cache.path_for(key)}: {rejected}; recomputed", None
    if found is not None:
        with contextlib.suppress(OSError):
            os.utime(cache.path_for(key))  # pruning removes the least recently used entries first
        return found, ReferenceLookup(HIT, batch, key, str(cache.path_for(key)), label=label)
    had_shared = False
    if share is not None:
        shared, record, why, had_shared = _take_shared(cache, share, source, pre, batch)
        if shared is not None:
            return shared, ReferenceLookup(SHARED, batch, key, None, note, label=label, shared=record)
        note = _join(note, why)
    outputs = run()
    path = None
    if keep is not None and not keep(outputs):
        return outputs, ReferenceLookup(MISS, batch, key, None, note, label=label)
    try:
        path = str(cache.save(key, parts, outputs))
    except OSError as err:
        note = (note + "; " if note else "") + f"could not write the validation cache in {cache.folder}: {err.strerror or err}"
    if share is not None and not had_shared:
        _give_shared(cache, share, source, pre, batch, outputs)
    return outputs, ReferenceLookup(MISS, batch, key, path, note, label=label)


def _rerun_sample(run_batch: Callable[[Any], np.ndarray], source, batch: int, batches: int):
    """(first item, outputs) of up to ``batches`` batches of ``source`` picked at random (``secrets``, so not
    predictable from a cache entry), each run again through ``run_batch`` with the composition ``batch`` gives."""
    count = -(-len(source) // batch)
    for j in sorted(secrets.SystemRandom().sample(range(count), min(batches, count))):
        start = j * batch
        part = source.shard(start, min(start + batch, len(source)))
        yield start, np.concatenate([np.asarray(run_batch(b.images), dtype=np.float32) for b in part.batches(batch)])


def verify_sample(run_batch: Callable[[Any], np.ndarray], source, batch: int, cached: Outputs,
                  batches: int = SAMPLE_BATCHES) -> str | None:
    """Run ``batches`` batches of ``source`` picked at random again (``run_batch(images) -> outputs``, the
    same runner and batch composition the cached outputs were computed with) and compare them with
    ``cached``; None when they agree to float noise, else what differed."""
    for start, got in _rerun_sample(run_batch, source, batch, batches):
        want = cached.values[start:start + len(got)]
        if got.shape != want.shape:
            return f"its outputs have shape {want.shape[1:]}, the artifact's {got.shape[1:]}"
        scale = float(np.max(np.abs(got))) if got.size else 0.0
        err = float(np.max(np.abs(got - want))) if got.size else 0.0
        if not np.isfinite(err) or err > 1e-4 * max(scale, 1.0):
            return (f"items {start}..{start + len(got) - 1} run again differ from the cached outputs by up to {err:.3g} "
                    f"(output scale {scale:.3g}): not the outputs of this artifact")
    return None
