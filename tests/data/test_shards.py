"""Prepare and verify on real files: round trip, determinism, resume, corruption, sharding."""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path

import numpy as np
import pytest
from helpers import DEFAULTS, run_main

from tfscale.flows.cli import main
from tfscale.tasks.data.datasets import DatasetError
from tfscale.tasks.data.inputs import Reading, build_dataset
from tfscale.tasks.data.manifest import ShardError, verify_shards
from tfscale.tasks.data.preparation import (
    dataset_dir,
    format_prepared,
    held_out_note,
    open_source,
    prepare_dataset,
    prepared_line,
)
from tfscale.tasks.settings.config import load_config


def read_split(manifest, data_dir, split, **kw):
    images, labels = [], []
    for x, y in build_dataset(manifest, data_dir, split, batch_size=64, training=False, **kw):
        images.append(x.numpy())
        labels.append(y.numpy())
    return np.concatenate(images), np.concatenate(labels)


def test_digits_round_trip_matches_source(make_config):
    config = make_config(prepare__num_shards=3)
    result = prepare_dataset(config, progress=False)
    manifest = result.manifest
    assert manifest.splits == {"test": 360, "train": 1437}
    assert len(manifest.files("train")) == 3
    assert manifest.feature["class_names"] == [str(i) for i in range(10)]
    source = open_source(config.prepare)
    for split in ("train", "test"):
        images, labels = read_split(manifest, result.data_dir, split)
        expected = list(source.examples(split, 0, source.splits[split]))
        assert images.dtype == np.uint8  # as stored: a model scales them itself
        np.testing.assert_array_equal(images, np.stack([e[0] for e in expected]))
        np.testing.assert_array_equal(labels, [e[1] for e in expected])
    # and the source is scikit-learn's digits, 0-16 scaled to 0-255, its test split the
    # stratified 20% prepare.seed (42) draws
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    pixels = np.rint(digits.images * (255.0 / 16.0)).astype(np.uint8)[..., None]
    split = train_test_split(
        pixels, digits.target, test_size=0.2, random_state=42, stratify=digits.target
    )
    images, labels = read_split(manifest, result.data_dir, "test")
    np.testing.assert_array_equal(images, split[1])
    np.testing.assert_array_equal(labels, split[3])


def test_same_params_give_byte_identical_shards(tmp_path, make_config):
    overrides = dict(
        prepare__dataset="synthetic",
        prepare__synthetic__train_examples=300,
        prepare__synthetic__test_examples=50,
        prepare__num_shards=2,
    )
    first = prepare_dataset(make_config(**overrides), progress=False)
    other = make_config(**overrides, prepare__data_dir=str(tmp_path / "again"))
    second = prepare_dataset(other, progress=False)
    for shard in first.manifest.shards:
        a = (Path(first.data_dir) / shard.file).read_bytes()
        assert a == (Path(second.data_dir) / shard.file).read_bytes()
    assert first.manifest.digest == second.manifest.digest


def test_synthetic_labels_follow_class_prototypes(make_config):
    config = make_config(
        prepare__dataset="synthetic",
        prepare__synthetic__classes=4,
        prepare__synthetic__train_examples=400,
    )
    source = open_source(config.prepare)
    images, labels = zip(*source.examples("train", 0, 400), strict=True)
    flat = np.stack(images).reshape(400, -1).astype(np.float32)
    centroids = np.stack([flat[np.array(labels) == c].mean(0) for c in range(4)])
    nearest = np.argmin(((flat[:, None] - centroids[None]) ** 2).sum(-1), axis=1)
    assert (nearest == np.array(labels)).mean() > 0.95


