"""The checksummed manifest that describes a prepared dataset's shards."""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from tfscale.tasks.core.errors import UserError
from tfscale.tasks.data.records import FORMAT
from tfscale.tasks.data.spec import FeatureSpec

MANIFEST_NAME = "manifest.json"
CHECKSUM = "checksum"  # manifest.json's own sha256, over everything else in it


class ShardError(UserError, RuntimeError):
    """Shards are missing, truncated or corrupted, or the manifest is absent."""


@dataclass(frozen=True)
class ShardInfo:
    file: str
    split: str
    examples: int
    bytes: int
    sha256: str
    # per numeric feature of a table or arrays: [values, sum, sum of squares] in this shard
    sums: dict[str, list[float]] | None = None


@dataclass(frozen=True)
class Manifest:
    """What `prepare` wrote: feature spec, split sizes and every shard with its checksum."""

    dataset: str
    version: str
    feature: dict[str, Any]
    splits: dict[str, int]
    shards: list[ShardInfo]
    params: dict[str, Any] = field(default_factory=dict)
    # the features a model of one input takes as one vector (`FeatureSpec.packed`): the
    # model's, never the file's, so neither the JSON nor the digest holds it
    packed: tuple[str, ...] = field(default=(), compare=False)
    keras_names: bool = field(default=False, compare=False)  # `FeatureSpec.keras_names`

    def files(self, split: str) -> list[str]:
        return [s.file for s in self.shards if s.split == split]

    @property
    def spec(self) -> FeatureSpec:
        """The features and the label, as prepare recorded them (and as the model takes
        them: `packed`)."""
        spec = FeatureSpec.from_dict(self.feature)
        if self.packed or self.keras_names:
            return replace(spec, packed=self.packed, keras_names=self.keras_names)
        return spec

    @property
    def shape(self) -> tuple[int, ...]:
        """The single feature's shape (an image's); () where there are several."""
        return self.spec.shape

    @property
    def num_classes(self) -> int:
        return int(self.feature["num_classes"])

    def to_json(self) -> str:
        return json.dumps(_plain(self), indent=2, sort_keys=True) + "\n"

    @property
    def digest(self) -> str:
        """A short content hash: the same shards give the same digest."""
        return hashlib.sha256(self.to_json().encode()).hexdigest()[:16]

    def file_text(self) -> str:
        """`manifest.json`: the content and its own sha256 (`checksum`), so a hand edit is
        caught on load."""
        raw = _plain(self)
        raw[CHECKSUM] = hashlib.sha256(self.to_json().encode()).hexdigest()
        return json.dumps(raw, indent=2, sort_keys=True) + "\n"

    @classmethod
    def from_json(cls, text: str) -> Manifest:
        """Raises `EditedManifest` when the content no longer matches its checksum."""
        raw = json.loads(text)
        checksum = raw.pop(CHECKSUM, None)
        raw["shards"] = [ShardInfo(**s) for s in raw["shards"]]
        manifest = cls(**raw)
        if (
            checksum is not None
            and checksum != hashlib.sha256(manifest.to_json().encode()).hexdigest()
        ):
            raise EditedManifest("its content no longer matches the checksum prepare wrote")
        return manifest


def _plain(manifest: Manifest) -> dict[str, Any]:
    """The manifest as JSON holds it: a shard's `sums` only where it has them, so image
    manifests read and hash as they always did."""
    raw = asdict(manifest)
    raw.pop("packed")
    raw.pop("keras_names")
    for shard in raw["shards"]:
        if shard.get("sums") is None:
            shard.pop("sums", None)
    return raw


class EditedManifest(ValueError):
    """A manifest changed after `prepare` wrote it."""


def load_manifest(data_dir: str | Path, dataset: str | None = None) -> Manifest:
    """Reads `<data_dir>/manifest.json`.

    Raises:
        ShardError: no manifest there, saying which command writes one.
    """
    path = Path(data_dir) / MANIFEST_NAME
    if not path.exists():
        name = dataset or Path(data_dir).name
        raise ShardError(
            f"No prepared dataset at {data_dir} ({MANIFEST_NAME} missing); "
            f"run 'tfscale prepare --dataset {name}' first."
        )
    try:
        manifest = Manifest.from_json(path.read_text())
    except EditedManifest as exc:
        raise ShardError(
            f"{path} was edited after prepare wrote it ({exc}); its shards cannot be trusted. "
            f"Re-create them with 'tfscale prepare --dataset {dataset or Path(data_dir).name} "
            "--force'."
        ) from None
    except (ValueError, TypeError, KeyError) as exc:
        raise ShardError(
            f"{path} is not a valid manifest ({exc}); re-run 'tfscale prepare'."
        ) from None
    if not manifest.spec.is_image and manifest.params.get("records") != FORMAT:
        raise ShardError(
            f"{data_dir} was prepared by an earlier tfscale, whose records kept the label "
            "under a key a feature could share; re-run 'tfscale prepare --dataset "
            f"{dataset or manifest.dataset}' (it rewrites them)."
        )
    return manifest


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


def shard_problems(manifest: Manifest, data_dir: str | Path, *, hashes: bool = True) -> list[str]:
    """Every shard that is missing, has the wrong size or (with `hashes`) the wrong sha256."""
    problems = []
    for shard in manifest.shards:
        path = Path(data_dir) / shard.file
        if not path.exists():
            problems.append(f"{shard.file}: missing")
        elif (size := path.stat().st_size) != shard.bytes:
            problems.append(
                f"{shard.file}: truncated or padded ({size} bytes, expected {shard.bytes})"
            )
        elif hashes and sha256_of(path) != shard.sha256:
            problems.append(f"{shard.file}: corrupted (sha256 does not match the manifest)")
    return problems


def shards_present(data_dir: str | Path) -> bool:
    """Cheap check, no hashing: the manifest is there and every shard has its size."""
    try:
        manifest = load_manifest(data_dir)
    except ShardError:
        return False
    return not shard_problems(manifest, data_dir, hashes=False)


def verify_shards(data_dir: str | Path, dataset: str | None = None) -> Manifest:
    """Re-checks every shard's presence, size and sha256 against the manifest.

    Raises:
        ShardError: listing every missing, truncated or corrupted file by name.
    """
    manifest = load_manifest(data_dir, dataset)
    problems = shard_problems(manifest, data_dir)
    if problems:
        raise ShardError(
            f"{len(problems)} of {len(manifest.shards)} shards in {data_dir} "
            "failed verification:\n  "
            + "\n  ".join(problems)
            + f"\nRe-create them with 'tfscale prepare --dataset {manifest.dataset} --force'."
        )
    return manifest
