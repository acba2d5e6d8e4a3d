"""What each `tfscale` subcommand does once its config is loaded."""

from __future__ import annotations

import argparse

from tasks.config import Config


def prepare(config: Config, args: argparse.Namespace) -> int:
    from tasks.preparation import format_summary, prepare_dataset

    result = prepare_dataset(config, force=args.force, progress=not args.no_progress)
    print(format_summary(result))
    return 0


def verify(config: Config, args: argparse.Namespace) -> int:
    from tasks.manifest import verify_shards
    from tasks.preparation import dataset_dir

    manifest = verify_shards(dataset_dir(config), config.prepare.dataset)
    print(
        f"ok: {len(manifest.shards)} shards of {manifest.dataset} in {dataset_dir(config)} "
        f"match their sizes and sha256"
    )
    return 0