def test_a_harder_synthetic_task_flips_its_label_noise_share_and_blends_less_signal(
    make_config,
):
    """signal 0.2, label noise 0.3 over 4 classes: a quarter of the flipped labels land on
    the true class again, so 0.3 x 3/4 = 22.5% of labels differ from the prototype's class
    (its nearest centroid, with a weaker signal still found); the images are the prototype
    and the noise blended 0.2 to 0.8, in a directory of their own."""
    values = dict(prepare__dataset="synthetic", prepare__synthetic__classes=4)
    values |= dict(prepare__synthetic__train_examples=4000)
    easy = open_source(make_config(**values).prepare)
    hard_config = make_config(
        **values, prepare__synthetic__signal=0.2, prepare__synthetic__label_noise=0.3
    )
    hard = open_source(hard_config.prepare)
    easy_images, easy_labels = zip(*easy.examples("train", 0, 4000), strict=True)
    hard_images, hard_labels = zip(*hard.examples("train", 0, 4000), strict=True)
    differ = np.mean(np.array(easy_labels) != np.array(hard_labels))
    assert differ == pytest.approx(0.225, abs=0.02)
    prototypes = easy._prototypes.astype(np.float64)
    flat = np.stack(hard_images).reshape(4000, -1).astype(np.float64)
    nearest = np.argmin(((flat[:, None] - prototypes.reshape(4, -1)[None]) ** 2).sum(-1), axis=1)
    assert (nearest == np.array(easy_labels)).mean() > 0.99  # the true class, still there
    # each image is signal x its class's prototype + the rest noise drawn apart from it:
    # over 50 images' pixels, the slope of an image on its prototype is the signal
    shown = prototypes[np.array(easy_labels[:50])].ravel()
    for images, signal in ((hard_images, 0.2), (easy_images, 0.75)):
        pixels = np.stack(images[:50]).astype(np.float64).ravel()
        slope = np.cov(shown, pixels)[0, 1] / np.var(shown, ddof=1)
        assert slope == pytest.approx(signal, abs=0.02)
    assert dataset_dir(hard_config).name.endswith("-signal0.2-noise0.3")
    assert dataset_dir(make_config(**values)).name == "synthetic-4000-32x32x3"


def test_synthetic_ranges_match_a_full_pass_across_chunks(make_config):
    config = make_config(prepare__dataset="synthetic", prepare__synthetic__train_examples=2100)
    source = open_source(config.prepare)
    assert source.splits == {"train": 2100, "test": 1024}  # `--examples` (and the default)
    full = list(source.examples("train", 0, 2100))
    part = list(source.examples("train", 1000, 2050))
    assert len(part) == 1050
    pairs = zip(part, full[1000:2050], strict=True)
    assert all(np.array_equal(a[0], b[0]) and a[1] == b[1] for a, b in pairs)


def test_synthetic_images_have_the_channels_asked_for(tmp_path):
    """`--channels 1`: grey images (the default is 3), in shards that read back at that depth."""
    data_dir = tmp_path / "tfrecords"
    argv = ["--params", DEFAULTS, "prepare", "--dataset", "synthetic", "--data-dir", str(data_dir)]
    argv += ["--examples", "64", "--test-examples", "16", "--image-size", "4", "--channels", "1"]
    code, _, err = run_main(argv, tmp_path)
    assert code == 0, err
    manifest = verify_shards(data_dir / "synthetic-64-4x4x1")
    assert manifest.shape == (4, 4, 1)
    images, _ = read_split(manifest, data_dir / "synthetic-64-4x4x1", "train")
    assert images.shape == (64, 4, 4, 1)


def test_rerun_with_same_params_rewrites_nothing(make_config):
    config = make_config()
    prepare_dataset(config, progress=False)
    mtimes = {p: p.stat().st_mtime_ns for p in dataset_dir(config).iterdir()}
    again = prepare_dataset(config, progress=False)
    assert (again.written, again.reused) == (0, len(again.manifest.shards))
    assert {p: p.stat().st_mtime_ns for p in dataset_dir(config).iterdir()} == mtimes


def test_force_rewrites_every_shard_of_an_up_to_date_dataset(tmp_path):
    argv = ["--params", DEFAULTS, "prepare", "--data-dir", str(tmp_path / "tfrecords")]
    assert run_main(argv, tmp_path)[0] == 0
    shards = sorted((tmp_path / "tfrecords" / "digits").glob("*.tfrecord"))
    for shard in shards:  # dated 1970: a shard written again is dated now
        os.utime(shard, ns=(0, 0))
    code, out, err = run_main([*argv, "--force"], tmp_path)
    assert code == 0, err
    assert f"written    {len(shards)} shards" in out and "; 0 reused" in out
    assert all(shard.stat().st_mtime_ns > 0 for shard in shards)


def test_force_on_the_current_folder_deletes_no_file_tfscale_did_not_write(tmp_path):
    """`prepare --dataset . --force` from an image folder: its shards go under the folder's
    own name (never the data folder itself), and a forced or changed prepare removes only
    the files tfscale wrote, whatever else the data folder or the dataset's folder holds."""
    from PIL import Image

    pets = tmp_path / "pets"
    for i in range(8):
        path = pets / ("cat", "dog")[i % 2] / f"{i}.png"
        path.parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(np.full((4, 4, 3), 30 * i, np.uint8)).save(path)
    store = tmp_path / "store"
    theirs = [store / "notes.txt", store / "other" / "mine.tfrecord", store / "pets" / "a.txt"]
    theirs += [store / "pets" / "mine.tfrecord", store / "pets" / ".draft.tmp", pets / "x.txt"]
    for path in theirs:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("the user's")
    argv = ["--params", DEFAULTS, "prepare", "--dataset", ".", "--data-dir", str(store)]
    for flags in ([], ["--force"], ["--force", "--num-shards", "2"]):
        code, out, err = run_main([*argv, *flags], pets)
        assert code == 0, err
        assert all(path.read_text() == "the user's" for path in theirs), flags
    assert sum(verify_shards(store / "pets").splits.values()) == 8
    assert sorted(p.name for p in (store / "pets").glob("*.tfrecord")) == [
        "mine.tfrecord", "test-00000-of-00002.tfrecord", "test-00001-of-00002.tfrecord",
        "train-00000-of-00002.tfrecord", "train-00001-of-00002.tfrecord",
    ]  # fmt: skip


@pytest.mark.parametrize("form", [".", "..", "trailing slash", "symlink", "inside"])
def test_each_path_form_of_an_image_folder_keeps_the_users_files_under_force(tmp_path, form):
    """`.`, `..`, a trailing slash and a symlink all name the folder by its real name, its
    shards beside a user's file that `--force` leaves; a data folder inside the image
    folder itself is refused before anything is written."""
    from PIL import Image

    pets = tmp_path / "pets"
    for i in range(8):
        path = pets / ("cat", "dog")[i % 2] / f"{i}.png"
        path.parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(np.full((4, 4, 3), 30 * i, np.uint8)).save(path)
    (tmp_path / "link").symlink_to(pets)
    cwd, dataset, store = {
        ".": (pets, ".", tmp_path / "store"),
        "..": (pets / "cat", "..", tmp_path / "store"),
        "trailing slash": (tmp_path, "pets/", tmp_path / "store"),
        "symlink": (tmp_path, "link", tmp_path / "store"),
        "inside": (tmp_path, "pets", pets / "shards"),
    }[form]
    store.mkdir(parents=True, exist_ok=True)
    (store / "notes.txt").write_text("the user's")
    argv = ["--params", DEFAULTS, "prepare", "--dataset", dataset, "--data-dir", str(store)]
    code, out, err = run_main([*argv, "--force"], cwd)
    assert (store / "notes.txt").read_text() == "the user's"
    if form == "inside":
        assert code == 1 and "into the dataset's own folder" in err, err
        assert not list(pets.rglob("*.tfrecord"))
        return
    assert code == 0, err
    assert sorted(p.name for p in store.iterdir()) == ["notes.txt", "pets"]
    (store / "pets" / "mine.txt").write_text("the user's too")
    assert run_main([*argv, "--force"], cwd)[0] == 0
    assert (store / "pets" / "mine.txt").read_text() == "the user's too"


def test_no_progress_keeps_the_bar_off_a_stand_in_terminal_that_shows_it_otherwise(tmp_path):
    """A prepare's bar shows on a terminal only: standard error stands in for one here
    (`helpers.StandInTerminal`), and `--no-progress` keeps the bar off it."""
    shown = {}
    for name, flags in (("bar", []), ("no bar", ["--no-progress"])):
        argv = ["--params", DEFAULTS, "prepare", "--data-dir", str(tmp_path / name), *flags]
        code, _, err = run_main(argv, tmp_path, terminal=True)
        assert code == 0, err
        shown[name] = "writing digits" in err
    assert shown == {"bar": True, "no bar": False}


def test_interrupted_prepare_leaves_no_manifest_and_resumes(make_config, monkeypatch):
    config = make_config(prepare__num_shards=4)
    import tfscale.tasks.data.shards as shards

    real, calls = shards._write_one, []

    def dies_on_third(source, shard, path):
        calls.append(shard.file)
        if len(calls) == 3:
            path.with_name(f".{path.name}.tmp").write_bytes(b"partial")
            raise KeyboardInterrupt
        return real(source, shard, path)

    monkeypatch.setattr(shards, "_write_one", dies_on_third)
    with pytest.raises(KeyboardInterrupt):
        prepare_dataset(config, progress=False)
    out = dataset_dir(config)
    assert not (out / "manifest.json").exists()
    monkeypatch.setattr(shards, "_write_one", real)
    resumed = prepare_dataset(config, progress=False)
    assert (resumed.written, resumed.reused) == (6, 2)
    assert not list(out.glob("*.tmp")) and not (out / ".journal.json").exists()
    verify_shards(out)


def test_changed_params_rewrite_and_drop_stale_shards(make_config):
    prepare_dataset(make_config(prepare__num_shards=5), progress=False)
    result = prepare_dataset(make_config(prepare__num_shards=2), progress=False)
    assert result.written == 4
    assert sorted(p.name for p in Path(result.data_dir).glob("*.tfrecord")) == sorted(
        s.file for s in result.manifest.shards
    )


@pytest.mark.parametrize("damage", ["truncate", "corrupt", "delete"])
def test_verify_names_the_damaged_shard(make_config, capsys, damage):
    config = make_config()
    result = prepare_dataset(config, progress=False)
    victim = Path(result.data_dir) / result.manifest.shards[1].file
    data = victim.read_bytes()
    if damage == "truncate":
        victim.write_bytes(data[:-10])
    elif damage == "corrupt":
        victim.write_bytes(data[:100] + bytes([data[100] ^ 0xFF]) + data[101:])
    else:
        victim.unlink()
    with pytest.raises(ShardError, match=victim.name):
        verify_shards(result.data_dir)
    argv = ["--params", DEFAULTS, "verify", "--data-dir", config.prepare.data_dir]
    assert main(argv) == 1
    assert victim.name in capsys.readouterr().err


def test_verify_without_prepare_says_which_command_to_run(tmp_path, capsys):
    assert main(["--params", DEFAULTS, "verify", "--data-dir", str(tmp_path)]) == 1
    assert "tfscale prepare --dataset digits" in capsys.readouterr().err


def test_shards_never_fewer_than_workers(make_config):
    config = make_config(prepare__target_shard_mb=1000, train__workers=3)
    manifest = prepare_dataset(config, progress=False).manifest
    assert len(manifest.files("train")) == 3 and len(manifest.files("test")) == 3


def test_the_shard_keys_and_the_test_splits_size_decide_what_prepare_writes(make_config, tmp_path):
    """Each key changes what is written, against the same data prepared by default (300
    training examples of the synthetic task, a few KB: one shard a split at 100 MB):
    `prepare.min_shards: 5` writes 5 a split; `prepare.target_shard_mb: 0.002` (2 KB, the
    records' bytes over it: about 9 KB here) more than 3; `prepare.synthetic.test_examples`
    sets the test split's size."""
    base = {"prepare__dataset": "synthetic", "prepare__synthetic__train_examples": 300}
    base["prepare__synthetic__test_examples"] = 60

    def prepared(folder: str, **values):
        values = {**base, **values, "prepare__data_dir": str(tmp_path / folder)}
        return prepare_dataset(make_config(**values), progress=False).manifest

    plain = prepared("-plain")
    assert (len(plain.files("train")), len(plain.files("test"))) == (1, 1)
    assert plain.splits["test"] == 60
    assert (len(prepared("-min", prepare__min_shards=5).files("train"))) == 5
    small = prepared("-small", prepare__target_shard_mb=0.002)
    per_shard = [s.bytes for s in small.shards if s.split == "train"]
    assert len(per_shard) > 3 and max(per_shard) < 2 * 0.002 * 2**20, per_shard
    assert prepared("-test", prepare__synthetic__test_examples=40).splits["test"] == 40


def test_the_synthetic_image_size_keys_and_flag_decide_the_shape_written(make_config, tmp_path):
    """`prepare.synthetic.height` and `width` set the images' shape each on its own (6 by
    12 here); `--image-size 8` sets both, as its help says."""
    import json

    values = {"prepare__dataset": "synthetic", "prepare__synthetic__train_examples": 64}
    values["prepare__synthetic__test_examples"] = 16
    values["prepare__data_dir"] = str(tmp_path / "keys")
    config = make_config(prepare__synthetic__height=6, prepare__synthetic__width=12, **values)
    assert prepare_dataset(config, progress=False).manifest.spec.shape == (6, 12, 3)
    argv = ["prepare", "--dataset", "synthetic", "--examples", "64", "--test-examples", "16"]
    argv += ["--image-size", "8", "--data-dir", str(tmp_path / "flag")]
    assert run_main(argv, tmp_path)[0] == 0
    (manifest,) = (tmp_path / "flag").glob("*/manifest.json")
    assert json.loads(manifest.read_text())["feature"]["shape"] == [8, 8, 3]


def test_evaluation_sees_every_example_once_across_pipelines(make_config, caplog):
    result = prepare_dataset(make_config(prepare__num_shards=2), progress=False)
    everything = read_split(result.manifest, result.data_dir, "test")[1]
    for pipelines, warns in ((2, False), (3, True)):
        caplog.clear()
        with caplog.at_level(logging.WARNING):
            parts = [
                read_split(result.manifest, result.data_dir, "test", reading=Reading(pipelines, i))[
                    1
                ]
                for i in range(pipelines)
            ]
        assert sum(len(p) for p in parts) == len(everything) == 360
        assert np.array_equal(np.sort(np.concatenate(parts)), np.sort(everything))
        assert ("DATA sharding" in caplog.text) is warns


def test_training_batches_are_static_and_seeded(make_config):
    result = prepare_dataset(make_config(), progress=False)

    def first_labels(seed):
        ds = build_dataset(
            result.manifest,
            result.data_dir,
            "train",
            100,
            training=True,
            reading=Reading(seed=seed),
        )
        assert ds.element_spec[0].shape.as_list() == [100, 8, 8, 1]
        return next(iter(ds))[1].numpy()

    assert (
        sum(
            1
            for _ in build_dataset(
                result.manifest, result.data_dir, "train", batch_size=100, training=True
            )
        )
        == 1437 // 100
    )
    assert not np.array_equal(first_labels(1), first_labels(2))
    # `train.seed` reaches the training's input (`train_dataset_fn`): its order follows it
    from tfscale.tasks.train.training import train_dataset_fn

    def first_by_key(seed):
        config = make_config(train__seed=seed)
        dataset_fn = train_dataset_fn(config.train, result.manifest, result.data_dir, 100)
        return next(iter(dataset_fn(None)))[1].numpy()

    assert np.array_equal(first_by_key(1), first_by_key(1))
    assert not np.array_equal(first_by_key(1), first_by_key(2))


def test_a_shuffle_buffer_of_one_keeps_the_order_the_shards_are_read_in(make_config):
    """`train.shuffle_buffer` examples are held to shuffle. The 4 training shards are read
    interleaved, one example of each in turn: with a buffer of 1 the first batch of 4 is
    the first example of each shard; with 4096, examples from anywhere in the split."""
    from tfscale.tasks.train.training import train_dataset_fn

    result = prepare_dataset(make_config(prepare__num_shards=4), progress=False)
    manifest, data_dir = result.manifest, result.data_dir
    counts = [s.examples for s in manifest.shards if s.split == "train"]
    images, _ = read_split(manifest, data_dir, "train")  # in the manifest's order
    firsts = {images[i].tobytes() for i in np.cumsum([0, *counts[:-1]])}

    def first_batch(buffer: int) -> set[bytes]:
        train = make_config(prepare__num_shards=4, train__shuffle_buffer=buffer).train
        dataset = train_dataset_fn(train, manifest, data_dir, batch=4)(None)
        return {image.tobytes() for image in next(iter(dataset))[0].numpy()}

    assert first_batch(1) == firsts
    assert first_batch(4096) != firsts


def test_image_folder_round_trip(tmp_path, make_config):
    from PIL import Image

    rng = np.random.default_rng(0)
    written = {}
    for split, n in (("train", 6), ("test", 3)):
        for i in range(n):
            label = ("cat", "dog")[i % 2]
            image = rng.integers(0, 256, (5, 7, 3), dtype=np.uint8)
            path = tmp_path / "pets" / split / label / f"{i}.png"
            path.parent.mkdir(parents=True, exist_ok=True)
            Image.fromarray(image).save(path)
            written[(split, label, i)] = image
    config = make_config(prepare__dataset=str(tmp_path / "pets"), prepare__min_shards=1)
    result = prepare_dataset(config, progress=False)
    assert result.manifest.feature["class_names"] == ["cat", "dog"]
    assert Path(result.data_dir).name == "pets"
    images, labels = read_split(result.manifest, result.data_dir, "train")
    expected = sorted((k for k in written if k[0] == "train"), key=lambda k: (k[1], k[2]))
    np.testing.assert_array_equal(images, np.stack([written[k] for k in expected]))
    assert labels.tolist() == [("cat", "dog").index(k[1]) for k in expected]


def write_images(root: Path, counts: dict[str, int], seed: int = 0) -> None:
    """Tiny PNGs: `counts` maps a folder under `root` (`cat` or `train/cat`) to its count."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    for folder, n in counts.items():
        (root / folder).mkdir(parents=True, exist_ok=True)
        for i in range(n):
            image = rng.integers(0, 256, (4, 4, 3), dtype=np.uint8)
            Image.fromarray(image).save(root / folder / f"{i}.png")


def drawn_split(make_config, root: Path, seed: int) -> dict[str, list[tuple[str, int]]]:
    config = make_config(
        prepare__dataset=str(root), prepare__seed=seed, prepare__test_fraction=0.25
    )
    source = open_source(config.prepare)
    return {s: [(p.relative_to(root).as_posix(), y) for p, y in f] for s, f in source.files.items()}


def test_flat_image_folder_holds_out_a_seeded_stratified_split(tmp_path, make_config):
    root = tmp_path / "flat"
    write_images(root, {"ant": 8, "bee": 12, "cow": 4})
    split = drawn_split(make_config, root, seed=1)
    assert drawn_split(make_config, root, seed=1) == split
    assert drawn_split(make_config, root, seed=2) != split
    assert {len(split["test"]), len(split["train"])} == {6, 18}
    for s in ("train", "test"):  # each class in both splits, in its share
        assert sorted({y for _, y in split[s]}) == [0, 1, 2]
    assert sorted(y for _, y in split["test"]) == [0, 0, 1, 1, 1, 2]
    assert not {p for p, _ in split["test"]} & {p for p, _ in split["train"]}
    assert all(p.startswith(("ant/", "bee/", "cow/")[y]) for p, y in split["train"])
    source = open_source(make_config(prepare__dataset=str(root)).prepare)
    assert source.spec.label.class_names == ("ant", "bee", "cow") and source.held_out == "drawn"
    note = held_out_note({"held_out": "drawn", "test_fraction": 0.25, "seed": 1})
    assert note == "test split drawn from each class folder (test_fraction 0.25, seed 1)"


def test_validation_folder_is_the_held_out_split_and_the_prepare_line_says_so(
    tmp_path, make_config
):
    root = tmp_path / "pets"
    write_images(root, {"Train/cat": 3, "Train/dog": 3, "validation/cat": 2, "validation/dog": 1})
    config = make_config(prepare__dataset=str(root), prepare__min_shards=1)
    result = prepare_dataset(config, progress=False)
    assert result.manifest.splits == {"test": 3, "train": 6}
    note = "validation/ held out as the test split"
    assert prepared_line(result).endswith(f"; {note}")
    assert f"held out   {note}" in format_prepared(result).splitlines()
    images, labels = read_split(result.manifest, result.data_dir, "test")
    assert images.shape == (3, 4, 4, 3) and labels.tolist() == [0, 0, 1]


def test_train_and_test_folders_say_nothing_of_a_held_out_split(tmp_path, make_config):
    root = tmp_path / "pets"
    write_images(root, {"train/cat": 2, "train/dog": 2, "test/cat": 1, "test/dog": 1})
    source = open_source(make_config(prepare__dataset=str(root)).prepare)
    assert source.splits == {"train": 4, "test": 2} and source.held_out == ""
    assert held_out_note({"held_out": source.held_out}) == ""
    write_images(root, {"validation/cat": 1})  # test/ stays the held-out split
    source = open_source(make_config(prepare__dataset=str(root)).prepare)
    assert source.splits["test"] == 2 and source.held_out == ""


@pytest.mark.parametrize(
    ("counts", "message", "fix"),
    [
        ({"train/cat": 2, "train/dog": 2}, "no held-out split", "add a test/ (or validation/)"),
        ({"train/cat": 2, "test/cat": 0}, "no held-out split", "add a test/ (or validation/)"),
        ({"test/cat": 2, "validation/dog": 2}, "no training images", "put them there"),
        ({"cat": 1, "dog": 1}, "cat, dog hold fewer than 2 images", "add images to them"),
        ({"cat": 3, "dog": 1}, "class folder(s) dog hold fewer", "add images to them"),
        ({}, "holds no images (.bmp, .gif, .jpeg, .jpg, .png)", "<root>/<class>/*"),
        (
            {"cat": 2, "train/dog": 2},
            "mixes split folders (train) with folders of images (cat)",
            "lay it out as",
        ),
        (
            {"pics/cat": 2, "pics/dog": 2},
            "pics holds folders, but only train/, test/ and validation/",
            "lay it out as",
        ),
        (
            {"train": 2, "test": 2},
            "test holds images directly; a split folder holds",
            "move its images into",
        ),
        ({"cat": 2, "cat/kitten": 2}, "cat holds both images and folders", "lay it out as"),
    ],
)
def test_image_folder_without_a_held_out_split_is_refused_naming_it(
    tmp_path, make_config, counts, message, fix
):
    root = tmp_path / "photos"
    root.mkdir()
    write_images(root, counts)
    with pytest.raises(DatasetError) as caught:
        open_source(make_config(prepare__dataset=str(root)).prepare)
    assert str(root) in caught.value.message and message in caught.value.message
    assert fix in caught.value.fix


@pytest.mark.parametrize("where", ["cat/loop.png", "cat/loop", "loop"])
def test_a_link_that_cannot_be_followed_in_an_image_folder_is_refused_naming_it(
    tmp_path, make_config, where
):
    """A link to itself, in a class folder (named as an image or not) or beside the class
    folders: refused by its path, never a crash ("a bug in tfscale")."""
    root = tmp_path / "pets"
    write_images(root, {"cat": 3, "dog": 3})
    link = root / where
    link.symlink_to(link.name)
    with pytest.raises(DatasetError) as caught:
        open_source(make_config(prepare__dataset=str(root)).prepare)
    assert f"{link} is a link that cannot be followed" in caught.value.message
    assert "remove the link" in caught.value.fix


@pytest.mark.parametrize(
    ("counts", "said"),
    [
        ({"train/cat": 2, "train/dog": 2, "test/cat": 2}, "test/ has no image of class dog"),
        ({"train/cat": 2, "validation/cat": 1, "validation/dog": 1}, "train/ has no image of"),
        (
            {"train/cat": 2, "train/dog": 2, "validation/cat": 1},
            "validation/ has no image of class dog",
        ),
    ],
    ids=["test", "train", "validation"],
)
def test_a_split_folder_without_a_class_is_refused_naming_it(tmp_path, make_config, counts, said):
    """A class the model is never trained on (or never measured on) is refused before any
    shard is written, naming the split folder and the class."""
    root = tmp_path / "pets"
    write_images(root, counts)
    with pytest.raises(DatasetError) as caught:
        open_source(make_config(prepare__dataset=str(root)).prepare)
    assert said in caught.value.message and "every split folder" in caught.value.fix


def test_a_test_fraction_leaving_nothing_to_train_on_is_refused(tmp_path, make_config):
    root = tmp_path / "flat"
    write_images(root, {"cat": 2})
    config = make_config(prepare__dataset=str(root), prepare__test_fraction=0.9)
    with pytest.raises(DatasetError, match="leaves none to train on"):
        open_source(config.prepare)


def test_prepare_refuses_a_folder_of_train_only_before_any_training(tmp_path, capsys):
    root = tmp_path / "pets"
    write_images(root, {"train/cat": 2, "train/dog": 2})
    argv = [
        "--params",
        DEFAULTS,
        "prepare",
        "--dataset",
        str(root),
        "--data-dir",
        str(tmp_path / "store"),
    ]
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert f"{root} has no held-out split" in err and "validation/" in err


def test_unknown_dataset_is_a_clear_error(make_config, capsys):
    argv = [
        "--params",
        DEFAULTS,
        "prepare",
        "--dataset",
        "no_such_dataset_xyz",
        "--data-dir",
        make_config().prepare.data_dir,
    ]
    assert main(argv) == 1
    assert "Unknown dataset 'no_such_dataset_xyz'" in capsys.readouterr().err


def test_tfds_by_name_with_the_download_mocked(make_config):
    import tensorflow_datasets as tfds

    config = make_config(prepare__dataset="mnist", prepare__num_shards=2)
    with tfds.testing.mock_data(num_examples=12):
        result = prepare_dataset(config, progress=False)
    manifest = result.manifest
    assert manifest.dataset == "mnist" and manifest.shape == (28, 28, 1)
    assert manifest.feature["class_names"] == [str(i) for i in range(10)]  # mnist's, by name
    assert manifest.splits["train"] == manifest.splits["test"] == 12
    images, labels = read_split(manifest, result.data_dir, "train")
    assert images.shape == (12, 28, 28, 1) and labels.max() < 10
    verify_shards(result.data_dir)


def test_an_image_folder_is_read_as_kerass_image_dataset_from_directory_reads_it(tmp_path):
    """Greyscale files sorted first do not decide the channels: rgb by default, as Keras's
    `image_dataset_from_directory`, `--color-mode grayscale` asked for; .bmp and .gif are
    read as Keras reads them; a file named .png that is not an image is named."""
    from PIL import Image

    rng = np.random.default_rng(1)
    folder = tmp_path / "mixed"
    for i in range(12):
        cls = ("a", "b")[i % 2]
        suffix = (".png", ".bmp", ".gif", ".jpg")[i % 4]
        (folder / cls).mkdir(parents=True, exist_ok=True)
        pixels = rng.integers(0, 256, (6, 6, 3), dtype=np.uint8)
        image = Image.fromarray(pixels).convert("L") if i < 3 else Image.fromarray(pixels)
        image.save(folder / cls / f"{i:02d}{suffix}")
    shapes = {}
    for mode in ("rgb", "grayscale", "rgba"):
        values = {"prepare.dataset": str(folder), "prepare.color_mode": mode}
        values["prepare.data_dir"] = str(tmp_path / mode)
        result = prepare_dataset(load_config(None, values), progress=False)
        assert sum(result.manifest.splits.values()) == 12  # every file Keras reads
        shapes[mode] = result.manifest.spec.shape
    assert shapes == {"rgb": (6, 6, 3), "grayscale": (6, 6, 1), "rgba": (6, 6, 4)}
    (folder / "a" / "notes.png").write_text("not an image")
    values = {"prepare.dataset": str(folder), "prepare.data_dir": str(tmp_path / "again")}
    with pytest.raises(DatasetError, match=r"notes.png is not an image tfscale can read"):
        prepare_dataset(load_config(None, values), progress=False)


def test_a_shard_corrupted_in_place_is_named_before_its_shards_are_reused(make_config):
    """`run` reuses prepared shards: a shard corrupted in place (its size kept) is named,
    with the fix, before any training reads it."""
    from tfscale.tasks.data.manifest import ShardError
    from tfscale.tasks.data.preparation import shards_reusable

    config = make_config(prepare__num_shards=2)
    result = prepare_dataset(config, progress=False)
    assert shards_reusable(config)
    shard = Path(result.data_dir) / result.manifest.shards[1].file
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF  # one byte flipped, the size as it was
    shard.write_bytes(bytes(data))
    with pytest.raises(ShardError, match=rf"{shard.name}: corrupted") as caught:
        shards_reusable(config)
    assert "prepare --dataset digits --force" in str(caught.value)


@pytest.mark.unit
def test_a_corrupted_record_met_while_training_is_one_line_naming_the_fix(tmp_path):
    """TensorFlow's DATA_LOSS on a shard read mid-training: a user's error naming
    `tfscale verify` and `prepare --force`, never "a bug in tfscale"."""
    import tensorflow as tf

    from tfscale.tasks.core.errors import system_error

    path = tmp_path / "train-00000-of-00001.tfrecord"
    with tf.io.TFRecordWriter(str(path)) as writer:
        for _ in range(50):
            writer.write(b"x" * 100)
    data = bytearray(path.read_bytes())
    data[500] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(tf.errors.DataLossError) as caught:
        list(tf.data.TFRecordDataset(str(path)))
    said = system_error(caught.value)
    assert said is not None and re.search(r"corrupted record at \d+\)$", said.message)
    assert "tfscale verify" in said.fix and "prepare --force" in said.fix
